//! The runtime's fallback levels, its index snapshot and reload, its counters and its
//! untuned-workload log, against real database files.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kernels::{default_for, Config, HardwareFingerprint, Measurement, Problem, Workload};
use runtime::{Level, Runtime};
use tuning_db::{Record, TuningDb};

fn gemm(m: usize, n: usize, k: usize) -> Workload {
    Workload::gemm(m, n, k).unwrap()
}

/// A machine of another micro-architecture (other vendor, model and ISA).
fn foreign() -> HardwareFingerprint {
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

/// This machine at another thread count: same arch key, another fingerprint.
fn sibling() -> HardwareFingerprint {
    let hw = HardwareFingerprint::current();
    hw.with_cores(hw.cores + 7)
}

/// A valid config of the packed family for `w` on this machine that is not the default.
fn tuned_config(w: &Workload) -> (String, Config) {
    let hw = HardwareFingerprint::current();
    let (k, d) = default_for(w, hw).unwrap();
    let c = k
        .space(w, hw)
        .iter_valid()
        .find(|c| *c != d && c.int("threads") == Some(1))
        .unwrap();
    (k.name().to_string(), c)
}

fn record(fp: &HardwareFingerprint, w: Workload, config: Config, median: f64) -> Record {
    let (name, _) = tuned_config(&w);
    let k = kernels::kernel(&name).unwrap();
    Record::ok(
        &fp.id,
        w,
        k.name(),
        k.version(),
        config,
        Measurement::from_samples(vec![median * 1.01, median, median * 0.99]),
        "test",
    )
}

fn add(path: &Path, fp: &HardwareFingerprint, recs: &[Record]) {
    let db = TuningDb::open(path).unwrap();
    db.upsert_fingerprint(fp).unwrap();
    db.insert_many(recs).unwrap();
}

#[test]
fn exact_then_same_arch_then_nearest_shape_then_default() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let here = HardwareFingerprint::current().clone();
    // Shapes whose defaults are serial (a borrowed config must keep the default's threads).
    let (w_exact, w_sib, w_foreign) = (gemm(24, 24, 24), gemm(36, 36, 36), gemm(48, 48, 48));
    let (_, c_exact) = tuned_config(&w_exact);
    let (_, c_sib) = tuned_config(&w_sib);
    let (_, c_foreign) = tuned_config(&w_foreign);
    add(
        &path,
        &here,
        &[record(&here, w_exact, c_exact.clone(), 1e-4)],
    );
    add(
        &path,
        &sibling(),
        &[record(&sibling(), w_sib, c_sib.clone(), 2e-4)],
    );
    add(
        &path,
        &foreign(),
        &[record(&foreign(), w_foreign, c_foreign.clone(), 1e-5)],
    );

    let rt = Runtime::open(&path).unwrap();
    rt.set_fallback_check(false); // the structural levels, deterministically
    assert!(rt.skipped().is_empty(), "{:?}", rt.skipped());
    let info = rt.index_info();
    assert_eq!((info.exact, info.same_arch), (1, 1), "{info:?}");
    assert_eq!(info.same_arch_fingerprints, 1);

    let c = rt.lookup(&w_exact).unwrap();
    assert_eq!((c.level, &c.config), (Level::Exact, &c_exact));
    let c = rt.lookup(&w_sib).unwrap();
    assert_eq!((c.level, &c.config), (Level::SameArch, &c_sib));
    assert_eq!(c.source.as_ref().unwrap().fingerprint_id, sibling().id);

    // The foreign record is never served, even for its own workload: the nearest tuned shape
    // of this arch (36³ is nearer to 48³ than 24³ is) lends its config instead.
    let c = rt.lookup(&w_foreign).unwrap();
    assert_eq!(c.level, Level::NearestShape);
    let src = c.source.as_ref().unwrap();
    assert_eq!(src.workload, w_sib);
    assert!((src.distance - 3f64.sqrt() * (128f64 / 96.0).log2()).abs() < 1e-9);
    assert_eq!(c.config, c_sib);

    // An op or shape class nobody tuned: the default.
    let tiny = gemm(1, 7, 5);
    let c = rt.lookup(&tiny).unwrap();
    assert!(matches!(c.level, Level::NearestShape | Level::Default));

    let counts = rt.lookups();
    assert_eq!(counts.levels.exact, 1);
    assert_eq!(counts.levels.same_arch, 1);
    assert_eq!(counts.total(), 4);
}

