#!/usr/bin/env bash
# Everything the reduced-precision issues ask to be run and measured on a machine, in one go,
# for a session that lands on a CPU the project has not measured yet (AVX-512 VNNI/BF16, AMX):
#
#   0. the measured arithmetic peaks (`autokernel hw --peak`: f32 FMA, vdpbf16ps, vpdpbusd,
#      AMX tdpbf16ps / tdpbusd where the CPU has them) at 1 and 2 threads;
#   1. the kernel tests at this CPU's best ISA level, then at each level below it
#      (scripts/test-isa-levels.sh): the AVX-512 and AMX paths run where the CPU has them;
#   2. the six GEMM shapes of the reduced-precision issue tuned in f32, int8 and bf16 at 1 and
#      2 threads, then timed side by side with ONNX Runtime and PyTorch
#      (scripts/bench-i8-peers.py) -> gemm_precision_{1t,2t}.md;
#   3. BERT-base (batch 1 and 8 x 128) tuned in f32, int8 and bf16 at 2 threads, then timed
#      side by side with PyTorch and ONNX Runtime (scripts/bench-bert-precision.py)
#      -> bert_precision.{md,json,jsonl}.
#
# Everything goes to a folder of its own, bench_results/<fp>/hw-evidence-<UTC date-time>/
# (earlier tables are never overwritten): the tables, hw-evidence.log with each step's
# output, and the tests' whole output in kernel-tests*.txt. The script stops at the first
# failing step. Not a test and not run by CI: a benchmark, run by hand.
#
#   scripts/hw-evidence.sh              # budget 24 per workload, 3 rounds: about an hour on 2 cores
#   scripts/hw-evidence.sh --quick      # budget 8, 2 rounds: about 25 minutes
#   scripts/hw-evidence.sh --smoke      # budget 2, 1 round, batch 1 only: checks the pipeline
#
# Needs cargo, and a Python with numpy, onnx, onnxruntime, torch and transformers (PY=path to
# it; default python3), plus the autokernel package for the drop-in rows (optional).
# RESULTS (default bench_results) and DBDIR (default target, for hw-gemm.db, hw-bert.db and the
# BERT checkpoint bert-base-ckpt/)
# move the outputs; a second run resumes the tuning where the databases left it. Relative
# paths in PY, RESULTS and DBDIR are taken from the repository root. AUTOKERNEL_ISA is
# ignored: the point is to run every level this CPU has.
set -euo pipefail
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

BUDGET=24 ROUNDS=3 BATCH=1,8 ITERS=10
case "${1:-}" in
    --quick) BUDGET=8 ROUNDS=2 ;;
    --smoke) BUDGET=2 ROUNDS=1 BATCH=1 ITERS=2 ;;
    -h|--help) usage; exit 0 ;;
    "") ;;
    *) echo "hw-evidence.sh: unknown option '$1' (--quick, --smoke or --help)" >&2; exit 2 ;;
