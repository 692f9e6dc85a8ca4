//! The two generic micro-kernel bodies of the bf16 family and the small traits they are
//! written in: [`WidenBf16`] (a group of bf16 values widened to two f32 vectors, then f32
//! FMAs) and [`DotBf16`] (`vdpbf16ps`: per f32 lane, two bf16 products added to the
//! accumulator). Each ISA implements the traits ([`super::x86`]), and so does the emulation
//! of the AVX-512 vocabulary in plain Rust (`emulate.rs`, tests only), so one body runs
//! on every CPU in tests and on the real instructions where the CPU has them.

use crate::cpu::gemm::ukernel::simd::{store_tile_epi, Epi, Simd};

/// A SIMD level's widening step: a group of `2·W` bf16 values in the interleaved order of
/// [`crate::cpu::bgemm::convert::slot_in`] (group `2·W`) to the two f32 vectors of its
/// columns `0..W` and `W..2W`.
pub(crate) trait WidenBf16: Simd {
    /// # Safety
    /// The CPU supports the ISA; `p` is readable for `2·W` `u16`s.
    unsafe fn widen_group(p: *const u16) -> (Self::V, Self::V);
}

/// A SIMD level's bf16 pair dot product, `vdpbf16ps`'s: every f32 lane `i` of the
/// accumulator gains `a.hi·b.hi` and then `a.lo·b.lo`, where `lo`/`hi` are the bf16 values in
/// the low and high halves of the operands' 32-bit lane `i`.
pub(crate) trait DotBf16 {
    /// The f32 vocabulary of the accumulators (and of the tile's store and epilogue).
    type S: Simd;
    /// A register of `W` bf16 pairs (`W` = `Self::S::W`).
    type P: Copy;
    /// `W` pairs (`2·W` bf16 values) from `p`.
    ///
    /// # Safety
    /// The CPU supports the ISA; `p` is readable for `2·W` `u16`s.
    unsafe fn load_pairs(p: *const u16) -> Self::P;
    /// The pair word at `p` in every lane.
    ///
    /// # Safety
    /// The CPU supports the ISA; `p` is readable for one `u32`.
    unsafe fn splat_pair(p: *const u32) -> Self::P;
    /// `acc + a.hi·b.hi + a.lo·b.lo` lane by lane, with the instruction's rounding.
    ///
    /// # Safety
    /// The CPU supports the ISA.
    unsafe fn dot(acc: <Self::S as Simd>::V, a: Self::P, b: Self::P) -> <Self::S as Simd>::V;
}

/// The widening `MR × W·NV` tile (`NV` even): for each of `tiles` row tiles, per depth step,
/// `NV/2` groups of B widened to `NV` vectors, `MR` broadcasts of A, `MR·NV` FMAs; then the
/// tile is stored (added with `accumulate`) with the epilogue `ep`.
///
/// # Safety
/// The CPU supports `S`'s ISA; `a` is readable for `tiles·steps·MR` f32 values, `b` for
/// `steps·NV·W` values; `c + r·ldc + j` is readable and writable for `r < tiles·MR`,
/// `j < NV·W`; unless `ep.act` is none, `ep.bias` is readable for `NV·W` values.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn widen_body<S: WidenBf16, const MR: usize, const NV: usize>(
    steps: usize,
    a: *const f32,
    b: *const u16,
    c: *mut f32,
    ldc: usize,
    tiles: usize,
    accumulate: bool,
    ep: Epi,
) {
    let nr = NV * S::W;
    // SAFETY (whole body): the caller guarantees the ISA and the extents; every read is at
    // `a + (t·steps + p)·MR + r` or `b + p·nr + 2W·g` (2W values, g < NV/2), every store
    // inside the `MR × nr` block of tile t (t < tiles, p < steps, r < MR).
    unsafe {
        for t in 0..tiles {
            let mut acc = [[S::zero(); NV]; MR];
            let mut ap = a.add(t * steps * MR);
            let mut bp = b;
            for _ in 0..steps {
                let mut bv = [S::zero(); NV];
                for g in 0..NV / 2 {
                    (bv[2 * g], bv[2 * g + 1]) = S::widen_group(bp.add(g * 2 * S::W));
                }
                for (r, row) in acc.iter_mut().enumerate() {
                    let ar = S::splat(ap.add(r));
                    for v in 0..NV {
                        row[v] = S::fmadd(ar, bv[v], row[v]);
                    }
                }
                ap = ap.add(MR);
                bp = bp.add(nr);
            }
            store_tile_epi::<S, MR, NV>(&acc, c.add(t * MR * ldc), ldc, accumulate, ep);
        }
    }
}

/// Where a pair tile's A words are: word (row `r`, depth pair `s`) of row tile `t` at
/// `a + t·tile + s·step + r·row`.
#[derive(Clone, Copy)]
pub(crate) struct PairsA {
    pub a: *const u32,
    pub tile: usize,
    pub step: usize,
    pub row: usize,
}

impl PairsA {
    /// Rows of pair words `ld` apart (a row's words contiguous: its values in order).
    #[inline(always)]
    pub(crate) fn rows(a: *const u32, ld: usize, mr: usize) -> Self {
        PairsA {
            a,
            tile: mr * ld,
            step: 1,
            row: ld,
        }
    }
}

/// The pair `MR × W·NV` tile: for each of `tiles` row tiles, per depth pair, `NV` loads of B
/// pairs, `MR` broadcasts of an A pair word, `MR·NV` pair dot products; then the tile is
/// stored (added with `accumulate`) with the epilogue `ep`.
///
/// # Safety
/// The CPU supports `D`'s ISA; `a` is readable for the words of `tiles` row tiles of `MR`
/// rows × `steps` depth pairs, `b` for `steps·2·NV·W` values; `c + r·ldc + j` is readable
/// and writable for `r < tiles·MR`, `j < NV·W`; unless `ep.act` is none, `ep.bias` is
/// readable for `NV·W` values.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn pair_body<D: DotBf16, const MR: usize, const NV: usize>(
    steps: usize,
    a: PairsA,
    b: *const u16,
    c: *mut f32,
    ldc: usize,
    tiles: usize,
    accumulate: bool,
    ep: Epi,
) {
    let w = D::S::W;
    // SAFETY (whole body): the caller guarantees the ISA and the extents; every read is at
    // `a.a + t·a.tile + s·a.step + r·a.row` (one word) or `b + s·2·NV·W + 2W·v` (2W values,
    // v < NV), every store inside the `MR × NV·W` block of tile t (t < tiles, s < steps,
    // r < MR).
    unsafe {
        for t in 0..tiles {
            let mut acc = [[D::S::zero(); NV]; MR];
            let mut ap = a.a.add(t * a.tile);
            let mut bp = b;
            for _ in 0..steps {
                let bv: [D::P; NV] = std::array::from_fn(|v| D::load_pairs(bp.add(2 * w * v)));
                for (r, row) in acc.iter_mut().enumerate() {
                    let ar = D::splat_pair(ap.add(r * a.row));
                    for (x, bv) in row.iter_mut().zip(&bv) {
                        *x = D::dot(*x, ar, *bv);
                    }
                }
                ap = ap.add(a.step);
                bp = bp.add(2 * NV * w);
            }
            store_tile_epi::<D::S, MR, NV>(&acc, c.add(t * MR * ldc), ldc, accumulate, ep);
        }
    }
}
