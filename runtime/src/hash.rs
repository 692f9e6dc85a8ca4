//! A small, fast, non-cryptographic hasher for the lookup tables (the "Fx" hash of rustc and
//! Firefox): a workload key is three integers, and SipHash would cost more than the probe.
//! Keys come from the program's own shapes, so hash flooding is not a concern here.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Rotate-xor-multiply hasher, one 64-bit word at a time.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FxHasher {
    hash: u64,
}

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(i.into());
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i.into());
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

/// A `HashMap` with [`FxHasher`].
pub(crate) type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn different_shapes_hash_differently() {
        let b = BuildHasherDefault::<FxHasher>::default();
        let h = |w: &kernels::Workload| b.hash_one(w);
        let mut seen = std::collections::HashSet::new();
        for m in 1..40 {
            for n in [1, 64, 768, 3072] {
                assert!(seen.insert(h(&kernels::Workload::gemm(m, n, 768).unwrap())));
            }
        }
    }
}
