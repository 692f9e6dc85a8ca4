//! The end of a tuning job: pick the finalists, re-measure them interleaved and decide the
//! winner, a statistical tie going to the incumbent or the simpler config (so that reruns on
//! a noisy machine keep the same winner), then record the decision.
//!
//! **Finalists.** The fastest distinct configs by trial median ([`TuneOptions::finalists`]),
//! plus the simplest config whose trial is statistically tied with the fastest one's, the
//! incumbent (the previous winner) and the default config, so that a winner beats what an
//! untuned runtime serves head to head. Only trials of kernels that still build the config
//! for this workload count.
//!
//! **Verdict.** The finalists tied with the fastest re-measured one (not slower round by
//! round, [`runner::not_slower`]) form a group: the incumbent wins if it is in it, else the
//! simplest of the group ([`simplicity_key`]).
//!
//! **A busy machine.** Where a finalist runs fewer threads than the default config, the share
//! of the CPUs that threads get where candidates run ([`runner::cpu_share`]) is measured after the
//! re-measurement. Below [`runner::CONTENDED`] other work holds the cores, and a config on
//! fewer threads than the default's looks faster than it is (measured: one-thread winners
//! tied with two-thread configs under another process's load, then ran at half their speed
//! once the machine was quiet). Such finalists are then not eligible: the winner runs at
//! least the default's thread count, and the decision says so ([`Decision::cpu_share`]).

use std::collections::HashSet;

use kernels::{default_for, Config, HardwareFingerprint, Kernel, Measurement, Status, Workload};
use runner::{median_ci, not_slower, overlaps, Contender, Evaluator};
use tuning_db::{Record, Remeasurement, TuningDb, WinnerDecision};

use crate::tuner::{SearchError, TuneOptions};

/// Why the winner won.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WinReason {
    /// The only verified config.
    OnlyCandidate,
    /// Fastest after re-measurement: every other finalist significantly slower (paired by
    /// round, [`runner::not_slower`]), or tied with it (`tie` says so) while no incumbent is
    /// among them and it is also the simplest of the tied.
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
    /// The winning finalist's trial record (with [`WinReason::Unconfirmed`], the fastest by
    /// trial median).
    pub winner: Record,
    /// Why it won.
    pub reason: WinReason,
    /// Whether another finalist was statistically tied with the fastest one.
    pub tie: bool,
    /// Every finalist, in the order they were picked: the fastest distinct configs by trial
    /// median, then the simplest one tied with the fastest, the incumbent and the default
    /// config, each once.
    pub finalists: Vec<Finalist>,
    /// Rounds each finalist was re-measured for (0 when not re-measured).
    pub rounds: usize,
    /// Why re-measurement failed, if it did.
    pub note: Option<String>,
    /// The [`runner::cpu_share`] at the finalists' largest thread count, measured where one
    /// of them runs fewer threads than the default config.
    pub cpu_share: Option<f64>,
}

/// Whether a [`runner::cpu_share`] says other work held the cores.
fn busy(share: Option<f64>) -> bool {
    share.is_some_and(|s| s < runner::CONTENDED)
}

impl Decision {
    /// Whether other work held the cores while the finalists were compared
    /// ([`runner::CONTENDED`]): configs on fewer threads than the default's could not win.
    pub fn contended(&self) -> bool {
        busy(self.cpu_share)
    }

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

/// Picks and records the winner of `w` (see the module docs). `None` when
/// [`TuneOptions::finalists`] is 0, when there is nothing to decide among, or when this run
/// measured nothing new (`measured_now` is 0) and a live incumbent stands.
pub(crate) fn decide(
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
    let judge = Judge {
        w,
        hw,
        families,
        default: default_for(w, hw)?,
    };
    let history = db.trials(&hw.id, w)?;
    let previous = db.winner(&hw.id, w)?;
    let incumbent = previous.as_ref().and_then(|p| {
        history.iter().find(|r| {
            r.id == Some(p.trial_id) && r.status == Status::Ok && judge.lookup(r).is_some()
        })
    });
    if measured_now == 0 && incumbent.is_some() {
        return Ok(None);
    }
    let picked = judge.finalists(&history, incumbent, opts.finalists);
    if picked.is_empty() {
        return Ok(None);
    }
    let decision = judge.decision(&picked, incumbent, opts, evaluator);
    if let Some(trial_id) = decision.winner.id {
        db.record_winner(&winner_row(&decision, trial_id, w, hw, opts))?;
    }
    Ok(Some(decision))
}

/// What a decision for one workload knows of its kernels.
struct Judge<'a> {
    w: &'a Workload,
    hw: &'a HardwareFingerprint,
    /// The families tuned (looked up before the registry's).
    families: &'a [&'static dyn Kernel],
    /// The registry's default kernel and config for `w`.
    default: (&'static dyn Kernel, Config),
}

