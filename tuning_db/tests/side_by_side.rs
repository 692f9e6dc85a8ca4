//! Side-by-side sets (schema v5): the winners of one shape's precisions re-measured in the
//! same rounds. Their medians serve while every decision they measured is in force, and they
//! travel with bundles and imports only where that still holds.

mod common;

use std::collections::HashMap;

use common::*;
use kernels::{DType, HardwareFingerprint, Measurement, Workload};
use tuning_db::{DbError, Remeasurement, SideBySide, TuningDb, WinnerDecision};

/// Records `w`'s trial of `median` and a decision for it re-measured at `remeasured`;
/// returns (trial id, decision id).
fn decided(db: &TuningDb, hw: &HardwareFingerprint, w: Workload, remeasured: f64) -> (i64, i64) {
    let trial = db
        .insert(&ok(&hw.id, w, configs(&w, hw, 1)[0].clone(), 1e-3))
        .unwrap();
    let decision = db
        .record_winner(&WinnerDecision {
            id: None,
            fingerprint_id: hw.id.clone(),
            workload: w,
            trial_id: trial,
            reason: "fastest".into(),
            tie: false,
            remeasured: vec![Remeasurement {
                trial_id: trial,
                measurement: timing(remeasured),
                ci_low_s: remeasured * 0.99,
                ci_high_s: remeasured * 1.01,
            }],
            decided_at: String::new(),
            tool_version: TOOL.into(),
        })
        .unwrap();
    (trial, decision)
}

fn timing(t: f64) -> Measurement {
    Measurement::from_samples(vec![t * 1.01, t, t * 0.99])
}

fn row(winner_id: i64, t: f64) -> SideBySide {
    SideBySide {
        winner_id,
        measurement: timing(t),
    }
}

/// A database with f32 and int8 decisions of one shape, re-measured apart (f32 at 2 ms,
/// int8 at 1 ms); returns it with (trial, decision) of each.
fn two_precisions(path: &std::path::Path) -> (TuningDb, (i64, i64), (i64, i64)) {
    let db = TuningDb::open(path).unwrap();
    let hw = hw();
    db.upsert_fingerprint(&hw).unwrap();
    let w = gemm(16, 24, 32);
    let f32 = decided(&db, &hw, w, 2e-3);
    let i8 = decided(&db, &hw, w.with_dtype(DType::I8), 1e-3);
    (db, f32, i8)
}

#[test]
fn a_set_serves_its_medians_while_its_decisions_are_in_force() {
    let dir = tempfile::tempdir().unwrap();
    let (db, (f_trial, f_dec), (i_trial, i_dec)) = two_precisions(&dir.path().join("a.db"));
    let id = hw().id;
    assert_eq!(
        db.remeasured_medians(&id).unwrap(),
        HashMap::from([(f_trial, 2e-3), (i_trial, 1e-3)])
    );
    // Side by side, f32 ran at 0.9 ms and int8 at 1.2 ms: those medians serve.
    db.record_side_by_side(&[row(f_dec, 0.9e-3), row(i_dec, 1.2e-3)], TOOL)
        .unwrap();
    assert_eq!(
        db.remeasured_medians(&id).unwrap(),
        HashMap::from([(f_trial, 0.9e-3), (i_trial, 1.2e-3)])
    );
    // A later set overrides an earlier one.
    db.record_side_by_side(&[row(i_dec, 1.1e-3), row(f_dec, 1.0e-3)], TOOL)
        .unwrap();
    assert_eq!(
        db.remeasured_medians(&id).unwrap(),
        HashMap::from([(f_trial, 1.0e-3), (i_trial, 1.1e-3)])
    );
    // int8 decided again: the sets compared a winner no longer in force, so every
    // precision is back on its own decision's median.
    let hw = hw();
    let (i_trial2, _) = decided(&db, &hw, gemm(16, 24, 32).with_dtype(DType::I8), 3e-3);
    assert_eq!(
        db.remeasured_medians(&id).unwrap(),
        HashMap::from([(f_trial, 2e-3), (i_trial2, 3e-3)])
    );
    db.verify().unwrap();
}

