//! `autokernel replay`: strategies replayed against recorded spaces, model metrics, export.

use std::path::{Path, PathBuf};

mod common;
use common::{autokernel, json_lines, stderr};

fn space(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("search/tests/data")
        .join(name)
        .display()
        .to_string()
}

#[test]
fn replay_reports_one_json_object_per_space_and_strategy() {
    let (a, b) = (space("gemm_16x64x48.jsonl"), space("gemm_24x48x40.jsonl"));
    let o = autokernel(&[
        "replay",
        "--space",
        &a,
        "--space",
        &b,
        "--strategy",
        "random",
        "model",
        "--seeds",
        "5",
        "--budget",
        "40",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows = json_lines(&o);
    assert_eq!(rows.len(), 4);
    for r in &rows {
        for field in [
            "space",
            "strategy",
            "trials_to_95",
            "trials_to_99",
            "best_at_budget",
        ] {
            assert!(r.get(field).is_some(), "{field} missing in {r}");
        }
        let f = r["best_at_budget"].as_f64().unwrap();
        assert!(f > 0.0 && f <= 1.0);
        assert_eq!(r["seeds"], 5);
    }
    assert_eq!(rows[0]["space"], a.as_str());
    assert_eq!(rows[1]["strategy"], "model");
    // Same command, same numbers.
    let again = autokernel(&[
        "replay",
        "--space",
        &a,
        &b,
        "--strategy",
        "random",
        "--strategy",
        "model",
        "--seeds",
        "5",
        "--budget",
        "40",
        "--json",
    ]);
    assert_eq!(json_lines(&again), rows);
}

#[test]
fn replay_table_plot_and_models() {
    let a = space("gemm_16x64x48.jsonl");
    let dir = tempfile::tempdir().unwrap();
    let svg: PathBuf = dir.path().join("curves.svg");
    let o = autokernel(&[
        "replay",
        "--space",
        &a,
        "--seeds",
        "3",
        "--budget",
        "30",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for s in [
        "random",
        "annealing",
        "evolutionary",
        "model-notransfer",
        "model",
    ] {
        assert!(out.contains(s), "{s} missing from\n{out}");
    }
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(drawn.starts_with("<svg") && drawn.contains("model-notransfer"));

    let o = autokernel(&[
        "replay",
        "--models",
        "--space",
        &a,
        &space("gemm_24x48x40.jsonl"),
        "--seeds",
        "2",
        "--train",
        "20",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows = json_lines(&o);
    assert_eq!(rows.len(), 8, "2 spaces × 2 models × with/without transfer");
    assert!(rows
        .iter()
        .all(|r| r["spearman"].is_f64() && r["regret"].as_f64().unwrap() >= 1.0));
}

#[test]
fn replay_errors_are_one_line_with_exit_code_2() {
    let o = autokernel(&["replay", "--space", "/nonexistent/space.jsonl"]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.starts_with("error: ") && err.contains("/nonexistent/space.jsonl"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");

    let o = autokernel(&["replay"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--space"));

    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.jsonl");
    std::fs::write(&junk, "not json\n").unwrap();
    let o = autokernel(&["replay", "--space", junk.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("junk.jsonl:1"), "{}", stderr(&o));

    let o = autokernel(&[
        "replay",
        "--space",
        &space("gemm_16x64x48.jsonl"),
        "--strategy",
        "bayes",
    ]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn export_writes_a_space_that_replays() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let db = db.to_str().unwrap();
    let out = dir.path().join("spaces/gemm_9x20x8.jsonl");
    let out = out.to_str().unwrap();
    let export = |to: &str, extra: &[&str]| {
        let mut args = vec!["replay", "--export", "gemm:9x20x8", "--db", db, "--out", to];
        args.extend(["--threads", "1"]);
        args.extend(extra);
        autokernel(&args)
    };
    // Not recorded yet: a clear error.
    let o = export(out, &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("not found"), "{}", stderr(&o));
    let o = autokernel(&[
        "tune",
        "--workload",
        "gemm:9x20x8",
        "--db",
        db,
        "--strategy",
        "exhaustive",
        "--budget",
        "10000",
        "--json",
        "--threads",
        "1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let size = json_lines(&o)[0]["space_size"].as_u64().unwrap();
    let o = export(out, &["--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(json_lines(&o)[0]["candidates"].as_u64(), Some(size));
    let o = autokernel(&[
        "replay",
        "--space",
        out,
        "--strategy",
        "model",
        "--seeds",
        "2",
        "--budget",
        "10",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(json_lines(&o)[0]["space_size"].as_u64(), Some(size));

    // Outputs never overwrite: not the space just written, not the database (as --out or
    // as a --plot), each refused before any work with the file left as it was.
    let db_bytes = std::fs::read(db).unwrap();
    let space_bytes = std::fs::read(out).unwrap();
    for to in [out, db] {
        let o = export(to, &[]);
        assert_eq!(o.status.code(), Some(2));
        assert!(stderr(&o).contains("already exists"), "{}", stderr(&o));
    }
    let o = autokernel(&[
        "replay", "--space", out, "--seeds", "2", "--budget", "10", "--plot", db,
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("not an SVG chart"), "{}", stderr(&o));
    assert_eq!(std::fs::read(db).unwrap(), db_bytes);
    assert_eq!(std::fs::read(out).unwrap(), space_bytes);
}
