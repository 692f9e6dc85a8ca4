//! Lookup counters by level and by the element type served. Each serving thread owns one shard of every runtime's
//! counters (an id handed out per thread, returned when the thread ends), so a count is a
//! relaxed load and store on a cache line no other thread writes: no read-modify-write,
//! no contended line. Threads beyond [`SHARDS`] at once share one extra shard, counted
//! with a relaxed `fetch_add`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use kernels::DType;

use crate::Level;

/// Counter slots per shard: the four levels, then the three element types calls are served
/// in (f32, bf16, int8).
const SLOTS: usize = 7;

/// The slot of a call served in `dtype` (workloads have no other element type).
fn dtype_slot(dtype: DType) -> usize {
    4 + match dtype {
        DType::Bf16 => 1,
        DType::I8 => 2,
        _ => 0,
    }
}

/// Threads that can own a shard at the same time.
pub(crate) const SHARDS: usize = 64;

/// The shard id of a thread that has not asked for one yet.
pub(crate) const UNASSIGNED: usize = usize::MAX;

/// Shard ids given back by threads that ended.
static FREE: Mutex<Vec<usize>> = Mutex::new(Vec::new());
/// Shard ids never handed out start here.
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A shard id for the calling thread: one no other live thread holds, or [`SHARDS`] (the
/// shared one) when all are taken.
pub(crate) fn acquire_shard() -> usize {
    if let Some(id) = FREE.lock().unwrap_or_else(|p| p.into_inner()).pop() {
        return id;
    }
    let next = NEXT.fetch_add(1, Ordering::Relaxed);
    if next < SHARDS {
        next
    } else {
        NEXT.store(SHARDS, Ordering::Relaxed); // never wraps around
        SHARDS
    }
}

/// Gives a shard id back when its thread ends. The mutex orders the last counts of the
/// ending thread before those of the next owner.
pub(crate) fn release_shard(id: usize) {
    if id < SHARDS {
        FREE.lock().unwrap_or_else(|p| p.into_inner()).push(id);
    }
}

#[repr(align(64))]
#[derive(Default)]
struct Shard([AtomicU64; SLOTS]);

/// Counts of lookups per [`Level`] and per element type served.
pub(crate) struct Counters {
    /// `SHARDS` owned shards, then the shared one.
    shards: Box<[Shard]>,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            shards: (0..=SHARDS).map(|_| Shard::default()).collect(),
        }
    }
}

impl Counters {
    /// Counts one lookup answered at `level`, served in `dtype`, by the thread holding
    /// shard `shard` (from [`acquire_shard`]).
    #[inline]
    pub(crate) fn count(&self, shard: usize, level: Level, dtype: DType) {
        for slot in [level as usize, dtype_slot(dtype)] {
            if shard < SHARDS {
                // Only the thread holding `shard` writes here: load + store loses nothing.
                let a = &self.shards[shard].0[slot];
                a.store(a.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
            } else {
                self.shards[SHARDS].0[slot].fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub(crate) fn snapshot(&self) -> LookupCounts {
        let sum = |slot: usize| {
            self.shards
                .iter()
                .map(|s| s.0[slot].load(Ordering::Relaxed))
                .sum()
        };
        LookupCounts {
            levels: LevelCounts {
                exact: sum(Level::Exact as usize),
                same_arch: sum(Level::SameArch as usize),
                nearest_shape: sum(Level::NearestShape as usize),
                default: sum(Level::Default as usize),
            },
            f32: sum(dtype_slot(DType::F32)),
            bf16: sum(dtype_slot(DType::Bf16)),
            int8: sum(dtype_slot(DType::I8)),
        }
    }
}

/// Calls counted by the level that answered them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LevelCounts {
    /// Calls served by [`Level::Exact`].
    pub exact: u64,
    /// Calls served by [`Level::SameArch`].
    pub same_arch: u64,
    /// Calls served by [`Level::NearestShape`].
    pub nearest_shape: u64,
    /// Calls served by [`Level::Default`].
    pub default: u64,
}

impl LevelCounts {
    /// Counts one call answered at `level`.
    pub fn add(&mut self, level: Level) {
        *self.slot(level) += 1;
    }

    /// Calls answered at `level`.
    pub fn get(&self, level: Level) -> u64 {
        let mut c = *self;
        *c.slot(level)
    }

    fn slot(&mut self, level: Level) -> &mut u64 {
        match level {
            Level::Exact => &mut self.exact,
            Level::SameArch => &mut self.same_arch,
            Level::NearestShape => &mut self.nearest_shape,
            Level::Default => &mut self.default,
        }
    }

    /// All calls.
    pub fn total(&self) -> u64 {
        Level::ALL.iter().map(|&l| self.get(l)).sum()
    }

    /// Calls not answered by an exact record.
    pub fn fallbacks(&self) -> u64 {
        self.total() - self.exact
    }
}

impl std::ops::AddAssign for LevelCounts {
    fn add_assign(&mut self, o: LevelCounts) {
        for l in Level::ALL {
            *self.slot(l) += o.get(l);
        }
    }
}

/// Lookups served so far, by level and by the element type they were served in (see
/// [`crate::Runtime::lookups`]). Each lookup counts once in each breakdown: an f32 call the
/// precision policy serves in int8 counts under `int8`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LookupCounts {
    /// By the level that answered.
    pub levels: LevelCounts,
    /// Served in f32.
    pub f32: u64,
    /// Served in bf16.
    pub bf16: u64,
    /// Served in int8.
    pub int8: u64,
}

impl LookupCounts {
    /// All lookups.
    pub fn total(&self) -> u64 {
        self.levels.total()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_from_many_threads_add_up() {
        let c = Counters::default();
        // More threads than shards, some sharing the extra shard; ids are reused as
        // threads end.
        for _ in 0..2 {
            std::thread::scope(|s| {
                for t in 0..(SHARDS + 8) {
                    let c = &c;
                    s.spawn(move || {
                        let id = acquire_shard();
                        for _ in 0..1000 {
                            c.count(id, Level::ALL[t % 4], [DType::F32, DType::I8][t % 2]);
                        }
                        release_shard(id);
                    });
                }
            });
        }
        let n = c.snapshot();
        assert_eq!(n.total(), 2 * (SHARDS as u64 + 8) * 1000);
        assert_eq!(n.levels.exact, 2 * 18 * 1000);
        assert_eq!((n.f32, n.bf16, n.int8), (2 * 36 * 1000, 0, 2 * 36 * 1000));
    }
}
