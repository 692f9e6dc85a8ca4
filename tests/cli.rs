//! End-to-end tests of the `autokernel` binary: the command-line contract users script against.

use std::path::Path;

mod common;
use common::{autokernel, autokernel_env, json_lines, ok_json_lines, stderr};

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
fn hw_peak_measures_what_the_cpu_has() {
    let o = autokernel(&["hw", "--json", "--threads", "1", "--peak"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let p = &json_lines(&o)[0]["peak"];
    assert_eq!(p["threads"], 1);
    assert!(p["f32_gflops"].as_f64().unwrap() > 0.0, "{p}");
    // The others: a positive rate where the fingerprint has the instruction, null elsewhere.
    for (field, isa) in [
        ("bf16_gflops", "avx512bf16"),
        ("int8_gops", "avx512vnni"),
        ("amx_bf16_gflops", "amx_bf16"),
        ("amx_int8_gops", "amx_int8"),
    ] {
        let has = json_lines(&o)[0]["isa"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f == isa);
        match p[field].as_f64() {
            Some(g) => assert!(has && g > 0.0, "{field}: {g}"),
            None => assert!(!has && p[field].is_null(), "{field}: {p}"),
        }
    }
    let text = autokernel(&["hw", "--threads", "1", "--peak"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("  peak     f32 FMA "));
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
    let a = &json_lines(&again)[0];
    assert_eq!(a["measured_now"], 0);
    // Its speedup is the one the decision in force re-measured, not a fresh default timing
    // against the winner's search trial.
    assert_eq!(t["speedup_from"], "this_run", "{t}");
    assert_eq!(a["speedup_from"], "earlier_decision", "{a}");
    assert_eq!(a["speedup_vs_default"], t["speedup_vs_default"]);
    // And the decision in force is reported as it was made (had been null on a resume).
    assert!(t["winner_reason"].is_string(), "{t}");
    assert_eq!(
        (&a["winner_reason"], &a["tie"]),
        (&t["winner_reason"], &t["tie"])
    );

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
    assert_eq!((&l["dtype"], &l["device"]), (&"f32".into(), &"cpu".into()));

    // An element-type suffix: `:f32` is the same workload; an element type no family of
    // this build serves is a one-line error from every command, and the database is kept.
    let o = autokernel(&[
        "lookup",
        "--workload",
        "gemm:24x20x16:f32",
        "--db",
        db,
        "--json",
    ]);
    assert_eq!(json_lines(&o)[0]["config"], t["config"]);
    assert_eq!(json_lines(&o)[0]["workload"], "gemm:24x20x16");
    let before = file_bytes(Path::new(db));
    for cmd in ["lookup", "run", "tune"] {
        let o = autokernel(&[cmd, "--workload", "attention:1x2x8x4:i8", "--db", db]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{cmd}: {err}");
        assert!(
            err.contains("attention:1x2x8x4:i8") && err.contains("i8 workloads"),
            "{err}"
        );
    }
    assert_eq!(
        file_bytes(Path::new(db)),
        before,
        "the database is untouched"
    );
    // bf16 GEMM runs on the CPU, verified, and costs accuracy against the f32 problem.
    let o = autokernel(&[
        "run",
        "--workload",
        "gemm:3x40x33:bf16",
        "--db",
        db,
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = &json_lines(&o)[0];
    assert_eq!(
        (&r["kernel"], &r["dtype"]),
        (&"gemm_bf16".into(), &"bf16".into())
    );
    let err = r["max_rel_err_vs_f32"].as_f64().unwrap();
    assert!(err > 1e-5 && err < 1e-2, "{r}");

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
        ("gemm:4x4x4:u8", "not a workload precision"),
        ("gemm:4x4x4:fp8", "unknown suffix ':fp8'"),
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
    // A negative count is out of range, not an unknown flag (`-1` read as one).
    for (flag, value) in [
        ("--budget", "-1"),
        ("--threads", "-1"),
        ("--finalists", "-2"),
    ] {
        let o = autokernel(&["tune", "--workload", "gemm:2x2x2", flag, value]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains(&format!("invalid value '{value}'")), "{err}");
        assert!(err.contains("is not in"), "{err}");
    }
    let o = autokernel(&["infer", "--iters", "-3"]);
    assert!(stderr(&o).contains("'-3' for '--iters"), "{}", stderr(&o));
}

/// `AUTOKERNEL_ISA` caps the level the kernels use: the capped process is a machine of its
/// own (its fingerprint drops the flags above the cap), so a database tuned under a cap is
/// never served as `exact` or `same_arch` to the uncapped process, nor the reverse. A cap
/// the CPU cannot honour is a one-line error.
#[test]
fn a_bad_helper_linger_is_refused_up_front() {
    for bad in ["abc", "-5", "2000000"] {
        let o = autokernel_env(&["hw"], &[("AUTOKERNEL_LINGER_US", bad)], &[]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{bad}: {err}");
        assert!(
            err.starts_with(&format!("error: AUTOKERNEL_LINGER_US={bad}:")),
            "{err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    for good in ["", "0", "1000"] {
        let o = autokernel_env(&["hw"], &[("AUTOKERNEL_LINGER_US", good)], &[]);
        assert!(o.status.success(), "{good}: {}", stderr(&o));
    }
}

#[test]
fn an_isa_cap_is_a_machine_of_its_own() {
    const ENV: &str = "AUTOKERNEL_ISA";
    let hw = |cap: &str| autokernel_env(&["hw", "--json"], &[(ENV, cap)], &[]);
    let free = ok_json_lines(&autokernel_env(&["hw", "--json"], &[], &[ENV])).remove(0);
    let best = free["cpu_simd"].as_str().unwrap().to_string();
    assert_eq!(free["simd"], best.as_str());
    assert!(free["isa_cap"].is_null());
    let levels: Vec<String> = free["simd_levels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_string())
        .collect();
    for level in &levels {
        let v = ok_json_lines(&hw(level)).remove(0);
        assert_eq!(v["simd"], level.as_str());
        assert_eq!(v["isa_cap"], level.as_str());
        assert_eq!(
            v["id"] == free["id"],
            *level == best,
            "{level}: own fingerprint"
        );
        let flags = |v: &serde_json::Value| v["isa"].as_array().unwrap().clone();
        assert!(flags(&v).iter().all(|f| flags(&free).contains(f)));
    }
    for level in ["portable", "avx2", "avx512"] {
        if levels.iter().any(|l| l == level) {
            continue;
        }
        let o = hw(level);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{level}: {err}");
        assert!(err.contains("above what this CPU runs"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    let o = hw("avx9");
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unknown ISA level"), "{}", stderr(&o));

    let lowest = &levels[0];
    if *lowest == best {
        // Past the harness's capture: a skipped path must say so.
        let note = format!("skipped the cross-level lookups: this CPU runs only {best}\n");
        std::io::Write::write_all(&mut std::io::stderr(), note.as_bytes()).unwrap();
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("caps.db");
    let db = db.to_str().unwrap();
    let w = "gemm:24x20x16";
    let run = |args: &[&str], cap: Option<&str>| {
        let o = match cap {
            Some(c) => autokernel_env(args, &[(ENV, c)], &[]),
            None => autokernel_env(args, &[], &[ENV]),
        };
        ok_json_lines(&o).remove(0)
    };
    let tune = [
        "tune",
        "--workload",
        w,
        "--db",
        db,
        "--budget",
        "2",
        "--json",
    ];
    let lookup = ["lookup", "--workload", w, "--db", db, "--json"];
    run(&tune, Some(lowest));
    assert_eq!(run(&lookup, Some(lowest))["level"], "exact");
    assert_eq!(
        run(&lookup, None)["level"],
        "default",
        "capped record served uncapped"
    );
    run(&tune, None);
    let capped = run(&lookup, Some(lowest));
    assert_eq!(capped["level"], "exact");
    assert_eq!(capped["source"]["fingerprint"], capped["fingerprint"]);
    assert_ne!(capped["fingerprint"], free["id"]);
    assert_eq!(run(&lookup, None)["source"]["fingerprint"], free["id"]);
}
