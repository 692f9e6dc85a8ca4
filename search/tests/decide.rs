//! Quarantine and the winner decision, driven by a scripted evaluator: every timing is chosen
//! by the test, so ties, clear wins and failures are exact, not left to a noisy machine.

use std::collections::HashMap;
use std::time::Duration;

use kernels::{
    default_for, Config, Executable, HardwareFingerprint, Kernel, Measurement, Space, Status,
    Workload,
};
use runner::{Contender, EvalError, Evaluation, Evaluator, Outcome, Protocol};
use search::{tune_with, StrategyKind, TuneOptions, WinReason};
use tuning_db::{Record, TuningDb};

/// A family whose configs are never run (the scripted evaluator times them): `x` in 0..=4.
struct Scripted;
struct Never;
impl Executable for Never {
    fn run(&self, _: &[kernels::Operand<'_>], _: kernels::OperandMut<'_>) -> kernels::Result<()> {
        unreachable!("the scripted evaluator never runs a kernel")
    }
}
impl Kernel for Scripted {
    fn name(&self) -> &'static str {
        "scripted"
    }
    fn version(&self) -> u32 {
        1
    }
    fn supports(&self, _: &Workload) -> bool {
        true
    }
    fn space(&self, _: &Workload, _: &HardwareFingerprint) -> Space {
        Space::new().knob("x", [0usize, 1, 2, 3, 4])
    }
    fn default_config(&self, _: &Workload, _: &HardwareFingerprint) -> Config {
        x(0)
    }
    fn build(&self, _: &Workload, _: &Config) -> kernels::Result<Box<dyn Executable>> {
        Ok(Box::new(Never))
    }
}

fn x(v: usize) -> Config {
    Config::from_pairs([("x", v)])
}

fn key(kernel: &dyn Kernel, c: &Config) -> String {
    format!("{} {}", kernel.name(), c.to_json())
}

/// Times each config as scripted: `medians` for the search (default 10 ms), `samples` for
/// the interleaved re-measurement (default: three copies of the median).
#[derive(Default)]
struct Fake {
    medians: HashMap<String, f64>,
    /// Samples of the search's timing (default: five copies of the median).
    trial_samples: HashMap<String, Vec<f64>>,
    statuses: HashMap<String, Status>,
    samples: HashMap<String, Vec<f64>>,
    fail_remeasure: bool,
    evaluated: Vec<String>,
    remeasured: Vec<Vec<String>>,
    /// What [`Evaluator::cpu_share`] reports (default: not measured).
    share: Option<f64>,
}

impl Fake {
    fn median(&self, k: &str) -> f64 {
        self.medians.get(k).copied().unwrap_or(10e-3)
    }
}

impl Evaluator for Fake {
    fn isolation(&self) -> &'static str {
        "scripted"
    }
    fn cpu_share(&mut self, _: usize) -> Option<f64> {
        self.share
    }
    fn setup(&mut self, _: &Workload, _: u64) -> Result<(), EvalError> {
        Ok(())
    }
    fn evaluate(
        &mut self,
        kernel: &dyn Kernel,
        config: &Config,
        _: &Protocol,
    ) -> Result<Evaluation, EvalError> {
        let k = key(kernel, config);
        self.evaluated.push(k.clone());
        let outcome = match self.statuses.get(&k) {
            Some(&status) => Outcome {
                status,
                message: Some("scripted failure".into()),
                measurement: None,
                accuracy: None,
            },
            None => Outcome {
                status: Status::Ok,
                message: None,
                measurement: Some(Measurement::from_samples(
                    self.trial_samples
                        .get(&k)
                        .cloned()
                        .unwrap_or_else(|| vec![self.median(&k); 5]),
                )),
                accuracy: None,
            },
        };
        Ok(Evaluation {
            outcome,
            elapsed: Duration::from_millis(1),
        })
    }
    fn remeasure(
        &mut self,
        finalists: &[Contender<'_>],
        _: &Protocol,
        _: usize,
    ) -> Result<Vec<Measurement>, EvalError> {
        let keys: Vec<String> = finalists.iter().map(|f| key(f.kernel, &f.config)).collect();
        self.remeasured.push(keys.clone());
        if self.fail_remeasure {
            return Err(EvalError::Remeasure {
                kernel: "scripted".into(),
                config: "{}".into(),
                status: Status::Crashed,
                message: "scripted crash".into(),
            });
        }
        Ok(keys
            .iter()
            .map(|k| {
                let s = self
                    .samples
                    .get(k)
                    .cloned()
                    .unwrap_or_else(|| vec![self.median(k); 3]);
                Measurement::from_samples(s)
            })
            .collect())
    }
}

