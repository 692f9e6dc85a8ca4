#!/usr/bin/env python3
"""Resident memory of BERT-base optimized by ``autokernel.torch.optimize``, with its float32
weights kept (the default) and released (``keep_weights=False``), per precision, and the
latency of one batch in each (so a memory saving is not bought with speed).

Each case runs in a fresh process: build the model, read the resident set size
(/proc/self/statm), optimize, read it again, run warm-up and timed forwards, read it again.
Writes a Markdown table (with the command, date and machine) to
``bench_results/<fingerprint>/dropin-memory-<timestamp>.md``.

    scripts/bench-dropin-memory.py [--db target/bert.db] [--precisions f32,bf16,int8]
        [--threads 2] [--seq 128] [--iters 10] [--out FILE]
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

CHILD = r"""
import gc, json, os, sys, time
import torch
from transformers import BertConfig, BertModel
import autokernel, autokernel.torch as akt

args = json.loads(sys.argv[1])
page = os.sysconf("SC_PAGE_SIZE")

def rss_mb():
    gc.collect()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page / 2**20

torch.manual_seed(0)
model = BertModel(BertConfig(), add_pooling_layer=False).eval()
before = rss_mb()
akt.optimize(model, db=args["db"], precision=args["precision"], threads=args["threads"], ms=[args["seq"]],
             keep_weights=args["keep"])
optimized = rss_mb()
ids = torch.randint(0, 30522, (1, args["seq"]))
times = []
with torch.no_grad():
    for i in range(args["iters"] + 2):
        t = time.perf_counter()
        model(ids)
        if i >= 2:
            times.append(time.perf_counter() - t)
times.sort()
print(json.dumps(dict(before=before, optimized=optimized, after_forward=rss_mb(),
                      released=len(model.autokernel_released_weights), p50_ms=times[len(times) // 2] * 1e3)))
"""


def commit() -> str:
    """The checkout's commit (``+dirty`` with uncommitted changes), or ``unknown``."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
        return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else the machine type."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default=None, help="tuning database (default: kernel defaults)")
    ap.add_argument("--precisions", default="f32,bf16,int8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", default=None, help="output file (default: bench_results/<fp>/dropin-memory-<ts>.md)")
    a = ap.parse_args()

    import autokernel

    fp = autokernel.fingerprint(a.threads)
    rows = []
    for precision in a.precisions.split(","):
        for keep in (True, False):
            args = dict(db=a.db, precision=precision, threads=a.threads, seq=a.seq, iters=a.iters, keep=keep)
            out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], check=True, capture_output=True,
                                 text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            rows.append((precision, keep, r))
            print(precision, "keep" if keep else "release", r, file=sys.stderr)

    now = datetime.datetime.now(datetime.timezone.utc)
    lines = [
        "# Python drop-in: resident memory of BERT-base, float32 weights kept or released",
        "",
        f"- command: `{' '.join([os.path.relpath(sys.argv[0])] + sys.argv[1:])}`",
        f"- date: {now.strftime('%Y-%m-%dT%H:%M:%SZ')}, commit {commit()}",
        f"- machine: fingerprint {fp} ({a.threads} threads); {cpu_name()}, {os.cpu_count()} CPUs",
        f"- model: `BertModel(BertConfig())` without pooler (seeded random weights; 85 M parameters in the "
        f"encoder's GEMMs), database: {a.db or 'none (kernel defaults)'}; batch 1 × {a.seq}, "
        f"p50 of {a.iters} forwards after 2 warm-ups, one fresh process per row",
        "",
        "| precision | f32 weights | RSS of the torch model | added by optimize | after a forward | weights released | p50 ms |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for precision, keep, r in rows:
        lines.append(
            f"| {precision} | {'kept' if keep else 'released'} | {r['before']:.0f} MB | "
            f"{r['optimized'] - r['before']:+.0f} MB | {r['after_forward'] - r['before']:+.0f} MB | "
            f"{r['released']} | {r['p50_ms']:.1f} |"
        )
    text = "\n".join(lines) + "\n"
    path = a.out or os.path.join("bench_results", fp, f"dropin-memory-{now.strftime('%Y%m%dT%H%M%SZ')}.md")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    print(text)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
