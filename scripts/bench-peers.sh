#!/usr/bin/env bash
# Benchmarks the outside peers (OpenBLAS through numpy; PyTorch where installed) on the same
# GEMM shapes autokernel tunes by default, next to autokernel itself. See --help.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/bench-peers.sh [OPTIONS]

Times f32 GEMM in numpy (OpenBLAS) and, if `import torch` works, PyTorch, on autokernel's
default tuning shapes (or the --workload ones), with the same protocol as `autokernel run`.
With --db, also runs each shape through autokernel's runtime (`autokernel run`) for a
side-by-side table. Writes RESULTS/<fingerprint>/peers-<UTC date-time>.{md,jsonl}.

numpy comes from the system python if it has it, else from a venv in target/peers-venv
(created on first use with pip: numpy, threadpoolctl). PyTorch is never installed by this
script (~4 GB); install it into that venv yourself to include it. OPENBLAS_CORETYPE and
OPENBLAS_L2_SIZE are unset for the peers' process only: set, they pin current OpenBLAS
builds to slower kernels.

Options:
  --workload W     shape to time (repeatable; default: the 5 default tuning shapes)
  --threads T      threads for every library (default: all cores)
  --db PATH        also time autokernel's runtime with this tuning database
  --results DIR    where to write (default: bench_results in the repository)
  --python PY      python with numpy to use (default: python3, else the venv)
  -h, --help       this help

Environment: AUTOKERNEL=path/to/autokernel uses that binary instead of building
target/release/autokernel with cargo.
EOF
}

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# autokernel's default tuning set (src/commands/tune.rs, DEFAULT_WORKLOADS).
workloads=()
defaults=(gemm:128x768x768 gemm:128x3072x768 gemm:128x768x3072 gemm:1x3072x768 gemm:8x3072x768)
threads="$(nproc)"
db=""
results="$root/bench_results"
py=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --workload) workloads+=("${2:?--workload needs a shape}"); shift 2 ;;
        --threads) threads="${2:?--threads needs a number}"; shift 2 ;;
        --db) db="${2:?--db needs a path}"; shift 2 ;;
        --results) results="${2:?--results needs a directory}"; shift 2 ;;
        --python) py="${2:?--python needs a program}"; shift 2 ;;
        *) echo "error: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[[ ${#workloads[@]} -gt 0 ]] || workloads=("${defaults[@]}")
[[ "$threads" =~ ^[1-9][0-9]*$ ]] || { echo "error: --threads '$threads' is not a positive number" >&2; exit 2; }
if [[ -n "$db" && ! -f "$db" ]]; then echo "error: database $db not found" >&2; exit 2; fi

if [[ -z "$py" ]]; then
    if python3 -c 'import numpy' >/dev/null 2>&1; then
        py=python3
    else
        venv="$root/target/peers-venv"
        if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c 'import numpy' >/dev/null 2>&1; then
            echo "bench-peers.sh: installing numpy into $venv" >&2
            python3 -m venv "$venv"
            "$venv/bin/python" -m pip install -q --disable-pip-version-check numpy threadpoolctl
        fi
        py="$venv/bin/python"
    fi
fi
"$py" -c 'import numpy' 2>/dev/null || { echo "error: $py cannot import numpy" >&2; exit 2; }

if [[ -n "${AUTOKERNEL:-}" ]]; then
    ak="$AUTOKERNEL"
else
    (cd "$root" && cargo build --release -q --bin autokernel) || { echo "error: building autokernel failed" >&2; exit 2; }
    ak="$root/target/release/autokernel"
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$ak" hw --json --threads "$threads" > "$tmp/hw.json"
fp="$(sed -n 's/.*"id":"\([0-9a-f]*\)".*/\1/p' "$tmp/hw.json")"
[[ -n "$fp" ]] || { echo "error: could not read this machine's fingerprint" >&2; exit 2; }

echo "bench-peers.sh: timing ${#workloads[@]} shape(s) at $threads thread(s) with $py" >&2
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \
    OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads" MKL_NUM_THREADS="$threads" \
    "$py" "$root/scripts/bench-peers.py" --threads "$threads" "${workloads[@]}" > "$tmp/peers.jsonl"

ak_args=()
if [[ -n "$db" ]]; then
    : > "$tmp/autokernel.jsonl"
    for w in "${workloads[@]}"; do
        "$ak" run --workload "$w" --db "$db" --threads "$threads" --json >> "$tmp/autokernel.jsonl"
    done
    ak_args=(--autokernel "$tmp/autokernel.jsonl")
fi

out="$results/$fp"
stamp="$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out"
cat "$tmp/peers.jsonl" ${db:+"$tmp/autokernel.jsonl"} > "$out/peers-$stamp.jsonl"
"$py" "$root/scripts/bench-peers.py" report --peers "$tmp/peers.jsonl" "${ak_args[@]}" \
    --hw "$tmp/hw.json" --out "$out/peers-$stamp.md"
echo "bench-peers.sh: wrote $out/peers-$stamp.md" >&2