fn setup() -> (TuningDb, &'static HardwareFingerprint, Workload) {
    let db = TuningDb::in_memory().unwrap();
    let hw = HardwareFingerprint::current();
    db.upsert_fingerprint(hw).unwrap();
    (db, hw, "gemm:24x24x24".parse().unwrap())
}

fn opts(budget: usize) -> TuneOptions {
    TuneOptions {
        budget,
        strategy: StrategyKind::Exhaustive,
        seed: 1,
        ..TuneOptions::default()
    }
}

/// Samples spread ±`rel` around `m` (11 of them: a CI of about ±0.8·`rel`).
fn around(m: f64, rel: f64) -> Vec<f64> {
    (0..11)
        .map(|i| m * (1.0 + rel * (i as f64 - 5.0) / 5.0))
        .collect()
}

/// [`around`] with its samples rotated by `rot` rounds: finalists whose noise does not move
/// together from round to round, as on a machine whose load comes and goes.
fn around_rotated(m: f64, rel: f64, rot: usize) -> Vec<f64> {
    let mut v = around(m, rel);
    v.rotate_left(rot % 11);
    v
}

/// Trial medians x3 < x2 < x1 < x4 < x0, all faster than the default's 10 ms.
fn fake() -> Fake {
    let mut f = Fake::default();
    for (v, ms) in [(0, 5.0), (1, 1.02), (2, 1.01), (3, 1.0), (4, 3.0)] {
        f.medians.insert(key(&Scripted, &x(v)), ms * 1e-3);
    }
    f
}

fn scripted_trial(db: &TuningDb, hw: &HardwareFingerprint, w: &Workload, v: usize) -> Record {
    db.trials(&hw.id, w)
        .unwrap()
        .into_iter()
        .find(|r| r.kernel == "scripted" && r.config == x(v))
        .unwrap()
}

#[test]
fn overlapping_finalists_tie_to_the_simplest_config() {
    let (db, hw, w) = setup();
    let mut ev = fake();
    for v in 1..=3 {
        let k = key(&Scripted, &x(v));
        let m = ev.medians[&k];
        ev.samples.insert(k, around_rotated(m, 0.05, 4 * v));
    }
    let s = tune_with(&db, &w, hw, &[&Scripted], &opts(6), &mut ev, &mut |_| {}).unwrap();
    let d = s.decision.clone().expect("a decision");
    assert_eq!(ev.remeasured.len(), 1);
    let (dk, dc) = default_for(&w, hw).unwrap();
    assert_eq!(
        ev.remeasured[0],
        vec![
            key(&Scripted, &x(3)),
            key(&Scripted, &x(2)),
            key(&Scripted, &x(1)),
            key(dk, &dc),
        ],
        "the three fastest distinct configs, then the default"
    );
    assert!(d.tie);
    assert_eq!(d.reason, WinReason::TieSimpler);
    assert_eq!(
        d.winner.config,
        x(1),
        "lexicographically first of the tied group"
    );
    assert_eq!((d.remeasured(), d.rounds), (4, 11));
    let stored = db.winner(&hw.id, &w).unwrap().unwrap();
    assert_eq!(Some(stored.trial_id), d.winner.id);
    assert_eq!((stored.reason.as_str(), stored.tie), ("tie_simpler", true));
    assert_eq!(stored.remeasured.len(), 4);
    assert!(s.tie() && s.remeasured() == 4);
    assert_eq!(
        s.median_spread,
        Some(0.0),
        "the scripted samples are identical"
    );
}

