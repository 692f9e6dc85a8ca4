#!/usr/bin/env python3
"""BERT-base (or any checkpoint directory `autokernel infer` serves: BERT, RoBERTa, DistilBERT,
ELECTRA) in f32, bf16 and int8: autokernel against PyTorch and ONNX Runtime, the same weights,
threads and batch/seq grid, interleaved rounds. Never used by tests or CI.

    scripts/bench-bert-precision.py --autokernel target/release/autokernel --db bert.db \\
        [--model-dir target/bert-base-ckpt] [--batch 1,8] [--seq 128] [--threads 2] \\
        [--rounds 3] [--iters 10] [--precisions f32,int8,bf16,auto,auto@5e-3] [--out DIR]
    scripts/bench-bert-precision.py --prepare [--model-dir DIR]   # step 1 only (to tune on it)

1. Makes (once, unless --model-dir already holds a model.safetensors, which PyTorch then loads
   with AutoModel) a Hugging Face BERT-base directory: random weights from a seed,
   `hidden_act="gelu"` (exact erf, as published checkpoints), saved by `save_pretrained`;
   exports it to ONNX (f32) and quantises that with `onnxruntime.quantization.quantize_dynamic`
   (int8, ORT's default per-tensor weights, as users run it).
2. Per round, per (batch, seq), ours first in even rounds and the peers first in odd ones:
   our `autokernel infer --model DIR --precision P --json` for each P (`auto@E` is `auto` with
   the error budget E: `auto@5e-3` keeps int8 out and mixes bf16 and f32); PyTorch f32,
   `autocast(bfloat16)` and `quantize_dynamic` int8 (nn.Linear); ORT f32 and int8. Every
   stack runs in a fresh process of its own (this script again, `--one-stack NAME`), so none
   runs beside another's idle (spinning) threads or memory, and on the same random token ids.
   With `--python-precisions` (default f32,int8 when the `autokernel` package imports): the
   same PyTorch model served by `autokernel.torch.optimize(model, precision=P)` (the Python
   drop-in; same database), rows "autokernel.torch P", compared with the Rust `infer` rows.
3. Accuracy: each PyTorch/ORT stack's cosine similarity and max |err| of `last_hidden_state`
   against PyTorch f32; ours as `infer` reports it against our f32 model (`cosine_vs_f32`,
   `max_abs_err_vs_f32`; our f32 matches transformers within 1e-4, tests/infer_cli.rs).
4. Writes DIR/bert_precision.{md,json,jsonl} with the command, date, machine and load.

Needs torch, transformers, onnx, onnxscript, onnxruntime (pip).
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time


def pct(samples, q):
    s = sorted(samples)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def cosine(a, b):
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


MADE_HERE = ".made-by-bench-bert-precision"


def make_model(dir_, seed):
    import torch
    from transformers import BertConfig, BertModel

    if os.path.exists(os.path.join(dir_, "model.safetensors")):
        return
    torch.manual_seed(seed)
    config = BertConfig(hidden_act="gelu", attn_implementation="sdpa")
    model = BertModel(config, add_pooling_layer=False).eval()
    model.save_pretrained(dir_)
    open(os.path.join(dir_, MADE_HERE), "w").close()


def load_torch(dir_, attn="sdpa"):
    """The directory's base model (BertModel, RobertaModel, DistilBertModel, ElectraModel, ...:
    whichever its config.json names, as `autokernel infer --model DIR` reads it)."""
    import torch
    from transformers import AutoModel

    # In f32 whatever the stored type (the baseline every stack is compared with).
    return AutoModel.from_pretrained(dir_, attn_implementation=attn, dtype=torch.float32).eval()


def describe(dir_):
    """What the report says the weights are: this script's own BERT-base, or the directory's
    model type and sizes."""
    with open(os.path.join(dir_, "config.json")) as f:
        c = json.load(f)
    if os.path.exists(os.path.join(dir_, MADE_HERE)):
        return "one random BERT-base (hidden_act gelu, exact erf) saved by save_pretrained"
    layers = c.get("num_hidden_layers", c.get("n_layers"))
    hidden = c.get("hidden_size", c.get("dim"))
    return f"{dir_}: {c.get('model_type')}, {layers} layers, hidden {hidden}"


def onnx_models(dir_):
    import torch

    f32 = os.path.join(dir_, "bert.onnx")
    i8 = os.path.join(dir_, "bert.int8.onnx")
    if not os.path.exists(f32):
        eager = load_torch(dir_, attn="eager")

        class Wrap(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, input_ids, attention_mask):
                return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

        # A short example (any model's positions take it); the axes stay dynamic.
        ids = torch.ones(1, 8, dtype=torch.long)
        mask = torch.ones(1, 8, dtype=torch.long)
        torch.onnx.export(
            Wrap(eager),
            (ids, mask),
            f32,
            input_names=["input_ids", "attention_mask"],
            output_names=["last_hidden_state"],
            dynamic_axes={"input_ids": {0: "b", 1: "s"}, "attention_mask": {0: "b", 1: "s"},
                          "last_hidden_state": {0: "b", 1: "s"}},
            opset_version=17,
            dynamo=False,
        )
    if not os.path.exists(i8):
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(f32, i8, weight_type=QuantType.QInt8)
    return f32, i8


def time_calls(fn, iters):
    fn()  # warm-up
    out = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def stacks(args):
    """The Python stacks timed, in order: PyTorch, the drop-in per precision, ORT."""
    names = ["torch f32", "torch bf16 autocast", "torch int8 dynamic"]
    names += [f"autokernel.torch {p}" for p in args.python_precisions]
    names += ["onnxruntime f32", "onnxruntime int8"]
    return [n for n in names if n not in args.skip]


def inputs(args, b, s):
    """The token ids and mask every stack runs at (batch, seq): seeded, all tokens real."""
    import torch

    with open(os.path.join(args.model_dir, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    g = torch.Generator().manual_seed(1000 * b + s)
    return torch.randint(0, vocab, (b, s), generator=g), torch.ones(b, s, dtype=torch.long)


def one_stack(args, name, b, s, out_path):
    """In a process of its own: times stack `name` at (batch, seq), saves its output to
    `out_path` (.npy) and prints its times as JSON."""
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    ids, mask = inputs(args, b, s)
    if name.startswith("onnxruntime"):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        opts.inter_op_num_threads = 1
        path = os.path.join(args.model_dir, "bert.onnx" if name.endswith("f32") else "bert.int8.onnx")
        sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}

        def fn():
            return sess.run(["last_hidden_state"], feeds)[0]
    else:
        model = load_torch(args.model_dir)
        if name == "torch int8 dynamic":
            model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
        elif name.startswith("autokernel.torch "):
            import autokernel.torch as akt

            model = akt.optimize(model, db=args.db, threads=args.threads, precision=name.split()[-1],
                                 ms=[b * s])
        autocast = name == "torch bf16 autocast"

        def fn():
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                return model(input_ids=ids, attention_mask=mask).last_hidden_state.float().numpy()
    times = time_calls(fn, args.iters)
    np.save(out_path, np.asarray(fn()))
    print(json.dumps({"times": times}))


def peers(args, b, s, outputs):
    """Times each Python stack at (batch, seq) in a fresh process of its own (as ours runs),
    so no stack runs beside another's idle threads; `outputs` keeps each stack's output
    (from the first round) for the accuracy columns."""
    import tempfile

    result = []
    for name in stacks(args):
        with tempfile.TemporaryDirectory() as tmp:
            out_path = os.path.join(tmp, "out.npy")
            cmd = [sys.executable, os.path.abspath(__file__), "--one-stack", name, "--batch", str(b),
                   "--seq", str(s), "--one-out", out_path, "--model-dir", args.model_dir, "--db", args.db,
                   "--threads", str(args.threads), "--iters", str(args.iters)]
            done = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            times = json.loads(done.strip().splitlines()[-1])["times"]
            if (name, b, s) not in outputs:
                import numpy as np

                outputs[(name, b, s)] = np.load(out_path)
        result.append({
            "impl": name, "batch": b, "seq": s,
            "p50_ms": 1e3 * pct(times, 0.5), "p90_ms": 1e3 * pct(times, 0.9),
            "seqs_per_s": b / pct(times, 0.5),
        })
    return result


def accuracy(rows, outputs):
    """Each Python stack's cosine and max |err| against PyTorch f32 on the same ids."""
    import numpy as np

    for r in rows:
        key, ref = (r["impl"], r["batch"], r["seq"]), outputs.get(("torch f32", r["batch"], r["seq"]))
        if key in outputs and ref is not None:
            r["cosine_vs_torch_f32"] = cosine(outputs[key], ref)
            r["max_abs_err_vs_torch_f32"] = float(np.max(np.abs(outputs[key] - ref)))


