//! Evolutionary (genetic) search over knobs.

use kernels::Rng;

use super::{Book, Grid};
use crate::strategy::{SearchContext, Strategy};

/// A steady-state genetic algorithm. The population is the fastest
/// [`POPULATION`](Self::POPULATION) configs measured so far (elitist: a good config never
/// leaves it until better ones arrive). Each child picks two parents by tournament (the
/// faster of 3 random members), takes each knob from one of them (uniform crossover,
/// probability 0.7, same family only), then changes one or two knobs (mutation, probability
/// 0.5, always when the child was already proposed). Children that break the space's rules
/// are never produced (see [`Grid`]). Until the population holds 4 members, and whenever no
/// new child is found in a few tries, candidates are drawn at random.
pub struct Evolutionary {
    grid: Grid,
    book: Book,
    rng: Rng,
}

impl Evolutionary {
    /// Population size.
    pub const POPULATION: usize = 16;
    /// Chance of crossover, in percent.
    pub const CROSSOVER: u64 = 70;
    /// Chance of mutating a fresh child, in percent.
    pub const MUTATION: u64 = 50;

    /// An evolutionary search over `ctx`'s candidates, seeded by `ctx.seed`. This workload's
    /// history counts as measured, so its fastest configs start the population.
    pub fn new(ctx: &SearchContext) -> Self {
        Evolutionary {
            grid: Grid::new(&ctx.points),
            book: Book::new(ctx),
            rng: Rng::new(ctx.seed ^ 0xE701),
        }
    }

    fn tournament(&mut self, pop: &[(usize, f64)]) -> usize {
        (0..3)
            .map(|_| pop[self.rng.below(pop.len() as u64) as usize])
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .expect("three draws")
            .0
    }

    fn child(&mut self, pop: &[(usize, f64)]) -> Option<usize> {
        for _ in 0..20 {
            let a = self.tournament(pop);
            let b = self.tournament(pop);
            let mut c = if self.rng.below(100) < Self::CROSSOVER {
                self.grid.crossover(a, b, &mut self.rng).unwrap_or(a)
            } else {
                a
            };
            if self.book.proposed[c] || self.rng.below(100) < Self::MUTATION {
                c = self.grid.mutate(c, &mut self.rng).unwrap_or(c);
            }
            if !self.book.proposed[c] {
                return Some(c);
            }
        }
        None
    }
}

impl Strategy for Evolutionary {
    fn name(&self) -> &'static str {
        "evolutionary"
    }

    fn ask(&mut self, n: usize) -> Vec<usize> {
        let mut pop = self.book.ranked();
        pop.truncate(Self::POPULATION);
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let pick = if pop.len() >= 4 {
                self.child(&pop)
            } else {
                None
            };
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
