#!/usr/bin/env python3
"""Greedy decoding through the PyTorch drop-in: GPT-2 small (random weights) generating with
its KV cache, stock PyTorch f32 against `autokernel.torch.optimize` in f32, int8 and bf16,
interleaved rounds. Per-token time excludes the prompt: (time of prompt + N new tokens − time
of prompt + 1 token) / (N − 1). Each decoding step is one row through every projection (a
GEMV) and the 50257-wide tied head. Written to
bench_results/<fingerprint>/dropin-generate-<UTC time>.md (with the command, date and machine).

Needs the package installed (`pip install ./python`), torch and transformers; run from the
repository root on a quiet machine:

    scripts/bench-dropin-generate.py --db tuning.db --threads 2 [--prompt 32] [--new 32] [--rounds 3]
"""

import argparse
import copy
import datetime
import os
import sys
import time
from pathlib import Path

import torch

import autokernel
import autokernel.torch as akt


def seconds(model, ids, new):
    """Wall time of one greedy generate of `new` tokens after `ids`."""
    with torch.inference_mode():
        t = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                       do_sample=False, pad_token_id=0)
        return time.perf_counter() - t


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--db", default="tuning.db")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--precisions", default="f32,int8,bf16")
    a = p.parse_args()
    if a.new < 2:
        p.error("--new: at least 2 (the per-token time is a difference)")
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    stock = GPT2LMHeadModel(GPT2Config()).eval()
    ids = torch.randint(3, 30000, (1, a.prompt))
    precisions = a.precisions.split(",")
    models = {"stock torch f32": stock}
    for prec in precisions:
        models[prec] = akt.optimize(copy.deepcopy(stock), db=a.db, precision=prec, threads=a.threads,
                                    ms=[1, a.prompt])
    with torch.inference_mode():
        want = stock.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=a.new, do_sample=False,
                              pad_token_id=0)
        same = {k: torch.equal(m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=a.new,
                                          do_sample=False, pad_token_id=0), want) for k, m in models.items()}
    per_token = {k: [] for k in models}
    for _ in range(a.rounds):
        for k, m in models.items():
            seconds(m, ids, 2)  # warm
            one, full = seconds(m, ids, 1), seconds(m, ids, a.new)
            per_token[k].append((full - one) / (a.new - 1) * 1e3)
    med = {k: sorted(v)[len(v) // 2] for k, v in per_token.items()}
    for k in models:
        print(f"{k}: {med[k]:.2f} ms/token", flush=True)

    fp = autokernel.fingerprint(a.threads)
    stamp = datetime.datetime.now(datetime.timezone.utc)
    out = Path("bench_results") / fp / f"dropin-generate-{stamp.strftime('%Y%m%dT%H%M%SZ')}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        "# PyTorch drop-in: GPT-2 small greedy decoding with the KV cache (random weights)",
        "",
        f"- command: `{' '.join(sys.argv)}`",
        f"- date: {stamp.isoformat(timespec='seconds')}",
        f"- machine: fingerprint `{fp}`, {a.threads} thread(s); torch {torch.__version__}",
        f"- batch 1, prompt {a.prompt} tokens, {a.new} new; per-token time = (prompt + {a.new} − prompt + 1) / "
        f"{a.new - 1}; {a.rounds} interleaved rounds, the median below",
        "",
        "| served as | ms / token | vs stock | tokens as stock's |",
        "|---|---:|---:|---|",
    ]
    for k in models:
        lines.append(f"| {k} | {med[k]:.2f} | {med['stock torch f32'] / med[k]:.2f}x | {'yes' if same[k] else 'no'} |")
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
