//! Ask/tell search strategies over a list of candidates.
//!
//! A strategy proposes candidate indices and is told how they did; it never runs anything
//! itself. That keeps batching, parallel preparation, resumption from the database and offline
//! replay in the [`Tuner`](crate::tune) and the [`Replayer`](crate::replay), and lets a cost
//! model plug in as just another strategy.
//!
//! A strategy is built from a [`SearchContext`]: the candidate list (kernel name + config per
//! index, which model-guided strategies featurise), the workload, the hardware fingerprint,
//! the seed, and the measured history — this workload's earlier trials (a resumed job) and
//! other workloads' trials on this or a similar machine (transfer learning).

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;

use costmodel::{transfer_weight, ModelKind};
use kernels::{Config, HardwareFingerprint, Rng, Workload};
use tuning_db::{DbError, TuningDb};

use crate::strategies::{Annealing, Evolutionary, ModelGuided, ModelOptions};
use crate::tuner::Candidate;

/// A search strategy: proposes candidates (by index into the tuner's candidate list) and
/// learns from their measured times.
pub trait Strategy: Send {
    /// Short name, as accepted by `--strategy`.
    fn name(&self) -> &'static str;

    /// Up to `n` indices never proposed before. Empty means the strategy has nothing left.
    fn ask(&mut self, n: usize) -> Vec<usize>;

    /// Results for proposed indices: seconds per call, or `None` for a failed candidate.
    fn tell(&mut self, results: &[(usize, Option<f64>)]);
}

/// One candidate as strategies see it: a kernel family's name and a config of its space.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Point {
    /// The kernel family's name.
    pub kernel: String,
    /// A valid config of the family's space for the workload.
    pub config: Config,
}

/// A measured record a strategy may learn from.
#[derive(Debug, Clone, PartialEq)]
pub struct Prior {
    /// The workload it was measured on.
    pub workload: Workload,
    /// The machine it was measured on (features are relative to its caches).
    pub hw: Arc<HardwareFingerprint>,
    /// The kernel family's name.
    pub kernel: String,
    /// The config measured.
    pub config: Config,
    /// Median seconds per call.
    pub seconds: f64,
    /// How much it counts, in `(0, 1]`: [`transfer_weight`] of its machine.
    pub weight: f64,
}

/// Everything a strategy may know when it is built.
#[derive(Debug, Clone)]
pub struct SearchContext {
    /// The workload searched.
    pub workload: Workload,
    /// The machine searched for: the cost model's features are relative to its caches.
    pub hw: HardwareFingerprint,
    /// The candidates; [`Strategy::ask`] returns indices into this list.
    pub points: Vec<Point>,
    /// Seed of the strategy's random choices: built from the same context and told the same
    /// results, a strategy proposes the same candidates.
    pub seed: u64,
    /// Measured records: this workload on this machine (earlier runs; strategies treat them
    /// as already measured) and other workloads or similar machines (transfer).
    pub history: Vec<Prior>,
}

impl SearchContext {
    /// A context without history.
    pub fn new(workload: Workload, hw: HardwareFingerprint, points: Vec<Point>, seed: u64) -> Self {
        SearchContext {
            workload,
            hw,
            points,
            seed,
            history: Vec::new(),
        }
    }

    /// The tuner's context: its candidates, plus every `ok` trial in `db` on this machine or
    /// a similar one ([`transfer_weight`] > 0) whose kernel family and version are the ones
    /// registered now.
    pub fn from_db(
        db: &TuningDb,
        w: &Workload,
        hw: &HardwareFingerprint,
        candidates: &[Candidate],
        seed: u64,
    ) -> Result<Self, DbError> {
        let points = candidates
            .iter()
            .map(|c| Point {
                kernel: c.kernel.name().to_string(),
                config: c.config.clone(),
            })
            .collect();
        let mut ctx = SearchContext::new(*w, hw.clone(), points, seed);
        let current: HashMap<&str, u32> = kernels::registry()
            .iter()
            .map(|k| (k.name(), k.version()))
            .collect();
        let mut machines = db.fingerprints()?;
        if !machines.iter().any(|f| f.id == hw.id) {
            machines.push(hw.clone());
        }
        for fp in machines {
            let weight = transfer_weight(hw, &fp);
            if weight <= 0.0 {
                continue;
            }
            let fp = Arc::new(fp);
            for r in db.ok_records(&fp.id)? {
                let Some(seconds) = r.median_s() else {
                    continue;
                };
                if current.get(r.kernel.as_str()) != Some(&r.kernel_version) {
                    continue;
                }
                ctx.history.push(Prior {
                    workload: r.workload,
                    hw: fp.clone(),
                    kernel: r.kernel,
                    config: r.config,
                    seconds,
                    weight,
                });
            }
        }
        Ok(ctx)
    }

