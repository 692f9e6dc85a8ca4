//! Outcomes of trying one config: a timing, or a failure kept as data.

use serde::{Deserialize, Serialize};

/// How a trial ended. Stored as text in the database (`ok`, `wrong_result`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Verified against the reference, then timed.
    Ok,
    /// Ran, but the output did not match the reference.
    WrongResult,
    /// The config could not be turned into an executable.
    BuildFailed,
    /// The executable panicked or errored while running.
    RunFailed,
    /// The worker process died (segfault, abort, illegal instruction).
    Crashed,
    /// The candidate ran past its time limit.
    Timeout,
    /// The candidate ran out of its memory limit.
    Oom,
}

impl Status {
    /// Every status, in declaration order.
    pub const ALL: [Status; 7] = [
        Status::Ok,
        Status::WrongResult,
        Status::BuildFailed,
        Status::RunFailed,
        Status::Crashed,
        Status::Timeout,
        Status::Oom,
    ];

    /// The text stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::WrongResult => "wrong_result",
            Status::BuildFailed => "build_failed",
            Status::RunFailed => "run_failed",
            Status::Crashed => "crashed",
            Status::Timeout => "timeout",
            Status::Oom => "oom",
        }
    }

    /// Parses the stored text.
    pub fn parse(s: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The timing of a verified candidate: every sample is kept, plus the summary statistics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// Seconds per call, one entry per sample, in the order they were taken.
    pub samples: Vec<f64>,
    /// Median of `samples`: the figure every comparison uses.
    pub median_s: f64,
    /// Relative spread: median absolute deviation ÷ median (0.01 = 1%).
    pub spread: f64,
}

impl Measurement {
    /// Summarises `samples` (must be non-empty).
    pub fn from_samples(samples: Vec<f64>) -> Self {
        assert!(
            !samples.is_empty(),
            "a measurement needs at least one sample"
        );
        let median_s = median(&samples);
        let deviations: Vec<f64> = samples.iter().map(|s| (s - median_s).abs()).collect();
        let spread = if median_s > 0.0 {
            median(&deviations) / median_s
        } else {
            0.0
        };
        Measurement {
            samples,
            median_s,
            spread,
        }
    }

    /// The fastest sample.
    pub fn min_s(&self) -> f64 {
        self.samples.iter().copied().fold(f64::INFINITY, f64::min)
    }

    /// GFLOP/s at the median for a workload of `flops` per call.
    pub fn gflops(&self, flops: f64) -> f64 {
        flops / self.median_s / 1e9
    }
}

/// Median of a non-empty slice (mean of the two middle values for even lengths).
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    median_sorted(&v)
}

/// [`median`] of a slice already sorted (non-empty).
pub fn median_sorted(v: &[f64]) -> f64 {
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The 95% confidence interval `(low, high)` of the median of `samples`, in the samples'
/// unit, from order statistics: the sorted samples at ranks `n/2 ∓ 0.98·√n`. Needs no
/// assumption about the distribution, which on a shared machine is skewed and heavy-tailed.
/// `None` with fewer than three samples (no confidence at all; callers say what that means
/// to them). The one place this rule is written: the timing protocols' stopping rule, the
/// runner's paired comparisons and the database merge's tie test all read it.
pub fn median_ci(samples: &[f64]) -> Option<(f64, f64)> {
    let n = samples.len();
    if n < 3 {
        return None;
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let half = 0.98 * (n as f64).sqrt();
    let lo = (n as f64 / 2.0 - half).floor().max(0.0) as usize;
    let hi = ((n as f64 / 2.0 + half).ceil() as usize).min(n - 1);
    Some((v[lo], v[hi]))
}

/// Relative half-width of [`median_ci`]: the stopping rule of both timing protocols (CPU and
/// CUDA). Infinite with fewer than three samples.
pub fn median_ci_halfwidth(samples: &[f64]) -> f64 {
    let Some((lo, hi)) = median_ci(samples) else {
        return f64::INFINITY;
    };
    let med = median(samples);
    if med <= 0.0 {
        return 0.0;
    }
    (hi - lo) / 2.0 / med
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_shrinks_with_agreeing_samples() {
        assert_eq!(median_ci_halfwidth(&[1.0, 2.0]), f64::INFINITY);
        assert_eq!(median_ci_halfwidth(&[1.0; 9]), 0.0);
        let spread = median_ci_halfwidth(&[1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.02]);
        assert!(spread > 0.0 && spread < 0.2, "{spread}");
    }

    #[test]
    fn statistics() {
        let m = Measurement::from_samples(vec![3.0, 1.0, 2.0, 100.0]);
        assert_eq!(m.median_s, 2.5);
        assert_eq!(m.min_s(), 1.0);
        // deviations 0.5, 1.5, 0.5, 97.5 -> median 1.0
        assert_eq!(m.spread, 1.0 / 2.5);
        assert_eq!(median(&[5.0]), 5.0);
        assert_eq!(Measurement::from_samples(vec![2.0]).gflops(4e9), 2.0);
    }

    #[test]
    fn status_text_round_trips() {
        for s in Status::ALL {
            assert_eq!(Status::parse(s.as_str()), Some(s));
        }
        assert_eq!(Status::parse("nope"), None);
    }
}
