//! The tuning loop: ask the strategy, prepare the batch in parallel, verify and time each
//! candidate one at a time, commit every trial (failures included) to the database, tell the
//! strategy.

use std::collections::HashSet;

use rayon::prelude::*;

use kernels::{
    default_for, kernels_for, Config, Executable, HardwareFingerprint, Kernel, Problem, Workload,
};
use runner::{evaluate_prepared, Outcome, Protocol};
use tuning_db::{DbError, Record, TuningDb};

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

/// Settings of one tuning job.
#[derive(Debug, Clone)]
pub struct TuneOptions {
    /// Distinct configs to have tried for each workload on this machine, counting trials
    /// already in the database: re-running the same command resumes instead of repeating.
    pub budget: usize,
    pub strategy: StrategyKind,
    pub seed: u64,
    pub protocol: Protocol,
    /// Candidates prepared together (in parallel) before being measured one by one.
    pub batch: usize,
    /// Stored in every record.
    pub tool_version: String,
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
}

/// What a tuning job achieved for one workload.
#[derive(Debug, Clone)]
pub struct TuneSummary {
    pub workload: Workload,
    /// The best verified record in the database after this run.
    pub best: Option<Record>,
    /// The default config's record, measured in this run.
    pub default: Record,
    /// Number of valid candidates in the joint space.
    pub space_size: usize,
    /// Configs measured by this run (excluding the re-measured default).
    pub measured: usize,
    /// Configs the strategy proposed that were already in the database.
    pub resumed: usize,
    /// Of `measured`, how many failed (any status but ok).
    pub failures: usize,
}

impl TuneSummary {
    /// Default time ÷ best time (1.0 when the default is the best).
    pub fn speedup_vs_default(&self) -> Option<f64> {
        let best = self.best.as_ref()?.measurement.as_ref()?.median_s;
        let default = self.default.measurement.as_ref()?.median_s;
        Some(default / best)
    }
}

/// Errors of the tuning loop (candidate failures are not errors: they become records).
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("no kernel supports workload {0}")]
    Unsupported(String),
}

/// Tunes `w` over every registered kernel family on this machine (`hw` must be the current
/// machine's fingerprint), writing every trial to `db`.
pub fn tune(
    db: &TuningDb,
    w: &Workload,
    hw: &HardwareFingerprint,
    opts: &TuneOptions,
    on_event: &mut dyn FnMut(Event<'_>),
) -> Result<TuneSummary, SearchError> {
    tune_families(db, w, hw, &kernels_for(w), opts, on_event)
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
    let cands = candidates(w, hw, families);
    if cands.is_empty() {
        return Err(SearchError::Unsupported(w.key()));
    }
    db.upsert_fingerprint(hw)?;
    let problem = Problem::random(w, opts.seed ^ 0x5EED);
    let reference = problem.reference();

    let mut tried: HashSet<(String, String)> = HashSet::new();
    for k in families
        .iter()
        .chain(std::iter::once(&default_for(w, hw).0))
    {
        for c in db.tried_configs(&hw.id, w, k.name(), k.version())? {
            tried.insert((k.name().to_string(), c));
        }
    }
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

    // The default first: the baseline of the speedup, and the first data point.
    let (dk, dc) = default_for(w, hw);
    let outcome = match dk.prepare(w, &dc) {
        Ok(exe) => evaluate_prepared(exe.as_ref(), &problem, &reference, &opts.protocol),
        Err(e) => Outcome {
            status: kernels::Status::BuildFailed,
            message: Some(e.to_string()),
            measurement: None,
        },
    };
    let default = record(dk, &dc, outcome);
    if tried.insert((dk.name().to_string(), dc.to_json())) {
        db.insert(&default)?;
    }
    on_event(Event::Default { record: &default });

    let mut strategy = opts.strategy.build(cands.len(), opts.seed);
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
                if tried.contains(&key) {
                    told.push((i, None));
                    resumed += 1;
                    false
                } else {
                    true
                }
            })
            .collect();
        // Prepare in parallel; measure strictly one at a time.
        let prepared: Vec<(usize, kernels::Result<Box<dyn Executable>>)> = fresh
            .par_iter()
            .map(|&i| (i, cands[i].kernel.prepare(w, &cands[i].config)))
            .collect();
        for (i, exe) in prepared {
            let c = &cands[i];
            let outcome = match exe {
                Ok(exe) => evaluate_prepared(exe.as_ref(), &problem, &reference, &opts.protocol),
                Err(e) => Outcome {
                    status: kernels::Status::BuildFailed,
                    message: Some(e.to_string()),
                    measurement: None,
                },
            };
            let rec = record(c.kernel, &c.config, outcome);
            db.insert(&rec)?;
            tried.insert((c.kernel.name().to_string(), c.config.to_json()));
            measured += 1;
            done += 1;
            if rec.measurement.is_none() {
                failures += 1;
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

    Ok(TuneSummary {
        workload: *w,
        best: db.best(&hw.id, w)?,
        default,
        space_size: cands.len(),
        measured,
        resumed,
        failures,
    })
}
