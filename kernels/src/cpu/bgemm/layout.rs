//! Where a micro-kernel finds its operands: the [`Layout`] of B's bf16 panels and of the
//! packed A words that go with it, and the depth-pair packings of the `vdpbf16ps` kernels.
//!
//! Two kinds of micro-kernel read B:
//!
//! - **Widening** kernels (AVX2, AVX-512F, portable) widen bf16 to f32 in registers. A panel
//!   row (one depth) holds its NR values in groups of `2·W` columns (`W` f32 lanes per
//!   vector), 32-bit word `j` of a group holding column `j` in its low half and column
//!   `j + W` in its high half ([`super::convert::slot_in`]): one load, a shift and a mask
//!   give both vectors. Packed A holds one f32 (rounded to a bf16 value) per row and depth.
//! - **Pair** kernels (`vdpbf16ps`, AVX512_BF16) multiply bf16 pairs. For each pair of
//!   depths `(2s, 2s + 1)` a panel holds, per column, the two values side by side (depth
//!   `2s` in the low half of the 32-bit word): one load gives 16 columns' pairs, the layout
//!   AMX's `tdpbf16ps` reads too (a B tile row is 16 such words). Packed A holds rows of the
//!   same pair words ([`APack::PairRows`]: a row's bf16 values in order, so packing is a
//!   plain conversion), each word broadcast to every lane; for the AMX `tdpbf16ps` kernels 16
//!   consecutive words of a row are one 64-byte A-tile row. An odd depth is padded with a
//!   zero value on both sides.
//!
//! ```
//! use kernels::cpu::bgemm::layout::Layout;
//!
//! // Depth 3, column 5 of a 32-column panel: pair 1, word 5, high half.
//! assert_eq!(Layout::Pairs.index(3, 5, 32), (1 * 32 + 5) * 2 + 1);
//! assert_eq!(Layout::Pairs.padded(7), 8);
//! assert_eq!(Layout::Widen16.index(3, 5, 32), 3 * 32 + 10);
//! ```

use super::convert::{slot_in, to_bf16, to_bf16_wide};
use crate::cpu::gemm::ukernel::prefetch_lines;

/// The arrangement of a B panel's bf16 values and of packed A (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Widening, groups of 16 columns (8-lane vectors: AVX2, portable).
    Widen16,
    /// Widening, groups of 32 columns (16-lane vectors: AVX-512F).
    Widen32,
    /// Depth pairs, each column's two values adjacent (`vdpbf16ps`, AMX).
    Pairs,
}

impl Layout {
    /// Depths per kernel step: 1, or 2 for [`Layout::Pairs`].
    pub const fn depth_per_step(self) -> usize {
        match self {
            Layout::Pairs => 2,
            _ => 1,
        }
    }

    /// Kernel steps (packed A words per row) for a depth of `k`.
    pub const fn steps(self, k: usize) -> usize {
        k.div_ceil(self.depth_per_step())
    }

    /// `k` rounded up to whole steps: the panel rows stored for a depth of `k`.
    pub const fn padded(self, k: usize) -> usize {
        self.steps(k) * self.depth_per_step()
    }

    /// The panel width every kernel of this layout has a multiple of.
    pub const fn group(self) -> usize {
        match self {
            Layout::Widen16 => 16,
            Layout::Widen32 => 32,
            Layout::Pairs => 16,
        }
    }

    /// Position of `B[p][c]` within an `nr`-column panel (`c < nr`).
    #[inline(always)]
    pub fn index(self, p: usize, c: usize, nr: usize) -> usize {
        match self {
            Layout::Widen16 => p * nr + slot_in(c, 16),
            Layout::Widen32 => p * nr + slot_in(c, 32),
            Layout::Pairs => ((p / 2) * nr + c) * 2 + p % 2,
        }
    }

    /// The code of this layout in a prepared weight's format (0 for the first layout, so
    /// formats of the widening-16 kernels are unchanged).
    pub fn code(self) -> usize {
        match self {
            Layout::Widen16 => 0,
            Layout::Widen32 => 1,
            Layout::Pairs => 2,
        }
    }
}

/// How a kernel's packed A block holds its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum APack {
    /// f32 values rounded to bf16, depth by depth ([`super::convert::pack_a_rounded`]):
    /// the widening layouts.
    Rounded,
    /// bf16 pair words, row by row ([`pack_a_pair_rows`]): `vdpbf16ps` and AMX `tdpbf16ps`.
    PairRows,
}

impl APack {
    /// The A packing of the vector kernels of `layout`.
    pub const fn of(layout: Layout) -> APack {
        match layout {
            Layout::Pairs => APack::PairRows,
            _ => APack::Rounded,
        }
    }
}

/// Packs columns `cols` of row-major `b` (`k` rows, row stride `ldb`) as one panel of `nr`
/// columns in the pair layout: `⌈k/2⌉` rows of `nr` 32-bit words, word `c` of row `s` holding
/// `bf16(B[2s][c])` in its low half and `bf16(B[2s + 1][c])` in its high half; columns past
/// the range and the depth past an odd `k` are zero. `out` holds `⌈k/2⌉·2·nr` values.
///
/// Read as bytes, a pair row of 16 columns is the 64-byte row of an AMX `tdpbf16ps` B tile:
/// a tile of 16 columns at column `16·t` of the panel is loaded from `out[32·t..]` with a
/// stride of `4·nr` bytes.
pub fn pack_pair_panel(
    b: &[f32],
    ldb: usize,
    k: usize,
    cols: std::ops::Range<usize>,
    nr: usize,
    out: &mut [u16],
) {
    let width = cols.len();
    assert!(
        width <= nr && out.len() >= k.div_ceil(2) * 2 * nr,
        "panel too small"
    );
    for (s, dst) in out.chunks_exact_mut(2 * nr).take(k.div_ceil(2)).enumerate() {
        dst.fill(0);
        for half in 0..2 {
            let p = 2 * s + half;
            if p >= k {
                continue;
            }
            let row = &b[p * ldb + cols.start..][..width];
            for (c, &x) in row.iter().enumerate() {
                dst[2 * c + half] = to_bf16(x);
            }
        }
    }
}

