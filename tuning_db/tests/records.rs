//! Writing records and reading them back: round trips, best-of queries, resumption, stats.

mod common;

use common::*;
use kernels::{Measurement, Status};
use tuning_db::{DbError, Record, TuningDb};

fn db_with_hw() -> (TuningDb, kernels::HardwareFingerprint) {
    let db = TuningDb::in_memory().unwrap();
    let hw = hw();
    db.upsert_fingerprint(&hw).unwrap();
    (db, hw)
}

#[test]
fn records_round_trip_including_failures_and_samples() {
    let (db, hw) = db_with_hw();
    let w = gemm(128, 768, 768);
    let cs = configs(&w, &hw, 2);
    let mut good = ok(&hw.id, w, cs[0].clone(), 2.5e-4);
    good.measurement = Some(Measurement::from_samples(vec![3e-4, 2.5e-4, 2.4e-4, 9e-4]));
    good.gflops = Some(w.flops() / 2.75e-4 / 1e9);
    let bad = failed(
        &hw.id,
        w,
        cs[cs.len() - 1].clone(),
        Status::WrongResult,
        "max |err| 3.2e-1 at C[5,7]",
    );
    let ids = db.insert_many(&[good.clone(), bad.clone()]).unwrap();
    assert!(ids[0] < ids[1]);

    let back = db.trials(&hw.id, &w).unwrap();
    assert_eq!(back.len(), 2);
    let mut expect_good = good.clone();
    expect_good.id = Some(ids[0]);
    let mut expect_bad = bad.clone();
    expect_bad.id = Some(ids[1]);
    assert_eq!(back[0], expect_good, "every field, samples included");
    assert_eq!(back[1], expect_bad);
    assert_eq!(
        back[0].measurement.as_ref().unwrap().samples,
        vec![3e-4, 2.5e-4, 2.4e-4, 9e-4]
    );

    // JSON output round-trips too.
    let json = serde_json::to_string(&back).unwrap();
    assert!(json.contains("\"workload\":\"gemm:128x768x768\""), "{json}");
    assert!(json.contains("\"status\":\"wrong_result\""), "{json}");
    let again: Vec<Record> = serde_json::from_str(&json).unwrap();
    assert_eq!(again, back);

    // Other workloads and machines see nothing.
    assert!(db.trials(&hw.id, &gemm(1, 2, 3)).unwrap().is_empty());
    assert!(db.trials("0000000000000000", &w).unwrap().is_empty());
}

#[test]
fn trials_keep_insertion_order_not_speed_order() {
    let (db, hw) = db_with_hw();
    let w = gemm(32, 32, 32);
    let c = configs(&w, &hw, 1).remove(0);
    for t in [3e-3, 1e-3, 2e-3] {
        db.insert(&ok(&hw.id, w, c.clone(), t)).unwrap();
    }
    let medians: Vec<f64> = db
        .trials(&hw.id, &w)
        .unwrap()
        .iter()
        .map(|r| r.median_s().unwrap())
        .collect();
    assert_eq!(medians, vec![3e-3, 1e-3, 2e-3]);
}

#[test]
fn best_picks_the_fastest_usable_ok_record() {
    let (db, hw) = db_with_hw();
    let w = gemm(256, 256, 256);
    let k = family(&w);
    let cs = configs(&w, &hw, 3);
    let fastest_valid = cs[cs.len() - 1].clone();

    db.insert(&ok(&hw.id, w, cs[0].clone(), 5e-3)).unwrap();
    let winner = db
        .insert(&ok(&hw.id, w, fastest_valid.clone(), 2e-3))
        .unwrap();
    db.insert(&ok(&hw.id, w, cs[0].clone(), 3e-3)).unwrap();

    // Faster, but failed.
    db.insert(&failed(
        &hw.id,
        w,
        cs[0].clone(),
        Status::Timeout,
        "over 10 s",
    ))
    .unwrap();
    // Faster, but a stale kernel version.
    let mut stale = ok(&hw.id, w, fastest_valid.clone(), 1e-4);
    stale.kernel_version = 999;
    db.insert(&stale).unwrap();
    // Faster, but a kernel family that no longer exists.
    let mut gone = ok(&hw.id, w, fastest_valid.clone(), 1e-4);
    gone.kernel = "retired_kernel".into();
    db.insert(&gone).unwrap();
    // Faster, but its config no longer fits the space (a knob that was removed).
    let mut removed_knob = fastest_valid.clone();
    removed_knob.set("zz_removed_knob", 7usize);
    db.insert(&ok(&hw.id, w, removed_knob, 1e-4)).unwrap();
    // Faster, but on another machine.
    let other = other_hw();
    db.upsert_fingerprint(&other).unwrap();
    db.insert(&ok(&other.id, w, fastest_valid.clone(), 1e-5))
        .unwrap();

    let best = db.best(&hw.id, &w).unwrap().expect("a usable record");
    assert_eq!(best.id, Some(winner));
    assert_eq!(best.config, fastest_valid);
    assert_eq!(best.kernel, k.name());
    assert_eq!(best.kernel_version, k.version());
    assert_eq!(best.median_s(), Some(2e-3));

    assert!(db.best(&hw.id, &gemm(3, 3, 3)).unwrap().is_none());
}

