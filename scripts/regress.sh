#!/usr/bin/env bash
# Regression run for CI: bench the tuning database's winners against the latest baseline of
# this machine's fingerprint and write the report. See --help.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/regress.sh [OPTIONS] [-- EXTRA BENCH ARGS...]

Re-measures the database's winners (and the kernel defaults) with `autokernel bench`,
compares them with the newest baseline saved for this machine's hardware fingerprint in
RESULTS/<fingerprint>/, and writes a Markdown + SVG report. With no baseline yet, the run is
saved as the first one and the script succeeds.

Exit status: 0 no significant regression, 1 at least one regression, 2 error.

Options:
  --db PATH          tuning database (default: tuning.db)
  --results DIR      where baselines live (default: bench_results in the repository)
  --threshold PCT    smallest slowdown that counts, in percent (default: 5)
  --threads T        threads to measure with (part of the fingerprint; default: all cores)
  --report DIR       report directory (default: RESULTS/<fingerprint>/report)
  --save             also save this run as the new baseline (e.g. after a merge to main)
  --quick            the short tuning protocol instead of the thorough one
  -h, --help         this help

Environment: AUTOKERNEL=path/to/autokernel uses that binary instead of building
target/release/autokernel with cargo.

Example (CI):
  scripts/regress.sh --db fleet/tuning.db || { echo "performance regression"; exit 1; }
EOF
}

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
db="tuning.db"
results="$root/bench_results"
threshold=5
threads=()
report=""
save=0
quick=()
extra=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --db) db="${2:?--db needs a path}"; shift 2 ;;
        --results) results="${2:?--results needs a directory}"; shift 2 ;;
        --threshold) threshold="${2:?--threshold needs a percentage}"; shift 2 ;;
        --threads) threads=(--threads "${2:?--threads needs a number}"); shift 2 ;;
        --report) report="${2:?--report needs a directory}"; shift 2 ;;
        --save) save=1; shift ;;
        --quick) quick=(--quick); shift ;;
        --) shift; extra=("$@"); break ;;
        *) echo "error: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done

if [[ -n "${AUTOKERNEL:-}" ]]; then
    ak="$AUTOKERNEL"
else
    (cd "$root" && cargo build --release -q --bin autokernel) || { echo "error: building autokernel failed" >&2; exit 2; }
    ak="$root/target/release/autokernel"
fi

fp="$("$ak" hw --json "${threads[@]}" | sed -n 's/.*"id":"\([0-9a-f]*\)".*/\1/p')"
[[ -n "$fp" ]] || { echo "error: could not read this machine's fingerprint" >&2; exit 2; }
[[ -n "$report" ]] || report="$results/$fp/report"

args=(bench --db "$db" --results "$results" --threshold "$threshold" --report "$report"
      "${threads[@]}" "${quick[@]}")
if ls "$results/$fp"/*.json >/dev/null 2>&1 && grep -lq autokernel-bench-baseline "$results/$fp"/*.json; then
    args+=(--baseline latest)
    [[ $save -eq 1 ]] && args+=(--save-baseline)
else
    echo "regress.sh: no baseline for fingerprint $fp in $results/$fp yet: saving this run as the first" >&2
    args+=(--save-baseline)
fi

set +e
"$ak" "${args[@]}" "${extra[@]}"
code=$?
set -e
case $code in
    0) echo "regress.sh: no significant regression (report: $report/report.md)" >&2 ;;
    1) echo "regress.sh: REGRESSION (report: $report/report.md)" >&2 ;;
    *) echo "regress.sh: autokernel bench failed (exit $code)" >&2 ;;
esac
exit $code
