#!/usr/bin/env bash
# Runs the kernel correctness tests once per ISA level below this CPU's best (capped with
# AUTOKERNEL_ISA), so one AVX-512 machine also tests the AVX2 and portable paths. The
# uncapped level is what `cargo test --workspace` runs. Says which levels it ran and skipped.
#   AUTOKERNEL=target/debug/autokernel scripts/test-isa-levels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# The binary only reports this CPU's levels: whichever build is there (debug first, as
# `cargo test` makes it), else a debug build.
if [ -z "${AUTOKERNEL:-}" ]; then
    for b in target/debug/autokernel target/release/autokernel; do
        [ -x "$b" ] && AUTOKERNEL=$b && break
    done
    [ -n "${AUTOKERNEL:-}" ] || { cargo build -q --bin autokernel && AUTOKERNEL=target/debug/autokernel; }
fi

hw=$(env -u AUTOKERNEL_ISA "$AUTOKERNEL" hw --json)
field() { python3 -c "import json,sys; v=json.loads(sys.argv[1])[sys.argv[2]]; print(' '.join(v) if isinstance(v, list) else v)" "$hw" "$1"; }
best=$(field cpu_simd)
levels=$(field simd_levels)
echo "this CPU runs: $levels (best: $best; cargo test --workspace covered $best)"
for level in portable avx2 avx512; do
    case " $levels " in *" $level "*) ;; *) echo "skipped $level: this CPU does not run it"; continue ;; esac
    [ "$level" = "$best" ] && continue
    echo "== kernel correctness at AUTOKERNEL_ISA=$level"
    AUTOKERNEL_ISA=$level cargo test -p kernels --lib \
        --test gemm_correctness --test epilogue_correctness --test attention_correctness
done