def ours(args, precision, b, s):
    policy, _, budget = precision.partition("@")
    cmd = [args.autokernel, "infer", "--model", args.model_dir, "--db", args.db,
           "--batch", str(b), "--seq", str(s), "--threads", str(args.threads),
           "--iters", str(args.iters), "--precision", policy, "--check", "none", "--json"]
    budget = budget or (str(args.max_rel_err) if args.max_rel_err is not None else "")
    if budget:
        cmd += ["--max-rel-err", budget]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    row = json.loads(out.strip().splitlines()[-1])
    return {
        "impl": f"autokernel {precision}", "batch": b, "seq": s,
        "p50_ms": row["p50_ms"], "p90_ms": row.get("p90_ms"),
        "seqs_per_s": row["seqs_per_s"],
        "cosine_vs_f32": row.get("cosine_vs_f32"),
        "max_abs_err_vs_f32": row.get("max_abs_err_vs_f32"),
        "calls": row.get("calls"), "workloads_by_precision": row.get("workloads_by_precision"),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--autokernel", default="target/release/autokernel")
    ap.add_argument("--db", default="target/bert.db")
    ap.add_argument("--model-dir", default="target/bert-base-ckpt")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--seq", default="128")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--precisions", default="f32,int8,bf16,auto",
                    help="our precisions, comma-separated: f32, int8, bf16, auto, or auto@E "
                         "(auto within the error budget E)")
    ap.add_argument("--max-rel-err", type=float, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="default bench_results/<fingerprint>")
    ap.add_argument("--python-precisions", default=None,
                    help="precisions to serve the PyTorch model in through autokernel.torch.optimize "
                         "(default f32,int8 when the autokernel package imports; '' for none)")
    ap.add_argument("--skip", default="", help="peer stacks to leave out, comma-separated, e.g. "
                    "'torch bf16 autocast' (10 s a call at batch 8 on CPUs without bf16 hardware)")
    ap.add_argument("--prepare", action="store_true",
                    help="only make the model directory and its ONNX models, then exit")
    ap.add_argument("--one-stack", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--one-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one_stack:
        return one_stack(args, args.one_stack, int(args.batch), int(args.seq), args.one_out)
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if args.python_precisions is None:
        import importlib.util
        found = importlib.util.find_spec("autokernel") is not None
        args.python_precisions = "f32,int8" if found else ""
    args.python_precisions = [p for p in args.python_precisions.split(",") if p]

    os.makedirs(args.model_dir, exist_ok=True)
    make_model(args.model_dir, args.seed)
    onnx_models(args.model_dir)
    if args.prepare:
        return 0
    hw = json.loads(subprocess.run([args.autokernel, "hw", "--json", "--threads", str(args.threads)],
                                   check=True, capture_output=True, text=True).stdout)
    # bench_results/ is keyed by the machine's fingerprint at all its threads (`hw` without
    # --threads), whatever thread count this run uses.
    machine = json.loads(subprocess.run([args.autokernel, "hw", "--json"], check=True,
                                        capture_output=True, text=True).stdout)
    out_dir = args.out or os.path.join("bench_results", machine["id"])
    os.makedirs(out_dir, exist_ok=True)
    shapes = [(int(b), int(s)) for b in args.batch.split(",") for s in args.seq.split(",")]
    precisions = [p for p in args.precisions.split(",") if p]
    rows, outputs = [], {}
    for r in range(args.rounds):
        for b, s in shapes:
            # Odd rounds run the peers first (every stack runs in a process of its own; the
            # order still decides who follows whom on a VM whose speed drifts).
            parts = [lambda: [ours(args, p, b, s) for p in precisions],
                     lambda: peers(args, b, s, outputs)]
            for part in parts if r % 2 == 0 else parts[::-1]:
                for row in part():
                    row["round"] = r
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    accuracy(rows, outputs)
    write_report(args, hw, out_dir, rows, shapes)


def write_report(args, hw, out_dir, rows, shapes):
    meta = {
        "command": " ".join(sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{hw['brand']} ({hw['vendor']} family {hw['family']} model {hw['model']}), "
                   f"isa {' '.join(hw['isa'])}, fingerprint {hw['id']}",
        "threads": args.threads,
        "loadavg": os.getloadavg(),
        "python": platform.python_version(),
    }
    with open(os.path.join(out_dir, "bert_precision.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    summary = []
    lines = ["# BERT-family encoder, f32 / bf16 / int8: autokernel vs PyTorch vs ONNX Runtime", "",
             f"- command: `{meta['command']}`", f"- date: {meta['date']}",
             f"- machine: {meta['machine']}", f"- threads: {args.threads}; load average at the end "
             f"{meta['loadavg'][0]:.2f}", f"- {args.rounds} interleaved rounds × {args.iters} "
             "timed forward passes; p50 per round, the median of those below; ratios are "
             "medians of per-round ratios", f"- weights: {describe(args.model_dir)}; ours loads that "
             "directory", ""]
    for b, s in shapes:
        lines += [f"## batch {b} × seq {s}", "",
                  "| implementation | p50 ms | seq/s | vs ORT int8 | vs torch bf16 | vs ORT f32 | vs torch f32 | cosine vs f32 | max abs err vs f32 |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        def per_round(impl):
            return {r["round"]: r for r in rows if r["impl"] == impl and r["batch"] == b and r["seq"] == s}
        for impl in impls:
            mine = per_round(impl)
            if not mine:
                continue
            p50 = statistics.median(r["p50_ms"] for r in mine.values())
            def ratio(peer):
                other = per_round(peer)
                rs = [other[k]["p50_ms"] / mine[k]["p50_ms"] for k in mine if k in other]
                return f"{statistics.median(rs):.2f}×" if rs else "—"
            any_row = next(iter(mine.values()))
            cos = any_row.get("cosine_vs_torch_f32", any_row.get("cosine_vs_f32"))
            err = any_row.get("max_abs_err_vs_torch_f32", any_row.get("max_abs_err_vs_f32"))
            fmt = lambda x, f: ("—" if x is None else format(x, f))  # noqa: E731
            lines.append(f"| {impl} | {p50:.1f} | {b * 1e3 / p50:.1f} | {ratio('onnxruntime int8')} | "
                         f"{ratio('torch bf16 autocast')} | {ratio('onnxruntime f32')} | {ratio('torch f32')} | "
                         f"{fmt(cos, '.6f')} | {fmt(err, '.2e')} |")
            summary.append({"impl": impl, "batch": b, "seq": s, "p50_ms": p50, "cosine": cos,
                            "max_abs_err": err})
        for p in args.python_precisions:
            py, rust = per_round(f"autokernel.torch {p}"), per_round(f"autokernel {p}")
            rs = [py[k]["p50_ms"] / rust[k]["p50_ms"] for k in py if k in rust]
            if rs:
                lines.append(f"\nPython drop-in {p} / Rust `infer` {p}: {statistics.median(rs):.3f} "
                             "(time ratio, median of rounds; 1.05 = 5% slower)")
        lines.append("")
    lines += ["Cosine / max abs err: PyTorch and ORT rows against PyTorch f32 on the same ids; "
              "autokernel rows against autokernel f32 (which matches transformers within 1e-4: "
              "tests/infer_cli.rs, tests/fixtures/tiny-bert); autokernel.torch rows (the Python "
              "drop-in serving the PyTorch model) against PyTorch f32.", ""]
    with open(os.path.join(out_dir, "bert_precision.md"), "w") as f:
        f.write("\n".join(lines))
    # The machine's BERT table, bench_results/<fingerprint>/bert.md, is the latest run written
    # there or in a folder of it (bench_results/<fingerprint>/bert-<date>/).
    out_abs = os.path.abspath(out_dir)
    fp_dir = next((d for d in (out_abs, os.path.dirname(out_abs))
                   if os.path.basename(os.path.dirname(d)) == "bench_results"), None)
    if fp_dir is not None:
        with open(os.path.join(fp_dir, "bert.md"), "w") as f:
            f.write(f"<!-- The latest run of scripts/bench-bert-precision.py here: "
                    f"{os.path.relpath(out_abs, fp_dir)}/bert_precision.md. -->\n\n")
            f.write("\n".join(lines))
    with open(os.path.join(out_dir, "bert_precision.json"), "w") as f:
        json.dump({"meta": meta, "summary": summary}, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
