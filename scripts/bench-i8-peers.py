#!/usr/bin/env python3
"""int8 GEMM side by side: ONNX Runtime (MatMul [+ Add] quantised by `quantize_dynamic`, the
scheme BERT users ship) against autokernel's `gemm_i8` and its f32 GEMM, same shapes, same
threads, in one run. Not a test: a benchmark, run by hand.

    pip install onnxruntime onnx numpy
    cargo build --release
    scripts/bench-i8-peers.py --db tuned.db --threads 2 > bench_results/<fingerprint>/gemm_i8.md

The database should hold tuned records for the workloads (`autokernel tune --workload
gemm_bias:128x768x768:i8 ...`); untuned ones are served at their default level, shown in the
table. Each figure is the median of interleaved rounds (ORT: median per-call time of a batch
of calls; autokernel: `run --json`'s median, thorough protocol).
"""

import argparse
import json
import subprocess
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

SHAPES = [
    ("gemm_bias", 128, 768, 768),
    ("gemm_bias", 128, 3072, 768),
    ("gemm_bias", 128, 768, 3072),
    ("gemm", 1024, 1024, 1024),
    ("gemm_bias", 8, 3072, 768),
    ("gemm", 1, 3072, 768),
]


def torch_median_s(m, n, k, threads, rounds, bias):
    """PyTorch's dynamically quantised nn.Linear (int8, per-tensor weights, fbgemm) and its
    bf16 matmul, on the same shape; None when torch is not installed."""
    try:
        import torch
    except ImportError:
        return None, None
    torch.set_num_threads(threads)
    lin = torch.nn.Linear(k, n, bias=bias).eval()
    q = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear}, dtype=torch.qint8)
    a = torch.rand(m, k) * 2 - 1
    ab, wb = a.bfloat16(), lin.weight.detach().t().contiguous().bfloat16()

    def med(fn):
        for _ in range(10):
            fn()
        per_call = []
        for _ in range(rounds):
            t, calls = time.perf_counter(), 0
            while time.perf_counter() - t < 0.05:
                fn()
                calls += 1
            per_call.append((time.perf_counter() - t) / calls)
        return float(np.median(per_call))

    with torch.inference_mode():
        return med(lambda: q(a)), med(lambda: ab @ wb)


def onnx_model(op, m, n, k, path):
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.uniform(-1, 1, (k, n)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["a", "w"], ["y" if op == "gemm" else "z"])]
    inits = [w]
    if op != "gemm":
        inits.append(numpy_helper.from_array(rng.uniform(-1, 1, (n,)).astype(np.float32), "bias"))
        nodes.append(helper.make_node("Add", ["z", "bias"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)


def ort_median_s(path, m, k, threads, rounds):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    a = np.random.default_rng(2).uniform(-1, 1, (m, k)).astype(np.float32)
    for _ in range(20):
        sess.run(None, {"a": a})
    per_call = []
    for _ in range(rounds):
        t = time.perf_counter()
        calls = 0
        while time.perf_counter() - t < 0.05:
            sess.run(None, {"a": a})
            calls += 1
        per_call.append((time.perf_counter() - t) / calls)
    return float(np.median(per_call))


def ours(binary, db, workload, threads):
    out = subprocess.run(
        [binary, "run", "--db", db, "--workload", workload, "--threads", str(threads), "--json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    r = json.loads(out)
    return r["median_s"], r["level"], r["kernel"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--db", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--binary", default="target/release/autokernel")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per shape")
    args = p.parse_args()
    hw = json.loads(subprocess.run([args.binary, "hw", "--json"], capture_output=True, text=True).stdout)
    print(f"# int8 GEMM vs ONNX Runtime `quantize_dynamic` ({hw['id']}, {args.threads} threads)\n")
    print(f"- Machine: {hw.get('brand', '?')}; ONNX Runtime {ort.__version__}; date {time.strftime('%Y-%m-%d')}")
    print(f"- Command: `scripts/bench-i8-peers.py --db {args.db} --threads {args.threads}`")
    print(f"- Medians of {args.rounds} interleaved rounds; ORT and torch: median per-call time of "
          "50 ms batches; ours: `autokernel run --json` median (thorough protocol). "
          "ORT int8: `quantize_dynamic` per-channel; torch int8: `quantize_dynamic` nn.Linear.\n")
    print("| workload | ORT f32 ms | ORT int8 ms | torch int8 ms | torch bf16 ms | ours f32 ms | ours i8 ms | ours bf16 ms | i8 vs ORT int8 | i8 vs torch int8 | i8 vs ours f32 | bf16 vs torch bf16 | bf16 vs ours f32 | f32 vs ORT f32 | levels f32/i8/bf16 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        for op, m, n, k in SHAPES:
            f32_path, i8_path = f"{d}/f32.onnx", f"{d}/i8.onnx"
            onnx_model(op, m, n, k, f32_path)
            quantize_dynamic(f32_path, i8_path, weight_type=QuantType.QInt8, per_channel=True)
            w = f"{op}:{m}x{n}x{k}"
            runs = {"ort_f32": [], "ort_i8": [], "t_i8": [], "t_bf16": [], "f32": [], "i8": [], "bf16": []}
            levels = {}
            for _ in range(args.rounds):
                runs["ort_f32"].append(ort_median_s(f32_path, m, k, args.threads, 9))
                runs["ort_i8"].append(ort_median_s(i8_path, m, k, args.threads, 9))
                ti8, tbf = torch_median_s(m, n, k, args.threads, 9, op != "gemm")
                if ti8 is not None:
                    runs["t_i8"].append(ti8)
                    runs["t_bf16"].append(tbf)
                for key, suffix in [("f32", ""), ("i8", ":i8"), ("bf16", ":bf16")]:
                    s, levels[key], _ = ours(args.binary, args.db, w + suffix, args.threads)
                    runs[key].append(s)
            med = {key: (float(np.median(v)) * 1e3 if v else float("nan")) for key, v in runs.items()}
            print(
                f"| {w} | {med['ort_f32']:.3f} | {med['ort_i8']:.3f} | {med['t_i8']:.3f} | {med['t_bf16']:.3f} | "
                f"{med['f32']:.3f} | {med['i8']:.3f} | {med['bf16']:.3f} | {med['ort_i8'] / med['i8']:.2f}× | "
                f"{med['t_i8'] / med['i8']:.2f}× | {med['f32'] / med['i8']:.2f}× | {med['t_bf16'] / med['bf16']:.2f}× | "
                f"{med['f32'] / med['bf16']:.2f}× | {med['ort_f32'] / med['f32']:.2f}× | "
                f"{levels['f32']}/{levels['i8']}/{levels['bf16']} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
