#!/usr/bin/env bash
# Fleet-scale tuning on Slurm: one job array, one shard of the workload list per task, then
# merge + verify + export of one hardware fingerprint's bundle. See --help.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/slurm-tune.sh WORKLOADS --shards N --out BUNDLE [OPTIONS]

Tunes a workload list on one hardware type of a Slurm cluster as a job array (sbatch --array,
one exclusive node per task so measurements never share cores), waits for it, checks that
every shard ran on the same hardware fingerprint, merges the shard databases with
`autokernel db merge`, checks the result with `autokernel db verify`, and exports the bundle
of that fingerprint (`autokernel db export`) to ship to the inference hosts
(`autokernel db import BUNDLE` there).

Each task runs `autokernel tune`, which reads SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT
and tunes its deterministic share of the list (balanced by estimated cost) into its own
database, WORKDIR/tuning.shard-I-of-N.db. Tasks are submitted with --requeue: a preempted
and requeued task resumes from its database. Re-running this script with the same --workdir
resubmits the array and every shard resumes where it stopped (finished shards measure
nothing new); --merge-only merges what a finished job left without submitting anything.

WORKLOADS (one or more of):
  --workloads FILE     workload list: one per line (gemm:MxNxK, ...), '#' starts a comment
  --workload W         one workload (repeat for several)
  --model NAME|DIR     every kernel call of a model's forward pass at each --batch × --seq,
                       as `autokernel infer` and the Python drop-in make them (the fused QKV
                       projection, attention, the output projection, FFN up with its GELU and
                       FFN down, biases fused): bert-base, bert-large, or a Hugging Face BERT
                       directory (listed by `autokernel tune --model ... --dry-run`; with
                       `--tune-arg --precision --tune-arg f32,int8` each in those types)
  --batch B,..         batch sizes for --model (default: 1,2,4,8, as `autokernel infer`'s)
  --seq S,..           sequence lengths for --model (default: 32,64,128; at most the model's
                       positions, 512 for BERT)
  --tokens M           the same as --batch 1 --seq M (older scripts: it used to give plain
                       GEMM shapes of M rows)

Required:
  --shards N           array tasks (1 to the number of workloads)
  --out BUNDLE         the bundle to write (must not exist)

Where to run (select ONE hardware type; a shard that lands elsewhere is caught at merge):
  --partition P        sbatch --partition
  --constraint C       sbatch --constraint (node features, e.g. "icelake&avx512")
  --time LIMIT         sbatch --time per task (default: the partition's)
  --sbatch-arg ARG     any other sbatch argument, e.g. --sbatch-arg=--account=ml (repeatable)

Tuning (passed to every `autokernel tune`):
  --budget N           distinct configs per workload (default: 32)
  --strategy S         search strategy (default: autokernel's)
  --seed S             seed (default: 0)
  --threads T          threads to tune for (part of the fingerprint; default: all of the node)
  --tune-arg ARG       any other tune argument, e.g. --tune-arg=--kernel=gemm_packed (repeatable)

Job:
  --workdir DIR        shard databases, logs, merged database; must be on a filesystem the
                       compute nodes see (default: ./slurm-tune-<UTC time>)
  --fingerprint ID     require every shard to have run on this fingerprint (default: all
                       shards must simply agree)
  --merge-only         do not submit: merge, verify and export what WORKDIR holds
  --poll SECONDS       how often to ask squeue (default: 10)
  -h, --help           this help

Environment:
  AUTOKERNEL=path      the autokernel binary (default: target/release/autokernel of this
                       repository, built with cargo when missing). It is copied into
                       WORKDIR/bin so every task of the job runs the same build.
  SLURM_CONF           as for any Slurm command.

Exit status: 0 bundle written and verified; 1 a task failed, shards on different hardware,
or verification failed; 2 usage or setup error.

Example:
  scripts/slurm-tune.sh --model bert-base --partition icelake --shards 8 \
      --budget 64 --out bundles/bert-icelake.db --workdir /shared/tune/bert-icelake
EOF
}

die() { echo "slurm-tune.sh: error: $*" >&2; exit 2; }
fail() { echo "slurm-tune.sh: FAILED: $*" >&2; exit 1; }
say() { echo "slurm-tune.sh: $*" >&2; }

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
list_files=()
workloads=()
model=""
tokens=""
model_batch=""
model_seq=""
shards=""
out=""
partition=""
constraint=""
time_limit=""
sbatch_extra=()
budget=32
strategy=""
seed=0
threads=""
tune_extra=()
workdir=""
want_fp=""
merge_only=0
poll=10

need() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value (see --help)"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --*=*) opt="${1%%=*}"; val="${1#*=}"; shift; set -- "$opt" "$val" "$@"; continue ;;
        --workloads) need "$@"; list_files+=("$2"); shift 2 ;;
        --workload) need "$@"; workloads+=("$2"); shift 2 ;;
        --model) need "$@"; model="$2"; shift 2 ;;
        --tokens) need "$@"; tokens="$2"; shift 2 ;;
        --batch) need "$@"; model_batch="$2"; shift 2 ;;
        --seq) need "$@"; model_seq="$2"; shift 2 ;;
        --shards) need "$@"; shards="$2"; shift 2 ;;
        --out) need "$@"; out="$2"; shift 2 ;;
        --partition) need "$@"; partition="$2"; shift 2 ;;
        --constraint) need "$@"; constraint="$2"; shift 2 ;;
        --time) need "$@"; time_limit="$2"; shift 2 ;;
        --sbatch-arg) need "$@"; sbatch_extra+=("$2"); shift 2 ;;
        --budget) need "$@"; budget="$2"; shift 2 ;;
        --strategy) need "$@"; strategy="$2"; shift 2 ;;
        --seed) need "$@"; seed="$2"; shift 2 ;;
        --threads) need "$@"; threads="$2"; shift 2 ;;
        --tune-arg) need "$@"; tune_extra+=("$2"); shift 2 ;;
        --workdir) need "$@"; workdir="$2"; shift 2 ;;
        --fingerprint) need "$@"; want_fp="$2"; shift 2 ;;
        --merge-only) merge_only=1; shift ;;
        --poll) need "$@"; poll="$2"; shift 2 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done

