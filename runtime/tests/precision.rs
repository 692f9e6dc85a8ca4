//! The precision policy: which element type an f32 call is served in, from the records'
//! stored accuracy and speed; and weights packed for the element type chosen per M.

use std::path::Path;

use kernels::{
    default_for, Accuracy, Act, DType, HardwareFingerprint, Measurement, Problem, Workload,
};
use runtime::{Level, MedianFrom, PrecisionPolicy, Runtime};
use tuning_db::{Record, Remeasurement, TuningDb, WinnerDecision};

/// A record of `w`'s family default on this machine, with its median and accuracy.
fn record(w: &Workload, median: f64, max_rel_err: Option<f64>) -> Record {
    let hw = HardwareFingerprint::current();
    let (k, c) = default_for(w, hw).unwrap();
    Record::ok(
        &hw.id,
        *w,
        k.name(),
        k.version(),
        c,
        Measurement::from_samples(vec![median; 3]),
        "test",
    )
    .with_accuracy(max_rel_err.map(|e| Accuracy {
        max_rel_err: e,
        fro_rel_err: e / 3.0,
    }))
}

fn db_with(path: &Path, recs: &[Record]) -> Runtime {
    let db = TuningDb::open(path).unwrap();
    db.upsert_fingerprint(HardwareFingerprint::current())
        .unwrap();
    db.insert_many(recs).unwrap();
    drop(db);
    let rt = Runtime::open(path).unwrap();
    rt.set_fallback_check(false);
    rt
}

#[test]
fn the_policy_picks_the_element_type_from_stored_accuracy_and_speed() {
    let dir = tempfile::tempdir().unwrap();
    let w: Workload = "gemm:48x64x96".parse().unwrap();
    let i8w = w.with_dtype(DType::I8);
    let rt = db_with(
        &dir.path().join("t.db"),
        &[record(&w, 2e-5, Some(1e-7)), record(&i8w, 1e-5, Some(4e-3))],
    );
    // f32 only until told otherwise.
    assert_eq!(rt.precision(), PrecisionPolicy::exact());
    assert_eq!(rt.serve_as(&w), w);
    rt.set_precision("int8".parse().unwrap());
    assert_eq!(rt.serve_as(&w), i8w);
    rt.set_precision(PrecisionPolicy::only(DType::I8).with_max_rel_err(1e-3));
    assert_eq!(rt.serve_as(&w), w, "4e-3 is over the budget");
    rt.set_precision(PrecisionPolicy::only(DType::I8).with_max_rel_err(5e-3));
    assert_eq!(rt.serve_as(&w), i8w);
    // auto: the faster measured record within the default budget.
    rt.set_precision(PrecisionPolicy::auto());
    assert_eq!(rt.serve_as(&w), i8w);
    rt.set_precision(PrecisionPolicy::auto().with_max_rel_err(1e-3));
    assert_eq!(rt.serve_as(&w), w);
    // Workloads of an explicit element type are served as they are; bf16 is not tuned here.
    assert_eq!(rt.serve_as(&i8w), i8w);
    rt.set_precision(PrecisionPolicy::only(DType::Bf16).with_max_rel_err(1.0));
    assert_eq!(
        rt.serve_as(&w),
        w,
        "no bf16 record: nothing measured to fit the budget"
    );
    // An untuned shape: int8 without a budget serves the family default, with one f32.
    let other: Workload = "gemm:5x7x9".parse().unwrap();
    rt.set_precision("int8".parse().unwrap());
    assert_eq!(rt.serve_as(&other), other.with_dtype(DType::I8));
    rt.set_precision(PrecisionPolicy::only(DType::I8).with_max_rel_err(1.0));
    assert_eq!(rt.serve_as(&other), other);
}

