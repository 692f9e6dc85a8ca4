#!/usr/bin/env python3
"""Helper of scripts/bench-bert-peers.sh (see its --help).

    bench-bert-peers.py torch --threads T --iters N --batch 1,8 --seq 128 --round R
        times a random-initialised BERT-base from `transformers` (BertConfig built in code,
        no hub download; hidden_act="gelu_new", the tanh form of GELU the autokernel model
        uses) under torch.inference_mode() with T threads: the encoder alone on a
        [batch, seq, 768] hidden-state input (the work autokernel's `infer` does), and the
        whole BertModel on token ids (embeddings + encoder + pooler). One JSON line per
        (batch, seq): p50/p90 in ms and sequences per second of each.

    bench-bert-peers.py report --results FILE.jsonl --out-md FILE.md --out-json FILE.json
        --meta JSON
        the median over rounds of each implementation's p50, and ratios of medians measured
        in the same rounds, as a Markdown table and a JSON document.
"""

import argparse
import json
import statistics
import sys
import time


def pct(samples, q):
    s = sorted(samples)
    import math

    return s[max(1, math.ceil(q * len(s))) - 1]


def cmd_torch(args):
    import torch
    from transformers import BertConfig, BertModel

    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        hidden_act="gelu_new",
        max_position_embeddings=512,
        attn_implementation="sdpa",
    )
    model = BertModel(config).eval()
    batches = [int(x) for x in args.batch.split(",")]
    seqs = [int(x) for x in args.seq.split(",")]
    with torch.inference_mode():
        for b in batches:
            for s in seqs:
                hidden = torch.randn(b, s, 768)
                ids = torch.randint(0, config.vocab_size, (b, s))
                variants = {
                    "encoder": lambda: model.encoder(hidden),
                    "bertmodel": lambda: model(input_ids=ids),
                }
                row = {
                    "impl": "torch",
                    "round": args.round,
                    "batch": b,
                    "seq": s,
                    "threads": args.threads,
                    "torch": torch.__version__,
                }
                for name, fn in variants.items():
                    for _ in range(3):  # warm-up (lazy init, oneDNN kernels)
                        fn()
                    times = []
                    for _ in range(args.iters):
                        t0 = time.perf_counter()
                        fn()
                        times.append(time.perf_counter() - t0)
                    p50 = statistics.median(times)
                    row[f"{name}_p50_ms"] = p50 * 1e3
                    row[f"{name}_p90_ms"] = pct(times, 0.9) * 1e3
                    row[f"{name}_seqs_per_s"] = b / p50
                print(json.dumps(row), flush=True)


def cmd_report(args):
    rows = [json.loads(l) for l in open(args.results) if l.strip()]
    meta = json.loads(args.meta) if args.meta else {}
    shapes = sorted({(r["batch"], r["seq"]) for r in rows})
    out = []
    for b, s in shapes:
        ak = [r for r in rows if r.get("impl") == "autokernel" and (r["batch"], r["seq"]) == (b, s)]
        th = [r for r in rows if r.get("impl") == "torch" and (r["batch"], r["seq"]) == (b, s)]
        by_round = {}
        for r in ak:
            by_round.setdefault(r["round"], {})["ak"] = r
        for r in th:
            by_round.setdefault(r["round"], {})["torch"] = r
        med = lambda xs: statistics.median(xs) if xs else None
        tuned = med([r["p50_ms"] for r in ak])
        untuned = med([r["untuned_p50_ms"] for r in ak if r.get("untuned_p50_ms")])
        enc = med([r["encoder_p50_ms"] for r in th])
        full = med([r["bertmodel_p50_ms"] for r in th])
        # Ratios within a round, then the median over rounds (both sides saw the same load).
        vs_enc = med([x["torch"]["encoder_p50_ms"] / x["ak"]["p50_ms"] for x in by_round.values() if "ak" in x and "torch" in x])
        vs_full = med([x["torch"]["bertmodel_p50_ms"] / x["ak"]["p50_ms"] for x in by_round.values() if "ak" in x and "torch" in x])
        vs_untuned = med([r["speedup_vs_untuned"] for r in ak if r.get("speedup_vs_untuned")])
        calls = ak[0]["calls"] if ak else {}
        out.append(
            {
                "batch": b,
                "seq": s,
                "rounds": len(by_round),
                "autokernel_p50_ms": tuned,
                "autokernel_seqs_per_s": b / tuned * 1e3 if tuned else None,
                "untuned_p50_ms": untuned,
                "untuned_seqs_per_s": b / untuned * 1e3 if untuned else None,
                "speedup_vs_untuned": vs_untuned,
                "torch_encoder_p50_ms": enc,
                "torch_encoder_seqs_per_s": b / enc * 1e3 if enc else None,
                "torch_bertmodel_p50_ms": full,
                "speedup_vs_torch_encoder": vs_enc,
                "speedup_vs_torch_bertmodel": vs_full,
                "calls": calls,
                "max_abs_err": max((r["max_abs_err"] for r in ak if r.get("max_abs_err") is not None), default=None),
            }
        )
    f = lambda x, p=2: "-" if x is None else f"{x:.{p}f}"
    lines = [
        "# BERT-base encoder: autokernel (tuned / untuned) vs PyTorch",
        "",
        "Written by `scripts/bench-bert-peers.sh`. " + " ".join(f"{k}: {v}." for k, v in meta.items()),
        "",
        "p50 latency of one forward pass in ms (the median over rounds of each round's p50), sequences/s",
        "from it, and speedups as the median over rounds of the ratio measured in the same round.",
        "autokernel and `torch encoder` do the same work (12 layers on [batch, seq, 768] hidden",
        "states, GELU tanh form, no mask); `torch BertModel` adds embeddings and the pooler.",
        "",
        "| batch | seq | autokernel ms | seq/s | untuned ms | tuned vs untuned | torch encoder ms | seq/s | vs torch encoder | torch BertModel ms | vs BertModel | calls exact/arch/near/default | max err |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in out:
        c = r["calls"] or {}
        lines.append(
            f"| {r['batch']} | {r['seq']} | {f(r['autokernel_p50_ms'])} | {f(r['autokernel_seqs_per_s'], 1)} | "
            f"{f(r['untuned_p50_ms'])} | {f(r['speedup_vs_untuned'])}× | {f(r['torch_encoder_p50_ms'])} | "
            f"{f(r['torch_encoder_seqs_per_s'], 1)} | {f(r['speedup_vs_torch_encoder'])}× | "
            f"{f(r['torch_bertmodel_p50_ms'])} | {f(r['speedup_vs_torch_bertmodel'])}× | "
            f"{c.get('exact', '-')}/{c.get('same_arch', '-')}/{c.get('nearest_shape', '-')}/{c.get('default', '-')} | "
            f"{'-' if r['max_abs_err'] is None else format(r['max_abs_err'], '.1e')} |"
        )
    open(args.out_md, "w").write("\n".join(lines) + "\n")
    json.dump({"meta": meta, "results": out}, open(args.out_json, "w"), indent=1)
    print("\n".join(lines))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("torch")
    t.add_argument("--threads", type=int, required=True)
    t.add_argument("--iters", type=int, default=10)
    t.add_argument("--batch", default="1,8")
    t.add_argument("--seq", default="128")
    t.add_argument("--round", type=int, default=0)
    r = sub.add_parser("report")
    r.add_argument("--results", required=True)
    r.add_argument("--out-md", required=True)
    r.add_argument("--out-json", required=True)
    r.add_argument("--meta", default="")
    args = p.parse_args()
    {"torch": cmd_torch, "report": cmd_report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
