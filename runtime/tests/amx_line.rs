//! The AMX flags split micro-architectures: records of a machine whose OS granted AMX are
//! never served (same_arch, nearest_shape) to one without it, and the other way round.

use kernels::{default_for, HardwareFingerprint, Measurement, Workload};
use runtime::{Level, Runtime};
use tuning_db::{Record, TuningDb};

/// `hw` with `flags` added (its id follows; everything else is the same machine).
fn with_flags(hw: &HardwareFingerprint, flags: &[&str]) -> HardwareFingerprint {
    let mut isa = hw.isa.clone();
    isa.extend(flags.iter().map(|f| f.to_string()));
    HardwareFingerprint::new(
        &hw.arch,
        &hw.vendor,
        (hw.family, hw.model, hw.stepping),
        &hw.brand,
        isa,
        hw.cores,
        (hw.l1d_bytes, hw.l2_bytes, hw.l3_bytes),
    )
}

/// A record of `w`'s default on `fp` (a valid config on this machine's space).
fn record(fp: &HardwareFingerprint, w: &Workload) -> Record {
    let here = HardwareFingerprint::current();
    let (k, c) = default_for(w, here).unwrap();
    let m = Measurement::from_samples(vec![1e-5; 3]);
    Record::ok(&fp.id, *w, k.name(), k.version(), c, m, "test")
}

#[test]
fn amx_and_non_amx_records_never_serve_each_other() {
    let plain = HardwareFingerprint::current().without_amx();
    let amx = with_flags(&plain, &["amx_tile", "amx_bf16", "amx_int8"]);
    assert_ne!(plain.arch_key(), amx.arch_key());
    let w: Workload = "gemm:64x64x64".parse().unwrap();
    let near: Workload = "gemm:64x64x72".parse().unwrap();
    for (stored, served) in [(&amx, &plain), (&plain, &amx)] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let db = TuningDb::open(&path).unwrap();
        // Stored at another core count: the same_arch level would take it if the key matched.
        let sibling = stored.with_cores(stored.cores + 3);
        db.upsert_fingerprint(&sibling).unwrap();
        db.insert(&record(&sibling, &w)).unwrap();
        drop(db);
        let rt = Runtime::open_for(&path, served.clone()).unwrap();
        rt.set_fallback_check(false);
        assert_eq!(rt.lookup(&w).unwrap().level, Level::Default, "{stored:?}");
        assert_eq!(rt.lookup(&near).unwrap().level, Level::Default);
        // Its own arch does take it: the line is the AMX flags, nothing else.
        let own = Runtime::open_for(&path, stored.clone()).unwrap();
        own.set_fallback_check(false);
        assert_eq!(own.lookup(&w).unwrap().level, Level::SameArch);
    }
}
