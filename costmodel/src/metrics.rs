//! How good a model is at what search needs from it: ranking configs, finding the fast ones.

/// Ranks (1-based, ties get the average rank).
pub fn ranks(v: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    let mut r = vec![0.0; v.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && v[idx[j + 1]] == v[idx[i]] {
            j += 1;
        }
        let avg = (i + j) as f64 / 2.0 + 1.0;
        for &k in &idx[i..=j] {
            r[k] = avg;
        }
        i = j + 1;
    }
    r
}

/// Spearman's rank correlation of `a` and `b` (Pearson correlation of their ranks);
/// 0 when either is constant or shorter than 2.
pub fn spearman(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "spearman needs paired values");
    let n = a.len();
    if n < 2 {
        return 0.0;
    }
    let (ra, rb) = (ranks(a), ranks(b));
    let mean = (n as f64 + 1.0) / 2.0;
    let (mut sab, mut saa, mut sbb) = (0.0, 0.0, 0.0);
    for (x, y) in ra.iter().zip(&rb) {
        sab += (x - mean) * (y - mean);
        saa += (x - mean) * (x - mean);
        sbb += (y - mean) * (y - mean);
    }
    if saa == 0.0 || sbb == 0.0 {
        0.0
    } else {
        sab / (saa * sbb).sqrt()
    }
}

/// Of the `k` truly fastest points (lowest `truth`), the share among the `k` the model ranks
/// fastest (lowest `pred`).
pub fn top_k_recall(pred: &[f64], truth: &[f64], k: usize) -> f64 {
    assert_eq!(pred.len(), truth.len(), "top-k recall needs paired values");
    let k = k.min(pred.len());
    if k == 0 {
        return 0.0;
    }
    let top = |v: &[f64]| {
        let mut idx: Vec<usize> = (0..v.len()).collect();
        idx.sort_by(|&a, &b| v[a].total_cmp(&v[b]).then(a.cmp(&b)));
        idx.truncate(k);
        idx
    };
    let (p, t) = (top(pred), top(truth));
    p.iter().filter(|i| t.contains(i)).count() as f64 / k as f64
}

/// Time of the model's pick ÷ the true best time (1 = the model picked the best; `times` are
/// seconds, `pred` any score where lower is faster).
pub fn regret(pred: &[f64], times: &[f64]) -> f64 {
    assert_eq!(pred.len(), times.len(), "regret needs paired values");
    let Some(pick) = (0..pred.len()).min_by(|&a, &b| pred[a].total_cmp(&pred[b])) else {
        return f64::NAN;
    };
    let best = times.iter().copied().fold(f64::INFINITY, f64::min);
    times[pick] / best
}

/// Held-out quality of a model's predictions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Metrics {
    /// Spearman rank correlation of predicted and true targets.
    pub spearman: f64,
    /// [`top_k_recall`] at `k`.
    pub top_k_recall: f64,
    /// The `k` asked for ([`top_k_recall`] caps it at the number of points).
    pub k: usize,
    /// [`regret`]: true time of the predicted best ÷ true best.
    pub regret: f64,
}

impl Metrics {
    /// All metrics of `pred` against true `times` (seconds).
    pub fn of(pred: &[f64], times: &[f64], k: usize) -> Metrics {
        Metrics {
            spearman: spearman(pred, times),
            top_k_recall: top_k_recall(pred, times, k),
            k,
            regret: regret(pred, times),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_average_ties() {
        assert_eq!(ranks(&[3.0, 1.0, 2.0, 1.0]), vec![4.0, 1.5, 3.0, 1.5]);
    }

    #[test]
    fn spearman_extremes() {
        let a = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert!((spearman(&a, &[10.0, 20.0, 30.0, 40.0, 50.0]) - 1.0).abs() < 1e-12);
        assert!((spearman(&a, &[5.0, 4.0, 3.0, 2.0, 1.0]) + 1.0).abs() < 1e-12);
        // Monotone but nonlinear is still perfect.
        assert!((spearman(&a, &[1.0, 8.0, 27.0, 64.0, 125.0]) - 1.0).abs() < 1e-12);
        assert_eq!(spearman(&a, &[1.0; 5]), 0.0);
        assert_eq!(spearman(&[1.0], &[2.0]), 0.0);
        // A known value: one swap in five.
        let rho = spearman(&a, &[1.0, 3.0, 2.0, 4.0, 5.0]);
        assert!((rho - 0.9).abs() < 1e-12, "{rho}");
    }

    #[test]
    fn recall_and_regret() {
        let truth = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let pred = [0.2, 0.9, 0.1, 0.8, 0.7, 0.3];
        // Model's top 2: indices 2, 0; truth's: 0, 1.
        assert_eq!(top_k_recall(&pred, &truth, 2), 0.5);
        assert_eq!(top_k_recall(&truth, &truth, 3), 1.0);
        // Model picks index 2 (time 3) against the best 1.
        assert_eq!(regret(&pred, &truth), 3.0);
        assert_eq!(regret(&truth, &truth), 1.0);
        let m = Metrics::of(&truth, &truth, 2);
        assert_eq!((m.top_k_recall, m.regret), (1.0, 1.0));
    }
}
