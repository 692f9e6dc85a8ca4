//! Offline replay: play strategies against a recorded search space, no kernel runs.
//!
//! ## The space file format (`autokernel-space` v1, JSON lines)
//!
//! The first line is a header; every other line is one candidate of the workload's joint
//! space (every valid config of every family that supports it), with its recorded outcome:
//!
//! ```text
//! {"format":"autokernel-space","version":1,"workload":"gemm:128x768x768","fingerprint":{...},"candidates":576,"exported_at":"2026-11-22T13:40:00Z","tool_version":"0.1.0"}
//! {"kernel":"gemm_packed","kernel_version":1,"config":{"kc":64,"mc":24,...},"status":"ok","median_s":0.00205,"spread":0.012}
//! {"kernel":"gemm_packed","kernel_version":1,"config":{...},"status":"wrong_result","median_s":null,"default":true}
//! ```
//!
//! `fingerprint` is the full [`HardwareFingerprint`] of the machine that measured (its cache
//! sizes feed the cost model's features); `default: true` marks the kernel default config.
//! `median_s` is the median seconds per call by the tuning protocol, `null` unless `status` is
//! `ok`. Files are written by `autokernel replay --export W --out FILE` from a database that
//! holds an exhaustive tuning run of `W` (`autokernel tune --strategy exhaustive`).
//!
//! ## What replay measures
//!
//! A [`Replayer`] asks a strategy for batches (of the tuner's batch size), answers each
//! candidate with its recorded time (failures as failures), and tracks the best time found
//! after every trial. A trial is one proposal; the replay stops at the budget, or early once
//! the space's best was found (the curve stays flat after). From the curve: trials to reach
//! 95% and 99% of the space's best speed (`best_s / found_s ≥ 0.95`), and the fraction of the
//! best speed found at the budget. Everything is deterministic for a seed.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use costmodel::transfer_weight;
use kernels::measurement::{median, median_sorted};
use kernels::{default_for, kernels_for, Config, HardwareFingerprint, Status, Workload};
use serde::{Deserialize, Serialize};
use tuning_db::{DbError, TuningDb};

use crate::strategies::Transfer;
use crate::strategy::{Point, Prior, SearchContext, StrategyKind};
use crate::tuner::candidates;

/// The `format` value of a space file's header.
pub const FORMAT: &str = "autokernel-space";
/// The version written; readers accept this one only.
pub const FORMAT_VERSION: u32 = 1;

/// Errors reading, writing or exporting space files.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A space file could not be opened, read, created or written; writing refuses a path
    /// that exists (kind `AlreadyExists`).
    #[error("{path}: {cause}")]
    Io {
        /// The space file.
        path: PathBuf,
        /// The I/O error.
        cause: std::io::Error,
    },
    /// A line of a space file breaks the format: a header that is not one or is of another
    /// format or version, a workload that does not parse, a malformed candidate, or a
    /// `median_s` that does not match its `status`.
    #[error("{path}:{line}: {reason}")]
    Parse {
        /// The space file.
        path: PathBuf,
        /// The line, counted from 1 (the header).
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A space file whose lines parse but do not make a space: a candidate count other than
    /// the header's, no candidate with a time, or a candidate listed twice.
    #[error("{path}: {reason}")]
    Invalid {
        /// The space file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Reading the tuning database failed.
    #[error(transparent)]
    Db(#[from] DbError),
    /// No kernel family supports the workload (its key).
    #[error("no kernel supports workload {0}")]
    Unsupported(String),
    /// The database does not hold a trial of every candidate of the workload's space, so no
    /// space can be exported from it.
    #[error(
        "{workload}: only {measured} of the {total} candidates have a trial in the database \
         (record the whole space first: autokernel tune --workload {workload} --threads {threads} --strategy exhaustive --budget {total})"
    )]
    Incomplete {
        /// The workload's key.
        workload: String,
        /// Candidates with a trial.
        measured: usize,
        /// Candidates in the space.
        total: usize,
        /// The thread count of the fingerprint replayed (the tune must run at it).
        threads: usize,
    },
}

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    format: String,
    version: u32,
    workload: String,
    fingerprint: HardwareFingerprint,
    candidates: usize,
    #[serde(default)]
    exported_at: String,
    #[serde(default)]
    tool_version: String,
}

