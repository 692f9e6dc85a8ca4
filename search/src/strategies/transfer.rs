//! Transfer learning for [`ModelGuided`](super::ModelGuided): other workloads' records (and
//! similar machines'), normalised per source, placed against this workload per kernel family,
//! and weighted by how well each source ranks this workload's own measurements.
//!
//! A *source* is one workload measured on one machine. Three things keep a source from
//! misleading the search:
//!
//! - **Normalised targets** ([`ModelOptions::normalise`]): each source's targets minus their
//!   median. Sources transfer a ranking, not a speed level: a GEMV is memory-bound, a 128-row
//!   GEMM is not.
//! - **Family levels** ([`Transfer::level`]): how the kernel families compare differs between
//!   workloads (the direct kernel is the fastest family at M = 1 and among the slowest at M =
//!   32), and a source that never ran a family at this workload's size cannot know it. So the
//!   sources transfer the ranking *within* a family, and where each family sits on this
//!   workload comes from its own measurements of that family.
//! - **Judged sources** ([`ModelOptions::judge`]): once [`JUDGE_FROM`] own configs are
//!   measured, the sources are judged in the manner of RGPE (Feurer, Letham and Bakshy,
//!   *Scalable meta-learning for Bayesian optimization*, 2018): on bootstrap resamples of the
//!   own measurements, each source's model and a model of the own measurements alone (out of
//!   sample, by k-fold) are scored by the share of measured pairs they order wrongly, and a
//!   source's share of the transfer weight becomes the probability that it orders them best.
//!   A source that ranks this workload worse than its own few measurements do fades out.

use costmodel::{features, target, ModelKind, TrainingSet};
use kernels::{Rng, Workload};

use super::{family_indices, ModelOptions};
use crate::strategy::Prior;

/// Own measurements before the sources are judged; until then each source counts by its
/// number of records.
const JUDGE_FROM: usize = 12;
/// Own measurements beyond which the judgement is kept as it is: by then the transfer set is
/// a small share of the training data whatever its split.
const JUDGE_UPTO: usize = 160;
/// Bootstrap resamples per judgement.
const RESAMPLES: usize = 48;
/// Folds of the own model's out-of-sample predictions.
const FOLDS: usize = 4;
/// Weight, in own measurements, of the all-family level in a family's level.
const LEVEL_PRIOR: f64 = 2.0;

/// One source: its records in the transfer set and its model's view of the candidates.
#[derive(Debug)]
struct Source {
    records: Vec<usize>,
    /// The model fitted on this source alone, predicting every candidate (`None`: too few
    /// records to fit one; such a source never wins a judgement).
    pred: Option<Vec<f64>>,
    /// Share of the transfer weight in `[0, 1]` once judged.
    share: Option<f64>,
}

/// The transfer history prepared for one workload's candidates.
#[derive(Debug)]
pub struct Transfer {
    /// Features, (normalised) targets and machine weights of the transfer records.
    set: TrainingSet,
    sources: Vec<Source>,
    /// The model of all sources together, predicting every candidate (with
    /// [`ModelOptions::normalise`]): it puts own targets on the sources' scale.
    prior: Option<Vec<f64>>,
    /// Kernel family (an index) of every candidate, and each family's current level
    /// ([`Transfer::update`]).
    family: Vec<usize>,
    levels: Vec<f64>,
    model: ModelKind,
    weight: f64,
    judge: bool,
    seed: u64,
}

