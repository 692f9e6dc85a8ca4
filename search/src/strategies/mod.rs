//! Adaptive strategies: simulated annealing, evolutionary search and cost-model-guided
//! search, all ask/tell over the tuner's candidate list.
//!
//! **Respecting the space's rules.** The candidate list is exactly the valid configs of each
//! family's [`Space`](kernels::Space) (`Space::iter_valid`), so a config is valid if and only
//! if it is in the list. Mutation and crossover work on knob coordinates ([`Grid`]) and keep a
//! child only if it is in the list: a move that breaks a rule (`mc` beyond M, `par=none` with
//! two threads, ...) is never proposed. The same holds in offline replay, where the list comes
//! from a recorded space file and no kernel code runs.

mod annealing;
mod evolutionary;
mod model;
mod transfer;

pub use annealing::Annealing;
pub use evolutionary::Evolutionary;
pub use model::{ModelGuided, ModelOptions};
pub use transfer::Transfer;

use std::collections::HashMap;

use kernels::{Rng, Value};

use crate::strategy::{Point, SearchContext};

/// One family's knobs: name and the sorted values its candidates use (`None`: knob absent).
#[derive(Debug)]
struct Family {
    knobs: Vec<(String, Vec<Option<Value>>)>,
    /// Candidate indices of this family.
    members: Vec<usize>,
}

/// The candidate list as coordinates on each family's knob grid, for neighbourhood moves,
/// mutation and crossover that only ever land on valid candidates.
#[derive(Debug)]
pub struct Grid {
    families: Vec<Family>,
    family_of: Vec<usize>,
    coords: Vec<Vec<u16>>,
    lookup: HashMap<(usize, Vec<u16>), usize>,
}

/// Each kernel name's family as an index (in order of first appearance), and the number of
/// families.
fn family_indices<'a>(kernels: impl IntoIterator<Item = &'a str>) -> (Vec<usize>, usize) {
    let mut names: Vec<&str> = Vec::new();
    let family = kernels
        .into_iter()
        .map(|k| match names.iter().position(|n| *n == k) {
            Some(f) => f,
            None => {
                names.push(k);
                names.len() - 1
            }
        })
        .collect();
    (family, names.len())
}

impl Grid {
    /// The grid of `points`.
    pub fn new(points: &[Point]) -> Grid {
        let (family_of, count) = family_indices(points.iter().map(|p| p.kernel.as_str()));
        let mut families: Vec<Family> = (0..count)
            .map(|_| Family {
                knobs: Vec::new(),
                members: Vec::new(),
            })
            .collect();
        for (i, &f) in family_of.iter().enumerate() {
            families[f].members.push(i);
        }
        for fam in &mut families {
            let mut knob_names: Vec<&String> = fam
                .members
                .iter()
                .flat_map(|&i| points[i].config.0.keys())
                .collect();
            knob_names.sort();
            knob_names.dedup();
            fam.knobs = knob_names
                .into_iter()
                .map(|k| {
                    let mut vals: Vec<Option<Value>> = fam
                        .members
                        .iter()
                        .map(|&i| points[i].config.get(k).cloned())
                        .collect();
                    vals.sort();
                    vals.dedup();
                    (k.clone(), vals)
                })
                .collect();
        }
        let coords: Vec<Vec<u16>> = points
            .iter()
            .enumerate()
            .map(|(i, p)| {
                families[family_of[i]]
                    .knobs
                    .iter()
                    .map(|(k, vals)| {
                        let v = p.config.get(k).cloned();
                        vals.binary_search(&v).expect("value collected above") as u16
                    })
                    .collect()
            })
            .collect();
        let lookup = coords
            .iter()
            .enumerate()
            .map(|(i, c)| ((family_of[i], c.clone()), i))
            .collect();
        Grid {
            families,
            family_of,
            coords,
            lookup,
        }
    }

    /// Number of candidates.
    pub fn len(&self) -> usize {
        self.coords.len()
    }

    /// Whether there are no candidates.
    pub fn is_empty(&self) -> bool {
        self.coords.is_empty()
    }

    fn find(&self, family: usize, coords: &[u16]) -> Option<usize> {
        self.lookup.get(&(family, coords.to_vec())).copied()
    }