/// One recorded candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// The kernel family's name.
    pub kernel: String,
    /// The family's version that recorded the trial.
    pub kernel_version: u32,
    /// The candidate's config.
    pub config: Config,
    /// How its trial ended.
    pub status: Status,
    /// Median seconds per call, when `status` is ok.
    pub median_s: Option<f64>,
    /// Relative spread of the timing (MAD ÷ median), when `status` is ok and it was
    /// recorded; the file may leave it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<f64>,
    /// Whether this is the kernel default config of the workload.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub default: bool,
}

/// A workload's whole search space with one recorded outcome per candidate.
#[derive(Debug, Clone)]
pub struct RecordedSpace {
    /// The workload whose space this is.
    pub workload: Workload,
    /// The machine that measured it (its cache sizes feed the cost model's features).
    pub hw: HardwareFingerprint,
    /// One entry per candidate, in file order.
    pub entries: Vec<Entry>,
}

impl RecordedSpace {
    /// Reads a space file.
    pub fn read(path: &Path) -> Result<Self, ReplayError> {
        let file = std::fs::File::open(path).map_err(|source| ReplayError::Io {
            path: path.into(),
            cause: source,
        })?;
        Self::from_reader(std::io::BufReader::new(file), path)
    }

    /// Parses the space file format from `r` (`path` names it in errors).
    pub fn from_reader(r: impl BufRead, path: &Path) -> Result<Self, ReplayError> {
        let parse = |line: usize, reason: String| ReplayError::Parse {
            path: path.into(),
            line,
            reason,
        };
        let mut lines = r.lines().enumerate();
        let header: Header = match lines.next() {
            Some((_, Ok(l))) => serde_json::from_str(&l)
                .map_err(|e| parse(1, format!("not a space file header: {e}")))?,
            Some((_, Err(source))) => {
                return Err(ReplayError::Io {
                    path: path.into(),
                    cause: source,
                })
            }
            None => return Err(parse(1, "empty file".into())),
        };
        if header.format != FORMAT || header.version != FORMAT_VERSION {
            return Err(parse(
                1,
                format!(
                    "format '{}' version {} (expected '{FORMAT}' version {FORMAT_VERSION})",
                    header.format, header.version
                ),
            ));
        }
        let workload: Workload = header
            .workload
            .parse()
            .map_err(|e| parse(1, format!("workload: {e}")))?;
        let mut entries = Vec::with_capacity(header.candidates);
        for (i, line) in lines {
            let line = line.map_err(|source| ReplayError::Io {
                path: path.into(),
                cause: source,
            })?;
            if line.trim().is_empty() {
                continue;
            }
            let e: Entry = serde_json::from_str(&line).map_err(|e| parse(i + 1, e.to_string()))?;
            let timed = e.median_s.is_some_and(|s| s.is_finite() && s > 0.0);
            if (e.status == Status::Ok) != timed {
                return Err(parse(
                    i + 1,
                    "median_s must be a positive time exactly when status is ok".into(),
                ));
            }
            entries.push(e);
        }
        let space = RecordedSpace {
            workload,
            hw: header.fingerprint,
            entries,
        };
        let invalid = |reason: String| ReplayError::Invalid {
            path: path.into(),
            reason,
        };
        if space.entries.len() != header.candidates {
            return Err(invalid(format!(
                "header says {} candidates, file has {}",
                header.candidates,
                space.entries.len()
            )));
        }
        if space.best_s().is_none() {
            return Err(invalid("no candidate has a time".into()));
        }
        let mut seen = std::collections::HashSet::new();
        for e in &space.entries {
            if !seen.insert((&e.kernel, e.config.to_json())) {
                return Err(invalid(format!("{} {} appears twice", e.kernel, e.config)));
            }
        }
        Ok(space)
    }