impl Judge<'_> {
    /// The kernel that recorded `r`, if it is still this version, supports the workload and
    /// its space still holds `r`'s config.
    fn lookup(&self, r: &Record) -> Option<&'static dyn Kernel> {
        self.families
            .iter()
            .chain(kernels::registry())
            .copied()
            .find(|k| k.name() == r.kernel && k.version() == r.kernel_version)
            .filter(|k| k.supports(self.w) && k.space(self.w, self.hw).check(&r.config).is_ok())
    }

    /// `r`'s place in the [`simplicity_key`] order.
    fn simplicity(&self, r: &Record) -> (i64, String, bool, String) {
        let (dk, dc) = &self.default;
        simplicity_key(&r.kernel, &r.config, (dk.name(), dc))
    }

    /// The finalists (see the module docs): the `n` fastest distinct configs, then the
    /// simplest one tied with the fastest, the incumbent and the default, each once.
    fn finalists<'r>(
        &self,
        history: &'r [Record],
        incumbent: Option<&'r Record>,
        n: usize,
    ) -> Vec<&'r Record> {
        let distinct = self.fastest_first(history);
        let mut picked: Vec<&Record> = distinct.iter().copied().take(n).collect();
        fn add<'r>(picked: &mut Vec<&'r Record>, r: &'r Record) {
            if !picked
                .iter()
                .any(|p| p.kernel == r.kernel && p.config == r.config)
            {
                picked.push(r);
            }
        }
        if let Some(r) = self.simplest_tied(&distinct) {
            add(&mut picked, r);
        }
        if let Some(inc) = incumbent {
            add(&mut picked, inc);
        }
        // The default config joins too: it is what an untuned runtime serves, so a winner
        // must beat it head to head, not only by trial medians taken minutes apart under
        // another load.
        let (dk, dc) = &self.default;
        if let Some(d) = distinct
            .iter()
            .find(|r| r.kernel == dk.name() && r.config == *dc)
        {
            add(&mut picked, d);
        }
        picked
    }

    /// The timed trials of live kernels, one per config (its fastest), fastest first (ties:
    /// older trial first).
    fn fastest_first<'r>(&self, history: &'r [Record]) -> Vec<&'r Record> {
        let mut ok: Vec<&Record> = history
            .iter()
            .filter(|r| {
                r.status == Status::Ok && r.median_s().is_some() && self.lookup(r).is_some()
            })
            .collect();
        ok.sort_by(|a, b| {
            a.median_s()
                .unwrap_or(f64::INFINITY)
                .total_cmp(&b.median_s().unwrap_or(f64::INFINITY))
                .then(a.id.cmp(&b.id))
        });
        let mut seen = HashSet::new();
        ok.into_iter()
            .filter(|r| seen.insert((r.kernel.clone(), r.config.to_json())))
            .collect()
    }

    /// The simplest config whose search timing is statistically tied with the fastest one's
    /// (`distinct` fastest first): which configs make the top few by median changes from run
    /// to run on a noisy machine, this one much less, and on a tie in the re-measurement it
    /// wins.
    fn simplest_tied<'r>(&self, distinct: &[&'r Record]) -> Option<&'r Record> {
        let ci_of = |r: &Record| {
            r.measurement
                .as_ref()
                .map_or((0.0, f64::INFINITY), |m| median_ci(&m.samples))
        };
        let best_ci = ci_of(distinct.first()?);
        distinct
            .iter()
            .copied()
            .filter(|r| overlaps(ci_of(r), best_ci))
            .min_by_key(|r| self.simplicity(r))
    }

    /// Re-measures `picked` interleaved (unless there is only one) and judges them; a failed
    /// re-measurement leaves the first (fastest by trial) as the unconfirmed winner.
    fn decision(
        &self,
        picked: &[&Record],
        incumbent: Option<&Record>,
        opts: &TuneOptions,
        evaluator: &mut dyn Evaluator,
    ) -> Decision {
        let is_incumbent =
            |r: &Record| incumbent.is_some_and(|i| i.kernel == r.kernel && i.config == r.config);
        let unmeasured = |r: &Record| Finalist {
            record: r.clone(),
            remeasured: None,
            ci: (0.0, f64::INFINITY),
            incumbent: is_incumbent(r),
        };
        let unjudged = |reason, note| Decision {
            winner: picked[0].clone(),
            reason,
            tie: false,
            finalists: picked.iter().map(|r| unmeasured(r)).collect(),
            rounds: 0,
            note,
            cpu_share: None,
        };
        if picked.len() == 1 {
            return unjudged(WinReason::OnlyCandidate, None);
        }
        let pairs: Vec<Contender<'_>> = picked
            .iter()
            .map(|r| {
                let k = self.lookup(r).expect("finalists are live trials");
                Contender::of(self.w, k, r.config.clone())
            })
            .collect();
        match evaluator.remeasure(&pairs, &opts.protocol, opts.remeasure_rounds) {
            Err(e) => unjudged(WinReason::Unconfirmed, Some(e.to_string())),
            Ok(ms) => self.verdict(
                picked
                    .iter()
                    .zip(ms)
                    .map(|(r, m)| Finalist {
                        record: (*r).clone(),
                        ci: median_ci(&m.samples),
                        remeasured: Some(m),
                        incumbent: is_incumbent(r),
                    })
                    .collect(),
                share_if_fewer(picked, self.default.1.threads(), evaluator),
            ),
        }
    }

    /// The decision among re-measured finalists, the CPU share `share` measured with them
    /// (see the module docs).
    fn verdict(&self, finalists: Vec<Finalist>, share: Option<f64>) -> Decision {
        let fewest = if busy(share) {
            self.default.1.threads()
        } else {
            1
        };
        let mut eligible: Vec<usize> = (0..finalists.len())
            .filter(|&i| finalists[i].record.config.threads() >= fewest)
            .collect();
        if eligible.is_empty() {
            eligible = (0..finalists.len()).collect();
        }
        let fastest = fastest(&finalists, &eligible);
        let group = tied_with(&finalists, &eligible, fastest);
        let tie = group.len() > 1;
        let (winner, reason) = match group.iter().find(|&&i| finalists[i].incumbent) {
            Some(&inc) if tie => (inc, WinReason::TieIncumbent),
            Some(&inc) => (inc, WinReason::Fastest),
            None => {
                let simplest = *group
                    .iter()
                    .min_by_key(|&&i| self.simplicity(&finalists[i].record))
                    .expect("the group holds the fastest");
                if simplest == fastest {
                    (fastest, WinReason::Fastest)
                } else {
                    (simplest, WinReason::TieSimpler)
                }
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
            cpu_share: share,
        }
    }
}