#[test]
fn auto_keeps_f32_when_it_was_measured_faster() {
    let dir = tempfile::tempdir().unwrap();
    let w: Workload = "gemm:48x64x96".parse().unwrap();
    let i8w = w.with_dtype(DType::I8);
    let rt = db_with(
        &dir.path().join("t.db"),
        &[record(&w, 1e-5, Some(1e-7)), record(&i8w, 3e-5, Some(1e-3))],
    );
    rt.set_precision(PrecisionPolicy::auto());
    assert_eq!(rt.serve_as(&w), w);
}

/// `auto` compares a winner's re-measured median, not its search median (swollen by other
/// work while it searched): an f32 winner re-measured faster than int8 keeps f32.
/// Records `trial_id` as `w`'s winner on this machine, re-measured at `t` seconds; returns
/// the decision's id.
fn decide(db: &TuningDb, w: Workload, trial_id: i64, t: f64) -> i64 {
    db.record_winner(&WinnerDecision {
        id: None,
        fingerprint_id: HardwareFingerprint::current().id.clone(),
        workload: w,
        trial_id,
        reason: "only_candidate".into(),
        tie: false,
        remeasured: vec![Remeasurement {
            trial_id,
            measurement: Measurement::from_samples(vec![t; 3]),
            ci_low_s: t,
            ci_high_s: t,
        }],
        decided_at: String::new(),
        tool_version: "test".into(),
    })
    .unwrap()
}

#[test]
fn auto_compares_the_winners_re_measured_medians() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let w: Workload = "gemm:48x64x96".parse().unwrap();
    let i8w = w.with_dtype(DType::I8);
    let rt = db_with(
        &path,
        &[record(&w, 3e-5, Some(1e-7)), record(&i8w, 1e-5, Some(1e-3))],
    );
    rt.set_precision(PrecisionPolicy::auto());
    assert_eq!(rt.serve_as(&w), i8w, "by search medians, int8 is faster");
    let db = TuningDb::open(&path).unwrap();
    let hw = HardwareFingerprint::current();
    let trial_id = db.best(&hw.id, &w).unwrap().unwrap().id.unwrap();
    let f32_decision = decide(&db, w, trial_id, 5e-6);
    drop(db);
    let rt = Runtime::open(&path).unwrap();
    rt.set_precision(PrecisionPolicy::auto());
    assert_eq!(rt.serve_as(&w), w, "re-measured, f32 is faster");
    let source = rt.choose(&w).unwrap().source.unwrap();
    assert_eq!(source.median_s, Some(5e-6));
    let from = |rt: &Runtime, w: &Workload| rt.choose(w).unwrap().source.unwrap().median_from;
    assert_eq!(from(&rt, &w), Some(MedianFrom::Decision));
    assert_eq!(from(&rt, &i8w), Some(MedianFrom::Search));

    // int8 decided too, then both timed side by side: int8 at 2 µs against f32's 6 µs.
    let db = TuningDb::open(&path).unwrap();
    let i8_trial = db.best(&hw.id, &i8w).unwrap().unwrap().id.unwrap();
    let i8_decision = decide(&db, i8w, i8_trial, 8e-6);
    let timed = |winner_id, t: f64| tuning_db::SideBySide {
        winner_id,
        measurement: Measurement::from_samples(vec![t; 3]),
    };
    db.record_side_by_side(
        &[timed(f32_decision, 6e-6), timed(i8_decision, 2e-6)],
        "test",
    )
    .unwrap();
    drop(db);
    let rt = Runtime::open(&path).unwrap();
    rt.set_precision(PrecisionPolicy::auto());
    assert_eq!(rt.serve_as(&w), i8w, "side by side, int8 is faster");
    assert_eq!(from(&rt, &w), Some(MedianFrom::SideBySide));
    assert_eq!(from(&rt, &i8w), Some(MedianFrom::SideBySide));
    let json = rt.lookup_json(&w, "cpu").unwrap();
    assert_eq!(json["precisions"]["i8"]["median_s"], 2e-6);
    assert_eq!(json["precisions"]["f32"]["median_from"], "side_by_side");
}