    /// Writes the space file format.
    pub fn write_to(&self, mut out: impl Write, tool_version: &str) -> std::io::Result<()> {
        let header = Header {
            format: FORMAT.into(),
            version: FORMAT_VERSION,
            workload: self.workload.key(),
            fingerprint: self.hw.clone(),
            candidates: self.entries.len(),
            exported_at: tuning_db::now_rfc3339(),
            tool_version: tool_version.into(),
        };
        writeln!(out, "{}", serde_json::to_string(&header)?)?;
        for e in &self.entries {
            writeln!(out, "{}", serde_json::to_string(e)?)?;
        }
        Ok(())
    }

    /// Writes the space to `path`, a new file: a path that exists is refused (an `Io` error
    /// of kind `AlreadyExists`), never overwritten.
    pub fn write(&self, path: &Path, tool_version: &str) -> Result<(), ReplayError> {
        let io = |source| ReplayError::Io {
            path: path.into(),
            cause: source,
        };
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(io)?;
        let mut w = std::io::BufWriter::new(file);
        self.write_to(&mut w, tool_version).map_err(io)?;
        w.flush().map_err(io)
    }

    /// The space of `w` on fingerprint `hw` as recorded in `db`: every candidate of the
    /// families that support `w` (current kernel versions), each with its trial — the fastest
    /// ok one if there are several, else the latest failure. Fails unless every candidate has
    /// a trial.
    pub fn from_db(
        db: &TuningDb,
        w: &Workload,
        hw: &HardwareFingerprint,
    ) -> Result<Self, ReplayError> {
        let families = kernels_for(w, hw);
        let cands = candidates(w, hw, &families);
        if cands.is_empty() {
            return Err(ReplayError::Unsupported(w.key()));
        }
        let mut trials: HashMap<(String, u32, String), tuning_db::Record> = HashMap::new();
        for r in db.trials(&hw.id, w)? {
            let key = (r.kernel.clone(), r.kernel_version, r.config.to_json());
            let better = match trials.get(&key) {
                None => true,
                Some(old) => match (old.median_s(), r.median_s()) {
                    (Some(a), Some(b)) => b < a,
                    (None, _) => true,
                    (Some(_), None) => false,
                },
            };
            if better {
                trials.insert(key, r);
            }
        }
        let (dk, dc) = default_for(w, hw).map_err(|_| ReplayError::Unsupported(w.key()))?;
        let mut entries = Vec::with_capacity(cands.len());
        for c in &cands {
            let key = (
                c.kernel.name().to_string(),
                c.kernel.version(),
                c.config.to_json(),
            );
            if let Some(r) = trials.get(&key) {
                entries.push(Entry {
                    kernel: r.kernel.clone(),
                    kernel_version: r.kernel_version,
                    config: r.config.clone(),
                    status: r.status,
                    median_s: r.median_s(),
                    spread: r.measurement.as_ref().map(|m| m.spread),
                    default: c.kernel.name() == dk.name() && c.config == dc,
                });
            }
        }
        if entries.len() < cands.len() {
            return Err(ReplayError::Incomplete {
                workload: w.key(),
                measured: entries.len(),
                total: cands.len(),
                threads: hw.cores,
            });
        }
        Ok(RecordedSpace {
            workload: *w,
            hw: hw.clone(),
            entries,
        })
    }

    /// The fastest recorded time.
    pub fn best_s(&self) -> Option<f64> {
        self.entries
            .iter()
            .filter_map(|e| e.median_s)
            .min_by(f64::total_cmp)
    }

    /// The candidates, in file order.
    pub fn points(&self) -> Vec<Point> {
        self.entries
            .iter()
            .map(|e| Point {
                kernel: e.kernel.clone(),
                config: e.config.clone(),
            })
            .collect()
    }

    /// Candidates reaching at least `fraction` of the best speed (`best_s / t ≥ fraction`).
    pub fn count_within(&self, fraction: f64) -> usize {
        let best = self.best_s().unwrap_or(f64::INFINITY);
        self.entries
            .iter()
            .filter(|e| e.median_s.is_some_and(|t| best / t >= fraction))
            .count()
    }

    /// Expected trials for uniform random sampling without replacement to hit one of the `k`
    /// candidates within `fraction` of the best: `(N+1)/(k+1)` (the Kernel Tuner methodology).
    pub fn random_expected_trials(&self, fraction: f64) -> f64 {
        let k = self.count_within(fraction) as f64;
        (self.entries.len() as f64 + 1.0) / (k + 1.0)
    }