#[test]
fn best_skips_rows_whose_config_no_longer_parses() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let db = TuningDb::open(&path).unwrap();
    let hw = hw();
    db.upsert_fingerprint(&hw).unwrap();
    let w = gemm(64, 64, 64);
    let c = configs(&w, &hw, 1).remove(0);
    let id = db.insert(&ok(&hw.id, w, c.clone(), 1e-3)).unwrap();
    db.verify().unwrap();

    // Another program (or an old bug) wrote a faster row with garbage config JSON.
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute(
        "INSERT INTO trials (fingerprint_id, workload, op, kernel, kernel_version, config, \
         status, median_s, created_at, tool_version) \
         VALUES (?1, ?2, 'gemm', ?3, ?4, '{not json', 'ok', 1e-9, 'x', 'y')",
        rusqlite::params![hw.id, w.key(), family(&w).name(), family(&w).version()],
    )
    .unwrap();
    drop(raw);

    assert_eq!(db.best(&hw.id, &w).unwrap().unwrap().id, Some(id));
    assert_eq!(db.best_all(&hw.id).unwrap().len(), 1);
    assert_eq!(db.trials(&hw.id, &w).unwrap().len(), 1, "bad row skipped");
    let err = db.verify().unwrap_err();
    assert!(matches!(err, DbError::Verify { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("does not parse"), "{msg}");
    assert!(msg.contains(path.to_str().unwrap()), "{msg}");
}

/// A row another program wrote with an impossible time (a negative, zero or infinite median) is
/// never served, and `verify` names it.
#[test]
fn best_skips_and_verify_names_rows_with_impossible_times() {
    for median in ["-1e-9", "0", "1e999"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let db = TuningDb::open(&path).unwrap();
        let hw = hw();
        db.upsert_fingerprint(&hw).unwrap();
        let w = gemm(64, 64, 64);
        let cs = configs(&w, &hw, 2);
        let id = db.insert(&ok(&hw.id, w, cs[0].clone(), 1e-3)).unwrap();
        let raw = rusqlite::Connection::open(&path).unwrap();
        raw.execute(
            &format!(
                "INSERT INTO trials (fingerprint_id, workload, op, kernel, kernel_version, \
                 config, status, median_s, created_at, tool_version) \
                 VALUES (?1, ?2, 'gemm', ?3, ?4, ?5, 'ok', {median}, 'x', 'y')"
            ),
            rusqlite::params![
                hw.id,
                w.key(),
                family(&w).name(),
                family(&w).version(),
                cs[1].to_json()
            ],
        )
        .unwrap();
        drop(raw);
        assert_eq!(
            db.best(&hw.id, &w).unwrap().unwrap().id,
            Some(id),
            "{median}"
        );
        let msg = db.verify().unwrap_err().to_string();
        assert!(msg.contains("is not a positive time"), "{median}: {msg}");
    }
}

#[test]
fn best_all_returns_one_winner_per_workload() {
    let (db, hw) = db_with_hw();
    let ws = [gemm(16, 16, 16), gemm(128, 64, 32), gemm(512, 512, 512)];
    let mut expected = Vec::new();
    for (i, w) in ws.iter().enumerate() {
        let cs = configs(w, &hw, 2);
        db.insert(&ok(&hw.id, *w, cs[0].clone(), 4e-3 + i as f64))
            .unwrap();
        let win = db
            .insert(&ok(&hw.id, *w, cs[cs.len() - 1].clone(), 1e-3 + i as f64))
            .unwrap();
        let mut stale = ok(&hw.id, *w, cs[0].clone(), 1e-9);
        stale.kernel_version = 999;
        db.insert(&stale).unwrap();
        expected.push((w.key(), win));
    }
    // A workload with only failures and stale records has no winner.
    let lost = gemm(7, 7, 7);
    let c = configs(&lost, &hw, 1).remove(0);
    db.insert(&failed(&hw.id, lost, c.clone(), Status::Crashed, "SIGILL"))
        .unwrap();
    let mut stale = ok(&hw.id, lost, c, 1e-9);
    stale.kernel_version = 999;
    db.insert(&stale).unwrap();

    let all = db.best_all(&hw.id).unwrap();
    let mut got: Vec<(String, i64)> = all
        .iter()
        .map(|r| (r.workload.key(), r.id.unwrap()))
        .collect();
    got.sort();
    expected.sort();
    assert_eq!(got, expected);
    for r in &all {
        assert_eq!(db.best(&hw.id, &r.workload).unwrap().as_ref(), Some(r));
    }
    assert!(db.best_all(&other_hw().id).unwrap().is_empty());
}

#[test]
fn stats_count_records_fingerprints_and_workloads() {
    let (db, hw) = db_with_hw();
    assert_eq!(
        db.stats().unwrap(),
        tuning_db::Stats {
            fingerprints: 1,
            ..Default::default()
        }
    );
    let other = other_hw();
    db.upsert_fingerprint(&other).unwrap();
    let (a, b) = (gemm(8, 8, 8), gemm(9, 9, 9));
    let c = configs(&a, &hw, 1).remove(0);
    db.insert(&ok(&hw.id, a, c.clone(), 1e-3)).unwrap();
    db.insert(&ok(&other.id, a, c.clone(), 1e-3)).unwrap();
    db.insert(&failed(&hw.id, b, c.clone(), Status::Oom, "8 GiB"))
        .unwrap();
    let s = db.stats().unwrap();
    assert_eq!(
        (s.records, s.ok, s.failures, s.fingerprints, s.workloads),
        (3, 2, 1, 2, 2)
    );
    let json = serde_json::to_string(&s).unwrap();
    assert!(json.contains("\"failures\":1"), "{json}");
}

#[test]
fn fingerprints_round_trip_and_upsert_is_idempotent() {
    let (db, hw) = db_with_hw();
    let other = other_hw();
    db.upsert_fingerprint(&other).unwrap();
    db.upsert_fingerprint(&other).unwrap();
    assert_eq!(db.fingerprint(&other.id).unwrap(), Some(other.clone()));
    assert_eq!(db.fingerprint(&hw.id).unwrap(), Some(hw.clone()));
    assert_eq!(db.fingerprint("nope").unwrap(), None);
    let mut all = vec![hw.clone(), other.clone()];
    all.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(db.fingerprints().unwrap(), all);
    assert!(db
        .fingerprints()
        .unwrap()
        .iter()
        .all(|f| f.id_is_consistent()));
}

#[test]
fn insert_requires_a_known_fingerprint_and_is_all_or_nothing() {
    let (db, hw) = db_with_hw();
    let w = gemm(8, 8, 8);
    let c = configs(&w, &hw, 1).remove(0);
    let err = db
        .insert(&ok("feedfacefeedface", w, c.clone(), 1e-3))
        .unwrap_err();
    assert!(
        matches!(err, DbError::UnknownFingerprint { ref id, .. } if id == "feedfacefeedface"),
        "{err}"
    );
    assert!(err.to_string().contains("upsert_fingerprint"), "{err}");

    let batch = [
        ok(&hw.id, w, c.clone(), 1e-3),
        ok("feedfacefeedface", w, c.clone(), 1e-3),
    ];
    assert!(db.insert_many(&batch).is_err());
    assert_eq!(
        db.stats().unwrap().records,
        0,
        "the good half was rolled back"
    );
}

#[test]
fn insert_rejects_records_that_break_the_invariants() {
    let (db, hw) = db_with_hw();
    let w = gemm(8, 8, 8);
    let c = configs(&w, &hw, 1).remove(0);
    let mut no_timing = ok(&hw.id, w, c.clone(), 1e-3);
    no_timing.measurement = None;
    let mut timed_failure = failed(&hw.id, w, c.clone(), Status::Crashed, "x");
    timed_failure.measurement = Some(Measurement::from_samples(vec![1.0]));
    let mut nan = ok(&hw.id, w, c.clone(), 1e-3);
    nan.measurement.as_mut().unwrap().median_s = f64::NAN;
    let mut zero = ok(&hw.id, w, c.clone(), 1e-3);
    zero.measurement.as_mut().unwrap().median_s = 0.0;
    for r in [no_timing, timed_failure, nan, zero] {
        let err = db.insert(&r).unwrap_err();
        assert!(matches!(err, DbError::InvalidRecord { .. }), "{err}");
    }
    assert_eq!(db.stats().unwrap().records, 0);
}

#[test]
fn verify_passes_on_a_good_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("good.db");
    make_db(&path, 50);
    let db = TuningDb::open(&path).unwrap();
    let hw = hw();
    let w = gemm(64, 64, 64);
    let c = configs(&w, &hw, 1).remove(0);
    db.insert(&failed(&hw.id, w, c, Status::RunFailed, "panicked"))
        .unwrap();
    db.verify().unwrap();
    assert_eq!(db.stats().unwrap().records, 51);
    TuningDb::open_read_only(&path).unwrap().verify().unwrap();
}