impl Transfer {
    /// Prepares `history` (other workloads' and machines' records) for tuning on candidates
    /// with features `x`; beyond [`ModelOptions::transfer_cap`] records, a subsample drawn
    /// with `rng`.
    pub fn new(
        mut history: Vec<&Prior>,
        x: &[Vec<f64>],
        kernels: &[&str],
        opts: &ModelOptions,
        rng: &mut Rng,
        seed: u64,
    ) -> Self {
        let (family, families) = family_indices(kernels.iter().copied());
        if history.len() > opts.transfer_cap {
            for i in 0..opts.transfer_cap {
                let j = i + rng.below((history.len() - i) as u64) as usize;
                history.swap(i, j);
            }
            history.truncate(opts.transfer_cap);
        }
        let mut set = TrainingSet::new();
        let mut keys: Vec<(Workload, &str)> = Vec::new();
        let mut sources: Vec<Source> = Vec::new();
        for (r, p) in history.iter().enumerate() {
            let key = (p.workload, p.hw.id.as_str());
            let s = match keys.iter().position(|k| *k == key) {
                Some(s) => s,
                None => {
                    keys.push(key);
                    sources.push(Source {
                        records: Vec::new(),
                        pred: None,
                        share: None,
                    });
                    sources.len() - 1
                }
            };
            sources[s].records.push(r);
            set.push(
                features(&p.workload, &p.kernel, &p.config, &p.hw),
                target(p.seconds, &p.workload),
                p.weight,
            );
        }
        let fit_predict = |data: &TrainingSet, seed: u64| {
            let mut m = opts.model.build(seed);
            m.fit(data).ok()?;
            m.predict(x).ok()
        };
        if opts.normalise {
            for s in &sources {
                let level = median(s.records.iter().map(|&r| set.y[r]).collect());
                for &r in &s.records {
                    set.y[r] -= level;
                }
            }
        }
        if opts.judge {
            for (i, s) in sources.iter_mut().enumerate() {
                let mut own = TrainingSet::new();
                for &r in &s.records {
                    own.push(set.x[r].clone(), set.y[r], 1.0);
                }
                s.pred = fit_predict(&own, seed ^ 0x50_0CE0 ^ i as u64);
            }
        }
        let prior = if opts.normalise && !set.is_empty() {
            fit_predict(&set, seed ^ 0x0005_EED5)
        } else {
            None
        };
        Transfer {
            levels: vec![0.0; families],
            family,
            set,
            sources,
            prior,
            model: opts.model,
            weight: opts.transfer_weight,
            judge: opts.judge,
            seed,
        }
    }

    /// Each source's current share of the transfer weight (`None` until judged), in the
    /// order the sources first appear in the history.
    pub fn shares(&self) -> Vec<Option<f64>> {
        self.sources.iter().map(|s| s.share).collect()
    }

    /// Where this workload's own targets sit relative to the transfer model, per kernel
    /// family: the median of own target minus the transfer model's prediction over the
    /// family's measured configs, shrunk towards that median over all own measurements (which
    /// is all a family gets before its first measurement). Subtracted from own targets for fitting and added back to
    /// predictions for ranking, so the sources transfer the ranking *within* a family while
    /// how the families compare on this workload is learned from its own measurements: one
    /// source's fastest family can be another workload's slowest. All 0 without a transfer
    /// model.
    fn levels(&self, own: &[(usize, f64)]) -> Vec<f64> {
        let (family, families) = (&self.family, self.levels.len());
        let Some(prior) = &self.prior else {
            return vec![0.0; families];
        };
        let gap = |i: usize, y: f64| y - prior[i];
        let all = median(own.iter().map(|&(i, y)| gap(i, y)).collect());
        (0..families)
            .map(|f| {
                let gaps: Vec<f64> = own
                    .iter()
                    .filter(|&&(i, _)| family[i] == f)
                    .map(|&(i, y)| gap(i, y))
                    .collect();
                let n = gaps.len() as f64;
                (n * median(gaps) + LEVEL_PRIOR * all) / (n + LEVEL_PRIOR)
            })
            .collect()
    }

    /// Brings the transfer up to date with the own measurements `own` (candidate index,
    /// target): judges the sources (see the module docs) and re-estimates each kernel
    /// family's level ([`Transfer::level`]).
    pub fn update(&mut self, own: &[(usize, f64)], x: &[Vec<f64>], rng: &mut Rng) {
        self.judge(own, x, rng);
        self.levels = self.levels(own);
    }

    /// Where candidate `i`'s family sits on this workload relative to the transfer model,
    /// from the own measurements of the last [`Transfer::update`]: add it to a prediction of
    /// a model fitted on [`Transfer::training_set`] to get a target of this workload.
    pub fn level(&self, i: usize) -> f64 {
        self.levels[self.family[i]]
    }

    /// Candidate `i`'s kernel family, as an index.
    pub fn family(&self, i: usize) -> usize {
        self.family[i]
    }

    /// Per kernel family: whether none of its candidates is `proposed` yet. All false
    /// without a transfer model (the levels are all 0 then, so nothing is learned from a
    /// family's first measurement).
    pub fn untried_families(&self, proposed: &[bool]) -> Vec<bool> {
        let mut untried = vec![self.prior.is_some(); self.levels.len()];
        for (&f, _) in self.family.iter().zip(proposed).filter(|&(_, &p)| p) {
            untried[f] = false;
        }
        untried
    }