    /// This space's ok records as transfer history for tuning on `target`, weighted by
    /// [`transfer_weight`] (none when the machines are unrelated).
    pub fn priors_for(&self, target: &HardwareFingerprint) -> Vec<Prior> {
        let weight = transfer_weight(target, &self.hw);
        if weight <= 0.0 {
            return Vec::new();
        }
        let hw = Arc::new(self.hw.clone());
        self.entries
            .iter()
            .filter_map(|e| {
                Some(Prior {
                    workload: self.workload,
                    hw: hw.clone(),
                    kernel: e.kernel.clone(),
                    config: e.config.clone(),
                    seconds: e.median_s?,
                    weight,
                })
            })
            .collect()
    }
}

/// The outcome of replaying one strategy with one seed.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The seed the strategy was built with.
    pub seed: u64,
    /// Best time found after each trial (seconds; infinite until the first success), padded
    /// to the budget (or the space size, if smaller).
    pub best_so_far: Vec<f64>,
    /// Trials actually played (fewer than the curve's length when the best was found early).
    pub played: usize,
}

impl Run {
    /// The first trial (1-based) at which `fraction` of the best speed was reached.
    pub fn trials_to(&self, best_s: f64, fraction: f64) -> Option<usize> {
        self.best_so_far
            .iter()
            .position(|&t| best_s / t >= fraction)
            .map(|p| p + 1)
    }
}

/// Settings of a replay.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// Trials per run.
    pub budget: usize,
    /// Candidates asked for at once (the tuner's batch).
    pub batch: usize,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            budget: 100,
            batch: 8,
        }
    }
}

/// The other spaces' records as transfer history for `space`, in an order that does not
/// depend on the order the spaces were given in (sorted by workload, then machine), so a
/// replay is the same whatever order the command line lists the files in. A space of the same
/// workload and machine as `space` is left out: it would be the answer itself.
fn transfer_priors(space: &RecordedSpace, others: &[&RecordedSpace]) -> Vec<Prior> {
    let mut others: Vec<&RecordedSpace> = others
        .iter()
        .copied()
        .filter(|o| !(o.workload == space.workload && o.hw.id == space.hw.id))
        .collect();
    others.sort_by(|a, b| (a.workload.key(), &a.hw.id).cmp(&(b.workload.key(), &b.hw.id)));
    others
        .iter()
        .flat_map(|o| o.priors_for(&space.hw))
        .collect()
}

/// Plays strategies against one recorded space, with the other recorded spaces as the
/// transfer history (used by strategies that transfer, `model`).
pub struct Replayer<'a> {
    /// The space replayed against.
    pub space: &'a RecordedSpace,
    history: Vec<Prior>,
    best_s: f64,
}

impl<'a> Replayer<'a> {
    /// A replayer over `space`; `others` provide the transfer history (a space of the same
    /// workload and machine as `space` is left out: it would be the answer itself).
    pub fn new(space: &'a RecordedSpace, others: &[&RecordedSpace]) -> Self {
        let history = transfer_priors(space, others);
        Replayer {
            space,
            history,
            best_s: space.best_s().unwrap_or(f64::INFINITY),
        }
    }

    /// The space's best time.
    pub fn best_s(&self) -> f64 {
        self.best_s
    }

    /// Replays `kind` with `seed`.
    pub fn run(&self, kind: StrategyKind, seed: u64, opts: &ReplayOptions) -> Run {
        let mut ctx = SearchContext::new(
            self.space.workload,
            self.space.hw.clone(),
            self.space.points(),
            seed,
        );
        ctx.history = self.history.clone();
        let mut strategy = kind.build(ctx);
        let n = self.space.entries.len();
        let budget = opts.budget.min(n);
        let mut asked = vec![false; n];
        let mut best = f64::INFINITY;
        let mut curve = Vec::with_capacity(budget);
        while curve.len() < budget && best > self.best_s {
            let batch = strategy.ask(opts.batch.min(budget - curve.len()).max(1));
            if batch.is_empty() {
                break;
            }
            let mut told = Vec::with_capacity(batch.len());
            for i in batch {
                let Some(e) = self.space.entries.get(i) else {
                    continue;
                };
                let t = e.median_s;
                told.push((i, t));
                if std::mem::replace(&mut asked[i], true) {
                    // A repeated proposal is answered but costs no trial (as in the tuner).
                    continue;
                }
                if curve.len() < budget {
                    best = best.min(t.unwrap_or(f64::INFINITY));
                    curve.push(best);
                }
            }
            strategy.tell(&told);
        }
        let played = curve.len();
        curve.resize(budget, best);
        Run {
            seed,
            best_so_far: curve,
            played,
        }
    }
}