is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }
positive() { [[ "$1" =~ ^[0-9]+$ && "$1" -ge 1 ]] || die "$2 must be a positive integer, not '$1'"; }
if [[ -z "$shards" && $merge_only -eq 1 && -n "$workdir" && -f "$workdir/shards" ]]; then
    shards="$(cat "$workdir/shards")"
fi
[[ -n "$shards" ]] || die "--shards N is required"
positive "$shards" --shards
[[ -n "$out" ]] || die "--out BUNDLE is required"
[[ ! -e "$out" ]] || die "the bundle $out already exists (export never overwrites; pick another --out)"
positive "$budget" --budget
is_uint "$seed" || die "--seed must be a non-negative integer, not '$seed'"
positive "$poll" --poll
if [[ -n "$tokens" ]]; then
    positive "$tokens" --tokens
    [[ -z "$model_batch$model_seq" ]] || die "--tokens M is --batch 1 --seq M: give one or the other"
    model_batch=1
    model_seq="$tokens"
fi
[[ -n "$model" || -z "$model_batch$model_seq" ]] || die "--batch, --seq and --tokens go with --model"
[[ -z "$threads" ]] || positive "$threads" --threads

if [[ $merge_only -eq 0 ]]; then
    for cmd in sbatch squeue; do
        command -v "$cmd" >/dev/null 2>&1 || die "$cmd not found: run this on a Slurm submit host (or use --merge-only)"
    done
fi

