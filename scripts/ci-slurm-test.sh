#!/usr/bin/env bash
# CI test of fleet tuning on a real Slurm cluster: a single-node cluster on this machine,
# scripts/slurm-tune.sh with 2 shards on 4 small workloads and bert-tiny's calls, the merged bundle checked. See --help.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/ci-slurm-test.sh [OPTIONS]

Starts a single-node Slurm cluster on this machine and tunes through it:

 1. installs slurm-wlm and munge from Debian if slurmctld / munged are missing (needs root
    and apt; service start-up during the install is suppressed);
 2. starts munged, slurmctld and slurmd with their key, sockets, configuration, state and
    logs in a temporary directory, talking over loopback ports only, the node being this
    machine (CPUs and memory from `slurmd -C`);
 3. runs scripts/slurm-tune.sh: 4 small workloads and `--model bert-tiny`'s calls at 1 × 8,
    2 shards (an array job of 2 exclusive tasks), merge, verify, export;
 4. checks the bundle: `db verify` passes and `lookup` finds an exact, verified winner for
    every workload, and `infer --model bert-tiny` serves every call from it exactly; that the two shard databases hold disjoint halves of the list; that a
    second run of the same job resumes (measures nothing new); and that a shard tuned on
    another fingerprint is refused at merge, by name;
 5. stops the daemons it started, by pid (also on failure or Ctrl-C), and removes the
    directory unless --keep.

Options:
  --keep        keep the temporary directory (configuration, logs, databases)
  -h, --help    this help

Environment: AUTOKERNEL=path/to/autokernel uses that binary; default: target/debug/autokernel,
built with cargo (a no-op after `cargo test`).
EOF
}

keep=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --keep) keep=1; shift ;;
        *) echo "error: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
t0=$SECONDS
log() { echo "ci-slurm-test [$((SECONDS - t0))s]: $*" >&2; }
die() { echo "ci-slurm-test: FAILED: $*" >&2; exit 1; }

# ---- 1. packages ---------------------------------------------------------------------------
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null ||
    ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
    [[ $EUID -eq 0 ]] || die "slurm-wlm and munge are not installed and this is not root"
    log "installing slurm-wlm and munge"
    # No service may start during the install (no systemd here; our daemons are our own).
    own_policy=0
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        own_policy=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt_log="$(mktemp)"
    if ! { apt-get install -y -q --no-install-recommends slurm-wlm munge >"$apt_log" 2>&1 ||
        { apt-get update -q >>"$apt_log" 2>&1 &&
            apt-get install -y -q --no-install-recommends slurm-wlm munge >>"$apt_log" 2>&1; }; }; then
        tail -n 30 "$apt_log" >&2
        [[ $own_policy -eq 0 ]] || rm -f /usr/sbin/policy-rc.d
        die "apt-get install slurm-wlm munge failed"
    fi
    rm -f "$apt_log"
    [[ $own_policy -eq 0 ]] || rm -f /usr/sbin/policy-rc.d
fi
log "$(slurmctld -V), munge $(munged -V 2>&1 | awk '{print $2; exit}')"

# The binary (before any daemon starts: a build can take minutes).
if [[ -n "${AUTOKERNEL:-}" ]]; then
    ak="$AUTOKERNEL"
else
    log "building autokernel (debug)"
    (cd "$root" && cargo build -q --bin autokernel) || die "building autokernel failed"
    ak="$root/target/debug/autokernel"
fi
[[ -x "$ak" ]] || die "autokernel binary $ak not found"
export AUTOKERNEL="$ak"

