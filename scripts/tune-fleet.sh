#!/usr/bin/env bash
# Fleet tuning job: tune a workload list for this hardware type, then export a bundle to ship
# to the machines of the same type. See --help.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/tune-fleet.sh [OPTIONS]

Tunes every workload of a list on this machine (resumable: re-running skips what is already
in the database), then exports the results for this machine's hardware fingerprint as a
bundle to ship to machines of the same type (`autokernel db import` there).

Options:
  --workloads FILE   workload list: one workload per line (gemm:MxNxK), '#' starts a comment
                     (default, without --model: autokernel's default set, the BERT-base and
                     skinny shapes)
  --model NAME|DIR   every call of a model's forward pass (bert-base, bert-large, or a Hugging
                     Face BERT directory), as `autokernel infer` and the Python drop-in look
                     them up, at --batch × --seq (with --workloads: those too)
  --batch B,..       batch sizes for --model (default: 1,2,4,8, as `autokernel infer`'s)
  --seq S,..         sequence lengths for --model (default: 32,64,128)
  --precision P,..   element types to tune each workload in (default: f32; e.g. f32,int8)
  --db PATH          tuning database to tune into (default: tuning.db)
  --budget N         distinct configs per workload (default: 32)
  --strategy S       search strategy (default: random)
  --threads T        threads to tune for (part of the fingerprint; default: all cores)
  --out FILE         the bundle (default: bundles/autokernel-<fingerprint>-<UTC date>.db)
  -h, --help         this help

Environment: AUTOKERNEL=path/to/autokernel uses that binary instead of building
target/release/autokernel with cargo.

Example:
  printf 'gemm:128x768x768\n# decoding\ngemm:1x3072x768\n' > shapes.txt
  scripts/tune-fleet.sh --workloads shapes.txt --budget 64 --out shapes-zen3.db
  scripts/tune-fleet.sh --model bert-base --batch 1,8 --precision f32,int8 --out bert-zen3.db
EOF
}

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
list=""
db="tuning.db"
budget=32
strategy="random"
threads=()
model=()
model_name=""
precision=()
out=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --workloads) list="${2:?--workloads needs a file}"; shift 2 ;;
        --db) db="${2:?--db needs a path}"; shift 2 ;;
        --budget) budget="${2:?--budget needs a number}"; shift 2 ;;
        --strategy) strategy="${2:?--strategy needs a name}"; shift 2 ;;
        --threads) threads=(--threads "${2:?--threads needs a number}"); shift 2 ;;
        --out) out="${2:?--out needs a file}"; shift 2 ;;
        --model) model_name="${2:?--model needs a name or directory}"; model+=(--model "$2"); shift 2 ;;
        --batch) model+=(--batch "${2:?--batch needs sizes}"); shift 2 ;;
        --seq) model+=(--seq "${2:?--seq needs lengths}"); shift 2 ;;
        --precision) precision=(--precision "${2:?--precision needs element types}"); shift 2 ;;
        *) echo "error: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done

workloads=()
if [[ -n "$list" ]]; then
    [[ -r "$list" ]] || { echo "error: workload list $list not found" >&2; exit 2; }
    while IFS= read -r line || [[ -n "$line" ]]; do
        line="${line%%#*}"
        line="$(echo "$line" | tr -d '[:space:]')"
        [[ -n "$line" ]] && workloads+=(--workload "$line")
    done < "$list"
    [[ ${#workloads[@]} -gt 0 ]] || { echo "error: $list lists no workload" >&2; exit 2; }
fi

if [[ -n "${AUTOKERNEL:-}" ]]; then
    ak="$AUTOKERNEL"
else
    (cd "$root" && cargo build --release -q --bin autokernel) || { echo "error: building autokernel failed" >&2; exit 2; }
    ak="$root/target/release/autokernel"
fi

fp="$("$ak" hw --json "${threads[@]}" | sed -n 's/.*"id":"\([0-9a-f]*\)".*/\1/p')"
[[ -n "$fp" ]] || { echo "error: could not read this machine's fingerprint" >&2; exit 2; }
[[ -n "$out" ]] || out="bundles/autokernel-$fp-$(date -u +%Y%m%dT%H%M%SZ).db"
[[ ! -e "$out" ]] || { echo "error: bundle $out already exists" >&2; exit 2; }
mkdir -p "$(dirname "$out")"

if [[ -n "$list" ]]; then
    what="$(( ${#workloads[@]} / 2 )) workload(s) from $list"
    [[ -z "$model_name" ]] || what="$what and the calls of $model_name"
elif [[ -n "$model_name" ]]; then
    what="the calls of $model_name"
else
    what="the default workloads"
fi
echo "tune-fleet.sh: tuning $what for fingerprint $fp into $db" >&2
"$ak" tune --db "$db" --budget "$budget" --strategy "$strategy" "${threads[@]}" "${precision[@]}" \
    "${model[@]}" "${workloads[@]}"

if "$ak" db --help >/dev/null 2>&1; then
    # With --threads the fingerprint is not the default one of this process: name it.
    if [[ ${#threads[@]} -gt 0 ]]; then which="$fp"; else which="current"; fi
    "$ak" db export --db "$db" --out "$out" --fingerprint "$which"
    echo "tune-fleet.sh: exported the bundle $out (fingerprint $fp)" >&2
else
    # This autokernel has no `db` commands yet: ship a consistent copy of the whole database.
    echo "tune-fleet.sh: this autokernel has no 'db export'; shipping a copy of the whole database instead" >&2
    if command -v sqlite3 >/dev/null 2>&1; then
        sqlite3 "$db" ".backup '$out'"
    else
        cp "$db" "$out"
    fi
    echo "tune-fleet.sh: wrote $out (a copy of $db, all fingerprints; this machine's is $fp)" >&2
fi
echo "$out"
