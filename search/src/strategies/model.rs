//! Cost-model-guided search (the AutoTVM recipe): fit, rank, measure the top, repeat.

use std::collections::{BTreeMap, HashSet};

use costmodel::{features, target, CostModel, ModelKind};
use kernels::{Rng, Workload};

use super::transfer::Transfer;
use super::{Book, Grid};
use crate::strategy::{SearchContext, Strategy};

/// Settings of [`ModelGuided`].
#[derive(Debug, Clone)]
pub struct ModelOptions {
    /// The cost model refitted after every batch.
    pub model: ModelKind,
    /// The name the strategy reports (`model`, `model-notransfer`, ...).
    pub name: &'static str,
    /// Share of each batch drawn uniformly at random (exploration).
    pub epsilon: f64,
    /// Optimism of the acquisition: candidates are ranked by the lower confidence bound
    /// `mean − kappa · spread` of the model's prediction (spread: the forest's per-tree
    /// standard deviation), so configs the model is unsure about get measured before
    /// confidently mediocre ones. 0 ranks by the mean alone (greedy). The default, 0.5, was
    /// chosen on the recorded spaces (`bench_results/<fingerprint>/costmodel.md`): with
    /// transfer, part of the trees' spread is sources disagreeing with this workload's own
    /// measurements, not ignorance, and 1 spent whole batches re-exploring a family the own
    /// data had already ranked lower.
    pub kappa: f64,
    /// Unproposed candidates scored directly when there are at most this many; above it, a
    /// random pool of this size plus the points visited by annealing chains over the model's
    /// predictions.
    pub pool: usize,
    /// Annealing chains and steps per chain (large spaces only).
    pub chains: usize,
    /// Steps per annealing chain (large spaces only).
    pub steps: usize,
    /// Most transfer records used for fitting (a seeded subsample beyond it).
    pub transfer_cap: usize,
    /// Total weight of the transfer records, in own measurements: the transfer set counts
    /// as this many points of the workload itself, so it leads while few are measured and
    /// fades as they accumulate.
    pub transfer_weight: f64,
    /// Fit on per-workload normalised targets: each transfer source's targets (one workload
    /// on one machine) minus their median, and this workload's own targets minus their
    /// median offset, per kernel family, from a model fitted on the normalised transfer
    /// records alone (see [`Transfer`]). Sources then agree on which configs are fast
    /// whatever their absolute speed per flop (a GEMV is memory-bound, a 128-row GEMM is
    /// not), and the trees split on configs instead of on the level of each workload.
    pub normalise: bool,
    /// Judge the transfer sources against the own measurements and fade those that rank this
    /// workload worse than its own data does (see [`Transfer`]).
    pub judge: bool,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            model: ModelKind::DEFAULT,
            name: "model",
            epsilon: 0.1,
            kappa: 0.5,
            pool: 4096,
            chains: 32,
            steps: 48,
            transfer_cap: 2048,
            transfer_weight: 16.0,
            normalise: true,
            judge: true,
        }
    }
}

/// Model-guided search. After each measured batch it refits the cost model on every
/// measurement of this workload (log seconds per flop, weight 1) plus, when the context has
/// history of other workloads or similar machines, those records weighted down, each source
/// normalised to its own level, the own targets placed against them per kernel family, and
/// sources that rank this workload badly faded out ([`Transfer`]); then it ranks
/// the unmeasured valid candidates by the lower confidence bound of their predicted time,
/// `mean − κ·spread` over the forest's trees ([`ModelOptions::kappa`]; all candidates when
/// there are at most [`ModelOptions::pool`], otherwise a random pool plus annealing over the
/// same score), and proposes the top of the ranking with a share ε of random picks. Within
/// a batch it skips candidates whose features equal a measured or already chosen one (configs
/// that run the same code, e.g. block sizes that clamp to the same value), while others are
/// left. It never proposes a candidate twice, and never one already measured.
///
/// With transfer, the very first batch is already ranked by a model trained on the other
/// workloads. Without it, until [`costmodel::MIN_POINTS`] candidates are measured the model declines to
/// fit and the strategy samples at random.
pub struct ModelGuided {
    opts: ModelOptions,
    grid: Grid,
    book: Book,
    rng: Rng,
    workload: Workload,
    /// Features of every candidate.
    x: Vec<Vec<f64>>,
    transfer: Transfer,
    model: Box<dyn CostModel>,
    /// Batches ranked by a fitted model.
    guided_batches: usize,
    /// Batches drawn at random because the model could not be fitted or could not predict.
    random_batches: usize,
}