#[test]
fn the_simplest_config_tied_in_the_search_joins_the_finalists() {
    let (db, hw, w) = setup();
    let mut ev = fake();
    // x0's search timing is slow by its median (5 ms) but so noisy that its confidence
    // interval reaches the fastest one's: it is statistically tied, and the simplest config.
    let k0 = key(&Scripted, &x(0));
    ev.trial_samples
        .insert(k0.clone(), vec![0.9e-3, 1.0e-3, 5e-3, 9e-3, 9.5e-3]);
    for v in 0..=3 {
        let k = key(&Scripted, &x(v));
        ev.samples.insert(k, around(1.0e-3, 0.05));
    }
    let s = tune_with(&db, &w, hw, &[&Scripted], &opts(6), &mut ev, &mut |_| {}).unwrap();
    assert_eq!(ev.remeasured[0].len(), 5, "{:?}", ev.remeasured[0]);
    assert_eq!(ev.remeasured[0][3], k0);
    let (dk, dc) = default_for(&w, hw).unwrap();
    assert_eq!(ev.remeasured[0][4], key(dk, &dc), "the default comes last");
    let d = s.decision.unwrap();
    assert_eq!((d.reason, d.winner.config), (WinReason::TieSimpler, x(0)));
}

#[test]
fn a_steady_gap_round_by_round_is_not_a_tie() {
    // The same round-to-round drift (±8%) hits every finalist alike, as in interleaved
    // rounds; x3 is 3% faster than x2 and x1 in every round. The medians' intervals overlap,
    // the per-round ratios do not reach 1: x3 wins outright.
    let (db, hw, w) = setup();
    let mut ev = fake();
    for (v, m) in [(1, 1.03e-3), (2, 1.03e-3), (3, 1.0e-3)] {
        ev.samples.insert(key(&Scripted, &x(v)), around(m, 0.08));
    }
    let s = tune_with(&db, &w, hw, &[&Scripted], &opts(6), &mut ev, &mut |_| {}).unwrap();
    let d = s.decision.unwrap();
    let ci = |v| runner::median_ci(&around(if v == 3 { 1.0e-3 } else { 1.03e-3 }, 0.08));
    assert!(
        runner::overlaps(ci(3), ci(1)),
        "unpaired, this would be a tie"
    );
    assert!(!d.tie, "{:?}", d.reason);
    assert_eq!((d.reason, d.winner.config), (WinReason::Fastest, x(3)));
}

#[test]
fn separated_finalists_keep_the_fastest() {
    let (db, hw, w) = setup();
    let mut ev = fake();
    for (v, m) in [(1, 1.3e-3), (2, 1.2e-3), (3, 1.0e-3)] {
        ev.samples.insert(key(&Scripted, &x(v)), around(m, 0.01));
    }
    let s = tune_with(&db, &w, hw, &[&Scripted], &opts(6), &mut ev, &mut |_| {}).unwrap();
    let d = s.decision.unwrap();
    assert!(!d.tie);
    assert_eq!(d.reason, WinReason::Fastest);
    assert_eq!(d.winner.config, x(3));
    assert_eq!(
        d.winner_remeasured_s(),
        Some(kernels::measurement::median(&around(1.0e-3, 0.01)))
    );
}

