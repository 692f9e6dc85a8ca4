//! The one prepared (packed or quantised) weight of a variant, keyed by the buffer it was
//! made from: a `prepacked` f32 GEMM and the int8 GEMM prepare B once and reuse it while the
//! caller passes the same weight.

use std::sync::{Arc, Mutex};

/// Identity of a weight buffer: address, length and 64 sampled values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WeightKey {
    addr: usize,
    len: usize,
    sample: u64,
}

impl WeightKey {
    fn of(b: &[f32]) -> WeightKey {
        // FNV-1a over the bits of 64 evenly spread values, the last one included.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let n = b.len();
        for i in 0..64usize.min(n) {
            let idx = if n <= 64 { i } else { i * (n - 1) / 63 };
            h = (h ^ u64::from(b[idx].to_bits())).wrapping_mul(0x0000_0100_0000_01b3);
        }
        WeightKey {
            addr: b.as_ptr() as usize,
            len: n,
            sample: h,
        }
    }
}

/// The one prepared form `T` of a weight, keyed by its source buffer.
pub(crate) struct WeightCache<T> {
    slot: Mutex<Option<(WeightKey, Arc<T>)>>,
}

impl<T> Default for WeightCache<T> {
    fn default() -> Self {
        WeightCache {
            slot: Mutex::new(None),
        }
    }
}

impl<T> WeightCache<T> {
    /// The prepared form of `b`: the cached one if `b` is the buffer it was made from, else
    /// `prepare()` (which then replaces it; its error, e.g. out of memory, is returned).
    pub(crate) fn get(
        &self,
        b: &[f32],
        prepare: impl FnOnce() -> crate::Result<T>,
    ) -> crate::Result<Arc<T>> {
        let key = WeightKey::of(b);
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        match &*slot {
            Some((k, p)) if *k == key => Ok(p.clone()),
            _ => {
                // The old form goes first: both at once may not fit.
                *slot = None;
                let p = Arc::new(prepare()?);
                *slot = Some((key, p.clone()));
                Ok(p)
            }
        }
    }
}