    /// Whether a prior is this workload on this machine (an earlier measurement of the very
    /// search space being explored).
    pub fn is_own(&self, p: &Prior) -> bool {
        p.workload == self.workload && p.hw.id == self.hw.id
    }

    /// Index of each point by (kernel, config).
    pub fn index(&self) -> HashMap<&Point, usize> {
        self.points
            .iter()
            .enumerate()
            .map(|(i, p)| (p, i))
            .collect()
    }

    /// Known outcomes of this workload's candidates from the history: the fastest recorded
    /// time per candidate index, in index order.
    pub fn own_results(&self) -> Vec<(usize, f64)> {
        let index = self.index();
        let mut best: HashMap<usize, f64> = HashMap::new();
        for p in self.history.iter().filter(|p| self.is_own(p)) {
            let key = Point {
                kernel: p.kernel.clone(),
                config: p.config.clone(),
            };
            if let Some(&i) = index.get(&key) {
                let e = best.entry(i).or_insert(p.seconds);
                *e = e.min(p.seconds);
            }
        }
        let mut out: Vec<(usize, f64)> = best.into_iter().collect();
        out.sort_by_key(|&(i, _)| i);
        out
    }

    /// Priors of other workloads or machines (the transfer set), in history order.
    pub fn transfer(&self) -> impl Iterator<Item = &Prior> {
        self.history.iter().filter(|p| !self.is_own(p))
    }
}

/// Tries every candidate, in the order the spaces list them.
#[derive(Debug)]
pub struct Exhaustive {
    next: usize,
    len: usize,
}

impl Exhaustive {
    /// Proposes the indices `0..len`, in order.
    pub fn new(len: usize) -> Self {
        Exhaustive { next: 0, len }
    }
}

impl Strategy for Exhaustive {
    fn name(&self) -> &'static str {
        "exhaustive"
    }

    fn ask(&mut self, n: usize) -> Vec<usize> {
        let end = (self.next + n).min(self.len);
        let out = (self.next..end).collect();
        self.next = end;
        out
    }

    fn tell(&mut self, _results: &[(usize, Option<f64>)]) {}
}

/// Uniform random order without replacement, fixed by a seed.
#[derive(Debug)]
pub struct RandomSearch {
    order: Vec<usize>,
    next: usize,
}

impl RandomSearch {
    /// Proposes the indices `0..len` in an order shuffled by `seed`.
    pub fn new(len: usize, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let mut order: Vec<usize> = (0..len).collect();
        // Fisher–Yates.
        for i in (1..len).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            order.swap(i, j);
        }
        RandomSearch { order, next: 0 }
    }
}

impl Strategy for RandomSearch {
    fn name(&self) -> &'static str {
        "random"
    }

    fn ask(&mut self, n: usize) -> Vec<usize> {
        let end = (self.next + n).min(self.order.len());
        let out = self.order[self.next..end].to_vec();
        self.next = end;
        out
    }

    fn tell(&mut self, _results: &[(usize, Option<f64>)]) {}
}

/// The strategies `--strategy` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrategyKind {
    /// Every candidate, in list order ([`Exhaustive`]).
    Exhaustive,
    /// Uniform random order without replacement ([`RandomSearch`]).
    Random,
    /// Simulated annealing over measured times ([`Annealing`]).
    Annealing,
    /// Genetic search: tournament selection, crossover and mutation over knobs
    /// ([`Evolutionary`]).
    Evolutionary,
    /// Cost-model-guided search ([`ModelGuided`]); `transfer` warm-starts the model from the
    /// history of other workloads and similar machines.
    Model {
        /// The cost model fitted.
        model: ModelKind,
        /// Whether to learn from the history of other workloads and similar machines;
        /// without it only this workload's earlier trials on this machine are kept.
        transfer: bool,
    },
}

impl StrategyKind {
    /// What `autokernel tune` uses when no strategy is named: model-guided with transfer.
    pub const DEFAULT: StrategyKind = StrategyKind::Model {
        model: ModelKind::DEFAULT,
        transfer: true,
    };

