//! bf16 conversion and the packings of the bf16 GEMM: B converted to bf16 once per weight
//! ([`Bf16B`], panels of NR columns in a kernel's [`Layout`]), and for the widening kernels
//! A rounded to bf16 *values* kept in f32 as it is packed per block ([`pack_a_rounded`]);
//! the pair kernels' A packing is [`super::layout::pack_a_pair_rows`].
//!
//! Why A stays f32 for the widening kernels: on AVX2 there is no bf16 arithmetic, so every bf16 value is widened to
//! f32 in registers before its FMA. Storing packed A as bf16 would cost a conversion going in
//! and a widening coming out for data that is re-read from L1/L2 by every column panel, and
//! would save nothing that matters: A's bytes are `M·K`, read from cache, while B's are
//! `K·N`, streamed from L3 or memory once per row block. Rounding A to bf16 values as it is
//! packed gives exactly the numerics of bf16 operands (a product of two bf16 values is exact
//! in f32, so an f32 FMA of them equals a bf16 dot-product step with f32 accumulation) at
//! the cost of a few integer operations per element of A; only B, the weight, is stored as
//! bf16, which halves the bytes that bound skinny and GEMV-like shapes.
//!
//! ```
//! use kernels::cpu::bgemm::convert::{from_bf16, round_bf16, to_bf16};
//!
//! assert_eq!(to_bf16(1.0), 0x3f80);
//! assert_eq!(from_bf16(to_bf16(3.0)), 3.0);
//! // 1 + 2⁻⁸ lies halfway between 1 and 1 + 2⁻⁷: the tie goes to the even mantissa, 1.
//! assert_eq!(round_bf16(1.0 + 1.0 / 256.0), 1.0);
//! assert!(round_bf16(f32::NAN).is_nan());
//! ```

use super::layout::{pack_pair_panel, Layout};
use crate::cpu::gemm::pack::pack_a;

/// Bits of an f32 whose exponent field is all ones (an infinity; above it, NaNs).
const INF_BITS: u32 = 0x7F80_0000;

/// The quiet bit of an f32 NaN (the top mantissa bit, which survives into bf16).
const QUIET_BIT: u32 = 0x0040_0000;

/// The f32 bits of `bits` rounded to the nearest bf16 value (ties to even), in the top 16
/// bits, low 16 bits zero. A NaN stays a NaN (made quiet, sign and top payload kept); an
/// overflow past the largest bf16 becomes ±∞; subnormals round like every other value (bf16
/// has f32's exponent range).
#[inline(always)]
fn round_bits(bits: u32) -> u32 {
    let nan = bits & 0x7FFF_FFFF > INF_BITS;
    // Adding 0x7FFF rounds a low half above 0x8000 up, below it down; the lowest kept bit
    // adds the last unit at exactly 0x8000 when it is odd (ties to even). No overflow: the
    // largest non-NaN pattern, 0xFF80_0000 (−∞), plus 0x8000 stays below 2³².
    let rounded = bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) & 0xFFFF_0000;
    if nan {
        (bits | QUIET_BIT) & 0xFFFF_0000
    } else {
        rounded
    }
}

/// The bf16 bit pattern nearest to `x`: round to nearest, ties to even; NaN stays NaN.
#[inline(always)]
pub fn to_bf16(x: f32) -> u16 {
    (round_bits(x.to_bits()) >> 16) as u16
}

/// The f32 value of the bf16 bit pattern `h` (exact).
#[inline(always)]
pub fn from_bf16(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// `src` rounded to bf16 into `dst` (as many as the shorter has), in a loop that vectorises.
#[inline(always)]
pub fn to_bf16_slice(src: &[f32], dst: &mut [u16]) {
    for (o, &x) in dst.iter_mut().zip(src) {
        *o = to_bf16(x);
    }
}

/// [`to_bf16_slice`] compiled for AVX-512F and AVX512BW where the CPU runs them and
/// `AUTOKERNEL_ISA` allows (16 values a vector; the generic build converts 4): for packers
/// that convert whole rows.
pub fn to_bf16_wide(src: &[f32], dst: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::Isa::Avx512.available() {
        // SAFETY: the CPU has AVX-512F and AVX512BW (`Isa::Avx512` implies both).
        return unsafe { to_bf16_avx512(src, dst) };
    }
    to_bf16_slice(src, dst)
}

/// [`to_bf16_slice`] compiled for AVX-512F and AVX512BW.
///
/// # Safety
/// The CPU has AVX-512F and AVX512BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn to_bf16_avx512(src: &[f32], dst: &mut [u16]) {
    to_bf16_slice(src, dst)
}

