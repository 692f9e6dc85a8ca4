//! Did it get slower? Comparing a fresh set of timing samples with a stored baseline.
//!
//! ```
//! use runner::compare::{compare, CompareOptions, Verdict};
//!
//! let baseline: Vec<f64> = (0..30).map(|i| 1.0e-3 * (1.0 + 0.001 * (i % 7) as f64)).collect();
//! let slower: Vec<f64> = baseline.iter().map(|t| t * 1.3).collect();
//! let c = compare(&baseline, &slower, &CompareOptions::default())?;
//! assert_eq!(c.verdict, Verdict::Regression);
//! assert!(c.ci_low > 1.25 && c.ci_high < 1.35);
//! # Ok::<(), runner::compare::CompareError>(())
//! ```
//!
//! Two statistics are computed on the per-call times of the two runs:
//!
//! - the **ratio of medians** `current ÷ baseline` (above 1 = slower) with a **bootstrap
//!   confidence interval**: both sample sets are resampled with replacement, seeded by
//!   [`kernels::Rng`], and the percentile interval of the resampled ratios is taken. A run
//!   measured in several rounds ([`compare_rounds`]) is resampled round-first, so drift
//!   between its rounds widens the interval;
//! - a two-sided **Mann–Whitney U test** (normal approximation with tie correction and
//!   continuity correction): are the two sets drawn from the same distribution?
//!
//! **Classification** is deliberately conservative, because on a small shared machine two runs
//! of identical code easily differ by a few percent: a workload is a
//! [`Verdict::Regression`] only if the difference is *significant* (`p < alpha`) **and**
//! *beyond the threshold with confidence* — the whole confidence interval of the ratio lies
//! above `1 + threshold`. [`Verdict::Improvement`] mirrors it (interval entirely below
//! `1 / (1 + threshold)`); everything else is [`Verdict::Unchanged`].

use kernels::measurement::{median, median_sorted};
use kernels::Rng;
use serde::{Deserialize, Serialize};

/// Fewest samples per side that the statistics accept.
pub const MIN_SAMPLES: usize = 3;

/// The outcome for one workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Significantly slower, by more than the threshold.
    Regression,
    /// Significantly faster, by more than the threshold.
    Improvement,
    /// Neither: within the threshold or within the noise.
    Unchanged,
}

impl Verdict {
    /// The name used in JSON and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Regression => "regression",
            Verdict::Improvement => "improvement",
            Verdict::Unchanged => "unchanged",
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Knobs of [`compare`].
#[derive(Debug, Clone, PartialEq)]
pub struct CompareOptions {
    /// Relative change that matters (0.05 = 5%).
    pub threshold: f64,
    /// Significance level of the Mann–Whitney test.
    pub alpha: f64,
    /// Confidence level of the bootstrap interval (0.95 = 95%).
    pub confidence: f64,
    /// Bootstrap resamples.
    pub resamples: usize,
    /// Seed of the bootstrap: the same samples and seed give the same interval.
    pub seed: u64,
}

impl Default for CompareOptions {
    fn default() -> Self {
        CompareOptions {
            threshold: 0.05,
            alpha: 0.01,
            confidence: 0.95,
            resamples: 2000,
            seed: 0x5EED_BE4C,
        }
    }
}

/// Errors of [`compare`]: inputs the statistics cannot be computed on.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CompareError {
    /// A run has fewer than [`MIN_SAMPLES`] samples, all its rounds pooled.
    #[error("the {which} run has {got} samples; at least {MIN_SAMPLES} are needed to compare")]
    TooFewSamples {
        /// Which run: `"baseline"` or `"current"`.
        which: &'static str,
        /// How many samples it has.
        got: usize,
    },
    /// A run has a sample that is not a positive, finite number of seconds (zero, negative,
    /// NaN or infinite).
    #[error("the {which} run has a sample that is not a positive finite time: {value}")]
    BadSample {
        /// Which run: `"baseline"` or `"current"`.
        which: &'static str,
        /// The first such sample.
        value: f64,
    },
    /// A run given in rounds ([`compare_rounds`]) has a round without samples.
    #[error("the {which} run has an empty round")]
    EmptyRound {
        /// Which run: `"baseline"` or `"current"`.
        which: &'static str,
    },
    /// A [`CompareOptions`] value out of range: a negative or non-finite `threshold`, an
    /// `alpha` or `confidence` outside `(0, 1)`, or fewer than 100 `resamples`. The text
    /// says which.
    #[error("invalid comparison option: {0}")]
    BadOption(String),
}

