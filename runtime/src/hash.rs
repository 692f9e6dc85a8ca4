//! The runtime's lookup table: every workload packed into a 128-bit [`Key`], hashed by one
//! folded multiply, in an insert-only open-addressing [`Table`] that readers probe without a
//! lock, an allocation or a read-modify-write.
//!
//! Keys come from the program's own shapes, so hash flooding is not a concern here.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use kernels::{Act, DType, Workload};

use crate::Choice;

/// Bits per dimension in a [`Key`]: validated dimensions are at most
/// [`kernels::MAX_DIM`] = 2^20, so 21 bits hold every one of them.
const DIM_BITS: u32 = 21;

/// A workload as one integer: the op (with its activation or causal flag) in the low 8
/// bits, then each dimension in [`DIM_BITS`] bits (the third and fourth in the high half). Injective over every workload whose
/// dimensions are below 2^21, which includes every validated one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Key(u128);

/// The op, its non-shape attributes and its element type as a small number: two workloads
/// may lend each other configs (nearest-shape) only if their classes are equal. The
/// text-form equivalent is the workload key without its dimensions (`gemm:`,
/// `attention::causal:bf16`).
#[inline]
pub(crate) fn class(w: &Workload) -> u8 {
    let dtype = DType::ALL
        .iter()
        .position(|d| *d == w.dtype())
        .expect("every element type is in DType::ALL") as u8;
    op_class(w) | dtype << 3
}

/// [`class`] without the element type: 1 to 7, in three bits.
#[inline]
fn op_class(w: &Workload) -> u8 {
    match *w {
        Workload::Gemm { .. } => 1,
        Workload::GemmBiasAct { act, .. } => match act {
            Act::Identity => 2,
            Act::Relu => 3,
            Act::Gelu => 4,
            Act::GeluErf => 7,
        },
        Workload::Attention { causal: false, .. } => 5,
        Workload::Attention { causal: true, .. } => 6,
    }
}

/// The dimensions of `w` in text-form order, padded with zeros to four.
#[inline]
pub(crate) fn dims4(w: &Workload) -> ([usize; 4], usize) {
    match *w {
        Workload::Gemm { m, n, k, .. } | Workload::GemmBiasAct { m, n, k, .. } => ([m, n, k, 0], 3),
        Workload::Attention { b, h, s, d, .. } => ([b, h, s, d], 4),
    }
}

impl Key {
    /// The key of `w`; `None` for a workload with a dimension of 2^21 or more (only
    /// constructible by bypassing validation): such a workload is resolved on every call.
    #[inline]
    pub(crate) fn of(w: &Workload) -> Option<Key> {
        let ([a, b, c, d], _) = dims4(w);
        if (a | b | c | d) >> DIM_BITS != 0 {
            return None;
        }
        // Low half: class, first and second dims; high half: third and fourth dims, each
        // half starting at its bit 0 so that the hash's multiply spreads every dimension.
        let lo = u64::from(class(w)) | (a as u64) << 8 | (b as u64) << (8 + DIM_BITS);
        let hi = c as u64 | (d as u64) << DIM_BITS;
        Some(Key(u128::from(lo) | u128::from(hi) << 64))
    }

    /// A 64-bit hash: the folded (high ^ low) 128-bit product of the key's two halves, each
    /// offset by a constant, so every key bit reaches the low bits used as the slot index.
    #[inline]
    fn hash(self) -> u64 {
        let lo = (self.0 as u64) ^ 0x243f_6a88_85a3_08d3;
        let hi = ((self.0 >> 64) as u64) ^ 0x1319_8a2e_0370_7344;
        let p = u128::from(lo) * u128::from(hi);
        (p as u64) ^ ((p >> 64) as u64)
    }
}

struct Entry {
    key: Key,
    choice: Arc<Choice>,
}

/// An insert-only hash table of `Key → Arc<Choice>` with a fixed number of slots (at least
/// twice the entries it may hold, linear probing). Readers never wait: a slot is a
/// `OnceLock`, read with one acquire load; a writer claims an empty slot with
/// `OnceLock::set` (writers racing for one slot wait for each other, briefly). Entries live
/// as long as the table.
pub(crate) struct Table {
    slots: Box<[OnceLock<Box<Entry>>]>,
    mask: usize,
    len: AtomicUsize,
}

