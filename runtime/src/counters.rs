//! Lookup counters by level: sharded per thread so that serving threads do not fight over
//! one cache line (a relaxed add on a line this thread mostly owns).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::Level;

const SHARDS: usize = 16;

#[repr(align(64))]
#[derive(Default)]
struct Shard([AtomicU64; 4]);

/// Counts of lookups per [`Level`].
pub(crate) struct Counters {
    shards: Box<[Shard]>,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
        }
    }
}

fn shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static IDX: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    IDX.with(|i| {
        if i.get() == usize::MAX {
            i.set(NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS);
        }
        i.get()
    })
}

impl Counters {
    #[inline]
    pub(crate) fn count(&self, level: Level) {
        self.shards[shard()].0[level as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> LookupCounts {
        let sum = |l: Level| {
            self.shards
                .iter()
                .map(|s| s.0[l as usize].load(Ordering::Relaxed))
                .sum()
        };
        LookupCounts {
            exact: sum(Level::Exact),
            same_arch: sum(Level::SameArch),
            nearest_shape: sum(Level::NearestShape),
            default: sum(Level::Default),
        }
    }
}

/// Lookups served so far, by level (see [`crate::Runtime::lookups`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LookupCounts {
    pub exact: u64,
    pub same_arch: u64,
    pub nearest_shape: u64,
    pub default: u64,
}

impl LookupCounts {
    /// All lookups.
    pub fn total(&self) -> u64 {
        self.exact + self.same_arch + self.nearest_shape + self.default
    }

    /// Lookups not answered by an exact record.
    pub fn fallbacks(&self) -> u64 {
        self.total() - self.exact
    }
}