    /// Every kind with its name, the one table [`StrategyKind::name`], [`FromStr`] and
    /// [`StrategyKind::NAMES`] read.
    const KINDS: [(&'static str, StrategyKind); 8] = [
        ("exhaustive", StrategyKind::Exhaustive),
        ("random", StrategyKind::Random),
        ("annealing", StrategyKind::Annealing),
        ("evolutionary", StrategyKind::Evolutionary),
        ("model", StrategyKind::DEFAULT),
        ("model-notransfer", Self::model(ModelKind::Forest, false)),
        ("model-linear", Self::model(ModelKind::Linear, true)),
        (
            "model-linear-notransfer",
            Self::model(ModelKind::Linear, false),
        ),
    ];

    /// The names accepted by [`FromStr`].
    pub const NAMES: [&'static str; 8] = {
        let mut names = [""; 8];
        let mut i = 0;
        while i < names.len() {
            names[i] = Self::KINDS[i].0;
            i += 1;
        }
        names
    };

    const fn model(model: ModelKind, transfer: bool) -> StrategyKind {
        StrategyKind::Model { model, transfer }
    }

    /// The name accepted by [`FromStr`].
    pub fn name(self) -> &'static str {
        Self::KINDS
            .iter()
            .find(|(_, k)| *k == self)
            .map(|(name, _)| *name)
            .expect("every strategy kind is in the table")
    }

    /// A fresh strategy of this kind over the context's candidates.
    pub fn build(self, mut ctx: SearchContext) -> Box<dyn Strategy> {
        let seed = ctx.seed;
        let len = ctx.points.len();
        match self {
            StrategyKind::Exhaustive => Box::new(Exhaustive::new(len)),
            StrategyKind::Random => Box::new(RandomSearch::new(len, seed)),
            StrategyKind::Annealing => Box::new(Annealing::new(&ctx)),
            StrategyKind::Evolutionary => Box::new(Evolutionary::new(&ctx)),
            StrategyKind::Model { model, transfer } => {
                if !transfer {
                    let own: Vec<Prior> = ctx
                        .history
                        .iter()
                        .filter(|p| ctx.is_own(p))
                        .cloned()
                        .collect();
                    ctx.history = own;
                }
                Box::new(ModelGuided::new(
                    ctx,
                    ModelOptions {
                        model,
                        name: self.name(),
                        ..ModelOptions::default()
                    },
                ))
            }
        }
    }
}

impl std::fmt::Display for StrategyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A strategy name that is not one of [`StrategyKind::NAMES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown strategy '{0}' (known: {known})", known = StrategyKind::NAMES.join(", "))]
pub struct UnknownStrategy(pub String);

impl FromStr for StrategyKind {
    type Err = UnknownStrategy;

    fn from_str(s: &str) -> Result<Self, UnknownStrategy> {
        Self::KINDS
            .iter()
            .find(|(name, _)| *name == s)
            .map(|(_, k)| *k)
            .ok_or_else(|| UnknownStrategy(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(s: &mut dyn Strategy, batch: usize) -> Vec<usize> {
        let mut all = Vec::new();
        loop {
            let b = s.ask(batch);
            if b.is_empty() {
                return all;
            }
            assert!(b.len() <= batch);
            s.tell(&b.iter().map(|&i| (i, Some(1.0))).collect::<Vec<_>>());
            all.extend(b);
        }
    }

    #[test]
    fn exhaustive_visits_everything_once_in_order() {
        assert_eq!(
            drain(&mut Exhaustive::new(7), 3),
            (0..7).collect::<Vec<_>>()
        );
        assert!(drain(&mut Exhaustive::new(0), 3).is_empty());
    }

    #[test]
    fn random_is_a_seeded_permutation() {
        let a = drain(&mut RandomSearch::new(50, 9), 4);
        let b = drain(&mut RandomSearch::new(50, 9), 7);
        let c = drain(&mut RandomSearch::new(50, 10), 4);
        assert_eq!(a, b, "batch size does not change the order");
        assert_ne!(a, c);
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
        assert_ne!(a, sorted, "not the identity order");
    }

    #[test]
    fn kinds_parse_and_print_their_names() {
        for name in StrategyKind::NAMES {
            let k: StrategyKind = name.parse().unwrap();
            assert_eq!(k.name(), name);
        }
        assert_eq!("model".parse::<StrategyKind>(), Ok(StrategyKind::DEFAULT));
        for model in ModelKind::ALL {
            for transfer in [true, false] {
                let k = StrategyKind::Model { model, transfer };
                assert_eq!(k.name().parse::<StrategyKind>(), Ok(k), "{}", k.name());
            }
        }
        assert!("bayes"
            .parse::<StrategyKind>()
            .unwrap_err()
            .to_string()
            .contains("exhaustive, random, annealing"));
    }
}
