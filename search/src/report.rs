//! What a tuning job reports per workload: the `--json` object of `autokernel tune`, built
//! in one place for the CLI and the bindings (the Python package's `autokernel.tune`).

use std::collections::BTreeMap;

use kernels::HardwareFingerprint;
use serde_json::{json, Value};
use tuning_db::{DbError, TuningDb};

use crate::TuneSummary;

/// Counts over every trial the database holds for a summary's workload on one fingerprint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrialCounts {
    /// Every trial, failures included.
    pub trials: usize,
    /// Trials without a measurement (any status but ok).
    pub failures: usize,
    /// Trials per status name (`ok`, `wrong`, `crashed`, ...).
    pub statuses: BTreeMap<&'static str, usize>,
}

impl TrialCounts {
    /// Reads the counts of `s.workload` on `hw` from `db`.
    pub fn of(db: &TuningDb, s: &TuneSummary, hw: &HardwareFingerprint) -> Result<Self, DbError> {
        let history = db.trials(&hw.id, &s.workload)?;
        let mut statuses: BTreeMap<&'static str, usize> = BTreeMap::new();
        for r in &history {
            *statuses.entry(r.status.as_str()).or_default() += 1;
        }
        Ok(TrialCounts {
            trials: history.len(),
            failures: history.iter().filter(|r| r.measurement.is_none()).count(),
            statuses,
        })
    }
}

/// The JSON object `autokernel tune --json` prints for one tuned workload: the winner and
/// its speed, the default's, accuracy against the f32 problem, trial counts, isolation,
/// the re-measurement decision and the noise of this run's timings.
pub fn summary_json(s: &TuneSummary, counts: &TrialCounts, hw: &HardwareFingerprint) -> Value {
    let best = s.best.as_ref();
    let decision = s.decision.as_ref();
    json!({
        "workload": s.workload.key(),
        "kernel": best.map(|b| b.kernel.clone()),
        "config": best.map(|b| b.config.clone()),
        "median_s": best.and_then(|b| b.measurement.as_ref()).map(|m| m.median_s),
        "gflops": best.and_then(|b| b.gflops),
        "spread": best.and_then(|b| b.measurement.as_ref()).map(|m| m.spread),
        "default_kernel": s.default.kernel,
        "default_config": s.default.config,
        "default_median_s": s.default.measurement.as_ref().map(|m| m.median_s),
        "speedup_vs_default": s.speedup_vs_default(),
        "speedup_from": s.speedup_source(),
        "dtype": s.workload.dtype(),
        "max_rel_err_vs_f32": s.best_accuracy.map(|a| a.max_rel_err),
        "fro_rel_err_vs_f32": s.best_accuracy.map(|a| a.fro_rel_err),
        "trials": counts.trials,
        "failures": counts.failures,
        "measured_now": s.measured,
        "space_size": s.space_size,
        "fingerprint": hw.id,
        "isolation": s.isolation,
        "timeout_s": s.timeout.map(|t| t.as_secs_f64()),
        "worker_restarts": s.restarts,
        "quarantined": s.quarantined,
        "statuses": counts.statuses,
        "remeasured": s.remeasured(),
        "remeasure_rounds": decision.map_or(0, |d| d.rounds),
        "tie": s.tie(),
        "winner_reason": s.winner_reason(),
        "winner_remeasured_median_s": decision.and_then(|d| d.winner_remeasured_s()),
        "default_remeasured_median_s": s.remeasured_s(&s.default),
        "machine_drift": s.drift(),
        "remeasure_error": decision.and_then(|d| d.note.clone()),
        "cpu_share": decision.and_then(|d| d.cpu_share),
        "contended": decision.is_some_and(|d| d.contended()),
        "median_spread": s.median_spread,
        "median_cv": s.median_cv,
        "timed_now": s.timed,
        "warnings": warnings(s),
    })
}

/// Above this [`TuneSummary::drift`] a tune warns that the machine's speed moved.
pub const DRIFT_WARNING: f64 = 1.3;

/// What the user should know about this workload's result, one sentence each: no config ran
/// correctly (nothing to serve), or the winner may not hold on a quiet machine — the default
/// config's speed moved by more than [`DRIFT_WARNING`] during the run, or other work held the
/// cores while configs of different thread counts were compared
/// ([`crate::Decision::contended`]). What `autokernel tune` prints as warnings and Python's
/// `tune` raises as `RuntimeWarning`s.
pub fn warnings(s: &TuneSummary) -> Vec<String> {
    let w = s.workload.key();
    let mut out = Vec::new();
    if s.best.is_none() {
        out.push(format!(
            "{w}: no config ran correctly (the default: {}; {} of the {} other configs \
             measured in this run failed), so the database has no record to serve it and the \
             runtime serves the default config untuned; the trials' statuses say why (a \
             timeout: give a longer one)",
            s.default.status, s.failures, s.measured
        ));
    }
    if let Some(d) = s.drift().filter(|&d| d > DRIFT_WARNING) {
        out.push(format!(
            "{w}: the default config ran {d:.2}x apart during this run (searched vs \
             re-measured): the machine's speed moved, so this winner may be noise; re-tune on \
             a quiet machine"
        ));
    }
    if let Some(d) = s.decision.as_ref().filter(|d| d.contended()) {
        let most = d.finalists.iter().map(|f| f.record.config.threads()).max();
        out.push(format!(
            "{w}: other work held the cores while the finalists were compared ({} threads got \
             {:.2} of their CPUs' time), so configs on fewer threads than the default's could \
             not win (the winner runs {}); re-tune on a quiet machine",
            most.unwrap_or(1),
            d.cpu_share.unwrap_or(0.0),
            d.winner.config.threads(),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{tune, StrategyKind, TuneOptions};

    #[test]
    fn a_tuned_workload_reports_every_field() {
        let db = TuningDb::in_memory().unwrap();
        let w: kernels::Workload = "gemm:12x8x8".parse().unwrap();
        let hw = HardwareFingerprint::current();
        let opts = TuneOptions {
            budget: 3,
            strategy: StrategyKind::Random,
            finalists: 0,
            ..TuneOptions::default()
        };
        let s = tune(&db, &w, hw, &opts, &mut |_| {}).unwrap();
        let counts = TrialCounts::of(&db, &s, hw).unwrap();
        assert_eq!(counts.trials, counts.statuses.values().sum::<usize>());
        assert!(counts.trials >= 1 && counts.failures <= counts.trials);
        let j = summary_json(&s, &counts, hw);
        assert_eq!(j["workload"], "gemm:12x8x8");
        assert_eq!(j["fingerprint"], hw.id.as_str());
        assert_eq!(j["trials"], counts.trials);
        assert_eq!(j["isolation"], "none");
        assert!(j["kernel"].is_string(), "{j}");
        assert!(j["median_s"].as_f64().is_some_and(|t| t > 0.0), "{j}");
        for key in [
            "speedup_vs_default",
            "default_kernel",
            "statuses",
            "tie",
            "timed_now",
            "cpu_share",
            "contended",
        ] {
            assert!(j.get(key).is_some(), "{key} missing from {j}");
        }
        assert!(j["warnings"].is_array(), "{j}");
        // Without a record to serve (every trial failed), the result says so.
        let failed = TuneSummary { best: None, ..s };
        let warned = warnings(&failed);
        assert!(
            warned.iter().any(|w| w.contains("no config ran correctly")),
            "{warned:?}"
        );
        assert!(warned.iter().all(|w| !w.contains("  ")), "{warned:?}");
    }
}
