#!/usr/bin/env python3
"""Benchmarks of the Python package (issue #20's targets), written to bench_results/<fingerprint>/python.md.

1. Call overhead: p50 of `rt.gemm` on gemm:8x64x64 from Python (with `out=` and without) minus
   the p50 of the same `Runtime::gemm` call from Rust (examples/gemm_call_latency.rs), for a
   Runtime on all CPUs and one with threads=1. Target: <= 3 us.
2. With --bert: Hugging Face BertModel (bert-base config, random weights), batch 1 and 8 x seq
   128, at --threads: `autokernel.torch.optimize`d vs stock PyTorch f32 (target >= 1.2x), and
   the Rust `autokernel infer` on the same shapes (its weights come from a seed, the
   arithmetic per call is the same). The side-by-side table of record is
   scripts/bench-bert-precision.py (rows `autokernel.torch f32|int8`: the same checkpoint for
   every stack, ONNX Runtime included, interleaved rounds).

Needs the package installed (`pip install ./python`), torch and transformers; run from the
repository root on a quiet machine:

    scripts/bench-python.py --db bert.db --threads 2
    scripts/bench-python.py --quick          # a smoke run: tiny sizes, few iterations
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import autokernel


def p50(f, iters):
    for _ in range(max(1, iters // 10)):
        f()
    samples = []
    for _ in range(iters):
        t = time.perf_counter()
        f()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def overhead(db, iters, root, threads=None):
    rt = autokernel.Runtime(db, threads=threads)
    a = np.full((8, 64), 0.5, np.float32)
    b = np.full((64, 64), 0.25, np.float32)
    out = np.empty((8, 64), np.float32)
    py_out = p50(lambda: rt.gemm(a, b, out=out), iters) * 1e6
    py_new = p50(lambda: rt.gemm(a, b), iters) * 1e6
    cmd = ["cargo", "run", "--release", "-q", "--example", "gemm_call_latency", "--",
           db or "-", "8", "64", "64", str(iters)]
    rust = json.loads(subprocess.run(cmd, cwd=root, check=True, capture_output=True, text=True).stdout)
    return {"threads": threads, "python_out_p50_us": py_out, "python_alloc_p50_us": py_new,
            "rust_p50_us": rust["p50_us"], "overhead_out_us": py_out - rust["p50_us"],
            "overhead_alloc_us": py_new - rust["p50_us"], "level": rust["level"]}


def bert(db, threads, batches, seq, iters, quick, root):
    import copy

    import torch
    from transformers import BertConfig, BertModel

    import autokernel.torch as akt

    torch.set_num_threads(threads)
    cfg = BertConfig(hidden_act="gelu") if not quick else BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, hidden_act="gelu")
    torch.manual_seed(0)
    stock = BertModel(cfg).eval()
    opt = akt.optimize(copy.deepcopy(stock), db=db, threads=threads, ms=[b * seq for b in batches])
    rows = []
    for b in batches:
        ids = torch.randint(0, cfg.vocab_size, (b, seq))
        with torch.no_grad():
            err = (opt(ids).last_hidden_state - stock(ids).last_hidden_state).abs().max().item()
            t_stock = p50(lambda: stock(ids), iters) * 1e3
            t_opt = p50(lambda: opt(ids), iters) * 1e3
        rows.append({"batch": b, "seq": seq, "stock_ms": t_stock, "optimized_ms": t_opt,
                     "speedup": t_stock / t_opt, "max_abs_err": err})
    if not quick:
        cmd = ["cargo", "run", "--release", "-q", "--", "infer", "--batch", ",".join(map(str, batches)),
               "--seq", str(seq), "--threads", str(threads), "--iters", str(iters), "--no-untuned", "--json"]
        if db:
            cmd += ["--db", db]
        out = subprocess.run(cmd, cwd=root, check=True, capture_output=True, text=True).stdout
        infer = {(r["batch"], r["seq"]): r["p50_ms"] for r in map(json.loads, out.splitlines()) if "p50_ms" in r}
        for r in rows:
            r["rust_infer_ms"] = infer.get((r["batch"], r["seq"]))
            if r["rust_infer_ms"]:
                r["optimized_vs_rust"] = r["optimized_ms"] / r["rust_infer_ms"]
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", default=None, help="tuning database (default: kernel defaults)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny model, few iterations, no report file")
    ap.add_argument("--bert", action="store_true", help="also time BertModel: optimize vs stock vs Rust infer")
    args = ap.parse_args()
    root = Path(__file__).resolve().parent.parent
    iters_call = args.iters or (2000 if args.quick else 200000)
    iters_model = args.iters or (3 if args.quick else 30)
    # All CPUs (the process-wide pool), then one thread (each call on the caller's thread).
    calls = [overhead(args.db, iters_call, root, t) for t in (None, 1)]
    for call in calls:
        print(json.dumps({"overhead": call}))
    rows = bert(args.db, args.threads, [1, 8], 16 if args.quick else 128, iters_model, args.quick,
                root) if args.bert or args.quick else []
    for r in rows:
        print(json.dumps({"bert": r}))
    if args.quick:
        return
    fp = autokernel.fingerprint(args.threads)
    out = root / "bench_results" / fp / "python.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    import platform

    lines = [f"# Python package benchmarks ({time.strftime('%Y-%m-%d')}, threads {args.threads}, db {args.db})", "",
             f"- command: `{' '.join(sys.argv)}`; machine: {platform.processor() or platform.machine()}, "
             f"fingerprint {fp}; load average {os.getloadavg()[0]:.2f}", "",
             "| gemm:8x64x64 p50, µs | Python (out=) | Python (new array) | Rust | overhead (out=) | overhead (new) |",
             "|---|---|---|---|---|---|",
             ] + [f"| Runtime(threads={c['threads']}) | {c['python_out_p50_us']:.2f} | {c['python_alloc_p50_us']:.2f} | "
                  f"{c['rust_p50_us']:.2f} | {c['overhead_out_us']:.2f} | {c['overhead_alloc_us']:.2f} |"
                  for c in calls] + [""]
    if rows:
        lines += ["| BertModel bert-base | stock PyTorch ms | optimize ms | speedup | Rust infer ms | optimize / infer |",
                  "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['batch']}×{r['seq']} | {r['stock_ms']:.1f} | {r['optimized_ms']:.1f} | {r['speedup']:.2f}× | "
                     f"{r.get('rust_infer_ms') or 0:.1f} | {r.get('optimized_vs_rust') or 0:.2f} |")
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
