//! History queries for learning: every timed trial of a machine, across workloads, so a cost
//! model can transfer what it learned on other shapes to the one being tuned.

use kernels::{Status, Workload};

use crate::db::TuningDb;
use crate::error::Result;
use crate::record::Record;

impl TuningDb {
    /// Every `ok` trial on fingerprint `fingerprint_id`, all workloads and kernel versions,
    /// grouped by workload (in key order), each group in insertion order. Rows that no longer
    /// parse are skipped (as in [`trials`](Self::trials)); callers decide which kernel
    /// versions they trust.
    pub fn ok_records(&self, fingerprint_id: &str) -> Result<Vec<Record>> {
        // The workloads with at least one usable ok record, then each one's trials.
        let mut workloads: Vec<Workload> = self
            .best_all(fingerprint_id)?
            .into_iter()
            .map(|r| r.workload)
            .collect();
        workloads.dedup();
        let mut out = Vec::new();
        for w in workloads {
            out.extend(
                self.trials(fingerprint_id, &w)?
                    .into_iter()
                    .filter(|r| r.status == Status::Ok && r.measurement.is_some()),
            );
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use kernels::{default_for, HardwareFingerprint, Measurement, Status, Workload};

    use crate::{Record, TuningDb};

    #[test]
    fn ok_records_span_workloads_and_skip_failures_and_other_machines() {
        let db = TuningDb::in_memory().unwrap();
        let hw = HardwareFingerprint::current();
        let other = hw.with_cores(hw.cores + 1);
        db.upsert_fingerprint(hw).unwrap();
        db.upsert_fingerprint(&other).unwrap();
        let m = || Measurement::from_samples(vec![1e-3, 1.1e-3, 0.9e-3]);
        let (a, b): (Workload, Workload) = (
            "gemm:8x8x8".parse().unwrap(),
            "gemm:16x8x8".parse().unwrap(),
        );
        let rec = |fp: &HardwareFingerprint, w: Workload, ok: bool| {
            let (k, c) = default_for(&w, fp).unwrap();
            if ok {
                Record::ok(&fp.id, w, k.name(), k.version(), c, m(), "t")
            } else {
                Record::failed(
                    &fp.id,
                    w,
                    k.name(),
                    k.version(),
                    c,
                    Status::WrongResult,
                    "x",
                    "t",
                )
            }
        };
        db.insert_many(&[
            rec(hw, a, true),
            rec(hw, a, false),
            rec(hw, b, true),
            rec(&other, a, true),
        ])
        .unwrap();
        let got = db.ok_records(&hw.id).unwrap();
        assert_eq!(got.len(), 2);
        // Grouped by workload key: "gemm:16x8x8" < "gemm:8x8x8".
        assert_eq!((got[0].workload, got[1].workload), (b, a));
        assert!(got
            .iter()
            .all(|r| r.status == Status::Ok && r.fingerprint_id == hw.id));
        assert_eq!(db.ok_records(&other.id).unwrap().len(), 1);
        assert!(db.ok_records("0000000000000000").unwrap().is_empty());
    }
}