    /// Whether a knob's values are numbers (ordered: moves go to adjacent values).
    fn numeric(vals: &[Option<Value>]) -> bool {
        vals.iter().all(|v| matches!(v, Some(Value::Int(_))))
    }

    /// Valid candidates one knob step away from `i`: the next smaller or larger value of a
    /// numeric knob, any other value of a named knob. In a fixed order.
    pub fn neighbours(&self, i: usize) -> Vec<usize> {
        let f = self.family_of[i];
        let mut out = Vec::new();
        let mut c = self.coords[i].clone();
        for (j, (_, vals)) in self.families[f].knobs.iter().enumerate() {
            let here = c[j];
            let options: Vec<u16> = if Self::numeric(vals) {
                [here.checked_sub(1), Some(here + 1)]
                    .into_iter()
                    .flatten()
                    .filter(|&v| (v as usize) < vals.len())
                    .collect()
            } else {
                (0..vals.len() as u16).filter(|&v| v != here).collect()
            };
            for v in options {
                c[j] = v;
                out.extend(self.find(f, &c));
            }
            c[j] = here;
        }
        out
    }

    /// A valid candidate that differs from `i` in one or two knobs (numeric knobs prefer an
    /// adjacent value), or `None` if none was found in a few tries.
    pub fn mutate(&self, i: usize, rng: &mut Rng) -> Option<usize> {
        let f = self.family_of[i];
        let knobs = &self.families[f].knobs;
        let movable: Vec<usize> = (0..knobs.len()).filter(|&j| knobs[j].1.len() > 1).collect();
        if movable.is_empty() {
            return None;
        }
        for _ in 0..32 {
            let mut c = self.coords[i].clone();
            let changes = 1 + (rng.below(4) == 0) as usize;
            for _ in 0..changes {
                let j = movable[rng.below(movable.len() as u64) as usize];
                let n = knobs[j].1.len() as u64;
                let here = c[j] as u64;
                let new = if Self::numeric(&knobs[j].1) && rng.below(2) == 0 {
                    if here == 0 || (here + 1 < n && rng.below(2) == 0) {
                        here + 1
                    } else {
                        here - 1
                    }
                } else {
                    (here + 1 + rng.below(n - 1)) % n
                };
                c[j] = new as u16;
            }
            if let Some(k) = self.find(f, &c).filter(|&k| k != i) {
                return Some(k);
            }
        }
        None
    }

    /// A valid child taking each knob from `a` or `b` (uniform crossover), or `None` when the
    /// parents are of different families or no valid child was found in a few tries.
    pub fn crossover(&self, a: usize, b: usize, rng: &mut Rng) -> Option<usize> {
        let f = self.family_of[a];
        if self.family_of[b] != f {
            return None;
        }
        let (ca, cb) = (&self.coords[a], &self.coords[b]);
        for _ in 0..16 {
            let c: Vec<u16> = ca
                .iter()
                .zip(cb)
                .map(|(&x, &y)| if rng.below(2) == 0 { x } else { y })
                .collect();
            if let Some(k) = self.find(f, &c) {
                return Some(k);
            }
        }
        None
    }
}

/// What adaptive strategies share: the candidates' outcomes so far and the proposals made.
#[derive(Debug)]
struct Book {
    /// Per candidate: not yet known (`None`), failed (`Some(None)`), or seconds.
    result: Vec<Option<Option<f64>>>,
    proposed: Vec<bool>,
    /// Unproposed candidates, for uniform random picks (swap-remove; `slot` finds them).
    open: Vec<usize>,
    slot: Vec<usize>,
}

impl Book {
    /// A book over `ctx`'s candidates, with the history of this workload counted as measured.
    fn new(ctx: &SearchContext) -> Book {
        let n = ctx.points.len();
        let mut b = Book {
            result: vec![None; n],
            proposed: vec![false; n],
            open: (0..n).collect(),
            slot: (0..n).collect(),
        };
        for (i, s) in ctx.own_results() {
            b.mark(i);
            b.result[i] = Some(Some(s));
        }
        b
    }

    /// Marks `i` as proposed.
    fn mark(&mut self, i: usize) {
        if self.proposed[i] {
            return;
        }
        self.proposed[i] = true;
        let s = self.slot[i];
        let last = *self.open.last().expect("i is open");
        self.open.swap_remove(s);
        if last != i {
            self.slot[last] = s;
        }
    }