#[test]
fn nearest_shape_skips_configs_invalid_for_the_new_shape_and_runs_correctly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let here = HardwareFingerprint::current().clone();
    // A config for M = 512 with mc = 384: the space caps mc at the first listed value >= M,
    // so it is not valid for M = 40 and must be passed over for the farther 16-row shape.
    let big = gemm(512, 64, 64);
    let small = gemm(16, 64, 64);
    let (name, mut c_big) = tuned_config(&big);
    assert_eq!(name, "gemm_packed");
    c_big.set("mc", 384usize);
    let (_, c_small) = tuned_config(&small);
    add(
        &path,
        &here,
        &[
            record(&here, big, c_big.clone(), 1e-3),
            record(&here, small, c_small.clone(), 1e-4),
        ],
    );
    let rt = Runtime::open(&path).unwrap();
    rt.set_fallback_check(false); // the structural levels, deterministically
    let w = gemm(40, 64, 64);
    let c = rt.lookup(&w).unwrap();
    assert_eq!(c.level, Level::NearestShape);
    assert_eq!(c.source.as_ref().unwrap().workload, small, "{c:?}");

    // Served through the runtime, the result is right.
    let p = Problem::random(&w, 3);
    let mut out = p.output();
    assert_eq!(
        rt.run(&w, &p.input_slices(), &mut out).unwrap(),
        Level::NearestShape
    );
    p.check(&out, &p.reference()).unwrap();

    // A repeated miss is served from the cache: the same handle.
    let again = rt.lookup(&w).unwrap();
    assert!(Arc::ptr_eq(&c, &again));
    assert_eq!(rt.index_info().cached_misses, 1);
    assert_eq!(rt.lookups().levels.nearest_shape, 3);
}

#[test]
fn a_record_whose_config_no_longer_fits_is_skipped_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let here = HardwareFingerprint::current().clone();
    let w = gemm(64, 64, 64);
    let (_, mut c) = tuned_config(&w);
    c.set("mc", 1000usize);
    add(&path, &here, &[record(&here, w, c, 1e-4)]);
    let rt = Runtime::open(&path).unwrap();
    rt.set_fallback_check(false); // the structural levels, deterministically
    let skipped = rt.skipped();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert_eq!(skipped[0].workload, "gemm:64x64x64");
    assert!(
        skipped[0].reason.contains("'mc' = 1000"),
        "{}",
        skipped[0].reason
    );
    assert_eq!(rt.lookup(&w).unwrap().level, Level::Default);
    // `lookup --json` (and the C ABI's and Python's lookups) say so too.
    let j = rt.lookup_json(&w, "cpu").unwrap();
    assert_eq!(j["not_served"], skipped[0].reason.as_str());
    assert!(rt.lookup_json(&gemm(8, 8, 8), "cpu").unwrap()["not_served"].is_null());
}

#[test]
fn a_sibling_record_that_does_not_fit_here_is_skipped_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let sib = sibling();
    let (w, w_served) = (gemm(64, 64, 64), gemm(96, 96, 96));
    // Valid on the sibling (its core count), not here: more threads than this machine has.
    let (name, mut c) = tuned_config(&w);
    c.set("threads", sib.cores);
    c.set("par", "m");
    let k = kernels::kernel(&name).unwrap();
    assert!(k.space(&w, &sib).check(&c).is_ok(), "{c}");
    let (_, c_ok) = tuned_config(&w_served);
    add(
        &path,
        &sib,
        &[record(&sib, w, c, 1e-4), record(&sib, w_served, c_ok, 1e-4)],
    );
    let rt = Runtime::open(&path).unwrap();
    rt.set_fallback_check(false);
    let skipped = rt.skipped();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert_eq!(skipped[0].workload, w.key());
    assert!(
        skipped[0].reason.contains(&sib.id) && skipped[0].reason.contains("threads"),
        "{}",
        skipped[0].reason
    );
    assert_ne!(rt.lookup(&w).unwrap().level, Level::SameArch);
    assert_eq!(rt.lookup(&w_served).unwrap().level, Level::SameArch);
}

