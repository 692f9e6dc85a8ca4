//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::Path;

use kernels::{registry, Config, HardwareFingerprint, Kernel, Measurement, Status, Workload};
use tuning_db::Record;

pub const TOOL: &str = "test-0.0.0";

/// This machine: `best` checks configs against the space for the stored fingerprint.
pub fn hw() -> HardwareFingerprint {
    HardwareFingerprint::current().clone()
}

/// A made-up second machine.
pub fn other_hw() -> HardwareFingerprint {
    HardwareFingerprint::new(
        "x86_64",
        "GenuineIntel",
        (6, 143, 8),
        "Test Xeon",
        vec!["avx2".into(), "fma".into(), "avx512f".into()],
        8,
        (48 << 10, 2 << 20, 105 << 20),
    )
}

pub fn gemm(m: usize, n: usize, k: usize) -> Workload {
    Workload::gemm(m, n, k).unwrap()
}

/// The first registered family supporting `w`.
pub fn family(w: &Workload) -> &'static dyn Kernel {
    registry()
        .iter()
        .copied()
        .find(|k| k.supports(w))
        .expect("a kernel family supports gemm")
}

/// Up to `n` distinct valid configs of `family(w)` on `hw` (at least one: the default).
pub fn configs(w: &Workload, hw: &HardwareFingerprint, n: usize) -> Vec<Config> {
    let k = family(w);
    let mut v: Vec<Config> = k.space(w, hw).iter_valid().take(n).collect();
    if v.is_empty() {
        v.push(k.default_config(w, hw));
    }
    v
}

pub fn ok(fp: &str, w: Workload, config: Config, median: f64) -> Record {
    let k = family(&w);
    Record::ok(
        fp,
        w,
        k.name(),
        k.version(),
        config,
        Measurement::from_samples(vec![median * 1.01, median, median * 0.99]),
        TOOL,
    )
}

pub fn failed(fp: &str, w: Workload, config: Config, status: Status, msg: &str) -> Record {
    let k = family(&w);
    Record::failed(fp, w, k.name(), k.version(), config, status, msg, TOOL)
}

pub fn bytes(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap()
}

/// A real database file with `n` ok records on `hw()`, closed.
pub fn make_db(path: &Path, n: usize) {
    let db = tuning_db::TuningDb::open(path).unwrap();
    let hw = hw();
    db.upsert_fingerprint(&hw).unwrap();
    let w = gemm(64, 64, 64);
    let c = configs(&w, &hw, 1).remove(0);
    let recs: Vec<Record> = (0..n)
        .map(|i| ok(&hw.id, w, c.clone(), 1e-3 + i as f64 * 1e-6))
        .collect();
    db.insert_many(&recs).unwrap();
}