#[test]
fn a_tied_incumbent_is_kept_and_a_resumed_job_does_not_redecide() {
    let (db, hw, w) = setup();
    // Job 1 (default + x0..x3): x1, x2, x3 tie and x1, the simplest, wins.
    let mut ev = fake();
    for v in 0..=4 {
        let k = key(&Scripted, &x(v));
        let m = ev.medians[&k];
        ev.samples.insert(k, around_rotated(m, 0.05, 4 * v));
    }
    let first = tune_with(&db, &w, hw, &[&Scripted], &opts(5), &mut ev, &mut |_| {}).unwrap();
    let first_medians = first.decided_medians();
    let d1 = first.decision.unwrap();
    assert_eq!(
        (d1.reason, d1.winner.config.clone()),
        (WinReason::TieSimpler, x(1))
    );

    // Same job again: nothing new measured, no re-measurement, the decision stands.
    let again = tune_with(&db, &w, hw, &[&Scripted], &opts(5), &mut ev, &mut |_| {}).unwrap();
    assert_eq!(again.measured, 0);
    assert!(again.decision.is_none());
    assert_eq!(ev.remeasured.len(), 1);
    assert_eq!(
        db.winner(&hw.id, &w).unwrap().unwrap().trial_id,
        d1.winner.id.unwrap()
    );
    // The decision's re-measured medians stand in for this run's only where the served best
    // is the decided winner (the scripted family is not registered, so `best` falls back to
    // the fastest trial here; tests/cli.rs checks the real case).
    assert!(first_medians.is_some_and(|m| m.2));
    let served_winner = again.best.as_ref().and_then(|b| b.id) == d1.winner.id;
    assert_eq!(again.earlier.is_some(), served_winner);

    // A bigger budget adds x4 (scripted to be about as fast, 0.99 ms): the finalists are the
    // three fastest trials plus the incumbent, all tied, and the (slow) default; the
    // incumbent stays.
    let k4 = key(&Scripted, &x(4));
    ev.medians.insert(k4.clone(), 0.99e-3);
    ev.samples
        .insert(k4.clone(), around_rotated(0.99e-3, 0.05, 9));
    let third = tune_with(&db, &w, hw, &[&Scripted], &opts(6), &mut ev, &mut |_| {}).unwrap();
    assert_eq!(third.measured, 1);
    let d3 = third.decision.unwrap();
    assert_eq!(ev.remeasured.len(), 2);
    assert_eq!(ev.remeasured[1].len(), 5, "{:?}", ev.remeasured[1]);
    assert_eq!(ev.remeasured[1][0], k4);
    assert!(d3
        .finalists
        .iter()
        .any(|f| f.incumbent && f.record.config == x(1)));
    assert_eq!(
        (d3.reason, d3.winner.config),
        (WinReason::TieIncumbent, x(1))
    );
    assert!(d3.tie);
}

#[test]
fn a_failed_remeasurement_falls_back_to_the_fastest_trial() {
    let (db, hw, w) = setup();
    let mut ev = fake();
    ev.fail_remeasure = true;
    let s = tune_with(&db, &w, hw, &[&Scripted], &opts(6), &mut ev, &mut |_| {}).unwrap();
    let d = s.decision.unwrap();
    assert_eq!(d.reason, WinReason::Unconfirmed);
    assert_eq!(d.winner.config, x(3));
    assert!(d.note.as_deref().unwrap().contains("scripted crash"));
    assert_eq!(d.remeasured(), 0);
    let stored = db.winner(&hw.id, &w).unwrap().unwrap();
    assert_eq!(
        (stored.reason.as_str(), stored.remeasured.len()),
        ("unconfirmed", 0)
    );
}

#[test]
fn quarantined_configs_are_never_measured_again() {
    let (db, hw, w) = setup();
    let mut ev = fake();
    ev.statuses.insert(key(&Scripted, &x(1)), Status::Crashed);
    ev.statuses.insert(key(&Scripted, &x(2)), Status::Timeout);
    let s = tune_with(&db, &w, hw, &[&Scripted], &opts(6), &mut ev, &mut |_| {}).unwrap();
    assert_eq!(s.quarantined, 2);
    assert_eq!(s.failures, 2);
    assert_eq!(scripted_trial(&db, hw, &w, 1).status, Status::Crashed);
    assert_eq!(scripted_trial(&db, hw, &w, 2).status, Status::Timeout);
    assert_ne!(s.decision.unwrap().winner.config, x(1));

    // Other strategies, seeds and bigger budgets propose them again: never re-run.
    ev.evaluated.clear();
    ev.statuses.clear();
    for (strategy, seed, budget) in [
        (StrategyKind::Random, 7, 50),
        (StrategyKind::Exhaustive, 9, 100),
    ] {
        let o = TuneOptions {
            budget,
            strategy,
            seed,
            ..TuneOptions::default()
        };
        let again = tune_with(&db, &w, hw, &[&Scripted], &o, &mut ev, &mut |_| {}).unwrap();
        assert_eq!(again.quarantined, 2);
    }
    assert!(
        !ev.evaluated.contains(&key(&Scripted, &x(1)))
            && !ev.evaluated.contains(&key(&Scripted, &x(2))),
        "{:?}",
        ev.evaluated
    );
    let rows = db.trials(&hw.id, &w).unwrap();
    assert_eq!(rows.iter().filter(|r| r.config == x(1)).count(), 1);
}