esac
if [ $# -gt 1 ]; then
    echo "hw-evidence.sh: one option at most, got: $*" >&2
    exit 2
fi
unset AUTOKERNEL_ISA
cd "$(dirname "$0")/.."
PY=${PY:-python3}
AK=target/release/autokernel
GEMM_DB=${DBDIR:-target}/hw-gemm.db
BERT_DB=${DBDIR:-target}/hw-bert.db
CKPT=${DBDIR:-target}/bert-base-ckpt
SHAPES=(gemm_bias:128x768x768 gemm_bias:128x3072x768 gemm_bias:128x768x3072
        gemm:1024x1024x1024 gemm_bias:8x3072x768 gemm:1x3072x768)

cargo build --release --quiet
FP=$("$AK" hw --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["id"])')
OUT=${RESULTS:-bench_results}/$FP/hw-evidence-$(date -u +%Y%m%dT%H%M%SZ)
if [ -e "$OUT" ]; then
    echo "hw-evidence.sh: $OUT exists; not writing over it" >&2
    exit 1
fi
mkdir -p "$OUT" "${DBDIR:-target}"
LOG=$OUT/hw-evidence.log
exec > >(tee -a "$LOG") 2>&1
step() { printf '\n== %s  (%s)\n' "$1" "$(date -u +%FT%TZ)"; }

step "machine"
"$AK" hw
step "arithmetic peaks, 1 and 2 threads (what the GEMM tables' GFLOP/s are out of)"
# Not fatal: the AMX peak loops had never run on a real tile unit when this was written.
for T in 1 2; do "$AK" hw --peak --threads "$T" || echo "hw --peak --threads $T FAILED (exit $?)"; done
ISA=$("$AK" hw --json | "$PY" -c 'import json,sys; print(" ".join(json.load(sys.stdin)["isa"]))')
# The reduced-precision paths this machine reports must run: a test that would skip one of
# them fails instead (kernels/src/testing.rs).
AUTOKERNEL_REQUIRE_ISA=$(printf '%s\n' $ISA | grep -E '^(avx512bf16|avx512vnni|avxvnni|amx_tile|amx_bf16|amx_int8)$' | paste -sd, - || true)
export AUTOKERNEL_REQUIRE_ISA
echo "required to run here: ${AUTOKERNEL_REQUIRE_ISA:-nothing beyond the baseline}"

# The tests' whole output is kept beside the log; the log gets their verdicts and skip lines.
tests() {
    local name=$1; shift
    if ! "$@" >"$OUT/$name.txt" 2>&1; then
        tail -40 "$OUT/$name.txt"
        echo "FAILED: $* (whole output: $OUT/$name.txt)"
        exit 1
    fi
    { grep -E "^==|^this CPU|^test result|skipped" "$OUT/$name.txt" || true; }
}
step "kernel tests at this CPU's best ISA level"
tests kernel-tests cargo test --release -p kernels
step "kernel tests at each lower ISA level"
tests kernel-tests-lower-isa env -u AUTOKERNEL_REQUIRE_ISA AUTOKERNEL="$AK" scripts/test-isa-levels.sh

for T in 1 2; do
    step "GEMM shapes tuned in f32, int8, bf16 at $T thread(s) (budget $BUDGET)"
    args=()
    for s in "${SHAPES[@]}"; do args+=(--workload "$s"); done
    "$AK" tune "${args[@]}" --precision f32,int8,bf16 --threads "$T" --budget "$BUDGET" --db "$GEMM_DB"
    step "GEMM side by side with ONNX Runtime and PyTorch, $T thread(s)"
    "$PY" scripts/bench-i8-peers.py --db "$GEMM_DB" --threads "$T" --rounds "$ROUNDS" --binary "$AK" \
        | tee "$OUT/gemm_precision_${T}t.md"
done

step "BERT-base tuned in f32, int8, bf16 at 2 threads (batch $BATCH x 128, budget $BUDGET)"
# Tuned on the very checkpoint the comparison serves (exact-erf GELU, as published BERTs):
# `--model bert-base` has the tanh form, whose FFN workload is another one.
"$PY" scripts/bench-bert-precision.py --prepare --model-dir "$CKPT"
"$AK" tune --model "$CKPT" --batch "$BATCH" --seq 128 --precision f32,int8,bf16 --threads 2 \
    --budget "$BUDGET" --db "$BERT_DB"

step "BERT side by side with PyTorch and ONNX Runtime, 2 threads"
# PyTorch's bf16 autocast takes ~10 s a call at batch 8 without bf16 hardware: left out there.
skip=""
case " $ISA " in *" avx512bf16 "*|*" amx_bf16 "*) ;; *) skip="torch bf16 autocast" ;; esac
"$PY" scripts/bench-bert-precision.py --autokernel "$AK" --db "$BERT_DB" --batch "$BATCH" --seq 128 \
    --threads 2 --rounds "$ROUNDS" --iters "$ITERS" --precisions f32,int8,bf16,auto,auto@5e-3 \
    --skip "$skip" --model-dir "$CKPT" --out "$OUT"

step "done: $OUT (gemm_precision_1t.md, gemm_precision_2t.md, bert_precision.md, hw-evidence.log)"
