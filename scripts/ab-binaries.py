#!/usr/bin/env python3
"""A/B of two autokernel builds: `autokernel run --json` of each workload by binary A and by
binary B, alternating in every round (so a shared machine's drift falls on both alike), then
the median GFLOP/s of each and their ratio. Not a test: a benchmark, run by hand.

    git worktree add /tmp/old <rev> && (cd /tmp/old && cargo build --release)
    scripts/ab-binaries.py /tmp/old/target/release/autokernel target/release/autokernel \\
        --db tuning.db --threads 2 gemm:1x3072x768 gemm_bias:8x3072x768 > ab.md

Both binaries serve the same database: a record neither can serve is the default config.
"""

import argparse
import datetime
import json
import statistics
import subprocess
import sys


def gflops(binary, workload, db, threads):
    out = subprocess.run(
        [binary, "run", "--workload", workload, "--db", db, "--threads", str(threads), "--json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    d = json.loads(out)
    return d["gflops"], f'{d["level"]} {d["kernel"]} {json.dumps(d["config"], sort_keys=True)}'


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="binary A (the baseline)")
    p.add_argument("b", help="binary B (the change)")
    p.add_argument("workloads", nargs="+")
    p.add_argument("--db", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()

    hw = subprocess.run([args.b, "hw", "--json"], check=True, capture_output=True, text=True)
    hw = json.loads(hw.stdout)
    print(f"# A/B of two builds: `run --json`, {args.threads} thread(s)\n")
    print(f"- Machine: {hw['brand']} ({hw['vendor']} family {hw['family']} model {hw['model']}), "
          f"{hw['cores']} cores, {' '.join(hw['isa'])}; fingerprint `{hw['id']}`; date "
          f"{datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')}")
    print(f"- Command: `scripts/ab-binaries.py {' '.join(sys.argv[1:])}`")
    print(f"- {args.rounds} rounds, A then B in each; each figure is `run --json`'s median "
          "(thorough protocol); the ratio is of the medians over rounds.\n")
    print("| workload | A GFLOP/s | B GFLOP/s | B/A | A rounds | B rounds | served |")
    print("|---|---:|---:|---:|---|---|---|")
    for w in args.workloads:
        ra, rb, served = [], [], ""
        for _ in range(args.rounds):
            ra.append(gflops(args.a, w, args.db, args.threads)[0])
            g, served = gflops(args.b, w, args.db, args.threads)
            rb.append(g)
        ma, mb = statistics.median(ra), statistics.median(rb)
        fmt = lambda r: ", ".join(f"{x:.1f}" for x in r)
        print(f"| {w} | {ma:.1f} | {mb:.1f} | {mb / ma:.2f} | {fmt(ra)} | {fmt(rb)} | {served} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
