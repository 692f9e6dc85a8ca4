//! # search — ask/tell strategies, the tuning loop, and offline replay
//!
//! ```
//! use kernels::{HardwareFingerprint, Workload};
//! use search::{tune, StrategyKind, TuneOptions};
//! use tuning_db::TuningDb;
//!
//! let db = TuningDb::in_memory()?;
//! let w: Workload = "gemm:48x40x24".parse()?;
//! let opts = TuneOptions { budget: 6, strategy: StrategyKind::Random, seed: 1, ..TuneOptions::default() };
//! let summary = tune(&db, &w, HardwareFingerprint::current(), &opts, &mut |_event| {})?;
//! let best = summary.best.expect("at least the default config verifies");
//! println!("{} {} {:.1} GFLOP/s", best.kernel, best.config, best.gflops.unwrap());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Why it exists: measuring is the expensive part of tuning, so *which* configs to measure is
//! its own concern. A [`Strategy`] only proposes and learns (ask/tell, as in TVM's
//! MetaSchedule); [`tune`] owns the loop — parallel preparation, one-at-a-time measurement,
//! every trial (failures too) committed to the database as it happens, and resumption: configs
//! already in the database are never measured again. Candidates run wherever the given
//! [`runner::Evaluator`] runs them ([`tune_with`]; a watched worker process for crash
//! isolation), and each job ends by re-measuring its finalists interleaved and recording a
//! [`Decision`] that keeps the incumbent or the simpler config on a statistical tie.
//!
//! Strategies: [`Exhaustive`], [`RandomSearch`], [`Annealing`], [`Evolutionary`] and the
//! default, [`ModelGuided`] (a cost model refitted after every batch, warm-started from the
//! database's records of other workloads: transfer learning). [`replay`] plays any of them
//! against a recorded search space without running a kernel, deterministically per seed, so
//! strategies are compared offline (`autokernel replay`).

#![warn(missing_docs)]

mod decide;
pub mod precision;
pub mod progress;
pub mod replay;
pub mod report;
pub mod shard;
mod side_by_side;
mod strategies;
mod strategy;
mod tuner;

pub use decide::{simplicity_key, Decision, Finalist, WinReason};
pub use replay::{RecordedSpace, ReplayError, ReplayOptions, Replayer};
pub use side_by_side::{
    compare_precisions, shapes_and_types, PrecisionComparison, PrecisionTiming,
};
pub use strategies::{Annealing, Evolutionary, Grid, ModelGuided, ModelOptions, Transfer};
pub use strategy::{
    Exhaustive, Point, Prior, RandomSearch, SearchContext, Strategy, StrategyKind, UnknownStrategy,
};
pub use tuner::{
    candidates, is_quarantine, tune, tune_families, tune_with, Candidate, Event, SearchError,
    TuneOptions, TuneSummary, FALLBACK_TIMEOUT, INITIAL_TIMEOUT,
};