# ---- the binary, frozen for the whole job -------------------------------------------------
if [[ -n "${AUTOKERNEL:-}" ]]; then
    src_ak="$AUTOKERNEL"
else
    src_ak="$root/target/release/autokernel"
    if [[ ! -x "$src_ak" ]]; then
        say "building $src_ak"
        (cd "$root" && cargo build --release -q --bin autokernel) || die "building autokernel failed"
    fi
fi
[[ -x "$src_ak" ]] || die "autokernel binary $src_ak not found or not executable"

[[ -n "$workdir" ]] || workdir="slurm-tune-$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$workdir"/{bin,logs,done,merge} || die "cannot create $workdir"
workdir="$(cd "$workdir" && pwd)"
ak="$workdir/bin/autokernel"
if [[ $merge_only -eq 0 ]]; then
    # A fresh copy each submission (a requeued task picks it up); not over a running binary.
    { cp "$src_ak" "$ak.new" && mv -f "$ak.new" "$ak"; } || die "cannot copy $src_ak into $workdir/bin"
elif [[ ! -x "$ak" ]]; then
    cp "$src_ak" "$ak" || die "cannot copy $src_ak into $workdir/bin"
fi

# ---- the workload list ---------------------------------------------------------------------
# The workloads of a `tune --dry-run --json` plan ($1), one per line.
plan_workloads() {
    sed -n 's/.*"workloads":\[\([^]]*\)\].*/\1/p' <<<"$1" | tr ',' '\n' | tr -d '"' | sed '/^$/d'
}

model_shapes() {
    # What the model's forward pass calls, in f32 (--precision, passed to every tune below,
    # adds the other element types): autokernel's own list, so the bundle holds what
    # `autokernel infer` and the drop-in look up.
    local plan
    local shape=()
    [[ -z "$model_batch" ]] || shape+=(--batch "$model_batch")
    [[ -z "$model_seq" ]] || shape+=(--seq "$model_seq")
    plan="$("$ak" tune --model "$1" "${shape[@]}" --db "$workdir/.model-plan.db" --dry-run \
        --json)" || die "autokernel cannot list --model '$1'"
    plan_workloads "$plan"
}

