//! `tune --model` and `infer` on the tiny BERT: the model's workload list is tuned, every
//! kernel call of the forward pass is served by the database (exact for tuned shapes,
//! nearest_shape for the others), the output is checked against the f64 reference — and
//! that check fails on a planted fault — and bad input gets a clear error.

use serde_json::Value;

mod common;
use common::{autokernel, json_lines, stderr};

#[test]
fn tune_a_model_then_infer_with_exact_and_nearest_shape_levels() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("bert.db");
    let db = db.to_str().unwrap();
    let o = autokernel(&[
        "tune",
        "--model",
        "bert-tiny",
        "--batch",
        "1,2",
        "--seq",
        "4",
        "--db",
        db,
        "--budget",
        "1",
        "--finalists",
        "0",
        "--isolation",
        "none",
        "--threads",
        "1",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let tuned: Vec<String> = json_lines(&o)
        .iter()
        .map(|t| t["workload"].as_str().unwrap().to_string())
        .collect();
    // 5 calls per shape, none shared between M = 4 and M = 8: 10 distinct workloads.
    assert_eq!(tuned.len(), 10, "{tuned:?}");
    assert!(
        tuned.contains(&"gemm_bias:8x192x64".to_string()),
        "{tuned:?}"
    );
    assert!(
        tuned.contains(&"attention:2x4x4x16".to_string()),
        "{tuned:?}"
    );
    assert!(
        tuned.contains(&"gemm_bias_gelu:4x128x64".to_string()),
        "{tuned:?}"
    );

    // The first-use check off: which borrowed configs beat the default is the machine's call;
    // the structural levels are what this test pins down.
    let o = common::autokernel_env(
        &[
            "infer",
            "--model",
            "bert-tiny",
            "--batch",
            "2",
            "--seq",
            "4,5",
            "--db",
            db,
            "--iters",
            "2",
            "--threads",
            "1",
            "--check",
            "all",
            "--json",
        ],
        &[(runtime::FALLBACK_CHECK_ENV, "0")],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let rows = json_lines(&o);
    assert_eq!(rows.len(), 2);
    let field = |r: &Value, k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} in {r}"));
    for r in &rows {
        for k in [
            "p50_ms",
            "seqs_per_s",
            "untuned_seqs_per_s",
            "speedup_vs_untuned",
        ] {
            assert!(field(r, k) > 0.0, "{k}: {r}");
        }
        assert_eq!(r["batch"], 2);
        assert_eq!(r["checked_sequences"], 2);
        assert!(field(r, "max_abs_err") <= field(r, "tolerance"), "{r}");
        assert_eq!(r["untuned_calls"]["default"], 10, "{r}");
    }
    // Seq 4 was tuned: all 10 calls exact. Seq 5 was not: the nearest tuned shapes serve.
    assert_eq!(rows[0]["seq"], 4);
    assert_eq!(rows[0]["exact"], 10, "{}", rows[0]);
    assert_eq!(rows[1]["nearest_shape"], 10, "{}", rows[1]);
    assert_eq!(rows[1]["calls"]["nearest_shape"], 10);

    // The check can fail: one wrong bias value makes infer exit non-zero, naming it.
    let o = autokernel(&[
        "infer",
        "--model",
        "bert-tiny",
        "--batch",
        "2",
        "--seq",
        "4",
        "--db",
        db,
        "--iters",
        "1",
        "--plant-fault",
        "--no-untuned",
    ]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("differ from the f64 reference"), "{e}");
    assert!(e.contains("batch 2 seq 4, sequence 1 (tuned)"), "{e}");
}

#[test]
fn bad_input_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("none.db");
    let missing = missing.to_str().unwrap();
    for (args, needle) in [
        (vec!["infer", "--batch", "0"], "'0' is not a whole number"),
        (vec!["infer", "--seq", "abc"], "'abc' is not a whole number"),
        (vec!["infer", "--batch", "1,,2"], "'' is not a whole number"),
        (vec!["infer", "--model", "gpt-7"], "unknown model 'gpt-7'"),
        (
            vec!["infer", "--model", "bert-tiny", "--db", missing],
            "not found",
        ),
        (vec!["tune", "--model", "gpt-7"], "unknown model 'gpt-7'"),
        (
            vec!["tune", "--model", "bert-tiny", "--seq", "8,x"],
            "'x' is not a whole number",
        ),
        (vec!["tune", "--batch", "2"], "--model"),
    ] {
        let o = autokernel(&args);
        assert!(!o.status.success(), "{args:?}");
        let e = stderr(&o);
        assert!(e.contains(needle), "{args:?}: {e}");
        assert!(!e.contains("panicked"), "{args:?}: {e}");
    }
}
