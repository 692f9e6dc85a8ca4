#!/usr/bin/env python3
"""Helper of scripts/bench-attention-peers.sh (see its --help).

    bench-attention-peers.py torch --threads T --secs S WORKLOAD...
        times torch.nn.functional.scaled_dot_product_attention on each workload
        (attention:BxHxSxD[:causal]) with T threads; one JSON line per workload, in the
        same form as kernels/examples/attention_speed.rs prints.

    bench-attention-peers.py report --results FILE.jsonl --out FILE.md [--meta JSON]
        turns the JSON lines of every round into the Markdown tables (median of the per-run
        medians, ratios of medians measured in the same rounds).

The timing protocol is the same as the Rust side: 0.2 s warm-up, then samples of at least
20 ms (back-to-back calls) until `secs` have passed (at least 7), median per call.
"""

import argparse
import json
import statistics
import sys
import time


def parse_attention(w):
    op, rest = w.split(":", 1)
    assert op == "attention", w
    causal = rest.endswith(":causal")
    shape = rest.split(":")[0]
    b, h, s, d = (int(x) for x in shape.split("x"))
    return b, h, s, d, causal


def flops(w):
    b, h, s, d, causal = parse_attention(w)
    f = 4.0 * b * h * s * s * d
    return f / 2 if causal else f


def time_calls(fn, secs):
    start = time.perf_counter()
    calls = 0
    while time.perf_counter() - start < 0.2 or calls < 2:
        fn()
        calls += 1
    per_call = (time.perf_counter() - start) / calls
    reps = max(1, int(0.02 / per_call + 0.999))
    samples = []
    t0 = time.perf_counter()
    while len(samples) < 7 or (time.perf_counter() - t0 < secs and len(samples) < 200):
        s = time.perf_counter()
        for _ in range(reps):
            fn()
        samples.append((time.perf_counter() - s) / reps)
    return statistics.median(samples), len(samples)


def cmd_torch(args):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    for w in args.workloads:
        b, h, s, d, causal = parse_attention(w)
        q, k, v = (torch.rand(b, h, s, d, dtype=torch.float32) * 2 - 1 for _ in range(3))
        with torch.inference_mode():
            # Correctness spot check against the plain formula in float64.
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            sc = (q.double() @ k.double().transpose(-1, -2)) / d**0.5
            if causal:
                mask = torch.ones(s, s, dtype=torch.bool).triu(1)
                sc = sc.masked_fill(mask, float("-inf"))
            ref = torch.softmax(sc, -1) @ v.double()
            err = (o.double() - ref).abs().max().item()
            if err > 1e-3:
                sys.exit(f"torch sdpa disagrees with the reference on {w}: {err}")
            median, n = time_calls(
                lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), args.secs
            )
        print(
            json.dumps(
                {
                    "label": "torch_sdpa",
                    "workload": w,
                    "threads": args.threads,
                    "kernel": f"torch {torch.__version__} scaled_dot_product_attention",
                    "config": "",
                    "median_ms": median * 1e3,
                    "gflops": flops(w) / median / 1e9,
                    "samples": n,
                }
            ),
            flush=True,
        )


