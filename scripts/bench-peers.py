#!/usr/bin/env python3
"""Times f32 GEMM in numpy (OpenBLAS) and, when importable, PyTorch, on the given shapes.

Run through scripts/bench-peers.sh, which sets up the environment (a venv with numpy, the
thread count, OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE unset). Prints one JSON object per line:
{"peer": ..., "workload": "gemm:MxNxK", "threads": T, "median_s": ..., "gflops": ...,
 "spread": ..., "samples": n}, and first a {"peer": "info", ...} line naming the BLAS in use.

The protocol mirrors autokernel's thorough one (runner/src/protocol.rs): warm-up 50 ms;
samples of back-to-back calls lasting >= 5 ms each; 11 to 101 samples, stopping when the 95%
CI of the median is within +-1% or after 3 s; the statistic is the median; buffers are reused.
"""

import argparse
import json
import math
import statistics
import sys
import time


def median_ci_halfwidth(samples):
    n = len(samples)
    if n < 3:
        return math.inf
    v = sorted(samples)
    half = 0.98 * math.sqrt(n)
    lo = max(0, math.floor(n / 2 - half))
    hi = min(n - 1, math.ceil(n / 2 + half))
    med = statistics.median(v)
    return (v[hi] - v[lo]) / 2 / med if med > 0 else 0.0


def measure(fn):
    start = time.perf_counter()
    calls = 0
    while calls == 0 or time.perf_counter() - start < 0.05:
        fn()
        calls += 1
    per_call = (time.perf_counter() - start) / calls
    reps = max(1, math.ceil(0.005 / max(per_call, 1e-9)))
    samples = []
    while True:
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        samples.append((time.perf_counter() - t) / reps)
        n = len(samples)
        if n >= 101:
            break
        if n >= 11 and (time.perf_counter() - start >= 3.0 or median_ci_halfwidth(samples) <= 0.01):
            break
    med = statistics.median(samples)
    mad = statistics.median(abs(s - med) for s in samples)
    return {"median_s": med, "spread": mad / med, "samples": len(samples)}


def parse(w):
    op, _, shape = w.partition(":")
    dims = shape.split("x")
    if op != "gemm" or len(dims) != 3 or not all(d.isdigit() and int(d) > 0 for d in dims):
        raise SystemExit(f"error: '{w}' is not a workload gemm:MxNxK")
    return tuple(int(d) for d in dims)


def load_average():
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "unknown"


def report(args):
    """Markdown table from the peers' JSON lines, autokernel's `run --json` lines and `hw --json`."""
    peers = [json.loads(l) for l in open(args.peers) if l.strip()]
    ours = [json.loads(l) for l in open(args.autokernel) if l.strip()] if args.autokernel else []
    hw = json.load(open(args.hw))
    info = next((p for p in peers if p["peer"] == "info"), {})
    rows = [p for p in peers if p["peer"] != "info"]
    names = sorted({p["peer"] for p in rows}, key=lambda x: (x != "numpy-openblas", x))
    workloads = list(dict.fromkeys(p["workload"] for p in rows))
    threads = info.get("threads")
    out = [
        f"# GEMM peers — {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
        "",
        f"Machine: {hw['brand']} ({hw['vendor']} family {hw['family']} model {hw['model']}), "
        f"ISA: {' '.join(hw['isa'])}; fingerprint `{hw['id']}`; {threads} thread(s).",
        "",
        f"numpy {info.get('numpy')}, BLAS: {json.dumps(info.get('blas'))}; "
        f"PyTorch: {info.get('torch') or 'not installed'}. OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE "
        "were unset for the run. GFLOP/s = 2·M·N·K ÷ median time (thorough protocol).",
        "",
        f"Load average when the report was written: {load_average()} (on {hw['cores']} thread(s) in use; "
        "a load above the core count means the numbers are contended).",
        "",
    ]
    cols = names + (["autokernel"] if ours else [])
    out.append("| workload (M×N×K) | " + " | ".join(cols) + (" | autokernel ÷ best peer |" if ours else " |"))
    out.append("|---|" + "---:|" * len(cols) + ("---:|" if ours else ""))
    for w in workloads:
        cells = []
        best = 0.0
        for n in names:
            g = next((p["gflops"] for p in rows if p["workload"] == w and p["peer"] == n), None)
            cells.append(f"{g:.1f}" if g else "—")
            best = max(best, g or 0.0)
        if ours:
            a = next((o for o in ours if o["workload"] == w), None)
            cells.append(f"{a['gflops']:.1f} ({a['level']})" if a else "—")
            cells.append(f"{a['gflops'] / best:.2f}×" if a and best else "—")
        out.append(f"| {w} | " + " | ".join(cells) + " |")
    out.append("")
    with open(args.out, "w") as f:
        f.write("\n".join(out))
    print("\n".join(out))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "report":
        ap = argparse.ArgumentParser(prog="bench-peers.py report")
        ap.add_argument("--peers", required=True)
        ap.add_argument("--autokernel")
        ap.add_argument("--hw", required=True)
        ap.add_argument("--out", required=True)
        return report(ap.parse_args(sys.argv[2:]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("workloads", nargs="+")
    args = ap.parse_args()
    shapes = [(w, parse(w)) for w in args.workloads]

    import numpy as np

    info = {"peer": "info", "numpy": np.__version__, "threads": args.threads}
    try:
        from threadpoolctl import threadpool_info

        info["blas"] = [
            {k: p.get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
            for p in threadpool_info()
            if p.get("user_api") == "blas"
        ]
    except ImportError:
        info["blas"] = "threadpoolctl not installed"
    try:
        import torch

        torch.set_num_threads(args.threads)
        info["torch"] = torch.__version__
    except ImportError:
        torch = None
        info["torch"] = None
    print(json.dumps(info), flush=True)

    rng = np.random.default_rng(1)
    for w, (m, n, k) in shapes:
        a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
        b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
        c = np.empty((m, n), dtype=np.float32)
        peers = [("numpy-openblas", lambda: np.matmul(a, b, out=c))]
        if torch is not None:
            ta, tb, tc = torch.from_numpy(a), torch.from_numpy(b), torch.empty(m, n)
            peers.append(("torch", lambda: torch.matmul(ta, tb, out=tc)))
        for name, fn in peers:
            r = measure(fn)
            r.update(
                peer=name,
                workload=w,
                threads=args.threads,
                gflops=2.0 * m * n * k / r["median_s"] / 1e9,
            )
            print(json.dumps(r), flush=True)


if __name__ == "__main__":
    sys.exit(main())