/// The result of a two-sided Mann–Whitney U test.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MannWhitney {
    /// U of the first sample set (number of pairs where it is the larger, ties count ½).
    pub u: f64,
    /// Standard score of `u`, continuity-corrected; positive when the first set tends larger.
    pub z: f64,
    /// Two-sided p-value (normal approximation, tie-corrected variance).
    pub p_value: f64,
}

/// Current vs baseline for one workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// Median of the baseline's samples (all rounds pooled), seconds per call.
    pub baseline_median_s: f64,
    /// Median of the current run's samples (all rounds pooled), seconds per call.
    pub current_median_s: f64,
    /// `current_median_s / baseline_median_s`: above 1 means slower.
    pub time_ratio: f64,
    /// Bootstrap confidence interval of `time_ratio`.
    pub ci_low: f64,
    /// Upper end of that interval, at [`CompareOptions::confidence`]; `ci_low` is its lower
    /// end.
    pub ci_high: f64,
    /// Two-sided Mann–Whitney p-value.
    pub p_value: f64,
    /// The classification of the change, by the rule of the [module docs](mod@crate::compare).
    pub verdict: Verdict,
}

impl Comparison {
    /// Speed relative to the baseline (`1 / time_ratio`): above 1 means faster.
    pub fn speed_ratio(&self) -> f64 {
        1.0 / self.time_ratio
    }

    /// The confidence interval of [`speed_ratio`](Self::speed_ratio), low to high.
    pub fn speed_ci(&self) -> (f64, f64) {
        (1.0 / self.ci_high, 1.0 / self.ci_low)
    }
}

/// Compares `current` samples (seconds per call) with `baseline` samples, each taken as one
/// round, and classifies the change (see the module docs for the rule).
pub fn compare(
    baseline: &[f64],
    current: &[f64],
    opts: &CompareOptions,
) -> Result<Comparison, CompareError> {
    compare_rounds(&[baseline], &[current], opts)
}

/// Like [`compare`], for runs measured in several rounds (separate measurements spread over
/// the run). The medians and the Mann–Whitney test use all samples pooled; the bootstrap
/// resamples rounds first, then samples within them, so that rounds that disagree (the
/// machine got busier during the run) widen the interval instead of hiding in the pool.
pub fn compare_rounds<B: AsRef<[f64]>, C: AsRef<[f64]>>(
    baseline: &[B],
    current: &[C],
    opts: &CompareOptions,
) -> Result<Comparison, CompareError> {
    check_options(opts)?;
    let baseline: Vec<&[f64]> = baseline.iter().map(AsRef::as_ref).collect();
    let current: Vec<&[f64]> = current.iter().map(AsRef::as_ref).collect();
    let base_pool = check_rounds("baseline", &baseline)?;
    let cur_pool = check_rounds("current", &current)?;
    let (baseline_median_s, current_median_s) = (median(&base_pool), median(&cur_pool));
    let time_ratio = current_median_s / baseline_median_s;
    let (ci_low, ci_high) = bootstrap_ratio_ci(&baseline, &current, opts);
    let p_value = mann_whitney(&cur_pool, &base_pool).p_value;
    let significant = p_value < opts.alpha;
    let verdict = if significant && ci_low > 1.0 + opts.threshold {
        Verdict::Regression
    } else if significant && ci_high < 1.0 / (1.0 + opts.threshold) {
        Verdict::Improvement
    } else {
        Verdict::Unchanged
    };
    Ok(Comparison {
        baseline_median_s,
        current_median_s,
        time_ratio,
        ci_low,
        ci_high,
        p_value,
        verdict,
    })
}

/// Checks every round and returns all samples pooled.
fn check_rounds(which: &'static str, rounds: &[&[f64]]) -> Result<Vec<f64>, CompareError> {
    let pool: Vec<f64> = rounds.iter().flat_map(|r| r.iter().copied()).collect();
    check_samples(which, &pool)?;
    if rounds.iter().any(|r| r.is_empty()) {
        return Err(CompareError::EmptyRound { which });
    }
    Ok(pool)
}

fn check_options(o: &CompareOptions) -> Result<(), CompareError> {
    let bad = |s: String| Err(CompareError::BadOption(s));
    if !(o.threshold.is_finite() && o.threshold >= 0.0) {
        return bad(format!(
            "threshold {} is not a non-negative number",
            o.threshold
        ));
    }
    if !(o.alpha > 0.0 && o.alpha < 1.0) {
        return bad(format!("alpha {} is not between 0 and 1", o.alpha));
    }
    if !(o.confidence > 0.0 && o.confidence < 1.0) {
        return bad(format!(
            "confidence {} is not between 0 and 1",
            o.confidence
        ));
    }
    if o.resamples < 100 {
        return bad(format!(
            "{} bootstrap resamples are too few (≥ 100)",
            o.resamples
        ));
    }
    Ok(())
}

