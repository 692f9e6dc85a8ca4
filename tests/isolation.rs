//! Crash-proof tuning end to end: `autokernel tune` over the test-only `planted_faults`
//! family, whose configs segfault, abort, execute an illegal instruction, hang, allocate
//! without bound, panic or compute a wrong result. The job must finish, record each fault
//! with the right status, quarantine the crashers, and pick a healthy winner.
//!
//! `cargo test` builds the binary with the `planted-faults` feature (the root package's
//! dev-dependency on `kernels` enables it); the family is registered only in processes started
//! with `AUTOKERNEL_PLANTED_FAULTS=1`, which the tuner's worker processes inherit.

use std::collections::HashMap;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use kernels::{Config, Status};
use serde_json::Value;
use tuning_db::TuningDb;

mod common;
use common::{json_lines, stderr};

/// `autokernel ARGS`, with the planted faulty family registered or not.
fn autokernel(args: &[&str], planted: bool) -> Output {
    const VAR: &str = "AUTOKERNEL_PLANTED_FAULTS";
    if planted {
        common::autokernel_env(args, &[(VAR, "1")], &[])
    } else {
        common::autokernel_env(args, &[], &[VAR])
    }
}

const WORKLOAD: &str = "gemm:16x12x8";

fn tune_planted(db: &str, extra: &[&str]) -> (Value, Duration) {
    let mut args = vec![
        "tune",
        "--workload",
        WORKLOAD,
        "--db",
        db,
        "--kernel",
        "planted_faults",
        // Generous enough for the oom config to reach its limit on a loaded 2-core machine.
        "--timeout-s",
        "3",
        "--mem-limit-mb",
        "256",
        "--json",
    ];
    args.extend_from_slice(extra);
    let t = Instant::now();
    let o = autokernel(&args, true);
    let took = t.elapsed();
    assert!(o.status.success(), "tune failed: {}", stderr(&o));
    let lines = json_lines(&o);
    assert_eq!(lines.len(), 1, "{lines:?}");
    (lines[0].clone(), took)
}

/// Status of every planted config in the database, by fault name, with the number of rows.
fn planted_statuses(db: &Path, fingerprint: &str) -> HashMap<String, (Status, usize)> {
    let db = TuningDb::open_read_only(db).unwrap();
    let mut out: HashMap<String, (Status, usize)> = HashMap::new();
    for r in db
        .trials(fingerprint, &WORKLOAD.parse().unwrap())
        .unwrap()
        .into_iter()
        .filter(|r| r.kernel == "planted_faults")
    {
        let fault = r.config.str("fault").unwrap().to_string();
        let e = out.entry(fault).or_insert((r.status, 0));
        assert_eq!(e.0, r.status, "one status per config");
        e.1 += 1;
    }
    out
}

#[test]
fn planted_faults_are_recorded_quarantined_and_never_win() {
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("t.db");
    let db = db_path.to_str().unwrap();

    let (t, took) = tune_planted(db, &["--strategy", "exhaustive", "--budget", "50"]);
    let fp = t["fingerprint"].as_str().unwrap().to_string();
    let got = planted_statuses(&db_path, &fp);
    let want = [
        ("none", Status::Ok),
        ("slow", Status::Ok),
        ("wrong", Status::WrongResult),
        ("panic", Status::RunFailed),
        ("segfault", Status::Crashed),
        ("abort", Status::Crashed),
        ("illegal", Status::Crashed),
        ("hang", Status::Timeout),
        ("oom", Status::Oom),
    ];
    for (fault, status) in want {
        assert_eq!(got.get(fault), Some(&(status, 1)), "{fault}: {got:?}");
    }
    assert_eq!(got.len(), want.len());
    assert_eq!(t["isolation"], "process");
    assert_eq!(
        t["worker_restarts"], 5,
        "segfault, abort, illegal, hang, oom: {t}"
    );
    assert_eq!(t["quarantined"], 5);
    assert_eq!(t["timeout_s"], 3.0);
    assert_eq!(t["statuses"]["crashed"], 3);
    assert_eq!(t["statuses"]["timeout"], 1);
    assert_eq!(t["statuses"]["oom"], 1);
    assert_eq!(t["trials"], 10, "the nine planted configs and the default");
    assert_eq!(t["failures"], 7);

    // The winner is healthy: an ok record, never a planted fault.
    let db_r = TuningDb::open_read_only(&db_path).unwrap();
    let winner = db_r
        .trials(&fp, &WORKLOAD.parse().unwrap())
        .unwrap()
        .into_iter()
        .find(|r| {
            r.kernel == t["kernel"]
                && r.config == Config::from_json(&t["config"].to_string()).unwrap()
        })
        .expect("the reported winner is a trial");
    assert_eq!(winner.status, Status::Ok);
    if winner.kernel == "planted_faults" {
        assert!(["none", "slow"].contains(&winner.config.str("fault").unwrap()));
    }
    assert!(t["remeasured"].as_u64().unwrap() >= 2, "{t}");
    assert!(t["median_spread"].as_f64().unwrap() >= 0.0);
    assert!(!t["tie"].is_null() && !t["winner_reason"].is_null());
    assert!(took < Duration::from_secs(60), "took {took:?}");

    // Quarantine holds whatever proposes the crashers again: another strategy, another seed,
    // a bigger budget. Nothing planted is run again, so no worker dies.
    let (again, _) = tune_planted(
        db,
        &["--strategy", "random", "--seed", "9", "--budget", "80"],
    );
    assert_eq!(again["measured_now"], 0);
    assert_eq!(again["worker_restarts"], 0);
    assert_eq!(again["quarantined"], 5);
    assert_eq!(planted_statuses(&db_path, &fp), got, "no new rows");

    // --retry-failed measures the five again (they fail the same way: still quarantined,
    // each with a second row); the configs that never failed are not re-run.
    let (retried, _) = tune_planted(
        db,
        &[
            "--strategy",
            "exhaustive",
            "--budget",
            "50",
            "--retry-failed",
        ],
    );
    assert_eq!(retried["worker_restarts"], 5, "{retried}");
    assert_eq!(retried["quarantined"], 5);
    let after = planted_statuses(&db_path, &fp);
    for (fault, (status, rows)) in &got {
        let failed = matches!(status, Status::Crashed | Status::Timeout | Status::Oom);
        let want = rows + usize::from(failed);
        assert_eq!(
            after.get(fault),
            Some(&(*status, want)),
            "{fault}: {after:?}"
        );
    }
}