/// Packs rows `i0..i0+mc` × depths `p0..p0+kc` of row-major `a` (row stride `lda`) into
/// `mr`-row micro-panels of bf16 pair words, row after row, as halves in `out`
/// (`⌈mc/mr⌉·mr·2⌈kc/2⌉` values): word `(r, s)` of a panel (its row `r`, depth pair `s`), at
/// halves `2(r·⌈kc/2⌉ + s)..`, holds `bf16(A[i][p0 + 2s])` in its low half and
/// `bf16(A[i][p0 + 2s + 1])` in its high half — each row's values in order. Read as bytes,
/// 16 consecutive words of a row are the 64-byte row of an AMX `tdpbf16ps` A tile (32
/// depths), and the panel's rows are `4·⌈kc/2⌉` bytes apart. Missing rows, and the depth
/// past an odd `kc`, are zero.
pub fn pack_a_pair_rows(
    a: &[f32],
    lda: usize,
    (i0, mc): (usize, usize),
    (p0, kc): (usize, usize),
    mr: usize,
    out: &mut [u16],
) {
    let row_len = 2 * kc.div_ceil(2);
    for (i, dst) in out
        .chunks_exact_mut(row_len)
        .take(mc.div_ceil(mr) * mr)
        .enumerate()
    {
        if i < mc {
            // The row 8 ahead on its way from L3 (attention's queries, a head's rows one
            // row stride apart) while this one is converted.
            if i + 8 < mc {
                prefetch_lines(&a[(i0 + i + 8) * lda + p0..][..kc]);
            }
            to_bf16_wide(&a[(i0 + i) * lda + p0..][..kc], &mut dst[..kc]);
            dst[kc..].fill(0);
        } else {
            dst.fill(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::bgemm::convert::from_bf16;

    #[test]
    fn every_layout_places_each_value_once() {
        for layout in [Layout::Widen16, Layout::Widen32, Layout::Pairs] {
            for nr in [32, 64, 128] {
                let k = 5;
                let rows = layout.padded(k);
                let mut seen = vec![false; rows * nr];
                for p in 0..rows {
                    for c in 0..nr {
                        let i = layout.index(p, c, nr);
                        assert!(!seen[i], "{layout:?} nr {nr}: ({p}, {c}) twice");
                        seen[i] = true;
                    }
                }
                assert!(seen.iter().all(|s| *s), "{layout:?}: a permutation");
            }
        }
        assert_eq!(Layout::Pairs.padded(5), 6);
        assert_eq!(Layout::Widen32.padded(5), 5);
        assert_eq!(Layout::Pairs.steps(1), 1);
    }

    #[test]
    fn pair_panels_interleave_depths_and_pad() {
        let (k, n, ldb) = (5, 21, 23);
        let b: Vec<f32> = (0..k * ldb).map(|i| i as f32 + 0.5).collect();
        let nr = 32;
        let mut out = vec![7u16; 3 * 2 * nr];
        pack_pair_panel(&b, ldb, k, 2..2 + n, nr, &mut out);
        for p in 0..6 {
            for c in 0..nr {
                let got = from_bf16(out[Layout::Pairs.index(p, c, nr)]);
                let want = if p < k && c < n {
                    from_bf16(to_bf16(b[p * ldb + 2 + c]))
                } else {
                    0.0
                };
                assert_eq!(got, want, "({p}, {c})");
            }
        }
        // Word c of pair row s: depth 2s low, depth 2s + 1 high (little-endian u16 order).
        assert_eq!(out[2 * 3], to_bf16(b[2 + 3]));
        assert_eq!(out[2 * 3 + 1], to_bf16(b[ldb + 2 + 3]));
    }

    #[test]
    fn a_pair_rows_pack_low_depth_low_and_pad() {
        let (m, k) = (7, 9);
        let a: Vec<f32> = (0..m * k).map(|i| 1.0 + i as f32 / 300.0).collect();
        for mr in [1, 2, 4, 12] {
            for (i0, mc, p0, kc) in [(1, 6usize, 2, 5usize), (0, 7, 0, 9), (3, 1, 1, 2)] {
                let steps = kc.div_ceil(2);
                let len = mc.div_ceil(mr) * mr * 2 * steps;
                let mut rows = vec![u16::MAX; len];
                pack_a_pair_rows(&a, k, (i0, mc), (p0, kc), mr, &mut rows);
                for (row, halves) in rows.chunks_exact(2 * steps).enumerate() {
                    for (p, &got) in halves.iter().enumerate() {
                        let want = match row < mc && p < kc {
                            true => to_bf16(a[(i0 + row) * k + p0 + p]),
                            false => 0,
                        };
                        assert_eq!(got, want, "mr {mr} row {row} depth {p}");
                    }
                }
            }
        }
    }
}
