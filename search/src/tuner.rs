//! The tuning loop of one workload ([`tune_with`]), in steps:
//!
//! 1. **Resume**: set the evaluator up, read the configs this machine already tried and the
//!    quarantined ones from the database.
//! 2. **Default**: evaluate the registry's default config first: the baseline of the speedup
//!    and the yardstick of the per-candidate time limit.
//! 3. **Search**: ask the strategy for a batch, prepare its new candidates together, evaluate
//!    each one at a time through an [`Evaluator`] (in this process, or in a watched worker
//!    process), commit every trial (failures included) to the database, tell the strategy;
//!    until the budget of distinct configs is tried.
//! 4. **Decide** ([`crate::decide`]): re-measure the finalists interleaved and decide the
//!    winner, a statistical tie going to the incumbent or the simpler config, so that reruns
//!    on a noisy machine keep the same winner.
//! 5. **Summarise** the job in a [`TuneSummary`].
//!
//! **Quarantine.** A config that crashed the worker, hung past its deadline or ran out of
//! memory (`crashed`, `timeout`, `oom`) for a workload, kernel and kernel version is never
//! measured again on this machine: like every tried config it is skipped whatever strategy,
//! seed or budget proposes it, and not even the default config is re-run if it crashed or ran
//! out of memory (one that timed out is: a deadline too tight for the runtime's fallback
//! says nothing against it). What counts is a config's latest trial: [`TuneOptions::retry_failed`] measures the
//! quarantined ones again (limits that were too tight, a worker killed from outside), and a
//! config that then passes is quarantined no more.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kernels::{
    default_for, kernels_for, Accuracy, Config, DeviceKind, HardwareFingerprint, Kernel,
    Measurement, Status, Workload,
};
use runner::{derived_timeout, EvalError, Evaluation, Evaluator, InProcess, Outcome, Protocol};
use tuning_db::{DbError, Record, TuningDb};

use crate::decide::{decide, Decision};
use crate::strategy::{SearchContext, StrategyKind};

/// One point of a workload's joint search space: a kernel family and one of its configs.
#[derive(Clone)]
pub struct Candidate {
    /// The kernel family.
    pub kernel: &'static dyn Kernel,
    /// A valid config of its space for the workload.
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
    /// Which configs to measure, in what order ([`StrategyKind::DEFAULT`], model-guided, by
    /// default, as for the CLI). On a GPU, a model-guided search runs as
    /// [`StrategyKind::Evolutionary`]: the cost model's features describe CPU kernels.
    pub strategy: StrategyKind,
    /// Seed of the strategy's random choices; the seed of the test problem's inputs is
    /// derived from it.
    pub seed: u64,
    /// The timing protocol of every trial and of the finalists' re-measurement.
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
    /// Measure again the configs whose latest trial crashed, timed out or ran out of memory
    /// (quarantined ones): for when the run that failed them had limits too tight, or its
    /// worker was killed from outside. Their new trials are what later runs go by.
    pub retry_failed: bool,
    /// Set from outside (a Ctrl-C the host saw) to stop the job before its next
    /// measurement: it returns [`SearchError::Stopped`], every trial measured so far stored.
    pub stop: Option<Arc<AtomicBool>>,
}

impl TuneOptions {
    /// [`SearchError::Stopped`] once [`TuneOptions::stop`] is set.
    pub(crate) fn check_stop(&self) -> Result<(), SearchError> {
        match &self.stop {
            Some(s) if s.load(Ordering::Relaxed) => Err(SearchError::Stopped),
            _ => Ok(()),
        }
    }

    /// The shortest per-candidate timeout a job may set: a candidate's time includes
    /// building and verifying it, so anything shorter fails every config.
    pub const MIN_TIMEOUT_S: f64 = 0.1;
    /// The longest per-candidate timeout a job may set: a day.
    pub const MAX_TIMEOUT_S: f64 = 86_400.0;