/// `retry_failed` measures the quarantined configs again (their limits were too tight, say);
/// one that then passes is no longer quarantined by later runs, one that fails again stays.
#[test]
fn retry_failed_measures_quarantined_configs_again_and_the_latest_trial_counts() {
    let (db, hw, w) = setup();
    let mut ev = fake();
    ev.statuses.insert(key(&Scripted, &x(1)), Status::Timeout);
    ev.statuses.insert(key(&Scripted, &x(2)), Status::Oom);
    let s = tune_with(&db, &w, hw, &[&Scripted], &opts(6), &mut ev, &mut |_| {}).unwrap();
    assert_eq!(s.quarantined, 2);

    ev.evaluated.clear();
    ev.statuses.clear();
    ev.statuses.insert(key(&Scripted, &x(2)), Status::Oom); // still fails
    let retry = TuneOptions {
        retry_failed: true,
        ..opts(6)
    };
    let again = tune_with(&db, &w, hw, &[&Scripted], &retry, &mut ev, &mut |_| {}).unwrap();
    for c in [1, 2] {
        assert!(
            ev.evaluated.contains(&key(&Scripted, &x(c))),
            "x{c} retried"
        );
    }
    assert_eq!(again.quarantined, 1, "x2 failed again");

    ev.evaluated.clear();
    let later = tune_with(&db, &w, hw, &[&Scripted], &opts(8), &mut ev, &mut |_| {}).unwrap();
    assert_eq!(later.quarantined, 1);
    assert!(
        !ev.evaluated.contains(&key(&Scripted, &x(2))),
        "x2 stays quarantined"
    );
    let rows = db.trials(&hw.id, &w).unwrap();
    let x1: Vec<Status> = rows
        .iter()
        .filter(|r| r.config == x(1))
        .map(|r| r.status)
        .collect();
    assert_eq!(
        x1,
        [Status::Timeout, Status::Ok],
        "the failure stays on record"
    );
}

/// Records a failed trial of `w`'s default config with `status`; returns that default.
fn failed_default(
    db: &TuningDb,
    hw: &HardwareFingerprint,
    w: &Workload,
    status: Status,
) -> (&'static dyn Kernel, Config) {
    let (dk, dc) = default_for(w, hw).unwrap();
    let rec = Record::failed(
        &hw.id,
        *w,
        dk.name(),
        dk.version(),
        dc.clone(),
        status,
        "planted",
        "t",
    );
    db.insert(&rec).unwrap();
    (dk, dc)
}

#[test]
fn a_quarantined_default_is_not_run_again() {
    let (db, hw, w) = setup();
    let (dk, dc) = failed_default(&db, hw, &w, Status::Oom);
    let mut ev = fake();
    let s = tune_with(&db, &w, hw, &[&Scripted], &opts(4), &mut ev, &mut |_| {}).unwrap();
    assert!(!ev.evaluated.contains(&key(dk, &dc)), "{:?}", ev.evaluated);
    assert_eq!(s.default.status, Status::Oom);
    assert_eq!(s.speedup_vs_default(), None);
    assert_eq!(s.quarantined, 1);
    assert_eq!(s.measured, 3, "the budget counts the quarantined default");
    assert!(s.decision.is_some());
}