    /// The training set for a round: the own measurements `own` (candidate index, target)
    /// minus their family's level ([`Transfer::level`]), plus the transfer records weighted
    /// by their source's share, in total as much as [`ModelOptions::transfer_weight`] own
    /// points (no record counting more than one).
    pub fn training_set(&self, own: &[(usize, f64)], x: &[Vec<f64>]) -> TrainingSet {
        let mut data = TrainingSet::new();
        for &(i, y) in own {
            data.push(x[i].clone(), y - self.level(i), 1.0);
        }
        let total: f64 = self.set.w.iter().sum();
        for s in &self.sources {
            let mass: f64 = s.records.iter().map(|&r| self.set.w[r]).sum();
            let scale = match s.share {
                Some(share) => self.weight * share / mass,
                None => self.weight / total,
            }
            .min(1.0);
            if scale <= 0.0 || !scale.is_finite() {
                continue;
            }
            for &r in &s.records {
                data.push(self.set.x[r].clone(), self.set.y[r], self.set.w[r] * scale);
            }
        }
        data
    }

    /// Judges the sources against the own measurements `own` (candidate index, target):
    /// each source's share becomes the probability, over bootstrap resamples of `own`, that it
    /// orders the measured pairs better than any other source and than a model of `own`
    /// alone (out of sample). A no-op below [`JUDGE_FROM`] own points, above `JUDGE_UPTO`,
    /// or when judging is off.
    fn judge(&mut self, own: &[(usize, f64)], x: &[Vec<f64>], rng: &mut Rng) {
        let n = own.len();
        if !self.judge || self.sources.is_empty() || !(JUDGE_FROM..=JUDGE_UPTO).contains(&n) {
            return;
        }
        let y: Vec<f64> = own.iter().map(|&(_, y)| y).collect();
        // Contestants: the own model's out-of-sample predictions first, then each source's.
        let mut preds: Vec<Option<Vec<f64>>> = vec![self.out_of_sample(own, x)];
        preds.extend(self.sources.iter().map(|s| {
            let pred = s.pred.as_ref()?;
            Some(own.iter().map(|&(i, _)| pred[i]).collect())
        }));
        let mut wins = vec![0.0; preds.len()];
        let mut pick = vec![0usize; n];
        for _ in 0..RESAMPLES {
            for p in &mut pick {
                *p = rng.below(n as u64) as usize;
            }
            let losses: Vec<f64> = preds
                .iter()
                .map(|p| {
                    p.as_ref()
                        .map_or(f64::INFINITY, |p| misordered(&pick, p, &y))
                })
                .collect();
            let best = losses.iter().copied().fold(f64::INFINITY, f64::min);
            let tied: Vec<usize> = (0..losses.len()).filter(|&c| losses[c] == best).collect();
            for &c in &tied {
                wins[c] += 1.0 / tied.len() as f64;
            }
        }
        for (s, w) in self.sources.iter_mut().zip(&wins[1..]) {
            s.share = Some(w / RESAMPLES as f64);
        }
    }

    /// Predictions for each own point by a model fitted on the other folds of `own` only
    /// (`None` when a fold is too small to fit).
    fn out_of_sample(&self, own: &[(usize, f64)], x: &[Vec<f64>]) -> Option<Vec<f64>> {
        let mut out = vec![0.0; own.len()];
        for f in 0..FOLDS {
            let mut fit = TrainingSet::new();
            let mut test = Vec::new();
            for (j, &(i, y)) in own.iter().enumerate() {
                if j % FOLDS == f {
                    test.push(j);
                } else {
                    fit.push(x[i].clone(), y, 1.0);
                }
            }
            let mut m = self.model.build(self.seed ^ 0xF01D ^ f as u64);
            m.fit(&fit).ok()?;
            let rows: Vec<Vec<f64>> = test.iter().map(|&j| x[own[j].0].clone()).collect();
            for (&j, p) in test.iter().zip(m.predict(&rows).ok()?) {
                out[j] = p;
            }
        }
        Some(out)
    }
}

/// Share of the pairs of `pick` with different measured `y` that `pred` orders the other way
/// (a tie in `pred` counts half).
fn misordered(pick: &[usize], pred: &[f64], y: &[f64]) -> f64 {
    let (mut bad, mut pairs) = (0.0, 0usize);
    for (a, &i) in pick.iter().enumerate() {
        for &j in &pick[a + 1..] {
            let dy = y[i] - y[j];
            if dy == 0.0 {
                continue;
            }
            pairs += 1;
            let dp = pred[i] - pred[j];
            if dp == 0.0 {
                bad += 0.5;
            } else if (dp > 0.0) != (dy > 0.0) {
                bad += 1.0;
            }
        }
    }
    if pairs == 0 {
        0.5
    } else {
        bad / pairs as f64
    }
}

/// Median of values (0 when empty).
fn median(v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    kernels::measurement::median(&v)
}