def cmd_report(args):
    rows = [json.loads(l) for l in open(args.results) if l.strip()]
    meta = json.loads(args.meta) if args.meta else {}
    by = {}
    for r in rows:
        by.setdefault((r["workload"], r["threads"], r["label"]), []).append(r)

    def med(w, t, label, field="median_ms"):
        xs = [r[field] for r in by.get((w, t, label), [])]
        return statistics.median(xs) if xs else None

    def spread(w, t, label):
        xs = [r["median_ms"] for r in by.get((w, t, label), [])]
        if len(xs) < 2:
            return None
        return (max(xs) - min(xs)) / statistics.median(xs)

    out = []
    p = out.append
    p("# Attention and fused GEMM epilogues vs PyTorch, this machine")
    p("")
    for k, v in meta.items():
        p(f"- {k}: {v}")
    p("")
    p(
        "GFLOP/s count 4·B·H·S²·D (halved for causal) whatever a variant computes; each cell "
        "is the median over the rounds of the per-round median, and ms per call. Rounds "
        "measure every variant of a shape back to back, so ratios compare numbers taken in "
        "the same minutes. `fused` and `unfused` are autokernel's tuned `attention_fused` "
        "and its unfused variant built on the tuned `gemm_packed` configs for `gemm:SxSxD` "
        "(Q·Kᵀ) and `gemm:SxDxS` (P·V); `torch` is "
        "`torch.nn.functional.scaled_dot_product_attention` on CPU with "
        "`torch.set_num_threads(T)`. Spread: (max - min) / median of the per-round medians, "
        "worst of the row."
    )
    p("")
    workloads = []
    for r in rows:
        if r["workload"].startswith("attention") and r["workload"] not in workloads:
            workloads.append(r["workload"])
    threads = sorted({r["threads"] for r in rows})
    labels = ["fused", "unfused", "torch_sdpa"]
    p(
        "| workload | T | fused GFLOP/s (ms) | unfused GFLOP/s (ms) | torch GFLOP/s (ms) "
        "| fused / torch | fused / unfused | spread |"
    )
    p("|---|---|---|---|---|---|---|---|")
    verdicts = []
    for w in workloads:
        for t in threads:
            cells = []
            for lab in labels:
                ms = med(w, t, lab)
                cells.append(f"{flops(w) / ms / 1e6:.1f} ({ms:.2f})" if ms else "—")
            f, u, tt = (med(w, t, lab) for lab in labels)
            r_t = tt / f if f and tt else None
            r_u = u / f if f and u else None
            sp = [x for x in (spread(w, t, lab) for lab in labels) if x is not None]
            verdicts.append((w, t, r_t, r_u))
            p(
                f"| {w} | {t} | {cells[0]} | {cells[1]} | {cells[2]} | "
                + (f"{r_t:.2f}×" if r_t else "—")
                + " | "
                + (f"{r_u:.2f}×" if r_u else "—")
                + " | "
                + (f"{max(sp) * 100:.0f}%" if sp else "—")
                + " |"
            )
    p("")
    ok_t = [v for v in verdicts if v[2] is not None]
    ok_u = [v for v in verdicts if v[3] is not None]
    if ok_t:
        worst = min(ok_t, key=lambda v: v[2])
        p(
            f"Fused vs torch: {sum(v[2] >= 1.0 for v in ok_t)} of {len(ok_t)} cells ≥ 1.0×, "
            f"{sum(v[2] >= 1.5 for v in ok_t)} ≥ 1.5×; geometric mean "
            f"{statistics.geometric_mean([v[2] for v in ok_t]):.2f}×, worst {worst[2]:.2f}× "
            f"({worst[0]}, {worst[1]} thread(s))."
        )
    if ok_u:
        worst = min(ok_u, key=lambda v: v[3])
        p(
            f"Fused vs unfused: {sum(v[3] >= 1.3 for v in ok_u)} of {len(ok_u)} cells ≥ 1.3×; "
            f"geometric mean {statistics.geometric_mean([v[3] for v in ok_u]):.2f}×, worst "
            f"{worst[3]:.2f}× ({worst[0]}, {worst[1]} thread(s))."
        )
    p("")
    gw = [r["workload"] for r in rows if r["workload"].startswith("gemm_bias")]
    if gw:
        w = gw[0]
        p(f"## {w}: fused epilogue + pre-packed weight vs GEMM then a separate pass")
        p("")
        p(
            "`fused+prepacked`: the best tuned `gemm_bias_act_packed` config with "
            "`fusion=fused, b_layout=prepacked` (the weight packed once, at the first call); "
            "`gemm+separate`: the tuned `gemm_packed` config for the same M×N×K, then one "
            "vectorised bias + GELU pass over C; `fused+rowmajor`: the fused epilogue with B "
            "packed on every call. GFLOP/s count 2·M·N·K."
        )
        p("")
        p("| T | fused+prepacked GFLOP/s (ms) | fused+rowmajor GFLOP/s (ms) | gemm+separate GFLOP/s (ms) | speedup | spread |")
        p("|---|---|---|---|---|---|")
        m, n, k = (int(x) for x in w.split(":")[1].split("x"))
        fl = 2.0 * m * n * k
        for t in threads:
            labs = ["fused_prepacked", "fused_rowmajor", "gemm_separate"]
            ms = [med(w, t, lab) for lab in labs]
            cells = [f"{fl / x / 1e6:.1f} ({x:.2f})" if x else "—" for x in ms]
            sp = [x for x in (spread(w, t, lab) for lab in labs) if x is not None]
            ratio = ms[2] / ms[0] if ms[0] and ms[2] else None
            p(
                f"| {t} | {cells[0]} | {cells[1]} | {cells[2]} | "
                + (f"{ratio:.2f}×" if ratio else "—")
                + " | "
                + (f"{max(sp) * 100:.0f}%" if sp else "—")
                + " |"
            )
        p("")
    p("## Configs")
    p("")
    seen = set()
    for r in rows:
        key = (r["workload"], r["threads"], r["label"])
        if key in seen or r["label"] == "torch_sdpa":
            continue
        seen.add(key)
        p(f"- `{r['workload']}` T={r['threads']} {r['label']}: `{r['kernel']}` `{r['config']}`")
    torch_rows = [r for r in rows if r["label"] == "torch_sdpa"]
    if torch_rows:
        p(f"- torch: {torch_rows[0]['kernel']}")
    open(args.out, "w").write("\n".join(out) + "\n")
    print("\n".join(out))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("torch")
    t.add_argument("--threads", type=int, required=True)
    t.add_argument("--secs", type=float, default=2.0)
    t.add_argument("workloads", nargs="+")
    r = sub.add_parser("report")
    r.add_argument("--results", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--meta")
    args = ap.parse_args()
    {"torch": cmd_torch, "report": cmd_report}[args.cmd](args)


if __name__ == "__main__":
    main()