/// The [`runner::cpu_share`] where candidates run, at the largest thread count of `picked`,
/// if one of them runs fewer threads than the default config's `default_threads` (only then
/// can a busy machine change the verdict).
fn share_if_fewer(
    picked: &[&Record],
    default_threads: usize,
    evaluator: &mut dyn Evaluator,
) -> Option<f64> {
    let threads: Vec<usize> = picked.iter().map(|r| r.config.threads()).collect();
    let most = threads.iter().copied().max()?;
    (threads.iter().any(|&t| t < default_threads))
        .then(|| evaluator.cpu_share(most))
        .flatten()
}

/// The finalist of `eligible` with the fastest re-measured median (the first of equals).
fn fastest(finalists: &[Finalist], eligible: &[usize]) -> usize {
    let median = |f: &Finalist| f.remeasured.as_ref().map_or(f64::INFINITY, |m| m.median_s);
    eligible
        .iter()
        .copied()
        .min_by(|&a, &b| median(&finalists[a]).total_cmp(&median(&finalists[b])))
        .expect("at least one eligible finalist")
}

/// The finalists of `eligible` tied with `fastest`, itself included: not slower than it,
/// judged round by round (the rounds are interleaved, so each pairs samples taken moments
/// apart).
fn tied_with(finalists: &[Finalist], eligible: &[usize], fastest: usize) -> Vec<usize> {
    let samples = |i: usize| {
        finalists[i]
            .remeasured
            .as_ref()
            .map_or(&[][..], |m| &m.samples[..])
    };
    eligible
        .iter()
        .copied()
        .filter(|&i| i == fastest || not_slower(samples(i), samples(fastest)))
        .collect()
}

/// The database row of `decision`, whose winner is trial `trial_id`.
fn winner_row(
    decision: &Decision,
    trial_id: i64,
    w: &Workload,
    hw: &HardwareFingerprint,
    opts: &TuneOptions,
) -> WinnerDecision {
    WinnerDecision {
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
    }
}