#[test]
fn calls_served_in_int8_compute_what_int8_computes_and_packed_weights_follow_the_policy() {
    let rt = Runtime::defaults_only();
    rt.set_precision("int8".parse().unwrap());
    let (m, n, k) = (13, 40, 33);
    let w = Workload::gemm_bias_act(m, n, k, Act::Gelu).unwrap();
    let p = Problem::random(&w, 3);
    let (a, b, bias) = (&p.inputs[0], &p.inputs[1], &p.inputs[2]);
    // Unpacked: the same bits as the int8 family's default on its own.
    let mut got = vec![0f32; m * n];
    assert_eq!(
        rt.gemm_bias_act(m, n, k, Act::Gelu, a, b, bias, &mut got)
            .unwrap(),
        Level::Default
    );
    let i8w = w.with_dtype(DType::I8);
    let (fam, c) = default_for(&i8w, HardwareFingerprint::current()).unwrap();
    let mut want = vec![0f32; m * n];
    fam.prepare(&i8w, &c)
        .unwrap()
        .run_f32(&[a, b, bias], &mut want)
        .unwrap();
    assert!(got == want);
    // Within int8's bound of the f32 problem.
    let pi = Problem::random(&i8w, 3);
    assert_eq!(pi.inputs, p.inputs);
    pi.check(&got, &pi.reference()).unwrap();
    // Packed for M = 13 and 1: prepared once in int8, same bits.
    let packed = rt.pack_weight_for(n, k, Act::Gelu, b, &[m, 1]).unwrap();
    assert_eq!(packed.dtypes(), vec![DType::I8]);
    let mut got2 = vec![0f32; m * n];
    let before = rt.lookups();
    rt.gemm_bias_act_packed(&packed, a, bias, &mut got2)
        .unwrap();
    assert!(got2 == want);
    // Each packed call counts once, in the element type it was served in.
    let after = rt.lookups();
    assert_eq!((after.int8 - before.int8, after.f32 - before.f32), (1, 0));
    assert_eq!(after.total() - before.total(), 1);
    // f32 again: a new packing serves f32.
    rt.set_precision(PrecisionPolicy::exact());
    let packed = rt.pack_weight_for(n, k, Act::Gelu, b, &[m]).unwrap();
    assert_eq!(packed.dtypes(), vec![DType::F32]);
    rt.gemm_bias_act_packed(&packed, a, bias, &mut got2)
        .unwrap();
    p.check(&got2, &p.reference()).unwrap();
}

#[test]
fn calls_served_in_bf16_compute_what_bf16_computes_and_packed_weights_follow_the_policy() {
    let rt = Runtime::defaults_only();
    rt.set_precision("bf16".parse().unwrap());
    let (m, n, k) = (7, 67, 65);
    let w = Workload::gemm_bias_act(m, n, k, Act::Relu).unwrap();
    let p = Problem::random(&w, 4);
    let (a, b, bias) = (&p.inputs[0], &p.inputs[1], &p.inputs[2]);
    let mut got = vec![0f32; m * n];
    assert_eq!(
        rt.gemm_bias_act(m, n, k, Act::Relu, a, b, bias, &mut got)
            .unwrap(),
        Level::Default
    );
    // The same bits as the bf16 family's default on its own, within bf16's bound.
    let bw = w.with_dtype(DType::Bf16);
    let (fam, c) = default_for(&bw, HardwareFingerprint::current()).unwrap();
    assert_eq!(fam.name(), "gemm_bf16");
    let mut want = vec![0f32; m * n];
    fam.prepare(&bw, &c)
        .unwrap()
        .run_f32(&[a, b, bias], &mut want)
        .unwrap();
    assert!(got == want);
    let pb = Problem::random(&bw, 4);
    pb.check(&got, &pb.reference()).unwrap();
    // Packed once in bf16 for M = 7 and 1, same bits.
    let packed = rt.pack_weight_for(n, k, Act::Relu, b, &[m, 1]).unwrap();
    assert_eq!(packed.dtypes(), vec![DType::Bf16]);
    let mut got2 = vec![0f32; m * n];
    rt.gemm_bias_act_packed(&packed, a, bias, &mut got2)
        .unwrap();
    assert!(got2 == want);
}