/// Median of values where `None` means "not reached" (sorts last); `None` if the median is.
pub fn median_trials(values: &[Option<usize>]) -> Option<f64> {
    let mut v: Vec<f64> = values
        .iter()
        .map(|x| x.map_or(f64::INFINITY, |t| t as f64))
        .collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let m = median_sorted(&v);
    m.is_finite().then_some(m)
}

/// The per (space, strategy) summary over seeds.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The label the space was given (`autokernel replay`: its file's path).
    pub space: String,
    /// The space's workload key.
    pub workload: String,
    /// The id of the machine that recorded the space.
    pub fingerprint: String,
    /// The strategy's name ([`StrategyKind::name`]).
    pub strategy: String,
    /// Runs summarised, one per seed.
    pub seeds: usize,
    /// Trials per run asked for ([`ReplayOptions::budget`]); a run stops at `space_size`
    /// when that is smaller.
    pub budget: usize,
    /// Candidates in the space.
    pub space_size: usize,
    /// The space's fastest recorded time, seconds per call.
    pub space_best_s: f64,
    /// Median over seeds of the trials needed to reach 95% / 99% of the best speed (`None`:
    /// the median run did not reach it within the budget).
    pub trials_to_95: Option<f64>,
    /// The same for 99% of the best speed.
    pub trials_to_99: Option<f64>,
    /// Median over seeds of the best speed found at the budget, as a fraction of the space's
    /// best (1 = found the best).
    pub best_at_budget: f64,
    /// Kernel Tuner reference: expected random draws to hit the top-95% configs,
    /// `(N+1)/(k+1)`.
    pub random_expected_95: f64,
    /// Median over seeds of the best-so-far fraction after each trial (for plots).
    #[serde(skip)]
    pub curve: Vec<f64>,
}

/// Replays `kind` with seeds `first_seed..first_seed + seeds` (wrapping) and summarises.
pub fn summarize(
    replayer: &Replayer<'_>,
    label: &str,
    kind: StrategyKind,
    first_seed: u64,
    seeds: usize,
    opts: &ReplayOptions,
) -> Summary {
    use rayon::prelude::*;
    let runs: Vec<Run> = (0..seeds as u64)
        .into_par_iter()
        .map(|s| replayer.run(kind, first_seed.wrapping_add(s), opts))
        .collect();
    let best = replayer.best_s();
    let to = |f: f64| {
        median_trials(
            &runs
                .iter()
                .map(|r| r.trials_to(best, f))
                .collect::<Vec<_>>(),
        )
    };
    let len = runs.first().map_or(0, |r| r.best_so_far.len());
    let frac_median = |vals: Vec<f64>| -> f64 {
        if vals.is_empty() {
            0.0
        } else {
            median(&vals)
        }
    };
    let curve: Vec<f64> = (0..len)
        .map(|t| frac_median(runs.iter().map(|r| best / r.best_so_far[t]).collect()))
        .collect();
    let space = replayer.space;
    Summary {
        space: label.to_string(),
        workload: space.workload.key(),
        fingerprint: space.hw.id.clone(),
        strategy: kind.name().to_string(),
        seeds,
        budget: opts.budget,
        space_size: space.entries.len(),
        space_best_s: best,
        trials_to_95: to(0.95),
        trials_to_99: to(0.99),
        best_at_budget: curve.last().copied().unwrap_or(0.0),
        random_expected_95: space.random_expected_trials(0.95),
        curve,
    }
}