    /// A per-candidate timeout given in seconds (`None`: derived per workload), checked:
    /// a number in `[MIN_TIMEOUT_S, MAX_TIMEOUT_S]`. The error says what it got.
    pub fn timeout_from_secs(s: Option<f64>) -> Result<Option<Duration>, String> {
        let range = Self::MIN_TIMEOUT_S..=Self::MAX_TIMEOUT_S;
        match s {
            None => Ok(None),
            Some(s) if range.contains(&s) => Ok(Some(Duration::from_secs_f64(s))),
            Some(s) => Err(format!(
                "must be a number of seconds from {} to {}, not {s:?}",
                Self::MIN_TIMEOUT_S,
                Self::MAX_TIMEOUT_S
            )),
        }
    }
}

impl Default for TuneOptions {
    fn default() -> Self {
        TuneOptions {
            budget: 32,
            strategy: StrategyKind::DEFAULT,
            seed: 0,
            protocol: Protocol::quick(),
            batch: 8,
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
            finalists: 3,
            remeasure_rounds: 31,
            timeout: None,
            retry_failed: false,
            stop: None,
        }
    }
}

/// Progress notifications, for progress bars and logs.
#[derive(Debug)]
pub enum Event<'a> {
    /// Tuning of a workload begins.
    Started {
        /// The workload.
        workload: &'a Workload,
        /// Valid candidates in its joint space.
        space_size: usize,
        /// [`TuneOptions::budget`].
        budget: usize,
        /// Configs already tried on this machine by earlier runs, which are not measured
        /// again (those this run retries are not counted).
        already_tried: usize,
    },
    /// The default config was measured (the baseline for the speedup).
    Default {
        /// Its record, which may be a failure; for a quarantined default, its earlier record
        /// (it is not run again).
        record: &'a Record,
    },
    /// One candidate finished (any status).
    Trial {
        /// Its record, as committed to the database.
        record: &'a Record,
        /// Distinct configs tried towards the budget so far, earlier runs' included; at
        /// most `budget`.
        done: usize,
        /// [`TuneOptions::budget`].
        budget: usize,
        /// The best GFLOP/s on record: the database's winner when the search started, or
        /// a faster trial of this run since; `None` until something is timed.
        best_gflops: Option<f64>,
    },
    /// The search is over; the finalists are being re-measured to decide the winner (when
    /// [`TuneOptions::finalists`] is not 0).
    Deciding,
}

/// What a tuning job achieved for one workload.
#[derive(Debug, Clone)]
pub struct TuneSummary {
    /// The workload tuned.
    pub workload: Workload,
    /// The winner the database serves after this run ([`TuningDb::best`]).
    pub best: Option<Record>,
    /// The winner's error against the exact f32 problem, as stored with it (what a reduced
    /// precision costs; rounding noise for f32); `None` for records older than schema v4.
    pub best_accuracy: Option<Accuracy>,
    /// The default config's record, measured in this run (or its quarantined record).
    pub default: Record,
    /// Number of valid candidates in the joint space.
    pub space_size: usize,
    /// Configs measured by this run (excluding the default; retried ones included).
    pub measured: usize,
    /// Configs the strategy proposed that were already in the database.
    pub resumed: usize,
    /// Of `measured`, how many failed (any status but ok).
    pub failures: usize,
    /// The winner decision of this run: `None` when [`TuneOptions::finalists`] is 0, or when
    /// this run measured nothing new and an earlier decision stands.
    pub decision: Option<Decision>,
    /// Without a decision of this run: the (best, default) medians the decision in force
    /// re-measured side by side, where it re-measured both.
    pub earlier: Option<(f64, f64)>,
    /// Without a decision of this run: why the winner in force won and whether that decision
    /// was a tie (the `winners` row of an earlier run).
    pub standing: Option<(String, bool)>,
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
    /// Configs of this workload's families whose latest trial crashed, timed out or ran
    /// out of memory: never re-run unless [`TuneOptions::retry_failed`].
    pub quarantined: usize,
    /// Those configs by the status of their latest trial, in [`Status::ALL`] order (those
    /// with none left out).
    pub quarantined_by_status: Vec<(Status, usize)>,
}