#[test]
fn each_shape_serves_its_latest_set_only() {
    let dir = tempfile::tempdir().unwrap();
    let (db, (f_trial, f_dec), (i_trial, i_dec)) = two_precisions(&dir.path().join("a.db"));
    let hw = hw();
    let shape = gemm(16, 24, 32);
    let (b_trial, b_dec) = decided(&db, &hw, shape.with_dtype(DType::Bf16), 1.5e-3);
    // Another shape's set is its own.
    let other = gemm(8, 8, 8);
    let (o_f, o_fd) = decided(&db, &hw, other, 5e-6);
    let (o_i, o_id) = decided(&db, &hw, other.with_dtype(DType::I8), 4e-6);
    db.record_side_by_side(&[row(o_fd, 6e-6), row(o_id, 3e-6)], TOOL)
        .unwrap();
    db.record_side_by_side(
        &[row(f_dec, 0.9e-3), row(b_dec, 0.7e-3), row(i_dec, 0.5e-3)],
        TOOL,
    )
    .unwrap();
    // A later set of two of the three, on the same decisions: int8 was not in its rounds,
    // so it is back on its own decision's median rather than the first set's.
    db.record_side_by_side(&[row(f_dec, 1.0e-3), row(b_dec, 0.8e-3)], TOOL)
        .unwrap();
    assert_eq!(
        db.remeasured_medians(&hw.id).unwrap(),
        HashMap::from([
            (f_trial, 1.0e-3),
            (b_trial, 0.8e-3),
            (i_trial, 1e-3),
            (o_f, 6e-6),
            (o_i, 3e-6)
        ])
    );
}

#[test]
fn the_latest_set_is_the_last_measured_not_the_last_inserted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let (db, (f_trial, f_dec), (i_trial, i_dec)) = two_precisions(&path);
    let newer = db
        .record_side_by_side(&[row(f_dec, 0.9e-3), row(i_dec, 1.2e-3)], TOOL)
        .unwrap();
    // A set copied in later (a higher id) that was measured earlier, as an import of an
    // older bundle brings.
    let older = db
        .record_side_by_side(&[row(f_dec, 3e-3), row(i_dec, 4e-3)], TOOL)
        .unwrap();
    assert!(older > newer);
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute(
            "UPDATE side_by_side SET measured_at = '2020-01-01T00:00:00Z' WHERE set_id = ?1",
            [older],
        )
        .unwrap();
    assert_eq!(
        db.remeasured_medians(&hw().id).unwrap(),
        HashMap::from([(f_trial, 0.9e-3), (i_trial, 1.2e-3)])
    );
    let tagged = db.winner_medians(&hw().id).unwrap();
    assert!(tagged.values().all(|m| m.side_by_side));
}

#[test]
fn a_set_must_be_one_shape_on_one_machine_in_distinct_types() {
    let dir = tempfile::tempdir().unwrap();
    let (db, (_, f_dec), (_, i_dec)) = two_precisions(&dir.path().join("a.db"));
    let hw = hw();
    let (_, other_shape) = decided(&db, &hw, gemm(16, 24, 48).with_dtype(DType::Bf16), 1e-3);
    let refused = |rows: &[SideBySide], needle: &str| {
        let e = db.record_side_by_side(rows, TOOL).unwrap_err();
        assert!(matches!(e, DbError::InvalidRecord { .. }), "{e}");
        assert!(e.to_string().contains(needle), "{e}");
    };
    refused(&[row(f_dec, 1e-3)], "two or more");
    refused(
        &[row(f_dec, 1e-3), row(f_dec, 2e-3)],
        "two rows of the set are f32",
    );
    refused(
        &[row(f_dec, 1e-3), row(other_shape, 1e-3)],
        "not of the set's shape",
    );
    refused(&[row(f_dec, 1e-3), row(9999, 1e-3)], "9999 does not exist");
    let mut nan = row(i_dec, 1e-3);
    nan.measurement.median_s = f64::NAN;
    refused(&[row(f_dec, 1e-3), nan], "finite positive");
    // Nothing was written.
    assert_eq!(
        db.remeasured_medians(&hw.id).unwrap().values().sum::<f64>(),
        2e-3 + 1e-3 + 1e-3
    );
}