/// A default that timed out (a `--timeout-s` too tight for it) runs again in the next job and
/// takes part in the decision: it had stayed quarantined, and a slower config then won
/// unopposed against the runtime's own fallback.
#[test]
fn a_timed_out_default_runs_again_and_is_a_finalist() {
    let (db, hw, w) = setup();
    let (dk, dc) = failed_default(&db, hw, &w, Status::Timeout);
    let mut ev = fake();
    ev.medians.insert(key(dk, &dc), 0.5e-3); // faster than every scripted config
    let s = tune_with(&db, &w, hw, &[&Scripted], &opts(4), &mut ev, &mut |_| {}).unwrap();
    assert!(ev.evaluated.contains(&key(dk, &dc)), "{:?}", ev.evaluated);
    assert_eq!(s.default.status, Status::Ok);
    assert_eq!(s.quarantined, 0, "its latest trial passed");
    let winner = s.decision.unwrap().winner;
    assert_eq!((winner.kernel.as_str(), &winner.config), (dk.name(), &dc));
}

#[test]
fn the_default_is_a_finalist_and_wins_when_it_is_faster_head_to_head() {
    let (db, hw, w) = setup();
    let mut ev = fake();
    // The default's search timing (10 ms) was taken under load; interleaved with the others
    // it is clearly the fastest.
    let (dk, dc) = default_for(&w, hw).unwrap();
    ev.samples.insert(key(dk, &dc), around(0.5e-3, 0.01));
    for (v, m) in [(1, 1.02e-3), (2, 1.01e-3), (3, 1.0e-3)] {
        ev.samples.insert(key(&Scripted, &x(v)), around(m, 0.01));
    }
    let s = tune_with(&db, &w, hw, &[&Scripted], &opts(6), &mut ev, &mut |_| {}).unwrap();
    assert!(
        ev.remeasured[0].contains(&key(dk, &dc)),
        "{:?}",
        ev.remeasured[0]
    );
    let d = s.decision.unwrap();
    assert_eq!(
        (d.winner.kernel.as_str(), &d.winner.config),
        (dk.name(), &dc)
    );
    assert_eq!(d.reason, WinReason::Fastest);
    assert_eq!(db.best(&hw.id, &w).unwrap().unwrap().config, dc);
}

/// A family of configs `x` in {0, 1}, serial (`par` none) or on `threads` threads (`par` m),
/// never run.
struct Threaded {
    threads: usize,
}
impl Kernel for Threaded {
    fn name(&self) -> &'static str {
        "threaded"
    }
    fn version(&self) -> u32 {
        1
    }
    fn supports(&self, _: &Workload) -> bool {
        true
    }
    fn space(&self, _: &Workload, _: &HardwareFingerprint) -> Space {
        Space::new()
            .knob("x", [0usize, 1])
            .knob("par", ["none", "m"])
            .knob("threads", [self.threads])
    }
    fn default_config(&self, _: &Workload, _: &HardwareFingerprint) -> Config {
        threaded(0, "m", self.threads)
    }
    fn build(&self, _: &Workload, _: &Config) -> kernels::Result<Box<dyn Executable>> {
        Ok(Box::new(Never))
    }
}

fn threaded(x: usize, par: &str, threads: usize) -> Config {
    Config::from_pairs([
        ("x", kernels::Value::from(x)),
        ("par", kernels::Value::from(par)),
        ("threads", kernels::Value::from(threads)),
    ])
}

