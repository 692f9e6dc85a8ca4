//! The tuning loop: ask the strategy, prepare the batch, evaluate each candidate one at a time
//! through an [`Evaluator`] (in this process, or in a watched worker process), commit every
//! trial (failures included) to the database, tell the strategy. At the end, re-measure the
//! finalists interleaved and decide the winner, a statistical tie going to the incumbent or
//! the simpler config, so that reruns on a noisy machine keep the same winner.
//!
//! **Quarantine.** A config that crashed the worker, hung past its deadline or ran out of
//! memory (`crashed`, `timeout`, `oom`) for a workload, kernel and kernel version is never
//! measured again on this machine: like every tried config it is skipped whatever strategy,
//! seed or budget proposes it, and not even the default config is re-run if it is quarantined.

use std::collections::HashSet;
use std::time::Duration;

use kernels::{
    default_for, kernels_for, Config, DeviceKind, HardwareFingerprint, Kernel, Measurement, Status,
    Workload,
};
use runner::{
    derived_timeout, median_ci, not_slower, overlaps, EvalError, Evaluation, Evaluator, InProcess,
    Outcome, Protocol,
};
use tuning_db::{DbError, Record, Remeasurement, TuningDb, WinnerDecision};

use crate::strategy::StrategyKind;

/// One point of a workload's joint search space: a kernel family and one of its configs.
#[derive(Clone)]
pub struct Candidate {
    pub kernel: &'static dyn Kernel,
    pub config: Config,
}

impl std::fmt::Debug for Candidate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.kernel.name(), self.config)
    }
}