impl TuneSummary {
    /// Default time ÷ best time (1.0 when the default is the best), as the decision saw
    /// them ([`TuneSummary::decided_medians`]).
    pub fn speedup_vs_default(&self) -> Option<f64> {
        let (best, default, _) = self.decided_medians()?;
        Some(default / best)
    }

    /// (best, default) median seconds from the interleaved re-measurement when this run
    /// re-measured both (what decided the winner) or, deciding nothing, the decision in force
    /// did ([`TuneSummary::earlier`]), else from their search trials; and which of the two
    /// they are (`true`: re-measured).
    pub fn decided_medians(&self) -> Option<(f64, f64, bool)> {
        let best = self.best.as_ref()?;
        if let Some((b, d)) = self
            .remeasured_s(best)
            .zip(self.remeasured_s(&self.default))
            .or(self.earlier)
        {
            return Some((b, d, true));
        }
        let trial = |r: &Record| r.measurement.as_ref().map(|m| m.median_s);
        let (b, d) = trial(best).zip(trial(&self.default))?;
        Some((b, d, false))
    }

    /// Where [`TuneSummary::decided_medians`] took its medians from: `this_run` (this run's
    /// re-measurement), `earlier_decision` ([`TuneSummary::earlier`]) or `search` (the
    /// search trials).
    pub fn speedup_source(&self) -> Option<&'static str> {
        let (_, _, remeasured) = self.decided_medians()?;
        Some(match (remeasured, self.decision.is_some()) {
            (true, true) => "this_run",
            (true, false) => "earlier_decision",
            (false, _) => "search",
        })
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

    /// How much the machine's speed moved during this run, seen on the default config: the
    /// ratio of its search-phase median to its re-measured one (the larger over the smaller,
    /// so ≥ 1), when both exist. Near 1 on a quiet machine; well above 1 means trials were
    /// timed at different speeds, and a winner picked from them may be an artifact (e.g. a
    /// single-threaded config that looked best while another load held a core).
    pub fn drift(&self) -> Option<f64> {
        let first = self.default.measurement.as_ref()?.median_s;
        let again = self.remeasured_s(&self.default)?;
        (first > 0.0 && again > 0.0).then(|| first.max(again) / first.min(again))
    }

    /// Whether the decision of this run declared a tie.
    pub fn tie(&self) -> bool {
        match &self.decision {
            Some(d) => d.tie,
            None => self.standing.as_ref().is_some_and(|s| s.1),
        }
    }

    /// Why the winner won: this run's decision, else the one in force ([`crate::WinReason`]'s
    /// names: `fastest`, `tie_incumbent`, …); `None` where nothing was decided.
    pub fn winner_reason(&self) -> Option<&str> {
        match &self.decision {
            Some(d) => Some(d.reason.as_str()),
            None => self.standing.as_ref().map(|s| s.0.as_str()),
        }
    }

    /// Finalists re-measured by this run.
    pub fn remeasured(&self) -> usize {
        self.decision.as_ref().map_or(0, Decision::remeasured)
    }
}