/// Each call counts once in `lookups()`, whichever way it runs: packing a weight and planning
/// an M count nothing, and an unpacked `gemm_bias_act` counts its call, not also its lookup.
#[test]
fn every_call_counts_once_and_packing_counts_nothing() {
    let rt = Runtime::defaults_only();
    let (n, k) = (48, 40);
    for m in [1, 7, 64, 160] {
        let w = Workload::gemm_bias_act(m, n, k, Act::Gelu).unwrap();
        let p = Problem::random(&w, 6);
        let (a, b, bias) = (&p.inputs[0], &p.inputs[1], &p.inputs[2]);
        let mut c = p.output();
        let before = rt.lookups().total();
        rt.gemm_bias_act(m, n, k, Act::Gelu, a, b, bias, &mut c)
            .unwrap();
        assert_eq!(rt.lookups().total() - before, 1, "unpacked M = {m}");
        p.check(&c, &p.reference()).unwrap();
        let before = rt.lookups().total();
        let packed = rt.pack_weight_for(n, k, Act::Gelu, b, &[m]).unwrap();
        assert_eq!(rt.lookups().total(), before, "packing for M = {m}");
        for other in [m, m + 2] {
            let w = Workload::gemm_bias_act(other, n, k, Act::Gelu).unwrap();
            let mut p = Problem::random(&w, 6);
            p.inputs[1] = b.clone();
            let mut c = p.output();
            let before = rt.lookups().total();
            rt.gemm_bias_act_packed(&packed, &p.inputs[0], &p.inputs[2], &mut c)
                .unwrap();
            assert_eq!(
                rt.lookups().total() - before,
                1,
                "packed for {m}, M = {other}"
            );
            p.check(&c, &p.reference()).unwrap();
        }
    }
}

/// A weight whose planned M are all served in a reduced precision is kept in that form only
/// (no f32 copy, which would be 2-4x its size), and every other M reads it: M of another
/// default micro-kernel (1), primes, and M after the policy went back to f32.
#[test]
fn a_weight_served_only_in_reduced_precision_keeps_no_f32_copy() {
    let rt = Runtime::defaults_only();
    let (n, k) = (67, 65);
    for (policy, dtype, bytes_per) in [("int8", DType::I8, 1), ("bf16", DType::Bf16, 2)] {
        rt.set_precision(policy.parse().unwrap());
        let problem = |m: usize| {
            let w = Workload::gemm_bias_act(m, n, k, Act::Relu).unwrap();
            Problem::random(&w.with_dtype(dtype), 5)
        };
        let b = problem(1).inputs[1].clone();
        let packed = rt.pack_weight_for(n, k, Act::Relu, &b, &[16]).unwrap();
        assert_eq!(packed.dtypes(), vec![dtype], "{policy}");
        assert!(packed.layouts().is_empty(), "{policy}: {packed:?}");
        // The reduced form only (panels padded to their width, scales): well under f32's.
        assert!(
            packed.bytes() < 2 * bytes_per * n * k + 4096,
            "{policy}: {packed:?}"
        );
        for (m, then) in [
            (1, None),
            (16, None),
            (37, None),
            (16, Some("f32")),
            (5, Some("f32")),
        ] {
            if let Some(p) = then {
                rt.set_precision(p.parse().unwrap());
            }
            let mut p = problem(m);
            p.inputs[1] = b.clone();
            let at = format!("{policy} M = {m} after {then:?}");
            let mut c = p.output();
            let before = rt.lookups();
            rt.gemm_bias_act_packed(&packed, &p.inputs[0], &p.inputs[2], &mut c)
                .unwrap();
            p.check(&c, &p.reference())
                .unwrap_or_else(|e| panic!("{at}: {e}"));
            // One call, counted once (planning an M does not count), in the reduced type.
            let after = rt.lookups();
            let served = match dtype {
                DType::I8 => after.int8 - before.int8,
                _ => after.bf16 - before.bf16,
            };
            assert_eq!((served, after.total() - before.total()), (1, 1), "{at}");
        }
        assert_eq!(packed.dtypes(), vec![dtype], "{policy}");
    }
}