impl ModelGuided {
    /// Batches proposed so far that a fitted model ranked.
    pub fn guided_batches(&self) -> usize {
        self.guided_batches
    }

    /// Batches proposed so far at random, because the model could not be fitted or could not
    /// predict (too few measurements, without transfer).
    pub fn random_batches(&self) -> usize {
        self.random_batches
    }

    /// A model-guided search over `ctx`'s candidates, seeded by `ctx.seed`. The history of
    /// this workload on this machine counts as measured; the rest of the history is the
    /// transfer set ([`Transfer`]).
    pub fn new(ctx: SearchContext, opts: ModelOptions) -> Self {
        let x: Vec<Vec<f64>> = ctx
            .points
            .iter()
            .map(|p| features(&ctx.workload, &p.kernel, &p.config, &ctx.hw))
            .collect();
        let mut rng = Rng::new(ctx.seed ^ 0x0003_0DE1);
        let kernels: Vec<&str> = ctx.points.iter().map(|p| p.kernel.as_str()).collect();
        let transfer = Transfer::new(
            ctx.transfer().collect(),
            &x,
            &kernels,
            &opts,
            &mut rng,
            ctx.seed,
        );
        ModelGuided {
            grid: Grid::new(&ctx.points),
            book: Book::new(&ctx),
            model: opts.model.build(ctx.seed),
            workload: ctx.workload,
            x,
            transfer,
            rng,
            opts,
            guided_batches: 0,
            random_batches: 0,
        }
    }

    /// Each transfer source's share of the transfer weight (`None` until judged; see
    /// [`Transfer`]).
    pub fn transfer_shares(&self) -> Vec<Option<f64>> {
        self.transfer.shares()
    }

    /// The own measurements as (candidate, target), best first.
    fn own(&self) -> Vec<(usize, f64)> {
        self.book
            .ranked()
            .into_iter()
            .map(|(i, s)| (i, target(s, &self.workload)))
            .collect()
    }

    fn u01(&mut self) -> f64 {
        (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The acquisition score of candidates (lower is more worth measuring): the lower
    /// confidence bound `mean − kappa · spread` of the predicted target.
    fn score(&self, cand: &[usize]) -> Option<Vec<f64>> {
        let rows: Vec<Vec<f64>> = cand.iter().map(|&i| self.x[i].clone()).collect();
        let pred = self.model.predict_spread(&rows).ok()?;
        Some(
            pred.into_iter()
                .zip(cand)
                .map(|((mean, spread), &i)| {
                    mean + self.transfer.level(i) - self.opts.kappa * spread
                })
                .collect(),
        )
    }

    /// Unproposed candidates worth scoring, with their predictions, best first.
    fn ranked_pool(&mut self) -> Option<Vec<(usize, f64)>> {
        let mut cand: Vec<usize> = if self.book.open.len() <= self.opts.pool {
            self.book.open.clone()
        } else {
            let mut picked: HashSet<usize> = HashSet::new();
            while picked.len() < self.opts.pool {
                picked.extend(self.book.random_open(&mut self.rng));
            }
            picked.extend(self.anneal_on_model()?);
            picked.into_iter().collect()
        };
        cand.sort_unstable();
        let pred = self.score(&cand)?;
        let mut scored: Vec<(usize, f64)> = cand.into_iter().zip(pred).collect();
        scored.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        Some(scored)
    }

    /// Annealing chains over the model's predictions, from the best measured points and random
    /// ones; returns the unproposed candidates visited.
    fn anneal_on_model(&mut self) -> Option<Vec<usize>> {
        let chains = self.opts.chains.max(1);
        let mut state: Vec<usize> = self
            .book
            .ranked()
            .into_iter()
            .map(|(i, _)| i)
            .take(chains / 2)
            .collect();
        while state.len() < chains {
            match self.book.random_open(&mut self.rng) {
                Some(i) => state.push(i),
                None => break,
            }
        }
        let mut score = self.score(&state)?;
        let mut visited: BTreeMap<usize, ()> = BTreeMap::new();
        let mut temp = 0.05;
        for _ in 0..self.opts.steps {
            let next: Vec<usize> = state
                .iter()
                .map(|&i| self.grid.mutate(i, &mut self.rng).unwrap_or(i))
                .collect();
            let pred = self.score(&next)?;
            for c in 0..state.len() {
                let delta = pred[c] - score[c];
                if delta < 0.0 || self.u01() < (-delta / temp).exp() {
                    state[c] = next[c];
                    score[c] = pred[c];
                }
                if !self.book.proposed[next[c]] {
                    visited.insert(next[c], ());
                }
            }
            temp *= 0.9;
        }
        Some(visited.into_keys().collect())
    }

    fn random_batch(&mut self, n: usize) -> Vec<usize> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let Some(j) = self.book.random_open(&mut self.rng) else {
                break;
            };
            self.book.mark(j);
            out.push(j);
        }
        out
    }
}

