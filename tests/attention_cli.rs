//! `tune` / `lookup` / `run` on attention and fused-epilogue workloads: the new workload
//! strings go through the same commands as GEMM, and bad ones fail with a one-line error.

mod common;
use common::{autokernel, json_lines, stderr};

#[test]
fn tune_lookup_run_attention_and_gemm_bias_gelu() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let db = db.to_str().unwrap();
    for w in [
        "attention:1x2x19x32:causal",
        "attention:2x1x8x16",
        "gemm_bias_gelu:9x20x7",
    ] {
        let o = autokernel(&[
            "tune",
            "--workload",
            w,
            "--db",
            db,
            "--budget",
            "3",
            "--seed",
            "5",
            "--threads",
            "1",
            "--json",
        ]);
        assert!(o.status.success(), "{w}: {}", stderr(&o));
        let t = &json_lines(&o)[0];
        assert_eq!(t["workload"], w);
        assert_eq!(t["failures"], 0, "{t}");
        assert!(t["median_s"].as_f64().unwrap() > 0.0, "{t}");
        let kernel = t["kernel"].as_str().unwrap();
        if w.starts_with("attention") {
            assert!(kernel.starts_with("attention_"), "{t}");
        } else {
            assert!(kernel.starts_with("gemm_bias_act_"), "{t}");
        }

        let o = autokernel(&[
            "lookup",
            "--workload",
            w,
            "--db",
            db,
            "--threads",
            "1",
            "--json",
        ]);
        assert!(o.status.success(), "{w}: {}", stderr(&o));
        let l = &json_lines(&o)[0];
        assert_eq!(l["level"], "exact", "{l}");
        assert_eq!(l["kernel"], t["kernel"]);
        assert_eq!(l["config"], t["config"]);

        let o = autokernel(&[
            "run",
            "--workload",
            w,
            "--db",
            db,
            "--threads",
            "1",
            "--json",
        ]);
        assert!(o.status.success(), "{w}: {}", stderr(&o));
        let r = &json_lines(&o)[0];
        assert_eq!(r["level"], "exact", "{r}");
        assert!(r["gflops"].as_f64().unwrap() > 0.0, "{r}");
    }

    // Never tuned: served by the kernel default, verified and timed all the same.
    let o = autokernel(&[
        "run",
        "--workload",
        "attention:1x1x5x8",
        "--db",
        db,
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_ne!(json_lines(&o)[0]["level"], "exact");
}

#[test]
fn bad_attention_and_epilogue_workloads_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let dbs = db.to_str().unwrap();
    for (w, needle) in [
        ("attention:1x12x128", "BxHxSxD"),
        (
            "attention:1x12x128x64:sideways",
            "unknown suffix ':sideways'",
        ),
        ("attention:0x1x1x1", "at least 1"),
        ("gemm_bias_gelu:2x2", "MxNxK"),
        ("gemm_bias_swish:2x2x2", "unknown op 'gemm_bias_swish'"),
    ] {
        for cmd in ["tune", "lookup", "run"] {
            let o = autokernel(&[cmd, "--workload", w, "--db", dbs]);
            let err = stderr(&o);
            assert!(!o.status.success(), "{cmd} {w} succeeded");
            assert!(err.contains(needle), "{cmd} {w}: {err}");
            assert_eq!(err.trim().lines().count(), 1, "one-line error: {err}");
            assert!(!err.contains("panicked"), "{err}");
        }
    }
    assert!(!db.exists(), "no database is created for bad input");
}
