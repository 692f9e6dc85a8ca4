//! The tuning loop against a real (in-memory) SQLite database.

use kernels::operand::host_f32;
use kernels::{
    Config, Executable, HardwareFingerprint, Kernel, Operand, OperandMut, Space, Status, Workload,
};
use search::{candidates, tune, tune_families, Event, StrategyKind, TuneOptions};
use tuning_db::TuningDb;

fn opts(budget: usize, strategy: StrategyKind) -> TuneOptions {
    TuneOptions {
        budget,
        strategy,
        seed: 5,
        ..TuneOptions::default()
    }
}

#[test]
fn tunes_records_everything_and_resumes() {
    let db = TuningDb::in_memory().unwrap();
    let hw = HardwareFingerprint::current();
    let w: Workload = "gemm:40x36x20".parse().unwrap();
    let (mut trials_seen, mut deciding) = (0, 0);
    let s = tune(
        &db,
        &w,
        hw,
        &opts(6, StrategyKind::Random),
        &mut |e| match e {
            Event::Trial { .. } => {
                assert_eq!(deciding, 0, "a trial after the search ended");
                trials_seen += 1
            }
            Event::Deciding => deciding += 1,
            _ => {}
        },
    )
    .unwrap();
    assert_eq!(deciding, 1, "the re-measurement phase is announced");
    let history = db.trials(&hw.id, &w).unwrap();
    assert_eq!(history.len(), 6, "budget counts distinct configs tried");
    assert_eq!(trials_seen, s.measured);
    assert!(s.measured >= 5, "the default plus at least five proposals");
    let best = s.best.clone().expect("a verified winner");
    assert_eq!(best.status, Status::Ok);
    let fastest = history
        .iter()
        .filter_map(|r| r.median_s())
        .fold(f64::INFINITY, f64::min);
    // The winner was decided on an interleaved re-measurement of the three fastest trials:
    // the fastest trial is a finalist, and the database serves the decided winner.
    let d = s.decision.clone().expect("a decision");
    // The three fastest, plus the simplest config tied with the fastest and the default if
    // they are not among them (which ones tie depends on this machine's timings).
    assert!(
        (3..=5).contains(&d.finalists.len()),
        "{}",
        d.finalists.len()
    );
    assert_eq!(d.remeasured(), d.finalists.len());
    assert!(d
        .finalists
        .iter()
        .any(|f| f.record.median_s() == Some(fastest)));
    assert!(d.finalists.iter().all(|f| f.ci.0 <= f.ci.1));
    assert_eq!(best.id, d.winner.id);
    assert_eq!(
        db.winner(&hw.id, &w).unwrap().unwrap().trial_id,
        best.id.unwrap()
    );
    assert!(s.speedup_vs_default().unwrap() > 0.0);
    // The speedup reported is the one the decision saw: re-measured side by side.
    let (win, def) = (s.remeasured_s(&best), s.remeasured_s(&s.default));
    assert!(def.is_some(), "the default is a finalist");
    if let (Some(win), Some(def)) = (win, def) {
        assert_eq!(s.speedup_vs_default(), Some(def / win));
    }
    // The default was timed twice (searched, re-measured): the drift is their ratio, ≥ 1.
    let first = s.default.measurement.as_ref().unwrap().median_s;
    let drift = s.drift().unwrap();
    assert!(drift >= 1.0, "{drift}");
    let again = def.unwrap();
    assert!((drift - first.max(again) / first.min(again)).abs() < 1e-12);
    assert!(s.median_spread.is_some() && s.timed >= 5);
    assert_eq!(s.isolation, "none");

    // Same job again: resumes, measures nothing new.
    let again = tune(&db, &w, hw, &opts(6, StrategyKind::Random), &mut |_| {}).unwrap();
    assert_eq!(again.measured, 0);
    assert_eq!(db.trials(&hw.id, &w).unwrap().len(), 6);

    // A bigger budget continues where the first job stopped.
    // (Capped by the space, which is smallest on a portable machine at one thread.)
    let total = 9.min(search::candidates(&w, hw, kernels::registry()).len());
    let more = tune(&db, &w, hw, &opts(9, StrategyKind::Random), &mut |_| {}).unwrap();
    assert_eq!(more.measured, total - 6);
    assert_eq!(db.trials(&hw.id, &w).unwrap().len(), total);
}

