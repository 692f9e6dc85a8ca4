//! Packing A and B into micro-panels, and the reusable 64-byte-aligned buffers they go in.
//!
//! A block `mc × kc` becomes `⌈mc/MR⌉` micro-panels of `kc × MR` values (column `p` of the
//! panel's MR rows stored together); a B block `kc × nc` becomes `⌈nc/NR⌉` micro-panels of
//! `kc × NR` values (row `p`'s NR columns together). Edges are zero-padded so the
//! micro-kernels always run full tiles.

use std::cell::Cell;
use std::thread::LocalKey;

/// One cache line of `f32`s; the unit of [`AlignedBuf`]'s allocation.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// A growable `f32` buffer whose start is 64-byte aligned (so packed B rows never straddle
/// cache lines).
#[derive(Default)]
pub struct AlignedBuf(Vec<Line>);

impl AlignedBuf {
    /// The first `len` values (contents unspecified), growing the buffer if needed.
    pub fn slice(&mut self, len: usize) -> &mut [f32] {
        let lines = len.div_ceil(16);
        if self.0.len() < lines {
            self.0.resize(lines, Line([0.0; 16]));
        }
        self.first(len)
    }

    /// [`AlignedBuf::slice`], or [`crate::Error::OutOfMemory`] naming `what` when the buffer
    /// cannot grow to `len` values.
    pub fn try_slice(&mut self, len: usize, what: &str) -> crate::Result<&mut [f32]> {
        let lines = len.div_ceil(16);
        if self.0.len() < lines {
            let more = lines - self.0.len();
            crate::alloc::reserve(&mut self.0, more, what)?;
            self.0.resize(lines, Line([0.0; 16]));
        }
        Ok(self.first(len))
    }

    /// The first `len` values of a buffer of at least that many.
    fn first(&mut self, len: usize) -> &mut [f32] {
        debug_assert!(len <= self.0.len() * 16);
        // SAFETY: `Line` is `repr(C)` around `[f32; 16]` with no padding (size 64 = 16·4), so
        // `lines` lines are `16·lines ≥ len` initialised, contiguous `f32`s, exclusively
        // borrowed through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast::<f32>(), len) }
    }

    /// The first `len` values, read-only. Panics if the buffer holds fewer.
    pub fn as_slice(&self, len: usize) -> &[f32] {
        assert!(
            len <= self.0.len() * 16,
            "aligned buffer shorter than {len}"
        );
        // SAFETY: as in `slice`: the lines are `16·lines ≥ len` initialised, contiguous
        // `f32`s (asserted above), shared-borrowed through `&self`.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast::<f32>(), len) }
    }
}

thread_local! {
    static POOL_A: Cell<AlignedBuf> = Cell::new(AlignedBuf::default());
    static POOL_B: Cell<AlignedBuf> = Cell::new(AlignedBuf::default());
    static POOL_KEYS: Cell<AlignedBuf> = Cell::new(AlignedBuf::default());
    static POOL_VALUES: Cell<AlignedBuf> = Cell::new(AlignedBuf::default());
    static POOL_WORK: Cell<AlignedBuf> = Cell::new(AlignedBuf::default());
}

/// Which per-thread buffer to borrow.
#[derive(Clone, Copy)]
pub enum Pool {
    /// Packed A blocks (GEMM).
    A,
    /// Packed B blocks (GEMM).
    B,
    /// Packed keys (attention).
    Keys,
    /// Padded values (attention).
    Values,
    /// Per-task working memory (attention).
    Work,
}

/// Runs `f` with this thread's reusable buffer for `which` (see `with_taken`).
pub fn with_buffer<R>(which: Pool, f: impl FnOnce(&mut AlignedBuf) -> R) -> R {
    let slot = match which {
        Pool::A => &POOL_A,
        Pool::B => &POOL_B,
        Pool::Keys => &POOL_KEYS,
        Pool::Values => &POOL_VALUES,
        Pool::Work => &POOL_WORK,
    };
    with_taken(slot, f)
}

/// Runs `f` with the value of this thread's `slot`, taken out of it for the duration and put
/// back after: a re-entrant call (a rayon worker running another call's task while it
/// waits inside `f`) gets a fresh value instead of a borrow conflict.
pub(crate) fn with_taken<T: Default, R>(
    slot: &'static LocalKey<Cell<T>>,
    f: impl FnOnce(&mut T) -> R,
) -> R {
    let mut value = slot.take();
    let r = f(&mut value);
    slot.set(value);
    r
}

