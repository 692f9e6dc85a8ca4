//! Bundles at the library level: the content checksum depends on the content only, and an
//! export → import round trip keeps every record and the winner.

mod common;

use common::*;
use tuning_db::{
    check_file, merge_files, DbError, Record, Remeasurement, TuningDb, WinnerDecision,
};

#[test]
fn the_checksum_ignores_insertion_order_and_row_ids_but_not_content() {
    let dir = tempfile::tempdir().unwrap();
    let hw = hw();
    let w = gemm(64, 64, 64);
    let cs = configs(&w, &hw, 3);
    let recs: Vec<_> = cs
        .iter()
        .enumerate()
        .map(|(i, c)| ok(&hw.id, w, c.clone(), 1e-3 * (i + 1) as f64))
        .collect();
    let make = |name: &str, order: &[usize]| {
        let db = TuningDb::open(dir.path().join(name)).unwrap();
        db.upsert_fingerprint(&hw).unwrap();
        for &i in order {
            db.insert(&recs[i]).unwrap();
        }
        db.content_checksum().unwrap()
    };
    let a = make("a.db", &[0, 1, 2]);
    let b = make("b.db", &[2, 0, 1]);
    assert_eq!(a, b);
    assert!(a.starts_with("sha256:") && a.len() == 7 + 64);
    let c = make("c.db", &[0, 1]);
    assert_ne!(a, c);
}

#[test]
fn export_then_import_keeps_every_record_and_the_best() {
    let dir = tempfile::tempdir().unwrap();
    let hw = hw();
    let w = gemm(32, 48, 64);
    let src = dir.path().join("src.db");
    let db = TuningDb::open(&src).unwrap();
    db.upsert_fingerprint(&hw).unwrap();
    db.upsert_fingerprint(&other_hw()).unwrap();
    let cs = configs(&w, &hw, 2);
    db.insert_many(&[
        ok(&hw.id, w, cs[0].clone(), 2e-4),
        ok(&hw.id, w, cs[1].clone(), 1e-4),
        failed(
            &hw.id,
            w,
            cs[0].clone(),
            kernels::Status::Crashed,
            "SIGSEGV",
        ),
    ])
    .unwrap();
    let bundle = dir.path().join("x.bundle");
    let m = db.export_bundle(&hw.id, &bundle, "t").unwrap();
    assert_eq!(m.record_count, 3);
    assert_eq!(m.fingerprint, hw.id);
    let report = check_file(&bundle).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    assert_eq!(report.checksum_ok, Some(true));
    assert_eq!(report.fingerprints, 1, "only the exported fingerprint");
    // A bundle is no database to write to: the writer and the dry run's check both say so.
    assert!(matches!(
        TuningDb::open(&bundle),
        Err(DbError::Bundle { .. })
    ));
    assert!(matches!(
        TuningDb::check_writer(&bundle),
        Err(DbError::Bundle { .. })
    ));

    let target = TuningDb::open(dir.path().join("t.db")).unwrap();
    let r = target.import_from(&bundle, "t").unwrap();
    assert_eq!((r.inserted, r.duplicates, r.fingerprints_added), (3, 0, 1));
    assert_eq!(target.stats().unwrap().failures, 1);
    assert_eq!(
        target.best(&hw.id, &w).unwrap().unwrap().config,
        db.best(&hw.id, &w).unwrap().unwrap().config
    );
    assert_eq!(target.content_checksum().unwrap(), m.checksum);
    let again = target.import_from(&bundle, "t").unwrap();
    assert!(!again.changed());
    assert_eq!(target.stats().unwrap().records, 3);
}

/// A decision in force whose trial is also the fastest one (so the target would serve it
/// without the decision) still travels, with its re-measurements: a round trip or a merge
/// with itself keeps every decision and the checksum.
#[test]
fn decisions_on_the_fastest_trial_survive_import_and_merge() {
    let dir = tempfile::tempdir().unwrap();
    let hw = hw();
    let w = gemm(32, 48, 64);
    let src = dir.path().join("src.db");
    let db = TuningDb::open(&src).unwrap();
    db.upsert_fingerprint(&hw).unwrap();
    let cs = configs(&w, &hw, 2);
    let fast = db.insert(&ok(&hw.id, w, cs[0].clone(), 1e-4)).unwrap();
    let slow = db.insert(&ok(&hw.id, w, cs[1].clone(), 2e-4)).unwrap();
    let remeasured = |trial_id, t: f64| Remeasurement {
        trial_id,
        measurement: kernels::Measurement::from_samples(vec![t, t * 1.01, t * 0.99]),
        ci_low_s: t * 0.99,
        ci_high_s: t * 1.01,
    };
    db.record_winner(&WinnerDecision {
        id: None,
        fingerprint_id: hw.id.clone(),
        workload: w,
        trial_id: fast,
        reason: "fastest".into(),
        tie: false,
        remeasured: vec![remeasured(fast, 1e-4), remeasured(slow, 2e-4)],
        decided_at: String::new(),
        tool_version: "t".into(),
    })
    .unwrap();
    let decision = |db: &TuningDb| {
        let d = db.winner(&hw.id, &w).unwrap().expect("a decision in force");
        (d.reason, d.remeasured.len())
    };
    let bundle = dir.path().join("a.bundle");
    let m = db.export_bundle(&hw.id, &bundle, "t").unwrap();

    let target = TuningDb::open(dir.path().join("t.db")).unwrap();
    let r = target.import_from(&bundle, "t").unwrap();
    assert_eq!(r.winners_recorded, 1);
    assert_eq!(decision(&target), ("fastest".to_string(), 2));
    let again = dir.path().join("b.bundle");
    assert_eq!(
        target.export_bundle(&hw.id, &again, "t").unwrap().checksum,
        m.checksum
    );
    assert!(
        !target.import_from(&bundle, "t").unwrap().changed(),
        "idempotent"
    );

    let merged = dir.path().join("m.db");
    merge_files(&src, &src, &merged, "t").unwrap();
    assert_eq!(
        decision(&TuningDb::open(&merged).unwrap()),
        ("fastest".to_string(), 2)
    );
}