impl Table {
    /// A table that holds `capacity` entries at a load factor of at most one half.
    pub(crate) fn with_capacity(capacity: usize) -> Table {
        let n = capacity.saturating_mul(2).next_power_of_two().max(16);
        Table {
            slots: (0..n).map(|_| OnceLock::new()).collect(),
            mask: n - 1,
            len: AtomicUsize::new(0),
        }
    }

    /// Entries in the table.
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// The choice stored for `key`.
    #[inline]
    pub(crate) fn get(&self, key: Key) -> Option<&Arc<Choice>> {
        let mut i = key.hash() as usize & self.mask;
        for _ in 0..self.slots.len() {
            let e = self.slots[i].get()?;
            if e.key == key {
                return Some(&e.choice);
            }
            i = (i + 1) & self.mask;
        }
        None
    }

    /// Stores `choice` for `key` unless the key is there already; returns what the table
    /// holds for `key` afterwards (the first writer's choice wins), or `None` if every slot
    /// is taken.
    pub(crate) fn insert(&self, key: Key, choice: Arc<Choice>) -> Option<&Arc<Choice>> {
        let mut i = key.hash() as usize & self.mask;
        let mut entry = Some(Box::new(Entry { key, choice }));
        for _ in 0..self.slots.len() {
            let slot = &self.slots[i];
            if slot.get().is_none() {
                if let Some(e) = entry.take() {
                    match slot.set(e) {
                        Ok(()) => {
                            self.len.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(back) => entry = Some(back), // another writer took the slot
                    }
                }
            }
            match slot.get() {
                Some(e) if e.key == key => return Some(&e.choice),
                _ => i = (i + 1) & self.mask,
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gemm(m: usize, n: usize, k: usize) -> Workload {
        Workload::Gemm {
            m,
            n,
            k,
            dtype: kernels::DType::F32,
        }
    }

    #[test]
    fn keys_are_distinct_and_refuse_unrepresentable_shapes() {
        let mut seen = std::collections::HashSet::new();
        for m in [1, 2, 3, 64, 1 << 20] {
            for n in [1, 7, 768, (1 << 21) - 1] {
                let ws = [
                    gemm(m, n, 768),
                    Workload::GemmBiasAct {
                        m,
                        n,
                        k: 768,
                        act: Act::Identity,
                        dtype: kernels::DType::F32,
                    },
                    Workload::GemmBiasAct {
                        m,
                        n,
                        k: 768,
                        act: Act::Relu,
                        dtype: kernels::DType::F32,
                    },
                    Workload::GemmBiasAct {
                        m,
                        n,
                        k: 768,
                        act: Act::Gelu,
                        dtype: kernels::DType::F32,
                    },
                    Workload::GemmBiasAct {
                        m,
                        n,
                        k: 768,
                        act: Act::GeluErf,
                        dtype: kernels::DType::F32,
                    },
                    Workload::Attention {
                        b: m,
                        h: n,
                        s: 768,
                        d: 64,
                        causal: false,
                        dtype: kernels::DType::F32,
                    },
                    Workload::Attention {
                        b: m,
                        h: n,
                        s: 768,
                        d: 64,
                        causal: true,
                        dtype: kernels::DType::F32,
                    },
                ];
                for w in ws {
                    for dtype in DType::PRECISIONS {
                        let w = w.with_dtype(dtype);
                        assert!(seen.insert(Key::of(&w).unwrap().0), "{w}");
                    }
                }
            }
        }
        assert_eq!(Key::of(&gemm(1 << 21, 1, 1)), None);
        assert_eq!(Key::of(&gemm(1, 1, usize::MAX)), None);
    }

    #[test]
    fn probes_stay_short_for_shapes_that_differ_in_one_dimension() {
        // Slot indices come from the low hash bits: shapes varying only in N or K (or only
        // in M) must still spread over the table.
        for vary in 0..3 {
            let mask = 8191u64;
            let mut used = std::collections::HashSet::new();
            for x in 1..=4096usize {
                let w = match vary {
                    0 => gemm(x, 768, 768),
                    1 => gemm(16, x, 768),
                    _ => gemm(16, 768, x),
                };
                used.insert(Key::of(&w).unwrap().hash() & mask);
            }
            // Random placement of 4096 keys in 8192 slots fills ~3225 distinct slots.
            assert!(
                used.len() > 3000,
                "vary {vary}: {} distinct slots",
                used.len()
            );
        }
    }
}