#[test]
fn exhaustive_stops_when_the_space_is_exhausted() {
    let db = TuningDb::in_memory().unwrap();
    let hw = HardwareFingerprint::current();
    let w: Workload = "gemm:3x5x2".parse().unwrap();
    let size = candidates(&w, hw, kernels::registry()).len();
    assert!(size > 0);
    let s = tune(
        &db,
        &w,
        hw,
        &opts(size + 50, StrategyKind::Exhaustive),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(s.space_size, size);
    assert_eq!(
        db.trials(&hw.id, &w).unwrap().len(),
        size,
        "every candidate once, the default not twice"
    );
}

/// A planted family: config `x` = 0 is correct, 1 computes garbage, 2 panics, 3 fails to build.
struct Planted;
struct PlantedExe {
    x: i64,
    w: Workload,
}
impl Executable for PlantedExe {
    fn run(&self, inputs: &[Operand<'_>], out: OperandMut<'_>) -> kernels::Result<()> {
        let Workload::Gemm { m, n, k, .. } = self.w else {
            unreachable!("the planted family only supports gemm")
        };
        let (inputs, out) = host_f32::<2>(&self.w, inputs, out)?;
        if self.x == 2 {
            panic!("planted crash");
        }
        for i in 0..m {
            for j in 0..n {
                let v: f32 = (0..k)
                    .map(|p| inputs[0][i * k + p] * inputs[1][p * n + j])
                    .sum();
                out[i * n + j] = if self.x == 1 { v * 1.5 } else { v };
            }
        }
        Ok(())
    }
}
impl Kernel for Planted {
    fn name(&self) -> &'static str {
        "planted"
    }
    fn version(&self) -> u32 {
        1
    }
    fn supports(&self, _: &Workload) -> bool {
        true
    }
    fn space(&self, _: &Workload, _: &HardwareFingerprint) -> Space {
        Space::new().knob("x", [0usize, 1, 2, 3])
    }
    fn default_config(&self, _: &Workload, _: &HardwareFingerprint) -> Config {
        Config::from_pairs([("x", 0usize)])
    }
    fn build(&self, w: &Workload, c: &Config) -> kernels::Result<Box<dyn Executable>> {
        let x = c.int("x").unwrap();
        if x == 3 {
            return Err(kernels::Error::InvalidConfig {
                kernel: "planted".into(),
                config: c.to_json(),
                reason: "planted build failure".into(),
            });
        }
        Ok(Box::new(PlantedExe { x, w: *w }))
    }
}

#[test]
fn failures_are_data_and_the_winner_is_healthy() {
    let db = TuningDb::in_memory().unwrap();
    let hw = HardwareFingerprint::current();
    let w: Workload = "gemm:7x6x5".parse().unwrap();
    let s = tune_families(
        &db,
        &w,
        hw,
        &[&Planted],
        &opts(10, StrategyKind::Exhaustive),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(s.failures, 3);
    let history = db.trials(&hw.id, &w).unwrap();
    let status_of = |x: i64| {
        history
            .iter()
            .find(|r| r.kernel == "planted" && r.config.int("x") == Some(x))
            .map(|r| r.status)
    };
    assert_eq!(status_of(0), Some(Status::Ok));
    assert_eq!(status_of(1), Some(Status::WrongResult));
    assert_eq!(status_of(2), Some(Status::RunFailed));
    assert_eq!(status_of(3), Some(Status::BuildFailed));
    let msg = |x: i64| {
        history
            .iter()
            .find(|r| r.config.int("x") == Some(x))
            .unwrap()
            .message
            .clone()
            .unwrap()
    };
    assert!(msg(2).contains("planted crash"));
    assert!(msg(3).contains("planted build failure"));
    // The winner is a verified record; never a failed one.
    assert_eq!(s.best.unwrap().status, Status::Ok);
}

#[test]
fn a_stop_request_ends_the_job_before_its_next_measurement_keeping_the_trials() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let db = TuningDb::in_memory().unwrap();
    let hw = HardwareFingerprint::current();
    let w: Workload = "gemm:24x20x12".parse().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let o = TuneOptions {
        stop: Some(stop.clone()),
        ..opts(8, StrategyKind::Random)
    };
    let mut trials = 0;
    let e = tune(&db, &w, hw, &o, &mut |e| {
        if let Event::Trial { .. } = e {
            trials += 1;
            // As a host's signal handler would, from outside the loop: after the third.
            stop.store(trials == 3, Ordering::Relaxed);
        }
    })
    .unwrap_err();
    assert!(matches!(e, search::SearchError::Stopped), "{e}");
    assert_eq!(trials, 3);
    // The default's trial (reported as Event::Default) and the three.
    assert_eq!(
        db.trials(&hw.id, &w).unwrap().len(),
        4,
        "what ran is stored"
    );
}

#[test]
fn the_precisions_winners_are_re_measured_side_by_side() {
    use kernels::DType;
    let db = TuningDb::in_memory().unwrap();
    let hw = HardwareFingerprint::current();
    let shape: Workload = "gemm:20x33x17".parse().unwrap();
    let o = opts(3, StrategyKind::Random);
    let mut ev = runner::InProcess::new();
    let both = [DType::F32, DType::I8];
    // Nothing decided yet, then one precision only: nothing to compare.
    let none = search::compare_precisions(&db, &shape, &both, hw, &o, &mut ev).unwrap();
    assert!(none.is_none());
    tune(&db, &shape, hw, &o, &mut |_| {}).unwrap();
    let one = search::compare_precisions(&db, &shape, &both, hw, &o, &mut ev).unwrap();
    assert!(one.is_none());

    tune(&db, &shape.with_dtype(DType::I8), hw, &o, &mut |_| {}).unwrap();
    // bf16 was asked for too but never tuned: the two decided precisions compare.
    let asked = [DType::F32, DType::I8, DType::Bf16];
    let c = search::compare_precisions(&db, &shape, &asked, hw, &o, &mut ev)
        .unwrap()
        .expect("f32 and int8 are decided");
    assert_eq!(c.shape, shape);
    let types: Vec<DType> = c
        .timings
        .iter()
        .map(|t| t.record.workload.dtype())
        .collect();
    assert_eq!(types, [DType::F32, DType::I8]);
    let medians = db.remeasured_medians(&hw.id).unwrap();
    for t in &c.timings {
        assert_eq!(t.measurement.samples.len(), o.remeasure_rounds);
        assert_eq!(
            medians.get(&t.record.id.unwrap()),
            Some(&t.measurement.median_s),
            "the set's medians serve"
        );
        assert!(t.ci.0 <= t.measurement.median_s && t.measurement.median_s <= t.ci.1);
    }
}
