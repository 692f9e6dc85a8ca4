//! The lookup hot path under concurrency: per-thread index handles, the lock-free miss
//! cache, counters and several runtimes used from the same threads.

use std::collections::HashMap;
use std::sync::Arc;

use kernels::{default_for, HardwareFingerprint, Measurement, Workload};
use runtime::{Level, Runtime};
use tuning_db::{Record, TuningDb};

fn gemm(m: usize, n: usize, k: usize) -> Workload {
    Workload::gemm(m, n, k).unwrap()
}

/// A database with one record (the default config) per shape.
fn db_with(path: &std::path::Path, shapes: &[Workload]) {
    let db = TuningDb::open(path).unwrap();
    let hw = HardwareFingerprint::current();
    db.upsert_fingerprint(hw).unwrap();
    let recs: Vec<Record> = shapes
        .iter()
        .map(|&w| {
            let (k, c) = default_for(&w, hw).unwrap();
            let m = Measurement::from_samples(vec![1e-4, 1.01e-4, 0.99e-4]);
            Record::ok(&hw.id, w, k.name(), k.version(), c, m, "test")
        })
        .collect();
    db.insert_many(&recs).unwrap();
}

#[test]
fn concurrent_misses_share_one_cached_choice_per_workload() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let tuned: Vec<Workload> = [16, 64, 256].iter().map(|&m| gemm(m, 96, 96)).collect();
    db_with(&path, &tuned);
    let rt = Runtime::open(&path).unwrap();
    rt.set_fallback_check(false); // the structural levels, deterministically
    let untuned: Vec<Workload> = (0..200).map(|i| gemm(300 + i, 96, 96)).collect();
    let threads = 4;
    let rounds = 3;
    let seen: Vec<Vec<Arc<runtime::Choice>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (rt, untuned, tuned) = (&rt, &untuned, &tuned);
                s.spawn(move || {
                    let mut out = Vec::new();
                    for r in 0..rounds {
                        for (i, w) in untuned.iter().enumerate() {
                            // Threads walk the shapes in different orders.
                            let w = if (t + r) % 2 == 0 {
                                w
                            } else {
                                &untuned[untuned.len() - 1 - i]
                            };
                            let c = rt.lookup(w).unwrap();
                            assert_eq!(c.level, Level::NearestShape, "{w}");
                            if r == rounds - 1 {
                                out.push(c);
                            }
                        }
                        for w in tuned {
                            assert_eq!(rt.lookup(w).unwrap().level, Level::Exact);
                        }
                    }
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // After the first round every workload is cached: all threads share one handle each.
    let mut distinct: HashMap<String, Arc<runtime::Choice>> = HashMap::new();
    for c in seen.into_iter().flatten() {
        // Distinct workloads never share a handle, so one handle per workload means
        // exactly as many distinct handles as workloads.
        distinct
            .entry(format!("{:p}", Arc::as_ptr(&c)))
            .or_insert(c);
    }
    assert_eq!(
        distinct.len(),
        untuned.len(),
        "one shared choice per workload"
    );
    assert_eq!(rt.index_info().cached_misses, untuned.len());
    let n = rt.lookups();
    let per_thread = (rounds * (untuned.len() + tuned.len())) as u64;
    assert_eq!(n.total(), threads as u64 * per_thread);
    assert_eq!(n.levels.exact, (threads * rounds * tuned.len()) as u64);
}

#[test]
fn many_runtimes_on_one_thread_each_serve_their_own_index() {
    // More runtimes than per-thread slots: they share slots and must never serve each
    // other's tables.
    let dir = tempfile::tempdir().unwrap();
    let mut rts = Vec::new();
    for i in 0..7 {
        let path = dir.path().join(format!("t{i}.db"));
        db_with(&path, &[gemm(40 + i, 64, 64)]);
        let rt = Runtime::open(&path).unwrap();
        rt.set_fallback_check(false); // the structural levels, deterministically
        rts.push(rt);
    }
    for round in 0..3 {
        for (i, rt) in rts.iter().enumerate() {
            for (j, _) in rts.iter().enumerate() {
                let w = gemm(40 + j, 64, 64);
                let want = if i == j {
                    Level::Exact
                } else {
                    Level::NearestShape
                };
                assert_eq!(
                    rt.lookup(&w).unwrap().level,
                    want,
                    "round {round}: runtime {i}, {w}"
                );
            }
        }
    }
    // Dropping a runtime and making a new one (possibly at the same address) serves the
    // new one's index.
    rts.clear();
    let path = dir.path().join("fresh.db");
    db_with(&path, &[gemm(99, 64, 64)]);
    let rt = Runtime::open(&path).unwrap();
    rt.set_fallback_check(false); // the structural levels, deterministically
    assert_eq!(rt.lookup(&gemm(99, 64, 64)).unwrap().level, Level::Exact);
    assert_ne!(rt.lookup(&gemm(40, 64, 64)).unwrap().level, Level::Exact);
}

#[test]
fn unvalidated_huge_workloads_are_resolved_not_mis_keyed() {
    // Fields are public: a workload may bypass validation. Its key cannot be packed, so it
    // is resolved on every call and never collides with a valid one in the cache.
    let rt = Runtime::defaults_only();
    let huge = Workload::Gemm {
        m: (1 << 21) + 3,
        n: 4,
        k: 4,
        dtype: kernels::DType::F32,
    };
    let small = gemm(3, 4, 4);
    let a = rt.resolve(&small).unwrap();
    assert_eq!(rt.lookup(&small).unwrap().level, Level::Default);
    let c = rt.lookup(&huge).unwrap();
    assert_eq!(c.level, Level::Default);
    assert_eq!(
        rt.index_info().cached_misses,
        1,
        "the huge workload is not cached"
    );
    assert_eq!(a.config, rt.lookup(&small).unwrap().config);
}