/// Attention under a bf16 policy: served in bf16 by `attention_bf16` where this CPU runs it
/// (AVX512_BF16), with the family's own result and within bf16's bound, padded batches
/// included; in f32, exactly as without a policy, everywhere else.
#[test]
fn attention_follows_the_bf16_policy_where_the_cpu_runs_bf16_attention() {
    let runs = kernels::cpu::attention::bf16::ukernel::TILES
        .iter()
        .any(|t| t.available());
    let (b, h, s, d) = (2, 3, 37, 64);
    let w = Workload::attention(b, h, s, d, true).unwrap();
    let p = Problem::random(&w, 9);
    let (q, k, v) = (&p.inputs[0], &p.inputs[1], &p.inputs[2]);
    let lens = [37, 5];
    let call = |rt: &Runtime| {
        let mut o = vec![f32::NAN; w.output_len()];
        rt.attention_masked(b, h, s, d, true, &lens, q, k, v, &mut o)
            .unwrap();
        o
    };
    let f32_out = call(&Runtime::defaults_only());
    let rt = Runtime::defaults_only();
    rt.set_precision("bf16".parse().unwrap());
    let served = rt.serve_as(&w);
    let got = call(&rt);
    if !runs {
        assert_eq!(served, w);
        assert!(got == f32_out, "f32 attention is served as f32");
        return;
    }
    let bw = w.with_dtype(DType::Bf16);
    assert_eq!(served, bw);
    let (fam, _) = default_for(&bw, HardwareFingerprint::current()).unwrap();
    assert_eq!(fam.name(), "attention_bf16");
    let pb = Problem {
        workload: bw,
        inputs: p.inputs.clone(),
    };
    pb.check(&got, &pb.reference_with_key_lens(&lens).unwrap())
        .unwrap();
    assert!(got != f32_out, "bf16 rounding shows");
}

/// An int8 GEMM accumulates in i32: at the deepest K it takes, inputs of one sign (every
/// product at its largest, 255 · 127) sum exactly; deeper shapes are never served in int8 (they
/// had wrapped: 70000 ones summed to −62622), and an `:i8` workload that deep is refused.
#[test]
fn int8_is_exact_at_its_deepest_k_and_never_served_deeper() {
    let rt = Runtime::defaults_only();
    rt.set_precision(PrecisionPolicy::only(DType::I8));
    let deepest = kernels::workload::MAX_I8_DEPTH;
    for (k, dtype) in [
        (deepest, DType::I8),
        (deepest + 1, DType::F32),
        (70_000, DType::F32),
    ] {
        let (m, n) = (2, 16);
        let w = Workload::gemm(m, n, k).unwrap();
        assert_eq!(rt.serve_as(&w).dtype(), dtype, "K = {k}");
        let (a, b) = (vec![1.0f32; m * k], vec![1.0f32; k * n]);
        let mut c = vec![0.0f32; m * n];
        rt.gemm(m, n, k, &a, &b, &mut c).unwrap();
        // Ones quantise exactly (scale 1/255 and 1/127): the i32 sums are exact.
        for &v in &c {
            assert!((v - k as f32).abs() <= 1e-6 * k as f32, "K = {k}: {v}");
        }
    }
    let e = format!("gemm:2x16x{}:i8", deepest + 1)
        .parse::<Workload>()
        .unwrap_err();
    assert!(e.to_string().contains("deeper than int8 GEMM takes"), "{e}");
}
