//! Ask/tell search strategies over a list of candidates.
//!
//! A strategy proposes candidate indices and is told how they did; it never runs anything
//! itself. That keeps batching, parallel preparation, resumption from the database and offline
//! replay in the [`Tuner`](crate::Tuner), and lets a cost model plug in as just another strategy.

use std::str::FromStr;

use kernels::Rng;

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

/// Tries every candidate, in the order the spaces list them.
#[derive(Debug)]
pub struct Exhaustive {
    next: usize,
    len: usize,
}

impl Exhaustive {
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
    Exhaustive,
    Random,
}

impl StrategyKind {
    pub const NAMES: [&'static str; 2] = ["exhaustive", "random"];

    /// A fresh strategy of this kind over `len` candidates.
    pub fn build(self, len: usize, seed: u64) -> Box<dyn Strategy> {
        match self {
            StrategyKind::Exhaustive => Box::new(Exhaustive::new(len)),
            StrategyKind::Random => Box::new(RandomSearch::new(len, seed)),
        }
    }
}

impl FromStr for StrategyKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "exhaustive" => Ok(StrategyKind::Exhaustive),
            "random" => Ok(StrategyKind::Random),
            other => Err(format!(
                "unknown strategy '{other}' (known: {})",
                Self::NAMES.join(", ")
            )),
        }
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
    fn kinds_parse() {
        assert_eq!("random".parse::<StrategyKind>(), Ok(StrategyKind::Random));
        assert!("annealing"
            .parse::<StrategyKind>()
            .unwrap_err()
            .contains("exhaustive, random"));
    }
}