#[test]
fn in_process_tuning_and_pinned_workers_both_work() {
    let dir = tempfile::tempdir().unwrap();
    for (i, extra) in [
        &["--isolation", "none"][..],
        &["--pin", "--threads", "1"][..],
    ]
    .into_iter()
    .enumerate()
    {
        let db = dir.path().join(format!("t{i}.db"));
        let mut args = vec![
            "tune",
            "--workload",
            "gemm:20x16x12",
            "--db",
            db.to_str().unwrap(),
            "--budget",
            "4",
            "--json",
        ];
        args.extend_from_slice(extra);
        let o = autokernel(&args, false);
        assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
        let t = &json_lines(&o)[0];
        assert_eq!(t["trials"], 4, "{t}");
        assert_eq!(
            t["isolation"],
            if i == 0 { "none" } else { "process" },
            "{t}"
        );
        let remeasured = t["remeasured"].as_u64().unwrap();
        assert!((3..=4).contains(&remeasured), "{t}");
        assert_eq!(t["remeasure_rounds"], 31, "{t}");
        assert!(t["median_cv"].as_f64().is_some(), "{t}");
        if i == 0 {
            assert!(t["timeout_s"].is_null());
        } else {
            assert!(t["timeout_s"].as_f64().unwrap() >= 2.0);
        }
    }
}

#[test]
fn bad_isolation_flags_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let db = db.to_str().unwrap();
    for (args, needle) in [
        (vec!["--timeout-s", "0"], "--timeout-s"),
        (vec!["--timeout-s", "nan"], "--timeout-s"),
        (
            vec!["--isolation", "none", "--timeout-s", "2"],
            "--isolation process",
        ),
        (
            vec!["--isolation", "none", "--mem-limit-mb", "100"],
            "--isolation process",
        ),
        (vec!["--kernel", "nope"], "unknown kernel family 'nope'"),
        (vec!["--kernel", "planted_faults"], "unknown kernel family"),
    ] {
        let mut full = vec![
            "tune",
            "--workload",
            "gemm:8x8x8",
            "--db",
            db,
            "--budget",
            "2",
        ];
        full.extend_from_slice(&args);
        let o = autokernel(&full, false);
        let err = stderr(&o);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
    assert!(
        !Path::new(db).exists(),
        "no database is created for bad flags"
    );

    let help = autokernel(&["--help"], false);
    assert!(!String::from_utf8_lossy(&help.stdout).contains("worker"));
}

/// A workload whose test problem does not fit the worker's memory limit ends that workload,
/// not the job: the workloads around it are tuned (a fresh worker serves the next), nothing is
/// recorded for it, and the exit status is 1 (it had aborted the whole job with exit 2).
#[test]
fn a_workload_too_large_to_set_up_ends_itself_not_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("big.db");
    let db = db.to_str().unwrap();
    let big = "gemm:8192x8192x1"; // 256 MiB for B alone, with the limit at 256 MiB
    let args = [
        "tune",
        "--workload",
        "gemm:8x8x8",
        "--workload",
        big,
        "--workload",
        "gemm:9x9x9",
        "--db",
        db,
        "--budget",
        "1",
        "--mem-limit-mb",
        "256",
        "--json",
    ];
    let o = autokernel(&args, false);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let tuned: Vec<String> = json_lines(&o)
        .iter()
        .map(|l| l["workload"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(tuned, ["gemm:8x8x8", "gemm:9x9x9"], "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains(&format!("tuning {big}: setting up its test problem"))
            && err.contains("could not be set up, nothing measured"),
        "{err}"
    );
    let db = TuningDb::open_read_only(Path::new(db)).unwrap();
    assert_eq!(db.stats().unwrap().records, 2);
}