    /// A uniformly random unproposed candidate.
    fn random_open(&self, rng: &mut Rng) -> Option<usize> {
        (!self.open.is_empty()).then(|| self.open[rng.below(self.open.len() as u64) as usize])
    }

    /// Records results. A failure never overwrites a known time (the tuner reports configs it
    /// skipped as already tried with `None`).
    fn tell(&mut self, results: &[(usize, Option<f64>)]) {
        for &(i, r) in results {
            if i >= self.result.len() {
                continue;
            }
            self.mark(i);
            match (self.result[i], r) {
                (Some(Some(_)), None) => {}
                (Some(Some(old)), Some(new)) => self.result[i] = Some(Some(old.min(new))),
                _ => self.result[i] = Some(r),
            }
        }
    }

    /// Measured (ok) candidates, fastest first (ties by index).
    fn ranked(&self) -> Vec<(usize, f64)> {
        let mut v: Vec<(usize, f64)> = self
            .result
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.flatten().map(|s| (i, s)))
            .collect();
        v.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels::Config;

    fn points() -> Vec<Point> {
        // a ∈ {1,2,3}, b ∈ {x,y}; rule: not (a = 3 and b = y).
        let mut v = Vec::new();
        for a in [1usize, 2, 3] {
            for b in ["x", "y"] {
                if !(a == 3 && b == "y") {
                    v.push(Point {
                        kernel: "k".into(),
                        config: Config::from_pairs([("a", Value::from(a)), ("b", b.into())]),
                    });
                }
            }
        }
        v.push(Point {
            kernel: "other".into(),
            config: Config::from_pairs([("z", 1usize)]),
        });
        v
    }

    #[test]
    fn neighbours_step_one_knob_and_stay_valid() {
        let p = points();
        let g = Grid::new(&p);
        let name = |i: usize| p[i].config.to_json();
        // (a=2, b=x) is index 2: neighbours a=1, a=3 (b=x) and b=y.
        let mut n: Vec<String> = g.neighbours(2).into_iter().map(name).collect();
        n.sort();
        assert_eq!(
            n,
            [
                r#"{"a":1,"b":"x"}"#,
                r#"{"a":2,"b":"y"}"#,
                r#"{"a":3,"b":"x"}"#
            ]
        );
        // (a=2, b=y): a=3,b=y breaks the rule, so it is not a neighbour.
        assert!(g
            .neighbours(3)
            .iter()
            .all(|&i| name(i) != r#"{"a":3,"b":"y"}"#));
        assert!(
            g.neighbours(5).is_empty(),
            "the other family has one config"
        );
    }

    #[test]
    fn mutation_and_crossover_land_on_valid_candidates() {
        let p = points();
        let g = Grid::new(&p);
        let mut rng = Rng::new(1);
        for _ in 0..200 {
            let i = rng.below(5) as usize;
            let m = g.mutate(i, &mut rng).unwrap();
            assert!(m != i && m < 5, "same family, different config");
            let j = rng.below(5) as usize;
            let c = g.crossover(i, j, &mut rng).unwrap();
            assert!(c < 5);
        }
        assert_eq!(g.crossover(0, 5, &mut rng), None);
        assert_eq!(g.mutate(5, &mut rng), None);
    }

    #[test]
    fn book_tracks_open_candidates() {
        let ctx = SearchContext::new(
            "gemm:8x8x8".parse().unwrap(),
            kernels::HardwareFingerprint::current().clone(),
            points(),
            1,
        );
        let mut b = Book::new(&ctx);
        b.tell(&[(2, Some(2.0)), (4, None), (0, Some(1.0))]);
        b.tell(&[(2, None)]);
        assert_eq!(b.ranked(), vec![(0, 1.0), (2, 2.0)]);
        let mut rng = Rng::new(3);
        for _ in 0..50 {
            let i = b.random_open(&mut rng).unwrap();
            assert!(![0, 2, 4].contains(&i));
        }
        for i in [1, 3, 5] {
            b.mark(i);
        }
        assert_eq!(b.random_open(&mut rng), None);
    }
}