#[test]
fn sets_travel_with_bundles_and_imports_once() {
    let dir = tempfile::tempdir().unwrap();
    let (db, (_, f_dec), (_, i_dec)) = two_precisions(&dir.path().join("a.db"));
    db.record_side_by_side(&[row(f_dec, 0.9e-3), row(i_dec, 1.2e-3)], TOOL)
        .unwrap();
    let id = hw().id;
    let bundle = dir.path().join("a.bundle");
    db.export_bundle(&id, &bundle, TOOL).unwrap();

    // The target already holds decisions of its own, so the copies get other ids.
    let target = TuningDb::open(dir.path().join("t.db")).unwrap();
    let hw = hw();
    target.upsert_fingerprint(&hw).unwrap();
    for w in [gemm(4, 4, 4), gemm(5, 5, 5), gemm(6, 6, 6)] {
        decided(&target, &hw, w, 1e-6);
    }
    target.import_from(&bundle, TOOL).unwrap();
    let medians = |db: &TuningDb| {
        let mut m: Vec<f64> = db.remeasured_medians(&id).unwrap().into_values().collect();
        m.sort_by(f64::total_cmp);
        m
    };
    assert_eq!(medians(&target), [1e-6, 1e-6, 1e-6, 0.9e-3, 1.2e-3]);
    // Importing again adds no second copy of the set.
    target.import_from(&bundle, TOOL).unwrap();
    assert_eq!(count(&dir.path().join("t.db"), "side_by_side"), 2);
    target.verify().unwrap();

    // A set whose int8 decision was superseded stays out of the bundle.
    decided(&db, &hw, gemm(16, 24, 32).with_dtype(DType::I8), 3e-3);
    let stale = dir.path().join("stale.bundle");
    db.export_bundle(&id, &stale, TOOL).unwrap();
    assert_eq!(count(&stale, "side_by_side"), 0);
    let fresh = TuningDb::open(dir.path().join("f.db")).unwrap();
    fresh.import_from(&stale, TOOL).unwrap();
    assert_eq!(medians(&fresh), [2e-3, 3e-3]);
}

#[test]
fn a_damaged_set_fails_verify_and_is_not_imported() {
    let dir = tempfile::tempdir().unwrap();
    let (db, (_, f_dec), (_, i_dec)) = two_precisions(&dir.path().join("a.db"));
    db.record_side_by_side(&[row(f_dec, 0.9e-3), row(i_dec, 1.2e-3)], TOOL)
        .unwrap();
    let bundle = dir.path().join("a.bundle");
    db.export_bundle(&hw().id, &bundle, TOOL).unwrap();
    // The checksum does not cover sets: an altered one still matches it.
    let raw = rusqlite::Connection::open(&bundle).unwrap();
    raw.execute("DELETE FROM side_by_side WHERE winner_id = ?1", [i_dec])
        .unwrap();
    raw.execute("UPDATE side_by_side SET samples = 'oops'", [])
        .unwrap();
    drop(raw);
    let e = TuningDb::open_read_only(&bundle)
        .unwrap()
        .verify()
        .unwrap_err();
    let text = e.to_string();
    assert!(text.contains("two or more winners"), "{text}");
    assert!(text.contains("parseable samples"), "{text}");
    let target = TuningDb::open(dir.path().join("t.db")).unwrap();
    assert!(target.import_from(&bundle, TOOL).is_err());
    assert_eq!(count(&dir.path().join("t.db"), "side_by_side"), 0);
}

/// Rows of `table` in the file at `path`.
fn count(path: &std::path::Path, table: &str) -> i64 {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
        .unwrap()
}