#[test]
fn on_a_busy_machine_configs_on_fewer_threads_than_the_default_cannot_win() {
    // A fixed 4-core machine, so the default of this shape runs on several threads whatever
    // CPU runs the test.
    let hw = HardwareFingerprint::reference_zen3().with_cores(4);
    let w: Workload = "gemm:512x512x512".parse().unwrap();
    let (_, dc) = default_for(&w, &hw).unwrap();
    let many = dc.threads();
    assert!(many > 1, "the default of {w} on 4 cores is parallel: {dc}");
    let family: &'static Threaded = Box::leak(Box::new(Threaded { threads: many }));
    let serial = key(family, &threaded(1, "none", many));
    // `serial_ms`: the serial config's time; every other config takes 10 ms.
    let decide = |share: Option<f64>, serial_ms: f64| {
        let db = TuningDb::in_memory().unwrap();
        db.upsert_fingerprint(&hw).unwrap();
        let mut ev = Fake {
            share,
            ..Fake::default()
        };
        ev.medians.insert(serial.clone(), serial_ms * 1e-3);
        let s = tune_with(&db, &w, &hw, &[family], &opts(8), &mut ev, &mut |_| {}).unwrap();
        let warned = search::report::warnings(&s)
            .iter()
            .any(|t| t.contains("other work held the cores"));
        assert_eq!(warned, share.is_some_and(|e| e < runner::CONTENDED));
        s.decision.expect("a decision")
    };

    // Quiet: a tie goes to fewer threads, and a faster serial config wins outright.
    let quiet = decide(Some(0.98), 10.0);
    assert!(quiet.tie && !quiet.contended());
    assert_eq!(quiet.cpu_share, Some(0.98));
    assert_eq!(quiet.reason, WinReason::TieSimpler);
    assert_eq!(
        quiet.winner.config.threads(),
        1,
        "fewer threads when as fast"
    );
    let quiet = decide(Some(0.98), 5.0);
    assert_eq!(
        (quiet.reason, quiet.winner.config.threads()),
        (WinReason::Fastest, 1)
    );

    // Busy: neither a tie nor a faster time makes a serial config the winner.
    for serial_ms in [10.0, 5.0] {
        let busy = decide(Some(0.6), serial_ms);
        assert!(busy.contended());
        assert_eq!(
            busy.winner.config.threads(),
            many,
            "serial at {serial_ms} ms under load: the default's thread count wins"
        );
    }

    // Not measured (a GPU, say): the quiet rules.
    let unmeasured = decide(None, 10.0);
    assert!(!unmeasured.contended());
    assert_eq!(unmeasured.winner.config.threads(), 1);
}

/// Where no finalist runs fewer threads than the default config (a serial default), a busy
/// machine cannot change the verdict: the CPU share is not measured, and nothing warns (it had
/// warned that configs on fewer threads than the default's could not win).
#[test]
fn a_serial_default_needs_no_cpu_share() {
    let hw = HardwareFingerprint::reference_zen3().with_cores(4);
    let w: Workload = "gemm:8x8x8".parse().unwrap();
    let (_, dc) = default_for(&w, &hw).unwrap();
    assert_eq!(dc.threads(), 1, "the default of {w} is serial: {dc}");
    let family: &'static Threaded = Box::leak(Box::new(Threaded { threads: 4 }));
    let db = TuningDb::in_memory().unwrap();
    db.upsert_fingerprint(&hw).unwrap();
    let mut ev = Fake {
        share: Some(0.6),
        ..Fake::default()
    };
    let s = tune_with(&db, &w, &hw, &[family], &opts(8), &mut ev, &mut |_| {}).unwrap();
    let d = s.decision.as_ref().expect("a decision");
    assert!(d.finalists.iter().any(|f| f.record.config.threads() == 4));
    assert_eq!(d.cpu_share, None);
    assert!(!d.contended());
    assert!(
        search::report::warnings(&s).is_empty(),
        "{:?}",
        search::report::warnings(&s)
    );
}

#[test]
fn a_default_that_ran_at_another_speed_when_re_measured_is_a_warning() {
    let (_, hw, w) = setup();
    let (dk, dc) = default_for(&w, hw).unwrap();
    let warned = |remeasured_ms: f64| {
        let db = TuningDb::in_memory().unwrap();
        db.upsert_fingerprint(hw).unwrap();
        let mut ev = fake();
        // The default: 10 ms while searched, `remeasured_ms` among the finalists.
        ev.samples
            .insert(key(dk, &dc), vec![remeasured_ms * 1e-3; 3]);
        let s = tune_with(&db, &w, hw, &[&Scripted], &opts(6), &mut ev, &mut |_| {}).unwrap();
        let drift = s.drift().expect("the default was re-measured");
        let texts = search::report::warnings(&s);
        (
            drift,
            texts
                .iter()
                .any(|t| t.contains("the machine's speed moved")),
        )
    };
    let (d, w1) = warned(10.0);
    assert!((d - 1.0).abs() < 1e-9 && !w1, "steady: {d}");
    let (d, w2) = warned(20.0);
    assert!((d - 2.0).abs() < 1e-9 && w2, "twice as slow: {d}");
}
