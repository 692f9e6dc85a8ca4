#!/usr/bin/env bash
# BERT-base encoder through the autokernel runtime (tuned database and kernel defaults) vs
# PyTorch + transformers, same batch/seq grid and threads, interleaved rounds. See --help.
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: scripts/bench-bert-peers.sh [OPTIONS]

For each of --rounds rounds, back to back:
  1. `autokernel infer --json` on --db (tuned) and kernel defaults (untuned), output checked
     against the f64 reference (first and last sequence of each batch, first round only);
  2. transformers' BertModel, random init from a BertConfig built in code (no hub
     download), torch.inference_mode(), torch.set_num_threads(T): the encoder alone (the
     same work) and the whole BertModel.
Then writes bench_results/<fingerprint id>/bert_f32.md and bert_f32.json (medians over rounds,
ratios within rounds) and bert_f32.jsonl (every measurement), with the command, date and load.

Tune the database first, e.g.:
  autokernel tune --model bert-base --batch 1,8 --seq 128 --db target/bert.db --budget 48

PyTorch and transformers come from a venv (--venv, default target/torch-venv), created with
`pip install torch transformers` when it cannot import them. Never used by tests or CI.

Options:
  --batch LIST     batch sizes (default 1,8)
  --seq LIST       sequence lengths (default 128)
  --threads T      threads for both (default 2)
  --rounds N       interleaved rounds (default 3)
  --iters N        timed forward passes per shape per round (default 10)
  --db PATH        tuning database (default target/bert.db)
  --venv DIR       python venv (default target/torch-venv)
  --results DIR    where to write (default bench_results)
  --autokernel BIN the autokernel binary to use (default: cargo build --release, then
                   target/release/autokernel); pass the binary that tuned --db, so a
                   rebuild with changed kernel spaces does not invalidate its records
  -h, --help       this help
USAGE
}

BATCH=1,8
SEQ=128
THREADS=2
ROUNDS=3
ITERS=10
DB=target/bert.db
VENV=target/torch-venv
RESULTS=bench_results
AK=
while [ $# -gt 0 ]; do
    case "$1" in
    --batch) BATCH="$2"; shift 2 ;;
    --seq) SEQ="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --iters) ITERS="$2"; shift 2 ;;
    --db) DB="$2"; shift 2 ;;
    --venv) VENV="$2"; shift 2 ;;
    --results) RESULTS="$2"; shift 2 ;;
    --autokernel) AK="$2"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

cd "$(dirname "$0")/.."
CMDLINE="scripts/bench-bert-peers.sh --batch $BATCH --seq $SEQ --threads $THREADS --rounds $ROUNDS --iters $ITERS --db $DB"
[ -f "$DB" ] || { echo "database $DB not found: tune it first (see --help)" >&2; exit 2; }
if [ -z "$AK" ]; then
    cargo build --release -q
    AK=./target/release/autokernel
fi
if ! "$VENV/bin/python" -c 'import torch, transformers' 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q torch transformers
fi
FP=$("$AK" hw --threads "$THREADS" --json | "$VENV/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["id"])')
OUT="$RESULTS/$FP"
mkdir -p "$OUT"
JSONL="$OUT/bert_f32.jsonl"
: > "$JSONL"
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 1 "$ROUNDS"); do
    CHECK=none
    [ "$r" = 1 ] && CHECK=ends
    echo "round $r/$ROUNDS: autokernel" >&2
    "$AK" infer --json --db "$DB" --batch "$BATCH" --seq "$SEQ" --threads "$THREADS" \
        --iters "$ITERS" --check "$CHECK" |
        "$VENV/bin/python" -c "import json,sys
for l in sys.stdin:
    d = json.loads(l); d['impl'] = 'autokernel'; d['round'] = $r; print(json.dumps(d))" >> "$JSONL"
    echo "round $r/$ROUNDS: torch" >&2
    "$VENV/bin/python" scripts/bench-bert-peers.py torch --threads "$THREADS" --iters "$ITERS" \
        --batch "$BATCH" --seq "$SEQ" --round "$r" >> "$JSONL"
done
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)
META=$("$VENV/bin/python" -c "import json,sys; print(json.dumps({'command': sys.argv[1], 'date': sys.argv[2], 'load average at start / end': sys.argv[3] + ' / ' + sys.argv[4], 'fingerprint': sys.argv[5], 'threads': int(sys.argv[6])}))" \
    "$CMDLINE" "$(date -u +%Y-%m-%dT%H:%MZ)" "$LOAD_START" "$LOAD_END" "$FP" "$THREADS")
"$VENV/bin/python" scripts/bench-bert-peers.py report --results "$JSONL" \
    --out-md "$OUT/bert_f32.md" --out-json "$OUT/bert_f32.json" --meta "$META"
