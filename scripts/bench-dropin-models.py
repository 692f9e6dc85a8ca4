#!/usr/bin/env python3
"""The PyTorch drop-in on the four BERT-family models transformers names differently: BERT,
RoBERTa, DistilBERT, ALBERT — and GPT-2, whose layers are Conv1D (base/small sizes, random
weights), stock PyTorch f32 against
`autokernel.torch.optimize` in f32, int8 and bf16, batch x 128 tokens, interleaved rounds.
Reports p50 per row, the speedup over stock, how many layer modules were served whole
(ALBERT-base's 12 steps share one), and the cosine
similarity of `last_hidden_state` to stock. Written to
bench_results/<fingerprint>/dropin-models-<UTC time>.md (with the command, date and machine).

Needs the package installed (`pip install ./python`), torch and transformers; run from the
repository root on a quiet machine, with a database tuned for the shapes (e.g.
`autokernel tune --model bert-base --batch 1 --seq 128 --precision f32,int8,bf16`):

    scripts/bench-dropin-models.py --db tuning.db --threads 2 [--batch 1] [--rounds 3] [--models albert-base]
"""

import argparse
import copy
import datetime
import os
import platform
import sys
import time
from pathlib import Path

import torch

import autokernel
import autokernel.torch as akt


MODELS = ("bert-base", "roberta-base", "distilbert-base", "albert-base", "gpt2")


def models(names):
    from transformers import (AlbertConfig, AlbertModel, BertConfig, BertModel, DistilBertConfig, DistilBertModel,
                              GPT2Config, GPT2Model, RobertaConfig, RobertaModel)

    make = {
        "bert-base": lambda: BertModel(BertConfig(), add_pooling_layer=False),
        # padding id 1, 514 positions
        "roberta-base": lambda: RobertaModel(RobertaConfig(), add_pooling_layer=False),
        "distilbert-base": lambda: DistilBertModel(DistilBertConfig()),
        # albert-base-v2's sizes (AlbertConfig's defaults are xxlarge's): embeddings 128 wide,
        # 12 steps of one shared layer, tanh GELU
        "albert-base": lambda: AlbertModel(AlbertConfig(hidden_size=768, num_attention_heads=12, intermediate_size=3072),
                                           add_pooling_layer=False),
        # GPT-2 small (124M): Conv1D projections, causal attention, tanh GELU
        "gpt2": lambda: GPT2Model(GPT2Config()),
    }
    for name in names:
        yield name, make[name]()


def cpu_name():
    """The CPU's model name (/proc/cpuinfo), or what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def p50(model, kw, iters):
    with torch.inference_mode():
        for _ in range(2):
            model(**kw)
        ts = []
        for _ in range(iters):
            t = time.perf_counter()
            model(**kw)
            ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2] * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--db", default="tuning.db")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--precisions", default="f32,int8,bf16")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    a = p.parse_args()
    unknown = set(a.models.split(",")) - set(MODELS)
    if unknown:
        p.error(f"unknown model(s) {', '.join(sorted(unknown))}: expected some of {', '.join(MODELS)}")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    precisions = a.precisions.split(",")
    rows = []
    for name, stock in models(a.models.split(",")):
        stock = stock.eval()
        ids = torch.randint(3, 30000, (a.batch, a.seq))
        kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids))
        served = {}
        for prec in precisions:
            m = akt.optimize(copy.deepcopy(stock), db=a.db, precision=prec, threads=a.threads, ms=[a.batch * a.seq])
            served[prec] = m
        with torch.no_grad():
            ref = stock(**kw).last_hidden_state.flatten()
        times = {k: [] for k in ["stock"] + precisions}
        for _ in range(a.rounds):
            times["stock"].append(p50(stock, kw, a.iters))
            for prec, m in served.items():
                times[prec].append(p50(m, kw, a.iters))
        med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        for prec, m in served.items():
            with torch.no_grad():
                got = m(**kw).last_hidden_state.flatten()
            cos = torch.nn.functional.cosine_similarity(ref, got, dim=0).item()
            layers = len(m.autokernel_fused_layers)
            rows.append((name, prec, med[prec], med["stock"] / med[prec], layers, cos))
        rows.append((name, "stock torch f32", med["stock"], 1.0, None, 1.0))
        print(*[f"{r[0]} {r[1]}: {r[2]:.1f} ms" for r in rows[-len(served) - 1:]], sep="\n", flush=True)

    fp = autokernel.fingerprint(a.threads)
    stamp = datetime.datetime.now(datetime.timezone.utc)
    out = Path("bench_results") / fp / f"dropin-models-{stamp.strftime('%Y%m%dT%H%M%SZ')}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        f"# PyTorch drop-in on {', '.join(name for name, *_ in rows[::len(precisions) + 1])} (base sizes, random weights)",
        "",
        f"- command: `{' '.join(sys.argv)}`",
        f"- date: {stamp.isoformat(timespec='seconds')}",
        f"- machine: {cpu_name()}, fingerprint `{fp}`, {a.threads} thread(s); "
        f"torch {torch.__version__}",
        f"- batch {a.batch} x seq {a.seq}; {a.rounds} interleaved rounds x {a.iters} forward passes, p50 per round, "
        "the median of the rounds below",
        "",
        "| model | served as | p50 ms | vs stock | layer modules served whole | cosine vs stock |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, prec, ms, speed, layers, cos in rows:
        lines.append(f"| {name} | {prec} | {ms:.1f} | {speed:.2f}x | {'' if layers is None else layers} | {cos:.6f} |")
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