/// Every valid config of every family in `families` that supports `w`, in a fixed order.
pub fn candidates(
    w: &Workload,
    hw: &HardwareFingerprint,
    families: &[&'static dyn Kernel],
) -> Vec<Candidate> {
    families
        .iter()
        .copied()
        .filter(|k| k.supports(w))
        .flat_map(|kernel| {
            kernel
                .space(w, hw)
                .iter_valid()
                .map(move |config| Candidate { kernel, config })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Time limit for the default config's own evaluation (before any time is known), unless
/// [`TuneOptions::timeout`] is set.
pub const INITIAL_TIMEOUT: Duration = Duration::from_secs(300);

/// Time limit per candidate when the default config could not be timed in this run (it is
/// quarantined), unless [`TuneOptions::timeout`] is set.
pub const FALLBACK_TIMEOUT: Duration = Duration::from_secs(60);

/// Settings of one tuning job.
#[derive(Debug, Clone)]
pub struct TuneOptions {
    /// Distinct configs to have tried for each workload on this machine, counting trials
    /// already in the database: re-running the same command resumes instead of repeating.
    pub budget: usize,
    pub strategy: StrategyKind,
    pub seed: u64,
    pub protocol: Protocol,
    /// Candidates prepared together (in parallel, in-process) before being measured one by one.
    pub batch: usize,
    /// Stored in every record.
    pub tool_version: String,
    /// Finalists re-measured interleaved before a winner is declared: the fastest distinct
    /// configs by trial median, plus the simplest config tied with the fastest, the incumbent
    /// and the default config (so a winner beats the default head to head). 0 turns
    /// re-measurement and the recorded
    /// decision off (the fastest trial then wins, as [`TuningDb::best`] finds it).
    pub finalists: usize,
    /// Rounds of the interleaved re-measurement (one sample of every finalist per round).
    pub remeasure_rounds: usize,
    /// Per-candidate time limit for evaluators that enforce one (worker processes). `None`:
    /// [`derived_timeout`] of the default config's evaluation time (`max(2 s, 50 ×)`).
    pub timeout: Option<Duration>,
}

impl Default for TuneOptions {
    fn default() -> Self {
        TuneOptions {
            budget: 32,
            strategy: StrategyKind::Random,
            seed: 0,
            protocol: Protocol::quick(),
            batch: 8,
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
            finalists: 3,
            remeasure_rounds: 31,
            timeout: None,
        }
    }
}

/// Progress notifications, for progress bars and logs.
#[derive(Debug)]
pub enum Event<'a> {
    /// Tuning of a workload begins.
    Started {
        workload: &'a Workload,
        space_size: usize,
        budget: usize,
        already_tried: usize,
    },
    /// The default config was measured (the baseline for the speedup).
    Default { record: &'a Record },
    /// One candidate finished (any status).
    Trial {
        record: &'a Record,
        done: usize,
        budget: usize,
        best_gflops: Option<f64>,
    },
    /// The search is over; the finalists are being re-measured to decide the winner (when
    /// [`TuneOptions::finalists`] is not 0).
    Deciding,
}

/// Why the winner won.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WinReason {
    /// The only verified config.
    OnlyCandidate,
    /// Fastest after re-measurement, every other finalist significantly slower (paired by
    /// round, [`runner::not_slower`]).
    Fastest,
    /// Tied with the fastest (not significantly slower, round by round): the incumbent stays.
    TieIncumbent,
    /// Tied with the fastest, no incumbent among them: the simplest config wins.
    TieSimpler,
    /// Re-measurement failed (see [`Decision::note`]): the fastest trial median wins.
    Unconfirmed,
}

impl WinReason {
    /// The text stored in the database's `winners.reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            WinReason::OnlyCandidate => "only_candidate",
            WinReason::Fastest => "fastest",
            WinReason::TieIncumbent => "tie_incumbent",
            WinReason::TieSimpler => "tie_simpler",
            WinReason::Unconfirmed => "unconfirmed",
        }
    }
}

impl std::fmt::Display for WinReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One finalist of a decision.
#[derive(Debug, Clone)]
pub struct Finalist {
    /// Its trial record (the measurement of the search).
    pub record: Record,
    /// Its interleaved re-measurement, when that succeeded.
    pub remeasured: Option<Measurement>,
    /// 95% confidence interval of the re-measured median, seconds (`(0, ∞)` if not re-measured).
    pub ci: (f64, f64),
    /// Whether it was the previous winner.
    pub incumbent: bool,
}

/// How the winner of a workload was decided at the end of a job.
#[derive(Debug, Clone)]
pub struct Decision {
    pub winner: Record,
    pub reason: WinReason,
    /// Whether another finalist was statistically tied with the fastest one.
    pub tie: bool,
    pub finalists: Vec<Finalist>,
    /// Rounds each finalist was re-measured for (0 when not re-measured).
    pub rounds: usize,
    /// Why re-measurement failed, if it did.
    pub note: Option<String>,
}

impl Decision {
    /// Finalists that were re-measured.
    pub fn remeasured(&self) -> usize {
        self.finalists
            .iter()
            .filter(|f| f.remeasured.is_some())
            .count()
    }

    /// The winner's re-measured median (seconds), if it was re-measured.
    pub fn winner_remeasured_s(&self) -> Option<f64> {
        self.finalists
            .iter()
            .find(|f| f.record.id == self.winner.id)
            .and_then(|f| f.remeasured.as_ref())
            .map(|m| m.median_s)
    }
}

/// What a tuning job achieved for one workload.
#[derive(Debug, Clone)]
pub struct TuneSummary {
    pub workload: Workload,
    /// The winner the database serves after this run ([`TuningDb::best`]).
    pub best: Option<Record>,
    /// The default config's record, measured in this run (or its quarantined record).
    pub default: Record,
    /// Number of valid candidates in the joint space.
    pub space_size: usize,
    /// Configs measured by this run (excluding the re-measured default).
    pub measured: usize,
    /// Configs the strategy proposed that were already in the database.
    pub resumed: usize,
    /// Of `measured`, how many failed (any status but ok).
    pub failures: usize,
    /// The winner decision of this run: `None` when [`TuneOptions::finalists`] is 0, or when
    /// this run measured nothing new and an earlier decision stands.
    pub decision: Option<Decision>,
    /// Timed (ok) evaluations of this run, the default's included.
    pub timed: usize,
    /// Median over this run's timed evaluations of their spread (MAD ÷ median).
    pub median_spread: Option<f64>,
    /// Median over this run's timed evaluations of their coefficient of variation
    /// (standard deviation ÷ mean of the samples).
    pub median_cv: Option<f64>,
    /// Where candidates ran: `"none"` (in-process) or `"process"`.
    pub isolation: &'static str,
    /// Per-candidate time limit in force after the default was timed (isolation only).
    pub timeout: Option<Duration>,
    /// Times the worker process was restarted after a candidate killed it.
    pub restarts: usize,
    /// Quarantined configs (crashed, timeout, oom) of this workload's families: never re-run.
    pub quarantined: usize,
}

impl TuneSummary {
    /// Default time ÷ best time (1.0 when the default is the best), as the decision saw
    /// them ([`TuneSummary::decided_medians`]).
    pub fn speedup_vs_default(&self) -> Option<f64> {
        let (best, default, _) = self.decided_medians()?;
        Some(default / best)
    }

    /// (best, default) median seconds from the interleaved re-measurement when this run
    /// re-measured both (what decided the winner), else from their search trials; and which
    /// of the two they are (`true`: re-measured).
    pub fn decided_medians(&self) -> Option<(f64, f64, bool)> {
        let best = self.best.as_ref()?;
        if let Some((b, d)) = self
            .remeasured_s(best)
            .zip(self.remeasured_s(&self.default))
        {
            return Some((b, d, true));
        }
        let trial = |r: &Record| r.measurement.as_ref().map(|m| m.median_s);
        let (b, d) = trial(best).zip(trial(&self.default))?;
        Some((b, d, false))
    }

    /// The re-measured median of the finalist with `r`'s kernel and config, if any.
    pub fn remeasured_s(&self, r: &Record) -> Option<f64> {
        let d = self.decision.as_ref()?;
        d.finalists
            .iter()
            .find(|f| f.record.kernel == r.kernel && f.record.config == r.config)
            .and_then(|f| f.remeasured.as_ref())
            .map(|m| m.median_s)
    }

    /// Whether the decision of this run declared a tie.
    pub fn tie(&self) -> bool {
        self.decision.as_ref().is_some_and(|d| d.tie)
    }

    /// Finalists re-measured by this run.
    pub fn remeasured(&self) -> usize {
        self.decision.as_ref().map_or(0, Decision::remeasured)
    }
}

/// Errors of the tuning loop (candidate failures are not errors: they become records).
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("no kernel supports workload {0}")]
    Unsupported(String),
    #[error(transparent)]
    Eval(#[from] EvalError),
    #[error(transparent)]
    Kernel(#[from] kernels::Error),
}

/// Tunes `w` over every registered kernel family on this machine (`hw` must be the current
/// machine's fingerprint), writing every trial to `db`. Candidates run in this process.
pub fn tune(
    db: &TuningDb,
    w: &Workload,
    hw: &HardwareFingerprint,
    opts: &TuneOptions,
    on_event: &mut dyn FnMut(Event<'_>),
) -> Result<TuneSummary, SearchError> {
    tune_families(db, w, hw, &kernels_for(w, hw), opts, on_event)
}

/// [`tune`] over the given kernel families only (tests plant faulty families this way). The
/// default config, the speedup's baseline, is always the registry's.
pub fn tune_families(
    db: &TuningDb,
    w: &Workload,
    hw: &HardwareFingerprint,
    families: &[&'static dyn Kernel],
    opts: &TuneOptions,
    on_event: &mut dyn FnMut(Event<'_>),
) -> Result<TuneSummary, SearchError> {
    tune_with(db, w, hw, families, opts, &mut InProcess::new(), on_event)
}

/// [`tune_families`] with candidates evaluated by `evaluator`: [`InProcess`], or
/// [`runner::Isolated`] for crash isolation.
pub fn tune_with(
    db: &TuningDb,
    w: &Workload,
    hw: &HardwareFingerprint,
    families: &[&'static dyn Kernel],
    opts: &TuneOptions,
    evaluator: &mut dyn Evaluator,
    on_event: &mut dyn FnMut(Event<'_>),
) -> Result<TuneSummary, SearchError> {
    let cands = candidates(w, hw, families);
    if cands.is_empty() {
        return Err(SearchError::Unsupported(w.key()));
    }
    db.upsert_fingerprint(hw)?;
    evaluator.setup(w, opts.seed ^ 0x5EED)?;

    let (dk, dc) = default_for(w, hw)?;
    let mut tried: HashSet<(String, String)> = HashSet::new();
    for k in families.iter().chain(std::iter::once(&dk)) {
        for c in db.tried_configs(&hw.id, w, k.name(), k.version())? {
            tried.insert((k.name().to_string(), c));
        }
    }
    let history = db.trials(&hw.id, w)?;
    let current_version = |r: &Record| {
        families
            .iter()
            .chain(std::iter::once(&dk))
            .any(|k| k.name() == r.kernel && k.version() == r.kernel_version)
    };
    let quarantine: Vec<&Record> = history
        .iter()
        .filter(|r| is_quarantine(r.status) && current_version(r))
        .collect();
    let quarantined: HashSet<(String, String)> = quarantine
        .iter()
        .map(|r| (r.kernel.clone(), r.config.to_json()))
        .collect();
    on_event(Event::Started {
        workload: w,
        space_size: cands.len(),
        budget: opts.budget,
        already_tried: tried.len(),
    });

    let record = |kernel: &dyn Kernel, config: &Config, outcome: Outcome| -> Record {
        match outcome.measurement {
            Some(m) => Record::ok(
                &hw.id,
                *w,
                kernel.name(),
                kernel.version(),
                config.clone(),
                m,
                &opts.tool_version,
            ),
            None => Record::failed(
                &hw.id,
                *w,
                kernel.name(),
                kernel.version(),
                config.clone(),
                outcome.status,
                outcome.message.unwrap_or_default(),
                &opts.tool_version,
            ),
        }
    };
    let mut timed: Vec<Measurement> = Vec::new();

    // The default first: the baseline of the speedup, the first data point, and the yardstick
    // of the per-candidate time limit. A quarantined default is not run again.
    let default_key = (dk.name().to_string(), dc.to_json());
    evaluator.set_timeout(opts.timeout.unwrap_or(INITIAL_TIMEOUT));
    let default = match quarantine
        .iter()
        .find(|r| (r.kernel.clone(), r.config.to_json()) == default_key)
    {
        Some(q) => {
            evaluator.set_timeout(opts.timeout.unwrap_or(FALLBACK_TIMEOUT));
            (*q).clone()
        }
        None => {
            let Evaluation { outcome, elapsed } = evaluator.evaluate(dk, &dc, &opts.protocol)?;
            evaluator.set_timeout(opts.timeout.unwrap_or_else(|| derived_timeout(elapsed)));
            let mut rec = record(dk, &dc, outcome);
            if tried.insert(default_key.clone()) {
                rec.id = Some(db.insert(&rec)?);
            }
            timed.extend(rec.measurement.clone());
            rec
        }
    };
    on_event(Event::Default { record: &default });

    let mut strategy = strategy_for(opts.strategy, hw).build(
        crate::strategy::SearchContext::from_db(db, w, hw, &cands, opts.seed)?,
    );
    let (mut measured, mut resumed, mut failures) = (0, 0, 0);
    let mut done = tried.len().min(opts.budget);
    let mut best_gflops = db.best(&hw.id, w)?.and_then(|r| r.gflops);

    while done < opts.budget {
        let batch = strategy.ask(opts.batch.min(opts.budget - done).max(1));
        if batch.is_empty() {
            break;
        }
        let mut told = Vec::with_capacity(batch.len());
        let fresh: Vec<usize> = batch
            .iter()
            .copied()
            .filter(|&i| {
                let c = &cands[i];
                let key = (c.kernel.name().to_string(), c.config.to_json());
                if tried.contains(&key) || quarantined.contains(&key) {
                    told.push((i, None));
                    resumed += 1;
                    false
                } else {
                    true
                }
            })
            .collect();
        let ahead: Vec<(&'static dyn Kernel, Config)> = fresh
            .iter()
            .map(|&i| (cands[i].kernel, cands[i].config.clone()))
            .collect();
        evaluator.prepare(&ahead);
        for i in fresh {
            let c = &cands[i];
            let Evaluation { outcome, .. } =
                evaluator.evaluate(c.kernel, &c.config, &opts.protocol)?;
            let mut rec = record(c.kernel, &c.config, outcome);
            rec.id = Some(db.insert(&rec)?);
            tried.insert((c.kernel.name().to_string(), c.config.to_json()));
            measured += 1;
            done += 1;
            match &rec.measurement {
                Some(m) => timed.push(m.clone()),
                None => failures += 1,
            }
            if let Some(g) = rec.gflops {
                best_gflops = Some(best_gflops.map_or(g, |b: f64| b.max(g)));
            }
            told.push((i, rec.measurement.as_ref().map(|m| m.median_s)));
            on_event(Event::Trial {
                record: &rec,
                done,
                budget: opts.budget,
                best_gflops,
            });
        }
        done = done.max(tried.len().min(opts.budget));
        strategy.tell(&told);
    }

    if opts.finalists > 0 {
        on_event(Event::Deciding);
    }
    let decision = decide(db, w, hw, families, opts, evaluator, measured)?;
    let quarantined_now = db
        .trials(&hw.id, w)?
        .iter()
        .filter(|r| is_quarantine(r.status) && current_version(r))
        .map(|r| (r.kernel.clone(), r.config.to_json()))
        .collect::<HashSet<_>>()
        .len();
    Ok(TuneSummary {
        workload: *w,
        best: db.best(&hw.id, w)?,
        default,
        space_size: cands.len(),
        measured,
        resumed,
        failures,
        decision,
        timed: timed.len(),
        median_spread: median_of(timed.iter().map(|m| m.spread)),
        median_cv: median_of(timed.iter().filter_map(cv)),
        isolation: evaluator.isolation(),
        timeout: evaluator.timeout(),
        restarts: evaluator.restarts(),
        quarantined: quarantined_now,
    })
}

/// The strategy that runs for `asked` on `hw`: the cost model's features describe CPU kernels
/// (micro-kernel shape, cache footprints), so on a GPU `model` searches evolutionarily
/// instead of pretending to learn.
fn strategy_for(asked: StrategyKind, hw: &HardwareFingerprint) -> StrategyKind {
    match (asked, hw.device_kind()) {
        (StrategyKind::Model { .. }, DeviceKind::Cuda) => StrategyKind::Evolutionary,
        (kind, _) => kind,
    }
}

/// Statuses that quarantine a config: the candidate took its process down or had to be killed.
pub fn is_quarantine(status: Status) -> bool {
    matches!(status, Status::Crashed | Status::Timeout | Status::Oom)
}

/// Median of the finite values, `None` if there are none.
pub(crate) fn median_of(values: impl Iterator<Item = f64>) -> Option<f64> {
    let v: Vec<f64> = values.filter(|x| x.is_finite()).collect();
    (!v.is_empty()).then(|| kernels::measurement::median(&v))
}

/// Coefficient of variation of a measurement's samples (sample standard deviation ÷ mean).
pub(crate) fn cv(m: &Measurement) -> Option<f64> {
    let n = m.samples.len();
    if n < 2 {
        return None;
    }
    let mean = m.samples.iter().sum::<f64>() / n as f64;
    let var = m.samples.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    (mean > 0.0).then(|| var.sqrt() / mean)
}

/// The deterministic "simpler" order used to break ties: fewer threads, then kernel name
/// (`gemm_direct` before `gemm_packed`: no packing), then the default config before others,
/// then the config's JSON.
pub fn simplicity_key(
    kernel: &str,
    config: &Config,
    default: (&str, &Config),
) -> (i64, String, bool, String) {
    (
        config.threads() as i64,
        kernel.to_string(),
        !(kernel == default.0 && config == default.1),
        config.to_json(),
    )
}

/// Picks and records the winner of `w` (see the module docs).
fn decide(
    db: &TuningDb,
    w: &Workload,
    hw: &HardwareFingerprint,
    families: &[&'static dyn Kernel],
    opts: &TuneOptions,
    evaluator: &mut dyn Evaluator,
    measured_now: usize,
) -> Result<Option<Decision>, SearchError> {
    if opts.finalists == 0 {
        return Ok(None);
    }
    let (dk, dc) = default_for(w, hw)?;
    let lookup = |r: &Record| -> Option<&'static dyn Kernel> {
        families
            .iter()
            .chain(kernels::registry())
            .copied()
            .find(|k| k.name() == r.kernel && k.version() == r.kernel_version)
            .filter(|k| k.supports(w) && k.space(w, hw).check(&r.config).is_ok())
    };
    let history = db.trials(&hw.id, w)?;
    let previous = db.winner(&hw.id, w)?;
    let incumbent = previous.as_ref().and_then(|p| {
        history
            .iter()
            .find(|r| r.id == Some(p.trial_id) && r.status == Status::Ok && lookup(r).is_some())
    });
    if measured_now == 0 && incumbent.is_some() {
        return Ok(None);
    }

    let mut ok: Vec<&Record> = history
        .iter()
        .filter(|r| r.status == Status::Ok && r.median_s().is_some() && lookup(r).is_some())
        .collect();
    ok.sort_by(|a, b| {
        a.median_s()
            .unwrap_or(f64::INFINITY)
            .total_cmp(&b.median_s().unwrap_or(f64::INFINITY))
            .then(a.id.cmp(&b.id))
    });
    let mut seen = HashSet::new();
    let distinct: Vec<&Record> = ok
        .into_iter()
        .filter(|r| seen.insert((r.kernel.clone(), r.config.to_json())))
        .collect();
    let mut picked: Vec<&Record> = distinct.iter().copied().take(opts.finalists).collect();
    fn add<'r>(picked: &mut Vec<&'r Record>, r: &'r Record) {
        if !picked
            .iter()
            .any(|p| p.kernel == r.kernel && p.config == r.config)
        {
            picked.push(r);
        }
    }
    // The simplest config whose search timing is statistically tied with the fastest one's
    // joins the finalists: which configs make the top few by median changes from run to run
    // on a noisy machine, this one much less, and on a tie in the re-measurement it wins.
    if let Some(fastest) = distinct.first() {
        let ci_of = |r: &Record| {
            r.measurement
                .as_ref()
                .map_or((0.0, f64::INFINITY), |m| median_ci(&m.samples))
        };
        let best_ci = ci_of(fastest);
        let simplest_tied = distinct
            .iter()
            .copied()
            .filter(|r| overlaps(ci_of(r), best_ci))
            .min_by_key(|r| simplicity_key(&r.kernel, &r.config, (dk.name(), &dc)));
        if let (Some(r), true) = (simplest_tied, opts.finalists > 0) {
            add(&mut picked, r);
        }
    }
    if let Some(inc) = incumbent {
        add(&mut picked, inc);
    }
    // The default config joins too: it is what an untuned runtime serves, so a winner must
    // beat it head to head, not only by trial medians taken minutes apart under another load.
    if let Some(d) = distinct
        .iter()
        .find(|r| r.kernel == dk.name() && r.config == dc)
    {
        add(&mut picked, d);
    }
    if picked.is_empty() {
        return Ok(None);
    }
    let is_incumbent =
        |r: &Record| incumbent.is_some_and(|i| i.kernel == r.kernel && i.config == r.config);
    let unmeasured = |r: &Record| Finalist {
        record: r.clone(),
        remeasured: None,
        ci: (0.0, f64::INFINITY),
        incumbent: is_incumbent(r),
    };

    let decision = if picked.len() == 1 {
        Decision {
            winner: picked[0].clone(),
            reason: WinReason::OnlyCandidate,
            tie: false,
            finalists: vec![unmeasured(picked[0])],
            rounds: 0,
            note: None,
        }
    } else {
        let pairs: Vec<(&dyn Kernel, Config)> = picked
            .iter()
            .map(|r| {
                let k: &dyn Kernel = lookup(r).expect("filtered on lookup above");
                (k, r.config.clone())
            })
            .collect();
        match evaluator.remeasure(&pairs, &opts.protocol, opts.remeasure_rounds) {
            Err(e) => Decision {
                winner: picked[0].clone(),
                reason: WinReason::Unconfirmed,
                tie: false,
                finalists: picked.iter().map(|r| unmeasured(r)).collect(),
                rounds: 0,
                note: Some(e.to_string()),
            },
            Ok(ms) => {
                let finalists: Vec<Finalist> = picked
                    .iter()
                    .zip(ms)
                    .map(|(r, m)| Finalist {
                        record: (*r).clone(),
                        ci: median_ci(&m.samples),
                        remeasured: Some(m),
                        incumbent: is_incumbent(r),
                    })
                    .collect();
                let median =
                    |f: &Finalist| f.remeasured.as_ref().map_or(f64::INFINITY, |m| m.median_s);
                let fastest = (0..finalists.len())
                    .min_by(|&a, &b| median(&finalists[a]).total_cmp(&median(&finalists[b])))
                    .expect("at least two finalists");
                // Tied with the fastest: not slower than it, judged round by round (the
                // rounds are interleaved, so each pairs samples taken moments apart).
                let samples = |i: usize| {
                    finalists[i]
                        .remeasured
                        .as_ref()
                        .map_or(&[][..], |m| &m.samples[..])
                };
                let group: Vec<usize> = (0..finalists.len())
                    .filter(|&i| i == fastest || not_slower(samples(i), samples(fastest)))
                    .collect();
                let tie = group.len() > 1;
                let (winner, reason) =
                    if let Some(&inc) = group.iter().find(|&&i| finalists[i].incumbent) {
                        (
                            inc,
                            if tie {
                                WinReason::TieIncumbent
                            } else {
                                WinReason::Fastest
                            },
                        )
                    } else {
                        let simplest = *group
                            .iter()
                            .min_by_key(|&&i| {
                                let r = &finalists[i].record;
                                simplicity_key(&r.kernel, &r.config, (dk.name(), &dc))
                            })
                            .expect("the group holds the fastest");
                        if simplest == fastest {
                            (fastest, WinReason::Fastest)
                        } else {
                            (simplest, WinReason::TieSimpler)
                        }
                    };
                Decision {
                    winner: finalists[winner].record.clone(),
                    reason,
                    tie,
                    rounds: finalists[0]
                        .remeasured
                        .as_ref()
                        .map_or(0, |m| m.samples.len()),
                    finalists,
                    note: None,
                }
            }
        }
    };

    let Some(trial_id) = decision.winner.id else {
        return Ok(Some(decision));
    };
    db.record_winner(&WinnerDecision {
        id: None,
        fingerprint_id: hw.id.clone(),
        workload: *w,
        trial_id,
        reason: decision.reason.as_str().to_string(),
        tie: decision.tie,
        remeasured: decision
            .finalists
            .iter()
            .filter_map(|f| {
                Some(Remeasurement {
                    trial_id: f.record.id?,
                    measurement: f.remeasured.clone()?,
                    ci_low_s: f.ci.0,
                    ci_high_s: f.ci.1,
                })
            })
            .collect(),
        decided_at: tuning_db::now_rfc3339(),
        tool_version: opts.tool_version.clone(),
    })?;
    Ok(Some(decision))
}