# ---- 2. the cluster ------------------------------------------------------------------------
tmp="$(mktemp -d /tmp/autokernel-slurm.XXXXXX)"
chmod 700 "$tmp"
pids=()
cleanup() {
    local rc=$?
    set +e
    if [[ -f "$tmp/slurm.conf" ]] && [[ ${#pids[@]} -gt 0 ]]; then
        SLURM_CONF="$tmp/slurm.conf" scancel --quiet --user root >/dev/null 2>&1
        sleep 1
    fi
    # Reverse start order: slurmd, slurmctld, munged.
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
        kill -TERM "${pids[$i]}" 2>/dev/null
    done
    for pid in "${pids[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    if [[ $rc -ne 0 ]]; then
        for f in "$tmp"/log/*.log "$tmp"/work/logs/task-*.err; do
            [[ -s "$f" ]] || continue
            echo "---- $f (last 25 lines)" >&2
            tail -n 25 "$f" >&2
        done
    fi
    if [[ $keep -eq 1 || $rc -ne 0 ]]; then
        echo "ci-slurm-test: kept $tmp" >&2
    else
        rm -rf "$tmp"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -p "$tmp"/{munge,state,spool,log,run}
chmod 700 "$tmp"/munge

# munged: its own key, socket, pid, seed and log, all in $tmp.
dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$tmp/munge/munge.key"
sock="$tmp/munge/munge.socket"
munged --foreground --force --key-file="$tmp/munge/munge.key" --socket="$sock" \
    --pid-file="$tmp/munge/munged.pid" --seed-file="$tmp/munge/munged.seed" \
    --log-file="$tmp/log/munged.log" --num-threads=2 2>>"$tmp/log/munged.log" &
pids+=($!)
for _ in $(seq 50); do [[ -S "$sock" ]] && break; sleep 0.1; done
[[ -S "$sock" ]] || die "munged did not create its socket"
munge --socket="$sock" -n </dev/null | unmunge --socket="$sock" >/dev/null || die "munge round trip failed"

# Two free loopback ports (nothing answers a connect).
free_port() {
    local p
    for _ in $(seq 200); do
        p=$((20000 + RANDOM % 40000))
        (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return 0; }
    done
    return 1
}
ctld_port="$(free_port)" || die "no free port"
slurmd_port="$(free_port)" || die "no free port"
[[ "$ctld_port" != "$slurmd_port" ]] || slurmd_port=$((ctld_port + 1))

# The node as slurmd sees this machine (CPUs, sockets, cores, threads, memory).
hw_line="$(slurmd -C | head -n 1 | sed 's/^NodeName=[^ ]* //; s/RealMemory=\([0-9]*\)/RealMemory=\1/')"
cpus="$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$hw_line")"
cat > "$tmp/slurm.conf" <<EOF
# Single-node test cluster of scripts/ci-slurm-test.sh: loopback only, state in $tmp.
ClusterName=autokernel-ci
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$sock
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/run/slurmctld.pid
SlurmdPidFile=$tmp/run/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=300
SlurmdTimeout=60
NodeName=localhost NodeAddr=127.0.0.1 NodeHostname=localhost $hw_line State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$tmp/slurm.conf"

slurmctld -D -i -f "$SLURM_CONF" >>"$tmp/log/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -N localhost -f "$SLURM_CONF" >>"$tmp/log/slurmd.out" 2>&1 &
pids+=($!)
state=""
for _ in $(seq 120); do
    state="$(sinfo -h -n localhost -o '%T' 2>/dev/null || true)"
    [[ "$state" == "idle" ]] && break
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null || die "a daemon exited (pid $pid)"; done
    sleep 0.5
done
[[ "$state" == "idle" ]] || die "the node did not become idle (state '$state')"
log "cluster up: node localhost ($cpus CPUs) idle, slurmctld :$ctld_port, slurmd :$slurmd_port (127.0.0.1)"
if command -v ss >/dev/null; then
    listening="$(ss -Hltn | awk -v a=":$ctld_port" -v b=":$slurmd_port" '$4 ~ a"$" || $4 ~ b"$" {print $4}')"
    if grep -qv '^127\.0\.0\.1:' <<<"$listening"; then
        die "a daemon listens beyond loopback: $(paste -sd ' ' - <<<"$listening")"
    fi
fi

# ---- 3. tune through Slurm -----------------------------------------------------------------
workloads=(gemm:16x16x16 gemm:32x24x16 gemm:1x64x32 gemm:24x8x40)
wl_args=()
for w in "${workloads[@]}"; do wl_args+=(--workload "$w"); done
# Plus every call of bert-tiny's forward pass at 1 × 8 (--model: slurm-tune.sh asks autokernel).
plan="$("$ak" tune --model bert-tiny --batch 1 --seq 8 --dry-run --json --db "$tmp/plan.db")" ||
    die "autokernel could not list bert-tiny's workloads"
mapfile -t model_workloads < <(python3 -c \
    'import json, sys; print("\n".join(json.load(sys.stdin)["workloads"]))' <<<"$plan")
[[ ${#model_workloads[@]} -ge 4 ]] || die "bert-tiny lists ${#model_workloads[@]} workloads"
job=(--shards 2 --budget 3 --strategy random --seed 1 --workdir "$tmp/work" --poll 1
    --tune-arg=--finalists=2 "${wl_args[@]}" --model bert-tiny --batch 1 --seq 8)
workloads+=("${model_workloads[@]}")
log "slurm-tune.sh: ${#workloads[@]} workloads (${#model_workloads[@]} of them bert-tiny's), 2 shards"
"$root/scripts/slurm-tune.sh" "${job[@]}" --out "$tmp/bundle.db" >"$tmp/run1.out" 2>&1 ||
    { cat "$tmp/run1.out" >&2; die "slurm-tune.sh failed"; }
sed 's/^/    /' "$tmp/run1.out" >&2

# ---- 4. checks -----------------------------------------------------------------------------
"$ak" db verify "$tmp/bundle.db" >/dev/null || die "db verify failed on the bundle"
for w in "${workloads[@]}"; do
    got="$("$ak" lookup --db "$tmp/bundle.db" --workload "$w" --json)"
    grep -q '"level":"exact"' <<<"$got" || die "$w: no exact winner in the bundle: $got"
done
log "bundle verified; lookup finds an exact winner for all ${#workloads[@]} workloads"
# What inference looks up is what the job tuned: every call of the model served exactly.
calls="$("$ak" infer --model bert-tiny --db "$tmp/bundle.db" --batch 1 --seq 8 --iters 1 \
    --no-untuned --json)" || die "infer on the bundle failed"
python3 -c 'import json, sys
c = json.loads(sys.stdin.readline())["calls"]
sys.exit(c["exact"] == 0 or c["default"] + c["same_arch"] + c["nearest_shape"] > 0)' <<<"$calls" ||
    die "bert-tiny's calls are not all served by exact records of the bundle: $calls"
log "infer --model bert-tiny on the bundle: every call exact"

# The shards hold disjoint parts of the list, together all of it.
declare -A owner=()
for i in 0 1; do
    db="$tmp/work/tuning.shard-$i-of-2.db"
    [[ -f "$db" ]] || die "missing shard database $db"
    for w in "${workloads[@]}"; do
        if "$ak" lookup --db "$db" --workload "$w" --json | grep -q '"level":"exact"'; then
            [[ -z "${owner[$w]:-}" ]] || die "$w tuned by shard ${owner[$w]} and shard $i"
            owner[$w]=$i
        fi
    done
done
[[ ${#owner[@]} -eq ${#workloads[@]} ]] || die "only ${#owner[@]} workloads were tuned by a shard"
log "shard databases: disjoint, together every workload"

# Re-running the same job resumes: every shard measures nothing new.
"$root/scripts/slurm-tune.sh" "${job[@]}" --out "$tmp/bundle2.db" >"$tmp/run2.out" 2>&1 ||
    { cat "$tmp/run2.out" >&2; die "the second slurm-tune.sh run failed"; }
new=0
while IFS= read -r n; do
    new=$((new + n))
done < <(cat "$tmp"/work/logs/tune-*.jsonl | grep -o '"measured_now":[0-9]*' | cut -d: -f2)
seen="$(cat "$tmp"/work/logs/tune-*.jsonl | grep -c '"measured_now":')"
[[ "$seen" == "${#workloads[@]}" ]] || die "the re-run reported $seen workloads, not ${#workloads[@]}"
[[ "$new" == "0" ]] || die "the re-run measured $new new configs instead of resuming"
log "re-run resumed: 0 new measurements, bundle written again"

# A shard tuned on another fingerprint (here: another thread count) is refused, by name.
if ((cpus >= 2)); then
    odd="$tmp/work/tuning.shard-1-of-2.db"
    rm -f "$odd"
    "$ak" tune --threads 1 --shard 1/2 --db "$tmp/work/tuning.db" --workloads-from "$tmp/work/workloads.txt" \
        --budget 1 --finalists 0 --isolation none --json >/dev/null
    if "$root/scripts/slurm-tune.sh" --merge-only --workdir "$tmp/work" --out "$tmp/bundle3.db" \
        >"$tmp/run3.out" 2>&1; then
        die "shards of different fingerprints were merged"
    fi
    if ! { grep -q "shard(s) 1: fingerprint" "$tmp/run3.out" && grep -q "refusing to merge" "$tmp/run3.out"; }; then
        cat "$tmp/run3.out" >&2
        die "the fingerprint mismatch was not reported by shard"
    fi
    [[ ! -e "$tmp/bundle3.db" ]] || die "a bundle was written despite the mismatch"
    log "a shard on another fingerprint is refused: $(grep 'shard(s) 1:' "$tmp/run3.out" | sed 's/^slurm-tune.sh: *//')"
fi

log "passed"