/// `x` rounded to the nearest bf16 value, kept as an f32: `from_bf16(to_bf16(x))`.
#[inline(always)]
pub fn round_bf16(x: f32) -> f32 {
    f32::from_bits(round_bits(x.to_bits()))
}

/// Columns per interleaved group of a B panel row for 8-lane kernels: two vectors of 8 f32
/// lanes.
pub const GROUP: usize = 16;

/// Where column `c` (`< NR`) of one panel row sits among its bf16 values for 8-lane
/// kernels: [`slot_in`] with groups of [`GROUP`].
#[inline(always)]
pub fn slot(c: usize) -> usize {
    slot_in(c, GROUP)
}

/// Where column `c` of one panel row sits in the widening layout of `group`-column groups
/// (`group` even): in each group, 32-bit word `j` holds column `j` in its low half and column
/// `j + group/2` in its high half, so one load of the group widens to both vectors of
/// `group/2` lanes with a shift and a mask.
#[inline(always)]
pub fn slot_in(c: usize, group: usize) -> usize {
    let (g, l, half) = (c / group, c % group, group / 2);
    g * group + (l % half) * 2 + l / half
}

/// A `K×N` weight converted to bf16 once (round to nearest even) and packed in panels of
/// `nr` columns: panel `q` holds columns `q·nr..`, its rows of `nr` values one after the
/// other (columns past N are zero), in the order of its [`Layout`]: `K` rows, each in the
/// interleaved order of [`slot_in`], for the widening layouts; `⌈K/2⌉` rows of `nr` depth
/// pairs, the last one padded with zeros for an odd K, for [`Layout::Pairs`]. A block of
/// depths `p0..p0+kc` (`p0` a whole number of steps) is the contiguous range
/// `p0·nr..(p0 + padded(kc))·nr` of a panel. The data starts 64-byte aligned.
pub struct Bf16B {
    /// Depth (rows of B).
    pub(crate) k: usize,
    /// Columns of B.
    pub(crate) n: usize,
    /// Panel width, a multiple of the layout's group.
    pub(crate) nr: usize,
    /// How each panel holds its values.
    pub(crate) layout: Layout,
    data: Vec<u16>,
    /// Index of the first value in `data` (where it is 64-byte aligned).
    start: usize,
}

impl std::fmt::Debug for Bf16B {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bf16B")
            .field("k", &self.k)
            .field("n", &self.n)
            .field("nr", &self.nr)
            .field("layout", &self.layout)
            .finish()
    }
}

impl Bf16B {
    /// Converts and packs row-major `b` (`k×n`) in `layout` ([`crate::Error::OutOfMemory`]
    /// when it does not fit). Panics if `b.len() != k·n`, a
    /// dimension is 0 or `nr` is not a positive multiple of the layout's group (the family
    /// checks all of these before it calls).
    pub fn new(b: &[f32], k: usize, n: usize, nr: usize, layout: Layout) -> crate::Result<Bf16B> {
        assert!(k >= 1 && n >= 1, "empty B");
        let group = layout.group();
        assert!(nr >= group && nr.is_multiple_of(group), "panel width {nr}");
        assert_eq!(b.len(), k * n, "B must be K×N = {k}×{n}");
        let size = layout.padded(k) * nr;
        let len = n.div_ceil(nr) * size;
        let mut data = crate::alloc::filled(len + 32, 0u16, "a packed bf16 weight")?;
        let start = data.as_ptr().align_offset(64).min(32);
        let packed = &mut data[start..start + len];
        for (q, panel) in packed.chunks_exact_mut(size).enumerate() {
            let cols = q * nr..n.min((q + 1) * nr);
            if layout == Layout::Pairs {
                pack_pair_panel(b, n, k, cols, nr, panel);
                continue;
            }
            for (p, dst) in panel.chunks_exact_mut(nr).enumerate() {
                for (c, &x) in b[p * n + cols.start..p * n + cols.end].iter().enumerate() {
                    dst[layout.index(0, c, nr)] = to_bf16(x);
                }
            }
        }
        Ok(Bf16B {
            k,
            n,
            nr,
            layout,
            data,
            start,
        })
    }