/// Held-out quality of one cost model on one recorded space, mean over seeds.
#[derive(Debug, Clone, Serialize)]
pub struct ModelReport {
    /// The space's workload key.
    pub workload: String,
    /// The cost model's name ([`ModelKind::name`](costmodel::ModelKind::name)).
    pub model: String,
    /// Points of the space itself the model was fitted on.
    pub train: usize,
    /// Whether the other spaces were added as (weighted-down) transfer records.
    pub transfer: bool,
    /// Seeds averaged over, each a different random training set.
    pub seeds: usize,
    /// Spearman rank correlation of predicted and true times on the held-out candidates
    /// (1 = the same order).
    pub spearman: f64,
    /// Share of the `k` truly fastest held-out candidates among the `k` the model ranks
    /// fastest.
    pub top_k_recall: f64,
    /// The `k` of `top_k_recall`.
    pub k: usize,
    /// True time of the held-out candidate the model ranks fastest ÷ the fastest true time
    /// among them (1 = the model picked the best).
    pub regret: f64,
}

/// Fits `kind` on `train` random timed candidates of `space` (plus the records of `others`
/// as transfer, normalised, judged and weighted as [`ModelGuided`](crate::ModelGuided) does:
/// [`Transfer`]) and scores its predictions on the space's remaining timed candidates:
/// Spearman correlation, top-10 recall and regret, averaged over `seeds` seeds from
/// `first_seed`.
pub fn evaluate_model(
    space: &RecordedSpace,
    others: &[&RecordedSpace],
    kind: costmodel::ModelKind,
    train: usize,
    first_seed: u64,
    seeds: usize,
) -> Result<ModelReport, costmodel::ModelError> {
    use costmodel::{features, target, Metrics};
    let opts = crate::ModelOptions {
        model: kind,
        ..crate::ModelOptions::default()
    };
    let timed_entries: Vec<(&Entry, f64)> = space
        .entries
        .iter()
        .filter_map(|e| Some((e, e.median_s?)))
        .collect();
    let x: Vec<Vec<f64>> = timed_entries
        .iter()
        .map(|(e, _)| features(&space.workload, &e.kernel, &e.config, &space.hw))
        .collect();
    let kernels: Vec<&str> = timed_entries
        .iter()
        .map(|(e, _)| e.kernel.as_str())
        .collect();
    let timed: Vec<f64> = timed_entries.iter().map(|&(_, t)| t).collect();
    let k = 10;
    // The points left to score are what the metrics are of: top-k recall needs k of them.
    if train + k > timed.len() {
        return Err(costmodel::ModelError::NothingToScore {
            train,
            points: timed.len(),
            need: k,
        });
    }
    let priors = transfer_priors(space, others);
    let mut sums = (0.0, 0.0, 0.0);
    for s in 0..seeds as u64 {
        let seed = first_seed.wrapping_add(s);
        let mut rng = kernels::Rng::new(seed ^ 0xE7A1);
        let mut order: Vec<usize> = (0..timed.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let (fit_idx, test_idx) = order.split_at(train);
        let own: Vec<(usize, f64)> = fit_idx
            .iter()
            .map(|&i| (i, target(timed[i], &space.workload)))
            .collect();
        let mut transfer =
            Transfer::new(priors.iter().collect(), &x, &kernels, &opts, &mut rng, seed);
        transfer.update(&own, &x, &mut rng);
        let data = transfer.training_set(&own, &x);
        let mut model = kind.build(seed);
        model.fit(&data)?;
        let test_x: Vec<Vec<f64>> = test_idx.iter().map(|&i| x[i].clone()).collect();
        let test_t: Vec<f64> = test_idx.iter().map(|&i| timed[i]).collect();
        let pred: Vec<f64> = model
            .predict(&test_x)?
            .into_iter()
            .zip(test_idx)
            .map(|(p, &i)| p + transfer.level(i))
            .collect();
        let m = Metrics::of(&pred, &test_t, k);
        sums.0 += m.spearman;
        sums.1 += m.top_k_recall;
        sums.2 += m.regret;
    }
    let n = seeds.max(1) as f64;
    Ok(ModelReport {
        workload: space.workload.key(),
        model: kind.name().to_string(),
        train,
        transfer: !others.is_empty(),
        seeds,
        spearman: sums.0 / n,
        top_k_recall: sums.1 / n,
        k,
        regret: sums.2 / n,
    })
}