/// Errors of the tuning loop (candidate failures are not errors: they become records).
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    /// The tuning database failed.
    #[error(transparent)]
    Db(#[from] DbError),
    /// No kernel family of those given supports the workload (its key).
    #[error("no kernel supports workload {0}")]
    Unsupported(String),
    /// The evaluator failed, not a candidate: a worker process that could not be started or
    /// broke the protocol, for one.
    #[error(transparent)]
    Eval(#[from] EvalError),
    /// The workload's test problem (inputs and reference) could not be made: too large for
    /// the memory the candidates may use, for one. Nothing was measured; other workloads may
    /// still be tuned.
    #[error("setting up its test problem: {0}")]
    Setup(EvalError),
    /// The registry names no default config for the workload ([`default_for`] failed).
    #[error(transparent)]
    Kernel(#[from] kernels::Error),
    /// [`TuneOptions::stop`] was set.
    #[error("stopped (every trial measured so far is stored)")]
    Stopped,
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
/// [`runner::Isolated`] for crash isolation. The steps are those of the module docs.
pub fn tune_with(
    db: &TuningDb,
    w: &Workload,
    hw: &HardwareFingerprint,
    families: &[&'static dyn Kernel],
    opts: &TuneOptions,
    evaluator: &mut dyn Evaluator,
    on_event: &mut dyn FnMut(Event<'_>),
) -> Result<TuneSummary, SearchError> {
    let mut job = Job::resume(db, w, hw, families, opts, evaluator)?;
    on_event(Event::Started {
        workload: w,
        space_size: job.cands.len(),
        budget: opts.budget,
        already_tried: job.tried.len(),
    });
    let default = job.run_default()?;
    on_event(Event::Default { record: &default });
    job.search(on_event)?;
    opts.check_stop()?;
    if opts.finalists > 0 {
        on_event(Event::Deciding);
    }
    let decision = decide(db, w, hw, families, opts, &mut *job.evaluator, job.measured)?;
    job.summary(default, decision)
}

/// How the loop knows a config: `(kernel name, config JSON)`.
type Key = (String, String);

fn key(kernel: &str, config: &Config) -> Key {
    (kernel.to_string(), config.to_json())
}

/// The state of one tuning job: what it resumed from the database, and what it measured.
struct Job<'a> {
    db: &'a TuningDb,
    w: &'a Workload,
    hw: &'a HardwareFingerprint,
    opts: &'a TuneOptions,
    evaluator: &'a mut dyn Evaluator,
    /// The families whose records count: the ones tuned and the registry's default family.
    kernels: Vec<&'static dyn Kernel>,
    cands: Vec<Candidate>,
    /// The registry's default kernel and config: the baseline.
    default: (&'static dyn Kernel, Config),
    /// Configs tried on this machine, by earlier runs or this one.
    tried: HashSet<Key>,
    /// Quarantined records of the current kernel versions, in database order.
    quarantine: Vec<Record>,
    /// Their keys: never measured again.
    quarantined: HashSet<Key>,
    /// The configs [`TuneOptions::retry_failed`] measures again: the default's in
    /// [`Job::run_default`], the others before the search.
    retry: HashSet<Key>,
    /// Timed (ok) evaluations of this run, the default's included.
    timed: Vec<Measurement>,
    measured: usize,
    resumed: usize,
    failures: usize,
    /// Distinct configs tried towards the budget (from when the search starts; at most the
    /// budget).
    done: usize,
    /// Best GFLOP/s on record (from when the search starts).
    best_gflops: Option<f64>,
}

impl<'a> Job<'a> {
    /// Sets the evaluator up and resumes from the database: the configs already tried on
    /// this machine, and the quarantined ones.
    fn resume(
        db: &'a TuningDb,
        w: &'a Workload,
        hw: &'a HardwareFingerprint,
        families: &[&'static dyn Kernel],
        opts: &'a TuneOptions,
        evaluator: &'a mut dyn Evaluator,
    ) -> Result<Self, SearchError> {
        let cands = candidates(w, hw, families);
        if cands.is_empty() {
            return Err(SearchError::Unsupported(w.key()));
        }
        db.upsert_fingerprint(hw)?;
        evaluator
            .setup(w, opts.seed ^ 0x5EED)
            .map_err(|e| match e {
                // This workload's problem could not be made (the device and the worker work).
                EvalError::Kernel(_)
                | EvalError::Device(_)
                | EvalError::Worker(runner::WorkerError::Setup { .. }) => SearchError::Setup(e),
                e => SearchError::Eval(e),
            })?;
        let (dk, dc) = default_for(w, hw)?;
        let kernels: Vec<&'static dyn Kernel> = families.iter().copied().chain([dk]).collect();
        let (mut tried, mut quarantine) = on_record(db, w, hw, &kernels)?;
        let mut retry: HashSet<Key> = match opts.retry_failed {
            true => quarantine
                .drain(..)
                .map(|r| key(&r.kernel, &r.config))
                .collect(),
            false => HashSet::new(),
        };
        // A default that timed out ran under a deadline too tight for it (`--timeout-s`): it
        // is what the runtime serves without a record, and the yardstick of every deadline,
        // so it runs again (a slower config had otherwise won unopposed).
        let default_key = key(dk.name(), &dc);
        if let Some(i) = quarantine
            .iter()
            .position(|r| r.status == Status::Timeout && key(&r.kernel, &r.config) == default_key)
        {
            quarantine.remove(i);
            retry.insert(default_key);
        }
        tried.retain(|k| !retry.contains(k));
        let quarantined = quarantine
            .iter()
            .map(|r| key(&r.kernel, &r.config))
            .collect();
        Ok(Job {
            db,
            w,
            hw,
            opts,
            evaluator,
            kernels,
            cands,
            default: (dk, dc),
            tried,
            quarantine,
            quarantined,
            retry,
            timed: Vec::new(),
            measured: 0,
            resumed: 0,
            failures: 0,
            done: 0,
            best_gflops: None,
        })
    }

    /// Evaluates the default config first: the baseline of the speedup, the first data point,
    /// and the yardstick of the per-candidate time limit. A quarantined default is not run
    /// again: its quarantine record stands for it.
    fn run_default(&mut self) -> Result<Record, SearchError> {
        let (dk, dc) = (self.default.0, self.default.1.clone());
        let default_key = key(dk.name(), &dc);
        let limit = self.opts.timeout;
        self.evaluator.set_timeout(limit.unwrap_or(INITIAL_TIMEOUT));
        let quarantined = |r: &&Record| key(&r.kernel, &r.config) == default_key;
        if let Some(q) = self.quarantine.iter().find(quarantined) {
            self.evaluator
                .set_timeout(limit.unwrap_or(FALLBACK_TIMEOUT));
            return Ok(q.clone());
        }
        let Evaluation { outcome, elapsed } =
            self.evaluator.evaluate(dk, &dc, &self.opts.protocol)?;
        // A default that failed (it may be retried: `retry_failed`) says nothing about how
        // long a candidate takes: the fallback limit then, as for a quarantined one.
        let derived = match outcome.measurement {
            Some(_) => derived_timeout(elapsed),
            None => FALLBACK_TIMEOUT,
        };
        self.evaluator.set_timeout(limit.unwrap_or(derived));
        let mut rec = self.record(dk, &dc, outcome);
        if self.tried.insert(default_key) {
            rec.id = Some(self.db.insert(&rec)?);
        }
        self.timed.extend(rec.measurement.clone());
        Ok(rec)
    }

    /// Asks the strategy for batches until the budget of distinct configs is tried or it has
    /// nothing more to propose, telling it every result.
    fn search(&mut self, on_event: &mut dyn FnMut(Event<'_>)) -> Result<(), SearchError> {
        let (db, w, hw, opts) = (self.db, self.w, self.hw, self.opts);
        self.done = self.tried.len().min(opts.budget);
        self.best_gflops = db.best(&hw.id, w)?.and_then(|r| r.gflops);
        self.retry_failed(on_event)?;
        let ctx = SearchContext::from_db(db, w, hw, &self.cands, opts.seed)?;
        let mut strategy = strategy_for(opts.strategy, hw).build(ctx);
        while self.done < opts.budget {
            let batch = strategy.ask(opts.batch.min(opts.budget - self.done).max(1));
            if batch.is_empty() {
                break;
            }
            let told = self.run_batch(&batch, on_event)?;
            self.done = self.done.max(self.tried.len().min(opts.budget));
            strategy.tell(&told);
        }
        Ok(())
    }

    /// Measures again the quarantined configs [`TuneOptions::retry_failed`] asked for (not
    /// the default's, which [`Job::run_default`] ran; not those no longer in the space),
    /// before the strategy is built, so that it learns from their new trials.
    fn retry_failed(&mut self, on_event: &mut dyn FnMut(Event<'_>)) -> Result<(), SearchError> {
        let again: Vec<usize> = (0..self.cands.len())
            .filter(|&i| {
                let k = key(self.cands[i].kernel.name(), &self.cands[i].config);
                self.retry.contains(&k) && !self.tried.contains(&k)
            })
            .collect();
        self.run_batch(&again, on_event)?;
        Ok(())
    }

    /// Measures the candidates of `batch` not tried or quarantined yet (prepared together,
    /// then timed one at a time). Returns what to tell the strategy: the skipped candidates
    /// first, without a time, then the measured ones with their median (`None`: failed).
    fn run_batch(
        &mut self,
        batch: &[usize],
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> Result<Vec<(usize, Option<f64>)>, SearchError> {
        let (fresh, skipped): (Vec<usize>, Vec<usize>) = batch.iter().partition(|&&i| {
            let k = key(self.cands[i].kernel.name(), &self.cands[i].config);
            !self.tried.contains(&k) && !self.quarantined.contains(&k)
        });
        self.resumed += skipped.len();
        let mut told: Vec<(usize, Option<f64>)> = skipped.into_iter().map(|i| (i, None)).collect();
        let ahead: Vec<(&'static dyn Kernel, Config)> = fresh
            .iter()
            .map(|&i| (self.cands[i].kernel, self.cands[i].config.clone()))
            .collect();
        self.evaluator.prepare(&ahead);
        for i in fresh {
            let median = self.measure(i, on_event)?;
            told.push((i, median));
        }
        Ok(told)
    }

    /// Evaluates candidate `i`, commits its record and reports the trial. Returns its median
    /// time (`None` if it failed).
    fn measure(
        &mut self,
        i: usize,
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> Result<Option<f64>, SearchError> {
        self.opts.check_stop()?;
        let Candidate { kernel, config } = self.cands[i].clone();
        let Evaluation { outcome, .. } =
            self.evaluator
                .evaluate(kernel, &config, &self.opts.protocol)?;
        let mut rec = self.record(kernel, &config, outcome);
        rec.id = Some(self.db.insert(&rec)?);
        self.tried.insert(key(kernel.name(), &config));
        self.measured += 1;
        // Retried configs may take `done` past the budget; the progress stops at it.
        self.done = (self.done + 1).min(self.opts.budget);
        match &rec.measurement {
            Some(m) => self.timed.push(m.clone()),
            None => self.failures += 1,
        }
        if let Some(g) = rec.gflops {
            self.best_gflops = Some(self.best_gflops.map_or(g, |b: f64| b.max(g)));
        }
        on_event(Event::Trial {
            record: &rec,
            done: self.done,
            budget: self.opts.budget,
            best_gflops: self.best_gflops,
        });
        Ok(rec.median_s())
    }

    /// The record of one evaluation of `kernel`'s `config`.
    fn record(&mut self, kernel: &dyn Kernel, config: &Config, outcome: Outcome) -> Record {
        let (hw, w, version) = (&self.hw.id, *self.w, &self.opts.tool_version);
        let accuracy = outcome.accuracy;
        let rec = match outcome.measurement {
            Some(m) => Record::ok(
                hw,
                w,
                kernel.name(),
                kernel.version(),
                config.clone(),
                m,
                version,
            ),
            None => Record::failed(
                hw,
                w,
                kernel.name(),
                kernel.version(),
                config.clone(),
                outcome.status,
                outcome.message.unwrap_or_default(),
                version,
            ),
        };
        rec.with_accuracy(accuracy)
    }

    /// What the job achieved: its counters and timing spread, the evaluator's state, the
    /// winner the database now serves and the quarantine it now holds.
    fn summary(
        self,
        default: Record,
        decision: Option<Decision>,
    ) -> Result<TuneSummary, SearchError> {
        let (db, hw, w) = (self.db, self.hw, self.w);
        let quarantine = on_record(db, w, hw, &self.kernels)?.1;
        let quarantined_by_status = Status::ALL
            .into_iter()
            .map(|s| (s, quarantine.iter().filter(|r| r.status == s).count()))
            .filter(|&(_, n)| n > 0)
            .collect();
        let best = db.best(&hw.id, w)?;
        let best_accuracy = best.as_ref().and_then(|b| b.accuracy);
        let standing = match (&decision, &best) {
            (None, Some(b)) => db.winner(&hw.id, w)?.filter(|d| b.id == Some(d.trial_id)),
            _ => None,
        };
        let earlier = match (&standing, &best) {
            (Some(d), Some(b)) => earlier_medians(db, hw, w, d, b, &default)?,
            _ => None,
        };
        Ok(TuneSummary {
            workload: *w,
            best,
            best_accuracy,
            default,
            space_size: self.cands.len(),
            measured: self.measured,
            resumed: self.resumed,
            failures: self.failures,
            decision,
            earlier,
            standing: standing.map(|d| (d.reason, d.tie)),
            timed: self.timed.len(),
            median_spread: median_of(self.timed.iter().map(|m| m.spread)),
            median_cv: median_of(self.timed.iter().filter_map(cv)),
            isolation: self.evaluator.isolation(),
            timeout: self.evaluator.timeout(),
            restarts: self.evaluator.restarts(),
            quarantined: quarantine.len(),
            quarantined_by_status,
        })
    }
}

/// The medians of `best` and `default` (matched by kernel, version and config) in the
/// re-measurement of `decision`, the one in force for `w` (which chose `best`), where it
/// re-measured both.
fn earlier_medians(
    db: &TuningDb,
    hw: &HardwareFingerprint,
    w: &Workload,
    decision: &tuning_db::WinnerDecision,
    best: &Record,
    default: &Record,
) -> Result<Option<(f64, f64)>, SearchError> {
    let trials = db.trials(&hw.id, w)?;
    let median_of = |r: &Record| {
        decision
            .remeasured
            .iter()
            .find(|m| {
                trials.iter().any(|t| {
                    t.id == Some(m.trial_id)
                        && t.kernel == r.kernel
                        && t.kernel_version == r.kernel_version
                        && t.config == r.config
                })
            })
            .map(|m| m.measurement.median_s)
    };
    Ok(median_of(best).zip(median_of(default)))
}

/// What the database holds of `w` on `hw` for the current versions of `kernels`: the configs
/// tried, and the quarantined records (in database order).
fn on_record(
    db: &TuningDb,
    w: &Workload,
    hw: &HardwareFingerprint,
    kernels: &[&'static dyn Kernel],
) -> Result<(HashSet<Key>, Vec<Record>), SearchError> {
    // The latest trial of each config of the current kernel versions is what counts: a
    // config measured again after a failure (`retry_failed`) is no longer quarantined.
    let mut latest: HashMap<Key, Record> = HashMap::new();
    for r in db.trials(&hw.id, w)? {
        if is_current(kernels, &r) {
            latest.insert(key(&r.kernel, &r.config), r);
        }
    }
    let mut quarantine = Vec::new();
    let tried = (latest.into_iter())
        .map(|(k, r)| {
            if is_quarantine(r.status) {
                quarantine.push(r);
            }
            k
        })
        .collect();
    quarantine.sort_by_key(|r| r.id);
    Ok((tried, quarantine))
}

/// Whether `r` was recorded by the current version of one of `kernels`.
fn is_current(kernels: &[&'static dyn Kernel], r: &Record) -> bool {
    kernels
        .iter()
        .any(|k| k.name() == r.kernel && k.version() == r.kernel_version)
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
