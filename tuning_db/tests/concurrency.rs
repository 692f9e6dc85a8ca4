//! Two writers on one file at once both succeed (WAL, busy timeout, short immediate
//! transactions).

mod common;

use std::sync::{Arc, Barrier};

use common::*;
use tuning_db::TuningDb;

#[test]
fn two_writers_insert_concurrently() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.db");
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = (0..2)
        .map(|t| {
            let path = path.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                // Both open the brand-new file at the same moment: both race to initialise it.
                barrier.wait();
                let db = TuningDb::open(&path).unwrap();
                let hw = hw();
                db.upsert_fingerprint(&hw).unwrap();
                let w = gemm(64, 32 + t, 16);
                let c = configs(&w, &hw, 1).remove(0);
                for i in 0..200 {
                    db.insert(&ok(&hw.id, w, c.clone(), 1e-3 + i as f64 * 1e-7))
                        .unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let db = TuningDb::open(&path).unwrap();
    let s = db.stats().unwrap();
    assert_eq!(
        (s.records, s.ok, s.workloads, s.fingerprints),
        (400, 400, 2, 1)
    );
    db.verify().unwrap();
}