#[test]
fn bad_files_are_errors_and_open_or_defaults_serves_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.db");
    std::fs::write(
        &junk,
        b"this is not a database, just some bytes of text....",
    )
    .unwrap();
    let e = Runtime::open(&junk).err().expect("refused");
    assert!(e.to_string().contains("junk.db"), "{e}");
    let rt = Runtime::open_or_defaults(&junk);
    assert!(rt.load_error().unwrap().contains("junk.db"));
    assert_eq!(rt.lookup(&gemm(8, 8, 8)).unwrap().level, Level::Default);

    // Once a good file is in place, reload picks it up.
    let here = HardwareFingerprint::current().clone();
    std::fs::remove_file(&junk).unwrap();
    let w = gemm(64, 64, 64);
    add(&junk, &here, &[record(&here, w, tuned_config(&w).1, 1e-4)]);
    let info = rt.reload().unwrap();
    assert_eq!(info.exact, 1);
    assert_eq!(rt.load_error(), None);
    assert_eq!(rt.lookup(&w).unwrap().level, Level::Exact);
}

#[test]
fn reload_swaps_the_index_while_other_threads_serve() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let here = HardwareFingerprint::current().clone();
    let w1 = gemm(32, 32, 32);
    let w2 = gemm(40, 40, 40);
    add(
        &path,
        &here,
        &[record(&here, w1, tuned_config(&w1).1, 1e-4)],
    );
    let rt = Runtime::open(&path).unwrap();
    rt.set_fallback_check(false); // the structural levels, deterministically
    assert_eq!(rt.lookup(&w2).unwrap().level, Level::NearestShape);

    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let p = Problem::random(&w1, 1);
                let mut out = p.output();
                while !stop.load(Ordering::Relaxed) {
                    assert_eq!(
                        rt.run(&w1, &p.input_slices(), &mut out).unwrap(),
                        Level::Exact
                    );
                    let l = rt.lookup(&w2).unwrap().level;
                    assert!(matches!(l, Level::NearestShape | Level::Exact), "{l}");
                }
            });
        }
        // A writer adds a record for w2 while the runtime serves; reload makes it exact.
        add(
            &path,
            &here,
            &[record(&here, w2, tuned_config(&w2).1, 1e-4)],
        );
        let info = rt.reload().unwrap();
        assert_eq!(info.exact, 2);
        assert_eq!(info.generation, 2);
        stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(rt.lookup(&w2).unwrap().level, Level::Exact);
}

#[test]
fn fallback_workloads_are_logged_once() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("untuned.txt");
    let rt = Runtime::defaults_only();
    rt.log_fallbacks_to(&log).unwrap();
    assert!(rt.log_fallbacks_to(&log).is_err(), "set once");
    for _ in 0..3 {
        rt.lookup(&gemm(3, 4, 5)).unwrap();
        rt.lookup(&gemm(6, 7, 8)).unwrap();
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text, "gemm:3x4x5  # default\ngemm:6x7x8  # default\n");
    assert_eq!(rt.lookups().levels.default, 6);
    assert_eq!(rt.fallback_log_errors().0, 0);
}