/// Exact bit pattern of a feature row, to spot configs that run the same code.
fn key(x: &[f64]) -> Vec<u64> {
    x.iter().map(|v| v.to_bits()).collect()
}

impl Strategy for ModelGuided {
    fn name(&self) -> &'static str {
        self.opts.name
    }

    fn ask(&mut self, n: usize) -> Vec<usize> {
        if n == 0 || self.book.open.is_empty() {
            return Vec::new();
        }
        let own = self.own();
        self.transfer.update(&own, &self.x, &mut self.rng);
        let data = self.transfer.training_set(&own, &self.x);
        let ranked = match self.model.fit(&data) {
            Ok(()) => self.ranked_pool(),
            Err(_) => None,
        };
        let Some(ranked) = ranked else {
            self.random_batches += 1;
            return self.random_batch(n);
        };
        self.guided_batches += 1;
        let mut seen: HashSet<Vec<u64>> = self
            .book
            .ranked()
            .iter()
            .map(|&(i, _)| key(&self.x[i]))
            .collect();
        let mut out: Vec<usize> = Vec::with_capacity(n);
        // A family's level on this workload comes from its own measurements
        // ([`Transfer::level`]), so with transfer each kernel family that has none proposed
        // yet gets its best-ranked config into the batch.
        let mut untried = self.transfer.untried_families(&self.book.proposed);
        for &(j, _) in &ranked {
            let f = self.transfer.family(j);
            if out.len() < n && untried[f] && !self.book.proposed[j] {
                untried[f] = false;
                seen.insert(key(&self.x[j]));
                self.book.mark(j);
                out.push(j);
            }
        }
        let mut skipped: Vec<usize> = Vec::new();
        let mut next = ranked.into_iter().map(|(i, _)| i);
        while out.len() < n {
            if self.u01() < self.opts.epsilon {
                if let Some(j) = self.book.random_open(&mut self.rng) {
                    self.book.mark(j);
                    out.push(j);
                    continue;
                }
            }
            let pick = loop {
                match next.next() {
                    Some(j) if self.book.proposed[j] => continue,
                    Some(j) if !seen.insert(key(&self.x[j])) => skipped.push(j),
                    other => break other,
                }
            };
            // Configs equivalent to measured ones come last, in rank order.
            let pick = pick.or_else(|| {
                while let Some(j) = (!skipped.is_empty()).then(|| skipped.remove(0)) {
                    if !self.book.proposed[j] {
                        return Some(j);
                    }
                }
                None
            });
            let Some(j) = pick.or_else(|| self.book.random_open(&mut self.rng)) else {
                break;
            };
            self.book.mark(j);
            out.push(j);
        }
        out
    }

    fn tell(&mut self, results: &[(usize, Option<f64>)]) {
        self.book.tell(results);
    }
}
