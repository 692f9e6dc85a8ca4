//! End-to-end tests of the `autokernel` binary: the command-line contract users script against.

use std::path::Path;

mod common;
use common::{autokernel, json_lines, stderr};

fn file_bytes(p: &Path) -> Option<Vec<u8>> {
    std::fs::read(p).ok()
}

#[test]
fn hw_reports_a_fingerprint() {
    let o = autokernel(&["hw", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = &json_lines(&o)[0];
    assert_eq!(v["id"].as_str().unwrap().len(), 16);
    assert!(v["cores"].as_u64().unwrap() >= 1);
    assert!(v["l1d_bytes"].as_u64().unwrap() > 0);
    let o = autokernel(&["hw", "--json", "--threads", "1"]);
    assert_eq!(
        json_lines(&o)[0]["cores"],
        1,
        "--threads is the core count used"
    );
}

#[test]
fn tune_lookup_run_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let db = db.to_str().unwrap();

    let o = autokernel(&[
        "tune",
        "--workload",
        "gemm:24x20x16",
        "--db",
        db,
        "--budget",
        "4",
        "--seed",
        "3",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines = json_lines(&o);
    assert_eq!(lines.len(), 1);
    let t = &lines[0];
    for field in [
        "workload",
        "kernel",
        "config",
        "median_s",
        "gflops",
        "default_median_s",
        "speedup_vs_default",
        "trials",
        "failures",
    ] {
        assert!(!t[field].is_null(), "tune --json lacks {field}: {t}");
    }
    assert_eq!(t["workload"], "gemm:24x20x16");
    assert_eq!(t["trials"], 4);
    assert_eq!(t["failures"], 0);
    assert!(t["median_s"].as_f64().unwrap() > 0.0);

    // Same command again resumes: nothing new is measured.
    let again = autokernel(&[
        "tune",
        "--workload",
        "gemm:24x20x16",
        "--db",
        db,
        "--budget",
        "4",
        "--seed",
        "3",
        "--json",
    ]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(json_lines(&again)[0]["measured_now"], 0);

    let o = autokernel(&[
        "lookup",
        "--workload",
        "gemm:24x20x16",
        "--db",
        db,
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let l = &json_lines(&o)[0];
    assert_eq!(l["level"], "exact");
    assert_eq!(l["kernel"], t["kernel"]);
    assert_eq!(l["config"], t["config"]);

    // Never tuned: the nearest tuned shape lends its config if it is valid for this one.
    let o = autokernel(&["lookup", "--workload", "gemm:5x7x9", "--db", db, "--json"]);
    let l = &json_lines(&o)[0];
    assert!(
        l["level"] == "nearest_shape" || l["level"] == "default",
        "{l}"
    );
    if l["level"] == "nearest_shape" {
        assert_eq!(l["source"]["workload"], "gemm:24x20x16");
    }

    let o = autokernel(&["run", "--workload", "gemm:24x20x16", "--db", db, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = &json_lines(&o)[0];
    assert_eq!(r["level"], "exact");
    assert!(r["gflops"].as_f64().unwrap() > 0.0);
    assert!(r["median_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn bad_workloads_fail_cleanly_and_touch_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let dbs = db.to_str().unwrap();
    for (w, needle) in [
        ("gemm:12x12", "MxNxK"),
        ("gemm:0x4x4", "at least 1"),
        ("gemm:4x-4x4", "not a positive"),
        ("gemm:99999999x4x4", "exceeds the maximum"),
        ("conv:4x4x4", "unknown op 'conv'"),
        ("hello", "expected OP:SHAPE"),
    ] {
        for cmd in [
            vec!["tune", "--workload", w, "--db", dbs],
            vec!["lookup", "--workload", w, "--db", dbs],
            vec!["run", "--workload", w, "--db", dbs],
        ] {
            let o = autokernel(&cmd);
            let err = stderr(&o);
            assert!(!o.status.success(), "{cmd:?} succeeded");
            assert!(err.contains(needle), "{cmd:?}: {err}");
            assert_eq!(err.trim().lines().count(), 1, "one-line error: {err}");
            assert!(!err.contains("panicked"), "{err}");
        }
    }
    assert!(!db.exists(), "no database is created for bad input");
}

#[test]
fn foreign_and_unwritable_databases_are_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let not_db = dir.path().join("notes.txt");
    std::fs::write(&not_db, b"these are my notes, not a database\n".repeat(200)).unwrap();
    let before = file_bytes(&not_db);
    for cmd in ["tune", "lookup", "run"] {
        let o = autokernel(&[
            cmd,
            "--workload",
            "gemm:4x4x4",
            "--db",
            not_db.to_str().unwrap(),
        ]);
        assert!(!o.status.success());
        let err = stderr(&o);
        assert!(
            err.contains("notes.txt") && err.contains("not a SQLite database"),
            "{cmd}: {err}"
        );
    }
    assert_eq!(file_bytes(&not_db), before, "the file is untouched");

    let missing_dir = dir.path().join("no/such/dir/t.db");
    let o = autokernel(&[
        "tune",
        "--workload",
        "gemm:4x4x4",
        "--db",
        missing_dir.to_str().unwrap(),
        "--budget",
        "1",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no/such/dir"), "{}", stderr(&o));

    let o = autokernel(&[
        "lookup",
        "--workload",
        "gemm:4x4x4",
        "--db",
        dir.path().join("absent.db").to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("not found"), "{}", stderr(&o));
}

#[test]
fn unknown_strategy_and_zero_budget_are_rejected() {
    let o = autokernel(&["tune", "--strategy", "bayes"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("bayes"));
    let o = autokernel(&["tune", "--budget", "0"]);
    assert!(!o.status.success());
}