#[test]
fn a_device_or_directory_is_not_a_fallback_log() {
    // /dev/zero would be read back without end; /dev/null and a directory are no log either.
    let dir = tempfile::tempdir().unwrap();
    for path in [Path::new("/dev/zero"), Path::new("/dev/null"), dir.path()] {
        if !path.exists() {
            continue;
        }
        let e = Runtime::defaults_only().log_fallbacks_to(path).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
}

/// A tuned shape lends its config only where it is expected to beat the default: within
/// `NEAREST_MAX_DISTANCE` and with the default's thread count (the case: a
/// two-thread config of `gemm:8x3072x768` had served `gemm:4x96x96` 28× slower than the
/// serial default). Served for this machine at two threads, so the rule means the same on
/// every CPU.
#[test]
fn a_borrowed_config_must_suit_the_new_shape() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let hw = HardwareFingerprint::current().with_cores(2);
    let threads = |w: &Workload| default_for(w, &hw).unwrap().1.int("threads").unwrap();
    let config_with = |w: &Workload, t: i64| {
        let (k, d) = default_for(w, &hw).unwrap();
        k.space(w, &hw)
            .iter_valid()
            .find(|c| *c != d && c.int("threads") == Some(t))
            .unwrap()
    };
    let (big, small) = (gemm(8, 3072, 768), gemm(24, 24, 24));
    assert_eq!(threads(&big), 2, "a large shape splits over both threads");
    assert_eq!(threads(&small), 1);
    let (c_big, c_small) = (config_with(&big, 2), config_with(&small, 1));
    add(
        &path,
        &hw,
        &[
            record(&hw, big, c_big, 1e-4),
            record(&hw, small, c_small.clone(), 1e-6),
        ],
    );
    let rt = Runtime::open_for(&path, hw.clone()).unwrap();
    rt.set_fallback_check(false); // the structural rules alone
                                  // Near and with the same thread count: borrowed.
    let near = gemm(30, 30, 30);
    let c = rt.lookup(&near).unwrap();
    assert_eq!((c.level, &c.config), (Level::NearestShape, &c_small));
    let d = c.source.as_ref().unwrap().distance;
    assert!(d < runtime::NEAREST_MAX_DISTANCE, "{d}");
    // The serial default for a tiny shape, not the large shape's two-thread config.
    let tiny = gemm(4, 96, 96);
    assert_eq!(threads(&tiny), 1);
    assert_eq!(rt.lookup(&tiny).unwrap().level, Level::Default);
    // Same thread count but too far (distance 2.2 from 24³): the default.
    let far = gemm(64, 64, 48);
    assert_eq!(threads(&far), 1);
    assert_eq!(rt.lookup(&far).unwrap().level, Level::Default);
}

/// A tuned attention variant that reads `[B, H, S, D]` operands only (the unfused family)
/// still serves attention over a fused QKV projection's rows — through head copies — at its
/// record's level, padded batches included, and agrees with the default (fused, in place).
#[test]
fn attention_over_qkv_rows_is_served_by_a_heads_only_variant_too() {
    use kernels::cpu::attention::Unfused;
    use kernels::Kernel;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let here = HardwareFingerprint::current().clone();
    let (batch, seq, heads, d) = (2, 19, 3, 16);
    let w = Workload::attention(batch, heads, seq, d, false).unwrap();
    let rec = Record::ok(
        &here.id,
        w,
        Unfused.name(),
        Unfused.version(),
        Unfused.default_config(&w, &here),
        Measurement::from_samples(vec![1e-4; 3]),
        "test",
    );
    add(&path, &here, &[rec]);
    let rt = Runtime::open(&path).unwrap();
    assert_eq!(rt.lookup(&w).unwrap().kernel.name(), Unfused.name());
    let dims = runtime::AttentionRows {
        batch,
        seq,
        heads,
        d,
        causal: false,
    };
    let n = dims.len();
    let qkv: Vec<f32> = (0..3 * n).map(|i| (i as f32 * 0.37).cos()).collect();
    let defaults = Runtime::defaults_only();
    for lens in [None, Some(&[19, 5][..])] {
        let mut got = vec![f32::NAN; n];
        let level = rt.attention_qkv(dims, lens, &qkv, &mut got).unwrap();
        assert_eq!(level, Level::Exact);
        let mut want = vec![f32::NAN; n];
        defaults.attention_qkv(dims, lens, &qkv, &mut want).unwrap();
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-5, "{lens:?}: {worst}");
    }
}

/// Attention's QKV-rows entry point called on a GEMM's choice is an error naming the
/// operands, not a panic (it is public: a caller can hold any `Choice`).
#[test]
fn qkv_rows_on_a_gemm_choice_is_an_error() {
    let rt = Runtime::defaults_only();
    let choice = rt.lookup(&gemm(4, 4, 4)).unwrap();
    let (qkv, mut out) = (vec![0.0f32; 48], vec![0.0f32; 16]);
    let err = choice.run_qkv_rows((&qkv, None), &mut out).unwrap_err();
    assert!(err.to_string().contains("not attention"), "{err}");
}

