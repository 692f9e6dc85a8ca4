#!/usr/bin/env bash
# What `--precision auto` compares when one precision was tuned under load: each precision's
# own decision, then the precisions' winners re-measured side by side (schema v5).
#
# Tunes one shape one precision at a time into a fresh database, int8 while two busy loops
# hold the cores and f32 and bf16 on the quiet machine, prints `lookup --precision auto`'s
# medians, then runs the three-precision job again (nothing new is searched; the winners are
# timed together) and prints them again. Run it on an otherwise idle machine.
#
#   scripts/side-by-side-under-load.sh [WORKLOAD]      (default gemm_bias:128x768x768)
#   AK=path/to/autokernel scripts/side-by-side-under-load.sh
set -euo pipefail
AK=${AK:-target/release/autokernel}
W=${1:-gemm_bias:128x768x768}
DIR=$(mktemp -d)
LOAD=()
stop_load() { [ ${#LOAD[@]} -eq 0 ] || kill "${LOAD[@]}" 2>/dev/null || true; LOAD=(); }
trap 'stop_load; rm -rf "$DIR"' EXIT
DB="$DIR/demo.db"
med() {
    "$AK" lookup --db "$DB" --workload "$W" --precision auto --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
p = d["precisions"]
cells = ["%s %.3f ms" % (t, p[t]["median_s"] * 1e3) for t in ("f32", "bf16", "i8")]
print(" | ".join(cells), "| auto serves", d["dtype"])'
}
echo "## 1. int8 tuned while two busy loops hold both cores"
for _ in 1 2; do
    timeout 120 sh -c 'while :; do :; done' &
    LOAD+=($!)
done
sleep 1
"$AK" tune --db "$DB" --workload "$W" --precision int8 --budget 6 2>&1 | grep -E "$W|noise" | cut -c1-120
stop_load
sleep 3
echo "## 2. f32 and bf16 tuned on the quiet machine (each decided on its own rounds)"
for p in f32 bf16; do
    "$AK" tune --db "$DB" --workload "$W" --precision $p --budget 6 2>&1 | grep -E "$W" | cut -c1-120
done
echo "## 3. what auto compares: each precision's own decision"
med
echo "## 4. the job for the three precisions again, quiet: nothing searched, winners side by side"
"$AK" tune --db "$DB" --workload "$W" --precision f32,bf16,int8 --budget 6 2>&1 | grep -E "side by side"
echo "## 5. what auto compares now"
med
