//! Schema v4: every record stores its accuracy against the f32 problem; files of schema v3
//! are still served read-only, and bundles, imports and checksums carry the new columns
//! without changing what they were for records that have none.

mod common;

use common::*;
use kernels::Accuracy;
use tuning_db::{TuningDb, SCHEMA_VERSION};

fn acc(max: f64, fro: f64) -> Accuracy {
    Accuracy {
        max_rel_err: max,
        fro_rel_err: fro,
    }
}

#[test]
fn accuracy_round_trips_and_bad_values_are_refused() {
    let db = TuningDb::in_memory().unwrap();
    let hw = hw();
    db.upsert_fingerprint(&hw).unwrap();
    let w = gemm(8, 8, 8);
    let c = configs(&w, &hw, 1).remove(0);
    let with = ok(&hw.id, w, c.clone(), 1e-6).with_accuracy(Some(acc(3e-3, 1e-3)));
    let id = db.insert(&with).unwrap();
    let got = db.trials(&hw.id, &w).unwrap();
    assert_eq!(got[0].id, Some(id));
    assert_eq!(got[0].accuracy, Some(acc(3e-3, 1e-3)));
    assert_eq!(
        db.best(&hw.id, &w).unwrap().unwrap().accuracy,
        with.accuracy
    );
    let without = ok(&hw.id, w, c.clone(), 2e-6);
    db.insert(&without).unwrap();
    assert_eq!(db.trials(&hw.id, &w).unwrap()[1].accuracy, None);
    for bad in [acc(f64::NAN, 0.0), acc(-1.0, 0.0), acc(0.0, f64::INFINITY)] {
        let r = ok(&hw.id, w, c.clone(), 1e-6).with_accuracy(Some(bad));
        let e = db.insert(&r).unwrap_err().to_string();
        assert!(e.contains("accuracy"), "{e}");
    }
    db.verify().unwrap();
}

/// A file as the v3 build left it: the v5 table and the v4 columns dropped, `user_version` 3.
fn downgrade_to_v3(path: &std::path::Path) {
    let raw = rusqlite::Connection::open(path).unwrap();
    raw.execute_batch(
        "DROP TABLE side_by_side; ALTER TABLE trials DROP COLUMN max_rel_err; \
         ALTER TABLE trials DROP COLUMN fro_rel_err; PRAGMA user_version = 3;",
    )
    .unwrap();
}

#[test]
fn a_v3_file_is_served_read_only_and_migrates_keeping_its_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v3.db");
    make_db(&path, 3);
    let before = TuningDb::open_read_only(&path)
        .unwrap()
        .content_checksum()
        .unwrap();
    downgrade_to_v3(&path);
    let v3 = bytes(&path);
    {
        let db = TuningDb::open_read_only(&path).unwrap();
        assert_eq!(db.schema_version().unwrap(), 3);
        let best = db.best_all(&hw().id).unwrap();
        assert!(!best.is_empty());
        assert!(best.iter().all(|r| r.accuracy.is_none()));
        assert_eq!(db.content_checksum().unwrap(), before);
        db.verify().unwrap();
    }
    assert_eq!(bytes(&path), v3, "a read-only open never writes");
    // Opened for writing, it migrates; the checksum of accuracy-less trials is unchanged.
    let db = TuningDb::open(&path).unwrap();
    assert_eq!(db.schema_version().unwrap(), SCHEMA_VERSION);
    assert_eq!(db.content_checksum().unwrap(), before);
}

#[test]
fn export_and_import_carry_accuracy_and_a_v3_source_imports_without_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.db");
    let hw = hw();
    let w = gemm(16, 16, 16);
    let c = configs(&w, &hw, 1).remove(0);
    {
        let db = TuningDb::open(&src).unwrap();
        db.upsert_fingerprint(&hw).unwrap();
        db.insert(&ok(&hw.id, w, c.clone(), 1e-6).with_accuracy(Some(acc(2e-3, 5e-4))))
            .unwrap();
    }
    let bundle = dir.path().join("b.db");
    let src_db = TuningDb::open(&src).unwrap();
    src_db.export_bundle(&hw.id, &bundle, TOOL).unwrap();
    let tgt = TuningDb::open(dir.path().join("tgt.db")).unwrap();
    let report = tgt.import_from(&bundle, TOOL).unwrap();
    assert_eq!(report.inserted, 1);
    assert_eq!(
        tgt.best(&hw.id, &w).unwrap().unwrap().accuracy,
        Some(acc(2e-3, 5e-4))
    );
    // The same trial from a v3 copy of a file without accuracy is a duplicate, not new.
    let plain = dir.path().join("plain.db");
    {
        let db = TuningDb::open(&plain).unwrap();
        db.upsert_fingerprint(&hw).unwrap();
        db.insert(&ok(&hw.id, w, c, 3e-6)).unwrap();
    }
    let first = tgt.import_from(&plain, TOOL).unwrap();
    assert_eq!(first.inserted, 1);
    downgrade_to_v3(&plain);
    let again = tgt.import_from(&plain, TOOL).unwrap();
    assert_eq!((again.inserted, again.duplicates), (0, 1));
}
