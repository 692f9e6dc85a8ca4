//! Simulated annealing over measured times.

use kernels::Rng;

use super::{Book, Grid};
use crate::strategy::{SearchContext, Strategy};

/// Simulated annealing: each batch is made of unmeasured neighbours (one knob step, see
/// [`Grid::neighbours`]) of the current point; after each batch the current point moves to
/// the batch's fastest member if it is faster, or with probability `exp(-Δ/T)` if it is slower
/// by `Δ = ln(t_new / t_current)`. The temperature `T` starts at 0.1 and cools by 0.85 per
/// batch. When the current point has no unmeasured neighbour left, the walk restarts from the
/// fastest point that still has some, then from a random point. The first batch (nothing
/// measured yet) is random.
pub struct Annealing {
    grid: Grid,
    book: Book,
    rng: Rng,
    current: Option<(usize, f64)>,
    temperature: f64,
}

impl Annealing {
    /// Initial temperature, in units of ln(time).
    pub const T0: f64 = 0.1;
    /// Cooling factor per batch.
    pub const COOLING: f64 = 0.85;

    /// An annealing search over `ctx`'s candidates, seeded by `ctx.seed`. This workload's
    /// history counts as measured, and the walk starts from its fastest config, if any.
    pub fn new(ctx: &SearchContext) -> Self {
        let book = Book::new(ctx);
        let current = book.ranked().first().copied();
        Annealing {
            grid: Grid::new(&ctx.points),
            book,
            rng: Rng::new(ctx.seed ^ 0x00A2_2EA1),
            current,
            temperature: Self::T0,
        }
    }

    fn open_neighbours(&self, i: usize) -> Vec<usize> {
        self.grid
            .neighbours(i)
            .into_iter()
            .filter(|&j| !self.book.proposed[j])
            .collect()
    }
}

impl Strategy for Annealing {
    fn name(&self) -> &'static str {
        "annealing"
    }

    fn ask(&mut self, n: usize) -> Vec<usize> {
        let mut out: Vec<usize> = Vec::with_capacity(n);
        if let Some((cur, _)) = self.current {
            // Neighbours of the current point first, then of the best points measured.
            let mut sources = vec![cur];
            sources.extend(self.book.ranked().into_iter().map(|(i, _)| i).take(8));
            for s in sources {
                let mut nb = self.open_neighbours(s);
                // Shuffle (Fisher–Yates) so ties between directions are broken by the seed.
                for k in (1..nb.len()).rev() {
                    nb.swap(k, self.rng.below(k as u64 + 1) as usize);
                }
                for j in nb {
                    if out.len() < n && !self.book.proposed[j] {
                        self.book.mark(j);
                        out.push(j);
                    }
                }
                if out.len() >= n {
                    break;
                }
            }
        }
        while out.len() < n {
            // Nothing measured, or the neighbourhood is exhausted: random restarts.
            match self.book.random_open(&mut self.rng) {
                Some(j) => {
                    self.book.mark(j);
                    out.push(j);
                }
                None => break,
            }
        }
        out
    }

    fn tell(&mut self, results: &[(usize, Option<f64>)]) {
        self.book.tell(results);
        let best = results
            .iter()
            .filter_map(|&(i, r)| r.map(|s| (i, s)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((i, s)) = best {
            match self.current {
                None => self.current = Some((i, s)),
                Some((_, cur)) => {
                    let delta = (s / cur).ln();
                    let u = (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                    if delta < 0.0 || u < (-delta / self.temperature.max(1e-9)).exp() {
                        self.current = Some((i, s));
                    }
                }
            }
        }
        self.temperature *= Self::COOLING;
    }
}