list="$workdir/workloads.txt.new"
{
    echo "# workloads of this job (written by scripts/slurm-tune.sh)"
    for f in "${list_files[@]}"; do
        [[ -r "$f" ]] || die "workload list $f not found"
        cat "$f"; echo
    done
    for w in "${workloads[@]}"; do echo "$w"; done
    [[ -z "$model" ]] || model_shapes "$model"
} > "$list"
if [[ ${#list_files[@]} -eq 0 && ${#workloads[@]} -eq 0 && -z "$model" ]]; then
    if [[ $merge_only -eq 1 && -f "$workdir/workloads.txt" ]]; then
        cp "$workdir/workloads.txt" "$list"
    else
        die "no workloads: give --workloads FILE, --workload W or --model NAME"
    fi
fi

tune_args=(--budget "$budget" --seed "$seed")
[[ -z "$strategy" ]] || tune_args+=(--strategy "$strategy")
[[ -z "$threads" ]] || tune_args+=(--threads "$threads")
tune_args+=("${tune_extra[@]}")

# The canonical list, parsed by autokernel itself (bad lines fail here, not on the cluster).
plan="$("$ak" tune --workloads-from "$list" --shard 0/1 --db "$workdir/tuning.db" \
    "${tune_args[@]}" --dry-run --json)" || die "autokernel rejected the workload list or tune options"
keys="$(plan_workloads "$plan")"
n_workloads="$(grep -c . <<<"$keys" || true)"
((n_workloads >= 1)) || die "the workload list is empty"
((shards <= n_workloads)) || die "--shards $shards is more than the $n_workloads workload(s): some shards would have nothing to do"
{ echo "# workloads of this job (canonical, written by scripts/slurm-tune.sh)"; echo "$keys"; } > "$list"

# One workdir = one job: the same list, shard count and tune options, or shards would mix.
job_desc="$(printf '%s\n' "shards=$shards" "${tune_args[@]}" | cat - "$list" | cksum)"
if [[ -f "$workdir/job.id" && $merge_only -eq 0 ]]; then
    [[ "$(cat "$workdir/job.id")" == "$job_desc" ]] ||
        die "$workdir holds a job with another workload list, shard count or tune options; use a new --workdir"
elif [[ -f "$workdir/shards" && "$(cat "$workdir/shards")" != "$shards" ]]; then
    die "$workdir holds a job of $(cat "$workdir/shards") shard(s), not $shards"
elif [[ $merge_only -eq 0 ]]; then
    echo "$job_desc" > "$workdir/job.id"
    echo "$shards" > "$workdir/shards"
fi
mv -f "$list" "$workdir/workloads.txt"
list="$workdir/workloads.txt"
db_base="$workdir/tuning.db"
shard_db() { echo "$workdir/tuning.shard-$1-of-$shards.db"; }

say "$n_workloads workload(s) in $shards shard(s), workdir $workdir"
for ((i = 0; i < shards; i++)); do
    shard_plan="$("$ak" tune --workloads-from "$list" --shard "$i/$shards" --db "$db_base" \
        "${tune_args[@]}" --dry-run)" || die "planning shard $i failed"
    say "  ${shard_plan%%$'\n'*}"
done

# ---- submit and wait -----------------------------------------------------------------------
if [[ $merge_only -eq 0 ]]; then
    batch="$workdir/shard.sbatch"
    {
        echo '#!/usr/bin/env bash'
        echo '# Generated by scripts/slurm-tune.sh: one array task = one shard. autokernel reads'
        echo '# SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT itself and tunes its share into'
        echo '# tuning.shard-I-of-N.db; a requeued task resumes from that database.'
        echo 'set -euo pipefail'
        printf 'workdir=%q\n' "$workdir"
        printf 'tune_args=(%s)\n' "$(printf '%q ' "${tune_args[@]}")"
        # shellcheck disable=SC2016
        cat <<'EOS'
task="${SLURM_ARRAY_TASK_ID:?not a Slurm array task}"
ak="$workdir/bin/autokernel"
rm -f "$workdir/done/task-$task"
echo "task $task on $(hostname) at $(date -u +%FT%TZ), ${SLURM_CPUS_ON_NODE:-?} CPUs" >&2
"$ak" tune --workloads-from "$workdir/workloads.txt" --db "$workdir/tuning.db" "${tune_args[@]}" \
    --dry-run --json > "$workdir/logs/plan-$task.json"
"$ak" tune --workloads-from "$workdir/workloads.txt" --db "$workdir/tuning.db" "${tune_args[@]}" \
    --json > "$workdir/logs/tune-$task.jsonl"
echo "$(hostname) $(date -u +%FT%TZ)" > "$workdir/done/task-$task"
EOS
    } > "$batch"
    chmod +x "$batch"

    sbatch_args=(--parsable --job-name "autokernel-tune" --array "0-$((shards - 1))"
        --exclusive --requeue --chdir "$workdir"
        --output "$workdir/logs/task-%a.out" --error "$workdir/logs/task-%a.err")
    [[ -z "$partition" ]] || sbatch_args+=(--partition "$partition")
    [[ -z "$constraint" ]] || sbatch_args+=(--constraint "$constraint")
    [[ -z "$time_limit" ]] || sbatch_args+=(--time "$time_limit")
    sbatch_args+=("${sbatch_extra[@]}")
    jobid="$(sbatch "${sbatch_args[@]}" "$batch")" || fail "sbatch refused the job (sbatch ${sbatch_args[*]})"
    jobid="${jobid%%;*}"
    echo "$jobid" >> "$workdir/jobs"
    say "submitted array job $jobid (${shards} task(s)); waiting (cancel with: scancel $jobid)"
    trap 'say "interrupted: job $jobid keeps running; when it ends, finish with: $0 --merge-only --workdir $workdir --out $out"; exit 130' INT TERM

    last="" misses=0
    while :; do
        if ! states="$(squeue -h -j "$jobid" -o '%T' 2>"$workdir/logs/squeue.err")"; then
            # Gone from the controller's memory (MinJobAge passed), or a hiccup: retry.
            ! grep -qi 'invalid job id' "$workdir/logs/squeue.err" || break
            misses=$((misses + 1))
            ((misses < 10)) || fail "squeue keeps failing: $(cat "$workdir/logs/squeue.err")"
            sleep "$poll"; continue
        fi
        misses=0
        [[ -n "$states" ]] || break
        now="$(sort <<<"$states" | uniq -c | awk '{printf "%s%d %s", (NR>1?", ":""), $1, tolower($2)}')"
        [[ "$now" == "$last" ]] || say "job $jobid: $now"
        last="$now"
        sleep "$poll"
    done
    trap - INT TERM
    say "job $jobid left the queue"
fi

# ---- every shard finished? -----------------------------------------------------------------
missing=()
for _ in 1 2 3 4 5 6; do  # shared filesystems may show the last files a few seconds late
    missing=()
    for ((i = 0; i < shards; i++)); do
        [[ -f "$workdir/done/task-$i" && -f "$(shard_db "$i")" ]] || missing+=("$i")
    done
    [[ ${#missing[@]} -gt 0 && $merge_only -eq 0 ]] || break
    sleep 5
done
if [[ ${#missing[@]} -gt 0 ]]; then
    for i in "${missing[@]}"; do
        say "shard $i/$shards did not finish; last lines of $workdir/logs/task-$i.err:"
        tail -n 5 "$workdir/logs/task-$i.err" 2>/dev/null | sed 's/^/    /' >&2 || true
    done
    fail "shard(s) ${missing[*]} of $shards did not finish; re-run the same command (same --workdir) to resume them"
fi

# Every listed workload tuned by exactly one shard, with a verified best.
declare -A tuned_by=()
for ((i = 0; i < shards; i++)); do
    log="$workdir/logs/tune-$i.jsonl"
    [[ -f "$log" ]] || fail "shard $i finished but its log $log is missing"
    while IFS= read -r line; do
        w="$(sed -n 's/.*"workload":"\([^"]*\)".*/\1/p' <<<"$line")"
        [[ -n "$w" ]] || continue
        [[ -z "${tuned_by[$w]:-}" ]] || fail "$w was tuned by shard ${tuned_by[$w]} and shard $i"
        tuned_by[$w]="$i"
        grep -q '"kernel":"' <<<"$line" || fail "$w (shard $i): no verified config (see $log)"
    done < "$log"
done
while IFS= read -r w; do
    [[ -n "${tuned_by[$w]:-}" ]] || fail "$w was tuned by no shard"
done <<<"$keys"
((${#tuned_by[@]} == n_workloads)) || fail "the shards tuned ${#tuned_by[@]} workloads, the list has $n_workloads"

# ---- same hardware everywhere --------------------------------------------------------------
# A string / number field of a one-line JSON object (no nesting needed here).
json_str() { sed -n "s/.*\"$2\":\"\([^\"]*\)\".*/\1/p" <<<"$1" | head -n 1; }
json_num() { sed -n "s/.*\"$2\":\([0-9][0-9]*\).*/\1/p" <<<"$1" | head -n 1; }
# The fingerprints a database holds, from `db stats --json`: "ID<TAB>BRAND, T threads" lines.
fingerprints_of() {
    local stats obj
    stats="$("$ak" db stats --db "$1" --json)" || return 1
    sed -n 's/.*"fingerprints_detail":\[\([^]]*\)\].*/\1/p' <<<"$stats" | sed 's/},{/}\n{/g' |
        while IFS= read -r obj; do
            [[ -n "$obj" ]] || continue
            printf '%s\t%s, %s threads\n' "$(json_str "$obj" id)" "$(json_str "$obj" brand)" \
                "$(json_num "$obj" cores)"
        done
}
declare -A shards_of=() label=()
for ((i = 0; i < shards; i++)); do
    fps="$(fingerprints_of "$(shard_db "$i")")" || fail "cannot read $(shard_db "$i")"
    [[ -n "$fps" ]] || fail "shard $i: no fingerprint in $(shard_db "$i")"
    if [[ "$(grep -c . <<<"$fps")" -gt 1 ]]; then
        fail "shard $i holds trials of several fingerprints (requeued onto other hardware?): $(tr '\t' ' ' <<<"$fps" | paste -sd ';' -); remove $(shard_db "$i") and re-run"
    fi
    id="${fps%%$'\t'*}"
    label[$id]="${fps#*$'\t'}"
    shards_of[$id]="${shards_of[$id]:-}${shards_of[$id]:+,}$i"
done
if [[ ${#shards_of[@]} -gt 1 || (-n "$want_fp" && -z "${shards_of[$want_fp]:-}") ]]; then
    say "the shards ran on different hardware fingerprints (a task scheduled on other hardware):"
    for id in "${!shards_of[@]}"; do
        say "  shard(s) ${shards_of[$id]}: fingerprint $id (${label[$id]})"
    done
    [[ -z "$want_fp" ]] || say "  expected: fingerprint $want_fp (--fingerprint)"
    fail "refusing to merge shards of different fingerprints; select one hardware type with --partition/--constraint (and --threads), remove the odd shards' databases and re-run"
fi
fp="${!shards_of[*]}"
say "all $shards shard(s) ran on fingerprint $fp (${label[$fp]})"

# ---- merge, verify, export -----------------------------------------------------------------
merged="$workdir/merged.db"
rm -f "$merged" "$merged-wal" "$merged-shm" "$workdir"/merge/*
if ((shards == 1)); then
    "$ak" db import "$(shard_db 0)" --db "$merged" > "$workdir/logs/merge.log" ||
        fail "importing the single shard failed (see $workdir/logs/merge.log)"
else
    acc="$(shard_db 0)"
    for ((i = 1; i < shards; i++)); do
        next="$workdir/merge/step-$i.db"
        ((i < shards - 1)) || next="$merged"
        "$ak" db merge "$acc" "$(shard_db "$i")" --out "$next" >> "$workdir/logs/merge.log" ||
            fail "db merge of shard $i failed (see $workdir/logs/merge.log)"
        acc="$next"
    done
    rm -f "$workdir"/merge/*
fi
say "merged: $(grep '^merged\|^imported' "$workdir/logs/merge.log" | tail -n 1)"
"$ak" db verify "$merged" >&2 || fail "db verify failed on the merged database $merged"

merged_stats="$("$ak" db stats --db "$merged" --json)"
# shellcheck disable=SC2001  # a regex with brackets, clearer in sed
totals="$(sed 's/"fingerprints_detail":\[[^]]*\]//' <<<"$merged_stats")" # drop the per-fingerprint counts
merged_workloads="$(json_num "$totals" workloads)"
[[ "$merged_workloads" == "$n_workloads" ]] ||
    fail "the merged database holds $merged_workloads workload(s), the list $n_workloads"

mkdir -p "$(dirname "$out")"
"$ak" db export --db "$merged" --out "$out" --fingerprint "$fp" >&2 || fail "db export failed"
"$ak" db verify "$out" >&2 || fail "db verify failed on the bundle $out"
say "bundle $out: fingerprint $fp, $n_workloads workload(s) from $shards shard(s); ship it and run 'autokernel db import $(basename "$out")' on the inference hosts"
echo "$out"