/// Packs rows `i0..i0+mc` × columns `p0..p0+kc` of row-major `a` (row stride `lda`) into
/// MR-row micro-panels in `out` (`⌈mc/MR⌉·MR·kc` values), zero-padding missing rows.
#[allow(clippy::too_many_arguments)]
pub fn pack_a(
    a: &[f32],
    lda: usize,
    (i0, mc): (usize, usize),
    (p0, kc): (usize, usize),
    mr: usize,
    out: &mut [f32],
) {
    for (panel, dst) in out
        .chunks_exact_mut(mr * kc)
        .take(mc.div_ceil(mr))
        .enumerate()
    {
        let r0 = panel * mr;
        let rows = mr.min(mc - r0);
        match (mr, rows) {
            (4, 4) => pack_a_full::<4>(a, lda, i0 + r0, p0, kc, dst),
            (5, 5) => pack_a_full::<5>(a, lda, i0 + r0, p0, kc, dst),
            (6, 6) => pack_a_full::<6>(a, lda, i0 + r0, p0, kc, dst),
            (8, 8) => pack_a_full::<8>(a, lda, i0 + r0, p0, kc, dst),
            (12, 12) => pack_a_full::<12>(a, lda, i0 + r0, p0, kc, dst),
            (14, 14) => pack_a_full::<14>(a, lda, i0 + r0, p0, kc, dst),
            (16, 16) => pack_a_full::<16>(a, lda, i0 + r0, p0, kc, dst),
            (32, 32) => pack_a_full::<32>(a, lda, i0 + r0, p0, kc, dst),
            _ => {
                for r in 0..mr {
                    if r < rows {
                        let row = &a[(i0 + r0 + r) * lda + p0..][..kc];
                        for (d, x) in dst.chunks_exact_mut(mr).zip(row) {
                            d[r] = *x;
                        }
                    } else {
                        dst.chunks_exact_mut(mr).for_each(|d| d[r] = 0.0);
                    }
                }
            }
        }
    }
}

/// One full MR-row panel; MR a constant so the inner loop is a fixed-size transpose.
#[inline(always)]
fn pack_a_full<const MR: usize>(
    a: &[f32],
    lda: usize,
    i: usize,
    p0: usize,
    kc: usize,
    dst: &mut [f32],
) {
    let rows: [&[f32]; MR] = std::array::from_fn(|r| &a[(i + r) * lda + p0..][..kc]);
    for (p, d) in dst.chunks_exact_mut(MR).take(kc).enumerate() {
        let d: &mut [f32; MR] = d.try_into().expect("chunk of MR");
        for r in 0..MR {
            d[r] = rows[r][p];
        }
    }
}

/// Packs rows `p0..p0+kc` × columns `j0..j0+nc` of row-major `b` (row stride `ldb`) into
/// NR-column micro-panels in `out` (`⌈nc/NR⌉·NR·kc` values), zero-padding missing columns.
/// `out` may cover only some of the block's panels: it gets panels `first_panel..` (as many
/// as fit), so threads can pack disjoint parts of one shared block.
///
/// B is read row by row (sequentially, which the hardware prefetchers follow) and each row
/// is scattered over the panels.
#[allow(clippy::too_many_arguments)]
pub fn pack_b(
    b: &[f32],
    ldb: usize,
    (p0, kc): (usize, usize),
    (j0, nc): (usize, usize),
    nr: usize,
    first_panel: usize,
    out: &mut [f32],
) {
    let c0 = first_panel * nr;
    if c0 >= nc {
        return;
    }
    let panels = (out.len() / (nr * kc)).min((nc - c0).div_ceil(nr));
    let cols = (panels * nr).min(nc - c0);
    let full = cols / nr;
    let out = &mut out[..panels * nr * kc];
    match nr {
        8 => pack_b_rows::<8>(b, ldb, p0, kc, j0 + c0, full, out),
        16 => pack_b_rows::<16>(b, ldb, p0, kc, j0 + c0, full, out),
        24 => pack_b_rows::<24>(b, ldb, p0, kc, j0 + c0, full, out),
        32 => pack_b_rows::<32>(b, ldb, p0, kc, j0 + c0, full, out),
        48 => pack_b_rows::<48>(b, ldb, p0, kc, j0 + c0, full, out),
        64 => pack_b_rows::<64>(b, ldb, p0, kc, j0 + c0, full, out),
        _ => {
            for q in 0..full {
                let panel = &mut out[q * nr * kc..(q + 1) * nr * kc];
                for (p, d) in panel.chunks_exact_mut(nr).enumerate() {
                    d.copy_from_slice(&b[(p0 + p) * ldb + j0 + c0 + q * nr..][..nr]);
                }
            }
        }
    }
    let rem = cols - full * nr;
    if rem > 0 {
        let panel = &mut out[full * nr * kc..(full + 1) * nr * kc];
        for (p, d) in panel.chunks_exact_mut(nr).enumerate() {
            d[..rem].copy_from_slice(&b[(p0 + p) * ldb + j0 + c0 + full * nr..][..rem]);
            d[rem..].fill(0.0);
        }
    }
}

/// The `full` whole NR-column panels starting at column `j`, row by row.
#[inline(always)]
fn pack_b_rows<const NR: usize>(
    b: &[f32],
    ldb: usize,
    p0: usize,
    kc: usize,
    j: usize,
    full: usize,
    out: &mut [f32],
) {
    for p in 0..kc {
        let row = &b[(p0 + p) * ldb + j..][..full * NR];
        for (q, s) in row.chunks_exact(NR).enumerate() {
            let s: &[f32; NR] = s.try_into().expect("NR values");
            let d: &mut [f32; NR] = (&mut out[(q * kc + p) * NR..][..NR])
                .try_into()
                .expect("NR values");
            *d = *s;
        }
    }
}