    /// Number of panels, `⌈N/nr⌉`.
    pub fn panels(&self) -> usize {
        self.n.div_ceil(self.nr)
    }

    /// Panel `q`: `padded(K)` rows of `nr` bf16 values in the layout's order. Panics if
    /// `q ≥ panels()`.
    pub fn panel(&self, q: usize) -> &[u16] {
        assert!(q < self.panels(), "panel {q} of {}", self.panels());
        let size = self.layout.padded(self.k) * self.nr;
        &self.data[self.start + q * size..][..size]
    }

    /// The bf16 bits of `B[p][j]` as stored.
    pub fn get(&self, p: usize, j: usize) -> u16 {
        self.panel(j / self.nr)[self.layout.index(p, j % self.nr, self.nr)]
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len() * 2
    }
}

/// Packs rows `i0..i0+mc` × columns `p0..p0+kc` of row-major `a` (row stride `lda`) into
/// `mr`-row micro-panels in `out` (`⌈mc/mr⌉·mr·kc` values; column `p` of a panel's rows
/// together), every value rounded to bf16 ([`round_bf16`]), missing rows zero: the f32
/// family's [`pack_a`], then the rounding over the packed (cache-hot) block.
pub fn pack_a_rounded(
    a: &[f32],
    lda: usize,
    rows: (usize, usize),
    depth: (usize, usize),
    mr: usize,
    out: &mut [f32],
) {
    pack_a(a, lda, rows, depth, mr, out);
    let packed = rows.1.div_ceil(mr) * mr * depth.1;
    out[..packed].iter_mut().for_each(|x| *x = round_bf16(*x));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// The bf16 nearest to `x` by exact distance in f64, ties to the even pattern: the
    /// definition, written without bit tricks. `None` for NaN (any NaN pattern is right).
    fn nearest_by_distance(x: f32) -> Option<u16> {
        if x.is_nan() {
            return None;
        }
        let hi = (x.to_bits() >> 16) as u16; // truncation: towards zero
        let lo_next = hi.wrapping_add(1); // one bf16 step away from zero
        let (a, b) = (from_bf16(hi) as f64, from_bf16(lo_next) as f64);
        if from_bf16(hi).is_infinite() {
            return Some(hi);
        }
        // The step past the largest finite bf16 is ∞; the rounding boundary is then the
        // midpoint to the next (virtual) power of two, 2¹²⁸·(1 − 2⁻⁹).
        let b = if from_bf16(lo_next).is_infinite() {
            a + (a - from_bf16(hi.wrapping_sub(1)) as f64)
        } else {
            b
        };
        let (da, db) = ((x as f64 - a).abs(), (x as f64 - b).abs());
        Some(match da.partial_cmp(&db).unwrap() {
            std::cmp::Ordering::Less => hi,
            std::cmp::Ordering::Greater => lo_next,
            std::cmp::Ordering::Equal if hi.is_multiple_of(2) => hi,
            std::cmp::Ordering::Equal => lo_next,
        })
    }

    fn agrees(x: f32) {
        let got = to_bf16(x);
        match nearest_by_distance(x) {
            Some(want) => assert_eq!(got, want, "{x:e} ({:#010x})", x.to_bits()),
            None => {
                assert!(
                    from_bf16(got).is_nan(),
                    "{:#010x} lost its NaN",
                    x.to_bits()
                );
                assert_eq!(got >> 15, (x.to_bits() >> 31) as u16, "NaN sign");
            }
        }
        assert_eq!(round_bf16(x).to_bits(), from_bf16(got).to_bits());
    }

    #[test]
    fn conversion_rounds_to_nearest_even_on_edge_values() {
        let one = 1.0f32.to_bits();
        let edges = [
            0.0f32,
            -0.0,
            1.0,
            f32::from_bits(one + 0x8000), // exact tie, even below: down to 1
            f32::from_bits(one + 0x18000), // exact tie, odd below: up
            f32::from_bits(one + 0x7FFF), // just below the tie
            f32::from_bits(one + 0x8001), // just above the tie
            f32::MAX,                     // rounds up past the largest bf16: ∞
            f32::from_bits(0x7F7F_7FFF),  // just below that tie: the largest bf16
            f32::from_bits(0x7F7F_8000),  // the tie itself: odd below, so ∞
            f32::MIN,
            f32::MIN_POSITIVE,
            f32::from_bits(1),           // smallest subnormal: rounds to 0
            f32::from_bits(0x8000),      // subnormal tie, even below: 0
            f32::from_bits(0x18000),     // subnormal tie, odd below: up
            f32::from_bits(0x007F_FFFF), // largest subnormal: up to MIN_POSITIVE
            -f32::from_bits(0x0001_8000),
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7F80_0001), // signalling NaN, payload only in the low bits
            f32::from_bits(0xFF80_0001),
            f32::from_bits(0x7FC0_1234),
        ];
        for x in edges {
            agrees(x);
        }
        assert_eq!(to_bf16(f32::from_bits(one + 0x8000)), 0x3F80);
        assert_eq!(to_bf16(f32::from_bits(one + 0x18000)), 0x3F82);
        assert_eq!(to_bf16(f32::MAX), 0x7F80);
        assert_eq!(to_bf16(f32::from_bits(0x7F7F_7FFF)), 0x7F7F);
        assert_eq!(to_bf16(f32::from_bits(1)), 0);
        assert_eq!(to_bf16(f32::from_bits(0x007F_FFFF)), 0x0080);
        assert_eq!(to_bf16(-0.0), 0x8000);
        assert_eq!(to_bf16(f32::NEG_INFINITY), 0xFF80);
        assert!(from_bf16(to_bf16(f32::from_bits(0x7F80_0001))).is_nan());
        // Every bf16 value converts to itself.
        for h in 0..=u16::MAX {
            let x = from_bf16(h);
            if !x.is_nan() {
                assert_eq!(to_bf16(x), h);
            }
        }
    }

    #[test]
    fn conversion_agrees_with_the_definition_on_random_patterns() {
        let mut rng = Rng::new(16);
        for _ in 0..200_000 {
            agrees(f32::from_bits(rng.below(1 << 32) as u32));
        }
    }

    #[test]
    fn b_panels_hold_every_value_once_and_pad_with_zeros() {
        let (k, n) = (5, 37);
        let b: Vec<f32> = (0..k * n).map(|i| i as f32 + 0.5).collect();
        for layout in [Layout::Widen16, Layout::Widen32, Layout::Pairs] {
            for nr in [16, 32, 64, 128]
                .into_iter()
                .filter(|nr| *nr >= layout.group())
            {
                let p = Bf16B::new(&b, k, n, nr, layout).unwrap();
                assert_eq!(p.panels(), n.div_ceil(nr));
                for i in 0..k {
                    for j in 0..n {
                        let want = to_bf16(b[i * n + j]);
                        assert_eq!(p.get(i, j), want, "{layout:?} nr {nr} ({i}, {j})");
                    }
                }
                // Padding columns of the last panel, and the padding depth of the pairs.
                let (q, live) = (p.panels() - 1, n - (p.panels() - 1) * nr);
                for i in 0..layout.padded(k) {
                    for c in (0..nr).filter(|&c| i >= k || c >= live) {
                        let at = layout.index(i, c, nr);
                        assert_eq!(p.panel(q)[at], 0, "{layout:?} pad ({i}, {c})");
                    }
                }
                assert_eq!(p.panel(q).len(), layout.padded(k) * nr);
                assert_eq!(p.panel(0).as_ptr() as usize % 64, 0, "aligned");
            }
        }
        let mut seen = [false; 16];
        (0..16).for_each(|c| seen[slot(c)] = true);
        assert!(seen.iter().all(|s| *s), "slot is a permutation");
    }

    #[test]
    fn a_packing_rounds_and_pads() {
        let (m, k) = (7, 9);
        let a: Vec<f32> = (0..m * k).map(|i| 1.0 + i as f32 / 300.0).collect();
        for mr in [1, 2, 3, 4, 6] {
            let (i0, mc, p0, kc) = (1, 6usize, 2, 5);
            let mut out = vec![f32::NAN; mc.div_ceil(mr) * mr * kc];
            pack_a_rounded(&a, k, (i0, mc), (p0, kc), mr, &mut out);
            for (t, panel) in out.chunks_exact(mr * kc).enumerate() {
                for p in 0..kc {
                    for r in 0..mr {
                        let row = t * mr + r;
                        let want = if row < mc {
                            round_bf16(a[(i0 + row) * k + p0 + p])
                        } else {
                            0.0
                        };
                        assert_eq!(panel[p * mr + r], want, "mr {mr} row {row} p {p}");
                    }
                }
            }
        }
    }
}