/// What the content checksum does not cover on its own — the fingerprint columns beside
/// their canonical form, the `op` column beside the workload, which trial a decision names —
/// `verify` checks for consistency: each tampering of a bundle (that still "matches" its
/// checksum) is a problem, so `import` refuses it.
#[test]
fn tampering_the_checksum_does_not_cover_is_caught_by_verify() {
    let dir = tempfile::tempdir().unwrap();
    let hw = hw();
    let (w, other) = (gemm(32, 48, 64), gemm(16, 16, 16));
    let db = TuningDb::open(dir.path().join("src.db")).unwrap();
    db.upsert_fingerprint(&hw).unwrap();
    let cs = configs(&w, &hw, 1);
    let fast = db.insert(&ok(&hw.id, w, cs[0].clone(), 1e-4)).unwrap();
    let crashed = failed(&hw.id, w, cs[0].clone(), kernels::Status::Crashed, "x");
    let crashed = db.insert(&crashed).unwrap();
    let elsewhere = db.insert(&ok(&hw.id, other, configs(&other, &hw, 1)[0].clone(), 1e-5));
    db.record_winner(&WinnerDecision {
        id: None,
        fingerprint_id: hw.id.clone(),
        workload: w,
        trial_id: fast,
        reason: "fastest".into(),
        tie: false,
        remeasured: vec![],
        decided_at: String::new(),
        tool_version: "t".into(),
    })
    .unwrap();
    let bundle = dir.path().join("a.bundle");
    db.export_bundle(&hw.id, &bundle, "t").unwrap();
    assert!(check_file(&bundle).unwrap().is_ok());
    let trial_of = |t: i64| format!("UPDATE winners SET trial_id = {t}");
    let cases = [
        (
            "UPDATE fingerprints SET isa = 'avx2 fma'".to_string(),
            "do not match its canonical form",
        ),
        (
            "UPDATE trials SET op = 'attention' WHERE id = 1".to_string(),
            "op 'attention' but workload",
        ),
        (trial_of(crashed), "which is crashed"),
        (trial_of(elsewhere.unwrap()), "names trial"),
    ];
    for (i, (sql, needle)) in cases.iter().enumerate() {
        let copy = dir.path().join(format!("t{i}.bundle"));
        std::fs::copy(&bundle, &copy).unwrap();
        rusqlite::Connection::open(&copy)
            .unwrap()
            .execute(sql, [])
            .unwrap();
        let report = check_file(&copy).unwrap();
        assert!(
            report.problems.iter().any(|p| p.contains(needle)),
            "{sql}: {:?}",
            report.problems
        );
        let target = TuningDb::open(dir.path().join(format!("t{i}.db"))).unwrap();
        assert!(target.import_from(&copy, "t").is_err(), "{sql}: imported");
    }
}

/// A trial is the same trial only when every column but its id agrees: one differing in a
/// column outside the identifying ones (here the tool version) is kept, and a trial the
/// source holds twice is inserted once.
#[test]
fn import_matches_trials_on_every_column() {
    let dir = tempfile::tempdir().unwrap();
    let hw = hw();
    let w = gemm(16, 16, 16);
    let r = ok(&hw.id, w, configs(&w, &hw, 1)[0].clone(), 1e-5);
    let other_tool = Record {
        tool_version: "another".into(),
        ..r.clone()
    };
    let src = TuningDb::open(dir.path().join("src.db")).unwrap();
    src.upsert_fingerprint(&hw).unwrap();
    for rec in [&r, &r, &other_tool] {
        src.insert(rec).unwrap();
    }
    drop(src);

    let empty = TuningDb::open(dir.path().join("empty.db")).unwrap();
    let into_empty = empty.import_from(&dir.path().join("src.db"), "t").unwrap();
    assert_eq!((into_empty.inserted, into_empty.duplicates), (2, 1));

    let holder = TuningDb::open(dir.path().join("holder.db")).unwrap();
    holder.upsert_fingerprint(&hw).unwrap();
    holder.insert(&r).unwrap();
    let into_holder = holder.import_from(&dir.path().join("src.db"), "t").unwrap();
    assert_eq!((into_holder.inserted, into_holder.duplicates), (1, 2));
    assert_eq!(holder.stats().unwrap().records, 2);
}