fn check_samples(which: &'static str, xs: &[f64]) -> Result<(), CompareError> {
    if xs.len() < MIN_SAMPLES {
        return Err(CompareError::TooFewSamples {
            which,
            got: xs.len(),
        });
    }
    match xs.iter().find(|x| !(x.is_finite() && **x > 0.0)) {
        Some(&value) => Err(CompareError::BadSample { which, value }),
        None => Ok(()),
    }
}

/// Percentile bootstrap interval of `median(current) / median(baseline)` at
/// `opts.confidence`. Each side is resampled independently, in two stages: its rounds with
/// replacement, then the samples of each drawn round with replacement (with one round, the
/// ordinary bootstrap). Every round must be non-empty.
pub fn bootstrap_ratio_ci(
    baseline: &[&[f64]],
    current: &[&[f64]],
    opts: &CompareOptions,
) -> (f64, f64) {
    let mut rng = Rng::new(opts.seed);
    let mut scratch = Vec::new();
    let mut ratios: Vec<f64> = (0..opts.resamples)
        .map(|_| {
            let b = resampled_median(baseline, &mut rng, &mut scratch);
            let c = resampled_median(current, &mut rng, &mut scratch);
            c / b
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    let tail = (1.0 - opts.confidence) / 2.0;
    (quantile(&ratios, tail), quantile(&ratios, 1.0 - tail))
}

fn resampled_median(rounds: &[&[f64]], rng: &mut Rng, scratch: &mut Vec<f64>) -> f64 {
    scratch.clear();
    for _ in 0..rounds.len() {
        let r = rounds[rng.below(rounds.len() as u64) as usize];
        scratch.extend((0..r.len()).map(|_| r[rng.below(r.len() as u64) as usize]));
    }
    scratch.sort_by(f64::total_cmp);
    median_sorted(scratch)
}

/// Linear-interpolated quantile `q ∈ [0, 1]` of sorted, non-empty `v`.
fn quantile(v: &[f64], q: f64) -> f64 {
    let pos = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

/// Two-sided Mann–Whitney U test of `x` against `y` (normal approximation, midranks for ties,
/// tie-corrected variance, continuity correction — as `scipy.stats.mannwhitneyu(x, y,
/// method="asymptotic")`). Both sets must be non-empty.
pub fn mann_whitney(x: &[f64], y: &[f64]) -> MannWhitney {
    let (n1, n2) = (x.len() as f64, y.len() as f64);
    let mut all: Vec<(f64, bool)> = x
        .iter()
        .map(|&v| (v, true))
        .chain(y.iter().map(|&v| (v, false)))
        .collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    let n = all.len();
    let (mut rank_sum_x, mut tie_term) = (0.0, 0.0);
    let mut i = 0;
    while i < n {
        let mut j = i + 1;
        while j < n && all[j].0 == all[i].0 {
            j += 1;
        }
        // Positions i..j (0-based) share the midrank of ranks i+1..=j.
        let midrank = (i + 1 + j) as f64 / 2.0;
        let in_x = all[i..j].iter().filter(|e| e.1).count() as f64;
        rank_sum_x += midrank * in_x;
        let t = (j - i) as f64;
        tie_term += t * t * t - t;
        i = j;
    }
    let u = rank_sum_x - n1 * (n1 + 1.0) / 2.0;
    let mean = n1 * n2 / 2.0;
    let nf = n as f64;
    let variance = if n > 1 {
        n1 * n2 / 12.0 * ((nf + 1.0) - tie_term / (nf * (nf - 1.0)))
    } else {
        0.0
    };
    if variance <= 0.0 {
        return MannWhitney {
            u,
            z: 0.0,
            p_value: 1.0,
        };
    }
    let d = u - mean;
    let z = d.signum() * (d.abs() - 0.5).max(0.0) / variance.sqrt();
    MannWhitney {
        u,
        z,
        p_value: erfc(z.abs() / std::f64::consts::SQRT_2).min(1.0),
    }
}

/// Standard normal cumulative distribution function.
pub fn normal_cdf(z: f64) -> f64 {
    0.5 * erfc(-z / std::f64::consts::SQRT_2)
}

/// Complementary error function, fractional error below 1.2e-7 everywhere (Chebyshev fit,
/// Numerical Recipes' `erfcc`).
pub fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    /// `n` timings around `center` with multiplicative noise of about ±`noise` (uniform) plus
    /// occasional slow outliers, as a shared machine produces.
    fn noisy(center: f64, noise: f64, n: usize, seed: u64) -> Vec<f64> {
        let mut rng = Rng::new(seed);
        (0..n)
            .map(|_| {
                let u = rng.symmetric_f32() as f64;
                let outlier = if rng.below(10) == 0 { 1.5 } else { 1.0 };
                center * (1.0 + noise * u) * outlier
            })
            .collect()
    }

    #[test]
    fn error_function_matches_tables() {
        assert!(close(erfc(0.0), 1.0, 1e-7));
        assert!(close(erfc(1.0), 0.157_299_207, 1e-7));
        assert!(close(erfc(-1.0), 1.842_700_793, 1e-7));
        assert!(close(erfc(3.0), 2.209_049_7e-5, 1e-10));
        assert!(close(normal_cdf(1.959_964), 0.975, 1e-7));
        assert!(close(normal_cdf(0.0), 0.5, 1e-7));
        assert!(close(normal_cdf(-2.575_829), 0.005, 1e-7));
    }

    #[test]
    fn mann_whitney_matches_scipy() {
        // scipy.stats.mannwhitneyu(x, y, method="asymptotic") gives U and p for these.
        let x = [1.0, 2.0, 3.0, 4.0, 5.0];
        let y = [6.0, 7.0, 8.0, 9.0, 10.0];
        let r = mann_whitney(&x, &y);
        assert_eq!(r.u, 0.0);
        assert!(close(r.p_value, 0.012_185_8, 1e-6), "{r:?}");
        assert!(r.z < 0.0);
        let s = mann_whitney(&y, &x);
        assert_eq!(s.u, 25.0);
        assert!(close(s.p_value, r.p_value, 1e-12) && s.z > 0.0);

        // With ties across and within the sets.
        let x = [1.0, 2.0, 2.0, 3.0, 3.0, 3.0, 7.0];
        let y = [2.0, 3.0, 4.0, 4.0, 5.0, 6.0];
        let r = mann_whitney(&x, &y);
        assert_eq!(r.u, 11.5);
        assert!(close(r.p_value, 0.189_164_9, 1e-6), "{r:?}");
    }

    #[test]
    fn mann_whitney_of_identical_sets_is_not_significant() {
        let r = mann_whitney(&[1.0; 8], &[1.0; 9]);
        assert_eq!(r.p_value, 1.0);
        let x = noisy(1.0, 0.05, 40, 1);
        let r = mann_whitney(&x, &x);
        assert!(r.p_value > 0.99, "{r:?}");
    }

    #[test]
    fn bootstrap_interval_covers_the_true_ratio_and_is_reproducible() {
        let base = noisy(2e-3, 0.04, 40, 11);
        let slow = noisy(2e-3 * 1.3, 0.04, 40, 12);
        let opts = CompareOptions::default();
        let (lo, hi) = bootstrap_ratio_ci(&[&base], &[&slow], &opts);
        assert!(lo < 1.3 && 1.3 < hi, "[{lo}, {hi}]");
        assert!(hi - lo < 0.1, "a 40-sample interval is tight: [{lo}, {hi}]");
        assert_eq!(bootstrap_ratio_ci(&[&base], &[&slow], &opts), (lo, hi));
        let other = CompareOptions {
            seed: 99,
            ..CompareOptions::default()
        };
        assert_ne!(bootstrap_ratio_ci(&[&base], &[&slow], &other), (lo, hi));
    }

    #[test]
    fn a_planted_regression_and_improvement_are_classified() {
        let opts = CompareOptions::default();
        let base = noisy(1e-3, 0.05, 25, 3);
        let slower = noisy(1.3e-3, 0.05, 25, 4);
        let c = compare(&base, &slower, &opts).unwrap();
        assert_eq!(c.verdict, Verdict::Regression, "{c:?}");
        assert!(c.p_value < 1e-6);
        assert!(close(c.time_ratio, 1.3, 0.05));
        let (slo, shi) = c.speed_ci();
        assert!(slo < c.speed_ratio() && c.speed_ratio() < shi);

        let c = compare(&slower, &base, &opts).unwrap();
        assert_eq!(c.verdict, Verdict::Improvement, "{c:?}");
    }

    #[test]
    fn noise_and_small_changes_are_not_regressions() {
        let opts = CompareOptions::default();
        // 200 pairs of runs of the same code: no false alarm.
        let mut alarms = 0;
        for seed in 0..200u64 {
            let a = noisy(1e-3, 0.08, 15, 2 * seed);
            let b = noisy(1e-3, 0.08, 15, 2 * seed + 1);
            if compare(&a, &b, &opts).unwrap().verdict != Verdict::Unchanged {
                alarms += 1;
            }
        }
        assert_eq!(alarms, 0);
        // A real but small (2%) slowdown, measured precisely: significant, below threshold.
        let base = noisy(1e-3, 0.002, 60, 5);
        let a_bit_slower = noisy(1.02e-3, 0.002, 60, 6);
        let c = compare(&base, &a_bit_slower, &opts).unwrap();
        assert!(c.p_value < 1e-6, "{c:?}");
        assert_eq!(c.verdict, Verdict::Unchanged);
        // The same 2% with a 1% threshold is a regression.
        let strict = CompareOptions {
            threshold: 0.01,
            ..CompareOptions::default()
        };
        assert_eq!(
            compare(&base, &a_bit_slower, &strict).unwrap().verdict,
            Verdict::Regression
        );
        // 10% slower on average, but so noisy that the interval reaches below 5%: unchanged.
        let wobbly_base = noisy(1e-3, 0.4, 6, 7);
        let wobbly = noisy(1.1e-3, 0.4, 6, 8);
        let c = compare(&wobbly_base, &wobbly, &opts).unwrap();
        assert_eq!(c.verdict, Verdict::Unchanged, "{c:?}");
    }

    #[test]
    fn disagreeing_rounds_widen_the_interval() {
        let opts = CompareOptions::default();
        // Each run: three rounds, one of them measured while the machine was 40% slower.
        let quiet = |seed| noisy(1e-3, 0.02, 40, seed);
        let busy = |seed| noisy(1.4e-3, 0.02, 40, seed);
        let base = [quiet(1), quiet(2), busy(3)];
        let cur = [quiet(4), busy(5), busy(6)];
        let pooled_base: Vec<f64> = base.concat();
        let pooled_cur: Vec<f64> = cur.concat();
        // Pooled as one round, the shifted mixture looks like a tight, large slowdown...
        let naive = compare(&pooled_base, &pooled_cur, &opts).unwrap();
        assert_eq!(naive.verdict, Verdict::Regression, "{naive:?}");
        // ...resampled by round, the interval admits that the rounds disagree.
        let c = compare_rounds(&base, &cur, &opts).unwrap();
        assert_eq!(c.verdict, Verdict::Unchanged, "{c:?}");
        assert!(c.ci_low < 1.05 && c.ci_high > 1.3, "{c:?}");
        assert_eq!((c.time_ratio, c.p_value), (naive.time_ratio, naive.p_value));
        // A slowdown seen in every round is still a regression.
        let slower = [busy(7), busy(8), busy(9)];
        let quiet_base = [quiet(10), quiet(11), quiet(12)];
        let c = compare_rounds(&quiet_base, &slower, &opts).unwrap();
        assert_eq!(c.verdict, Verdict::Regression, "{c:?}");
        let empty: [&[f64]; 2] = [&[1.0, 2.0, 3.0], &[]];
        assert_eq!(
            compare_rounds(&empty, &slower, &opts).unwrap_err(),
            CompareError::EmptyRound { which: "baseline" }
        );
    }

    #[test]
    fn bad_inputs_are_errors() {
        let ok = [1.0, 2.0, 3.0];
        let opts = CompareOptions::default();
        assert_eq!(
            compare(&[1.0, 2.0], &ok, &opts).unwrap_err(),
            CompareError::TooFewSamples {
                which: "baseline",
                got: 2
            }
        );
        let e = compare(&ok, &[1.0, f64::NAN, 2.0], &opts).unwrap_err();
        assert!(e.to_string().contains("current run"), "{e}");
        assert!(compare(&ok, &[1.0, 0.0, 2.0], &opts).is_err());
        let bad = CompareOptions {
            threshold: -0.1,
            ..CompareOptions::default()
        };
        assert!(compare(&ok, &ok, &bad)
            .unwrap_err()
            .to_string()
            .contains("threshold"));
        let bad = CompareOptions {
            alpha: 1.5,
            ..CompareOptions::default()
        };
        assert!(compare(&ok, &ok, &bad).is_err());
    }
}