/// When a workload's fastest records go stale (a family's new version), the fastest record
/// left is served only if it beat the default config measured beside it: a runner-up never
/// compared with the default (measured 25x slower in a review) falls to the fallback levels
/// and is listed as to re-tune.
#[test]
fn a_runner_up_left_by_stale_records_is_served_only_if_it_beat_the_default() {
    let hw = HardwareFingerprint::current();
    let dir = tempfile::tempdir().unwrap();
    // (the default's own record still served?, the runner-up's median, what serves)
    for (default_usable, runner_up_s, served) in [
        (false, 50e-6, Level::Default),
        (true, 5e-6, Level::Exact),
        // The default's record is stale, but it measured the same config here: compared.
        (false, 5e-6, Level::Exact),
    ] {
        let path = dir
            .path()
            .join(format!("{default_usable}-{runner_up_s}.db"));
        let db = TuningDb::open(&path).unwrap();
        db.upsert_fingerprint(hw).unwrap();
        let w = gemm(48, 40, 36);
        let (k, default) = default_for(&w, hw).unwrap();
        let (_, other) = tuned_config(&w);
        let mut stale = record(hw, w, other.clone(), 1e-6);
        stale.kernel_version = k.version() + 1;
        db.insert(&stale).unwrap();
        let mut d = record(hw, w, default.clone(), 10e-6);
        if !default_usable {
            d.kernel_version = k.version() + 1;
        }
        db.insert(&d).unwrap();
        // A third config of the family, current version: the runner-up.
        let third = k
            .space(&w, hw)
            .iter_valid()
            .find(|c| *c != default && *c != other);
        db.insert(&record(hw, w, third.unwrap(), runner_up_s))
            .unwrap();
        drop(db);
        let rt = Runtime::open(&path).unwrap();
        rt.set_fallback_check(false);
        let choice = rt.lookup(&w).unwrap();
        if served == Level::Exact {
            // Faster than the default measured beside it: served.
            assert_eq!(choice.level, Level::Exact);
            assert_eq!(
                choice.source.as_ref().unwrap().trial_id,
                Some(3),
                "the runner-up"
            );
            continue;
        }
        assert_ne!(choice.level, Level::Exact, "{choice:?}");
        let skipped = rt.skipped();
        assert_eq!(skipped.len(), 1, "{skipped:?}");
        assert!(skipped[0].reason.contains("re-tune"), "{skipped:?}");
    }
}

/// A faster record whose config was damaged in the file does not pass silently: the next one
/// serves, and `skipped` (the CLI's warning, `lookup --json`'s `not_served`) names the row.
#[test]
fn an_unreadable_faster_record_is_reported_while_the_next_serves() {
    let hw = HardwareFingerprint::current();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let w = gemm(40, 24, 56);
    let (_, tuned) = tuned_config(&w);
    let (_, default) = default_for(&w, hw).unwrap();
    {
        let db = TuningDb::open(&path).unwrap();
        db.upsert_fingerprint(hw).unwrap();
        db.insert(&record(hw, w, tuned, 1e-6)).unwrap();
        db.insert(&record(hw, w, default, 2e-6)).unwrap();
    }
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute("UPDATE trials SET config = 'not json{' WHERE id = 1", [])
        .unwrap();
    drop(raw);
    let rt = Runtime::open(&path).unwrap();
    rt.set_fallback_check(false);
    let choice = rt.lookup(&w).unwrap();
    assert_eq!(choice.level, Level::Exact);
    assert_eq!(choice.source.as_ref().unwrap().trial_id, Some(2));
    let skipped = rt.skipped();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert_eq!(skipped[0].workload, w.key());
    assert!(
        skipped[0].reason.contains("record 1 does not read back")
            && skipped[0].reason.contains("not json{"),
        "{skipped:?}"
    );
    let json = rt.lookup_json(&w, "cpu").unwrap();
    assert!(
        json["not_served"].as_str().unwrap().contains("record 1"),
        "{json}"
    );
}
