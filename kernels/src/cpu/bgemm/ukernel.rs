//! The bf16 micro-kernels: `MR × NR` tiles of `A (f32, rounded to bf16 values) · B (bf16)`
//! with f32 accumulation, one generic body over a widening step per ISA, and the safe,
//! bounds-checked entry points the driver calls. All `unsafe` code of the bf16 family lives
//! here.
//!
//! - `avx2_*` (AVX2 + FMA): one 256-bit load of 16 bf16 values per group of 16 columns,
//!   widened to two f32 vectors in registers (`vpslld 16` for the columns in the low halves,
//!   `vpand` for those in the high halves: [`super::convert::slot`]), then f32 FMAs.
//! - `portable_*`: the same body over 8-lane arrays, for CPUs without AVX2.
//!
//! Not here: AVX-512F widening kernels and AVX512_BF16 `vdpbf16ps` ones. The development
//! machine (AMD Zen 3) runs neither, so such code would never have run before it shipped;
//! on AVX-512 machines the AVX2 kernels are offered ([`Isa::offered_under`]).

use super::convert::GROUP;
use crate::cpu::gemm::ukernel::simd::{store_tile_epi, Epi, Simd};
use crate::cpu::gemm::ukernel::{bias_act_row, epi_for, TileEpilogue};
use crate::cpu::gemm::view::CView;
use crate::cpu::Isa;

/// `(kc, a, b, c, ldc, tiles, accumulate, epilogue)`: see [`tile_body`].
type TileFn = unsafe fn(usize, *const f32, *const u16, *mut f32, usize, usize, bool, Epi);

/// Largest `MR·NR` of any kernel (edge tiles are computed in a stack buffer).
const MAX_TILE: usize = 96;

/// Widest panel of any kernel (the padded bias of an edge tile).
const MAX_NR: usize = 64;

/// One bf16 micro-kernel: its name (the `ukernel` knob's value), tile shape and ISA.
#[derive(Debug)]
pub struct Bf16Kernel {
    pub name: &'static str,
    /// Rows of the tile.
    pub mr: usize,
    /// Columns of the tile (a multiple of 16: the panel width of B).
    pub nr: usize,
    pub isa: Isa,
    f: TileFn,
}

/// Every bf16 micro-kernel of this build, best first within an ISA.
pub static KERNELS: &[Bf16Kernel] = &[
    #[cfg(target_arch = "x86_64")]
    Bf16Kernel::new("avx2_6x16", 6, 16, Isa::Avx2, x86::avx2::<6, 2>),
    #[cfg(target_arch = "x86_64")]
    Bf16Kernel::new("avx2_4x16", 4, 16, Isa::Avx2, x86::avx2::<4, 2>),
    // Few rows (decoding, GEMV): B is the whole cost, so wider panels and no padded rows.
    #[cfg(target_arch = "x86_64")]
    Bf16Kernel::new("avx2_2x32", 2, 32, Isa::Avx2, x86::avx2::<2, 4>),
    #[cfg(target_arch = "x86_64")]
    Bf16Kernel::new("avx2_1x64", 1, 64, Isa::Avx2, x86::avx2::<1, 8>),
    #[cfg(target_arch = "x86_64")]
    Bf16Kernel::new("avx2_1x32", 1, 32, Isa::Avx2, x86::avx2::<1, 4>),
    Bf16Kernel::new("portable_4x16", 4, 16, Isa::Portable, portable::<4, 2>),
    Bf16Kernel::new("portable_1x32", 1, 32, Isa::Portable, portable::<1, 4>),
];

impl Bf16Kernel {
    const fn new(name: &'static str, mr: usize, nr: usize, isa: Isa, f: TileFn) -> Bf16Kernel {
        assert!(mr * nr <= MAX_TILE && nr <= MAX_NR && nr.is_multiple_of(GROUP));
        Bf16Kernel {
            name,
            mr,
            nr,
            isa,
            f,
        }
    }

    /// Whether this process runs it.
    pub fn available(&self) -> bool {
        self.isa.available()
    }

    /// The kernel called `name`, if this process runs it.
    pub fn by_name(name: &str) -> Option<&'static Bf16Kernel> {
        KERNELS
            .iter()
            .find(|k| k.name == name)
            .filter(|k| k.available())
    }

    /// `C[i.., j..] (+)= A_tiles · B_panel` for `tiles` row tiles stacked from `(i, j)`,
    /// clipped to `c`'s window: tile `t` reads the packed A micro-panel `a[t·MR·kc..]` (`kc`
    /// groups of MR values) against the panel block `b` (`kc` rows of NR interleaved bf16
    /// values). With `accumulate` the products are added to C, else C is overwritten; then
    /// with `ep`, `act(x + bias)` is stored (bias from column `j` on). Whole tiles are stored
    /// from registers; a tile that sticks out of the window is computed in a stack buffer and
    /// only its valid part written. Panics if A, the panel or the bias is too short, `(i, j)`
    /// is outside `c`, or this process does not run the kernel.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn tiles(
        &self,
        kc: usize,
        a: &[f32],
        tiles: usize,
        b: &[u16],
        c: &mut CView<'_>,
        (i, j): (usize, usize),
        accumulate: bool,
        ep: Option<TileEpilogue<'_>>,
    ) {
        let (mr, nr) = (self.mr, self.nr);
        assert!(self.available(), "{} does not run here", self.name);
        assert!(
            a.len() >= tiles * mr * kc && b.len() >= kc * nr,
            "micro-panels too short"
        );
        assert!(i < c.rows() && j < c.cols(), "tile outside the window");
        let cols = nr.min(c.cols() - j);
        let whole = (c.rows() - i) / mr;
        let full = if cols == nr { tiles.min(whole) } else { 0 };
        if full > 0 {
            let epi = epi_for(ep.as_ref(), nr);
            let (ld, p) = (c.ld(), c.block_ptr(i, j, full * mr, nr));
            // SAFETY: `available()` checked the ISA; the `full` A tiles and the B panel block
            // are inside their slices (asserted above); `block_ptr` checked that the whole
            // `full·MR × NR` block lies in `c`'s window; `epi_for` checked that the bias, if
            // any, holds NR values.
            unsafe { (self.f)(kc, a.as_ptr(), b.as_ptr(), p, ld, full, accumulate, epi) }
        }
        for t in full..tiles {
            let row = i + t * mr;
            if row >= c.rows() {
                break;
            }
            self.edge(kc, &a[t * mr * kc..], b, c, (row, j), accumulate, ep);
        }
    }

    /// One tile that sticks out of `c`'s window at `(i, j)`: computed in a stack buffer, then
    /// its valid part added or copied, and the epilogue applied row by row.
    #[allow(clippy::too_many_arguments)]
    fn edge(
        &self,
        kc: usize,
        a: &[f32],
        b: &[u16],
        c: &mut CView<'_>,
        (i, j): (usize, usize),
        accumulate: bool,
        ep: Option<TileEpilogue<'_>>,
    ) {
        let (mr, nr) = (self.mr, self.nr);
        let rows = mr.min(c.rows() - i);
        let cols = nr.min(c.cols() - j);
        let mut buf = [0.0f32; MAX_TILE];
        assert!(a.len() >= mr * kc && b.len() >= kc * nr && mr * nr <= MAX_TILE);
        // SAFETY: `available()` was checked by the caller; the A tile and the panel block are
        // inside their slices (asserted above); the destination is `buf`, an MR×NR block with
        // stride NR (`mr·nr ≤ MAX_TILE`, asserted).
        unsafe {
            (self.f)(
                kc,
                a.as_ptr(),
                b.as_ptr(),
                buf.as_mut_ptr(),
                nr,
                1,
                false,
                Epi::NONE,
            )
        }
        for r in 0..rows {
            let src = &buf[r * nr..r * nr + cols];
            let dst = &mut c.row_mut(i + r)[j..j + cols];
            if accumulate {
                dst.iter_mut().zip(src).for_each(|(d, s)| *d += s);
            } else {
                dst.copy_from_slice(src);
            }
            if let Some(ep) = &ep {
                bias_act_row(dst, ep.bias, ep.act);
            }
        }
    }
}

/// A SIMD level's widening step: a group of 16 bf16 values in the interleaved order of
/// [`super::convert::slot`] to the two f32 vectors of its columns `0..8` and `8..16`.
pub(crate) trait WidenBf16: Simd {
    /// # Safety
    /// The CPU supports the ISA; `p` is readable for 16 `u16`s. `Self::W` is 8.
    unsafe fn widen_group(p: *const u16) -> (Self::V, Self::V);
}

/// The `MR × 8·NV` tile body: for each of `tiles` row tiles, per depth step, NV/2 groups of
/// B widened to NV vectors, MR broadcasts of A, MR·NV FMAs; then the tile is stored (added
/// with `accumulate`) with the epilogue `ep`.
///
/// # Safety
/// The CPU supports `S`'s ISA; `a` is readable for `tiles·kc·MR` values, `b` for `kc·NV·8`
/// values; `c + r·ldc + j` is readable and writable for `r < tiles·MR`, `j < NV·8`; unless
/// `ep.act` is none, `ep.bias` is readable for `NV·8` values.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_body<S: WidenBf16, const MR: usize, const NV: usize>(
    kc: usize,
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
    // `a + (t·kc + p)·MR + r` or `b + p·nr + 16·g` (16 values, g < NV/2), every store inside
    // the `MR × nr` block of tile t (t < tiles, p < kc, r < MR).
    unsafe {
        for t in 0..tiles {
            let mut acc = [[S::zero(); NV]; MR];
            let mut ap = a.add(t * kc * MR);
            let mut bp = b;
            for _ in 0..kc {
                let mut bv = [S::zero(); NV];
                for g in 0..NV / 2 {
                    (bv[2 * g], bv[2 * g + 1]) = S::widen_group(bp.add(g * GROUP));
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

impl WidenBf16 for crate::cpu::gemm::ukernel::portable::Portable {
    #[inline(always)]
    unsafe fn widen_group(p: *const u16) -> ([f32; 8], [f32; 8]) {
        // SAFETY: `p` is readable for 16 values (caller contract); `read_unaligned` needs no
        // alignment beyond `u16`'s.
        let g = unsafe { p.cast::<[u16; 16]>().read_unaligned() };
        (
            std::array::from_fn(|j| f32::from_bits(u32::from(g[2 * j]) << 16)),
            std::array::from_fn(|j| f32::from_bits(u32::from(g[2 * j + 1]) << 16)),
        )
    }
}

/// The portable tile.
///
/// # Safety
/// As [`tile_body`] with `NV·8` columns.
#[allow(clippy::too_many_arguments)]
unsafe fn portable<const MR: usize, const NV: usize>(
    kc: usize,
    a: *const f32,
    b: *const u16,
    c: *mut f32,
    ldc: usize,
    tiles: usize,
    accumulate: bool,
    ep: Epi,
) {
    use crate::cpu::gemm::ukernel::portable::Portable;
    // SAFETY: forwarded caller contract; portable code runs everywhere.
    unsafe { tile_body::<Portable, MR, NV>(kc, a, b, c, ldc, tiles, accumulate, ep) }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{tile_body, WidenBf16};
    use crate::cpu::gemm::ukernel::avx2::Avx2;
    use crate::cpu::gemm::ukernel::simd::Epi;

    impl WidenBf16 for Avx2 {
        #[inline(always)]
        unsafe fn widen_group(p: *const u16) -> (__m256, __m256) {
            // SAFETY: AVX2 is available and `p` is readable for 16 values (caller contract).
            unsafe {
                let raw = _mm256_loadu_si256(p.cast());
                let low = _mm256_slli_epi32::<16>(raw);
                let high = _mm256_and_si256(raw, _mm256_set1_epi32(0xFFFF_0000_u32 as i32));
                (_mm256_castsi256_ps(low), _mm256_castsi256_ps(high))
            }
        }
    }

    /// The `MR × 8·NV` tile, compiled for AVX2 + FMA.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; extents as for [`tile_body`].
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn avx2<const MR: usize, const NV: usize>(
        kc: usize,
        a: *const f32,
        b: *const u16,
        c: *mut f32,
        ldc: usize,
        tiles: usize,
        accumulate: bool,
        ep: Epi,
    ) {
        // SAFETY: forwarded caller contract; this function is compiled with the features
        // `Avx2` needs.
        unsafe { tile_body::<Avx2, MR, NV>(kc, a, b, c, ldc, tiles, accumulate, ep) }
    }
}

#[cfg(test)]
mod tests {
    use super::super::convert::{from_bf16, slot};
    use super::*;
    use crate::rng::Rng;
    use crate::workload::Act;

    /// Every kernel this process runs, on whole and clipped tiles, with and without
    /// accumulation and an epilogue, equals the f64 sum of the same bf16 products within
    /// f32 rounding.
    #[test]
    fn every_available_kernel_computes_its_tile() {
        let mut rng = Rng::new(21);
        for uk in KERNELS {
            if !uk.available() {
                println!("skipped {}: not available here", uk.name);
                continue;
            }
            let (mr, nr) = (uk.mr, uk.nr);
            for kc in [1, 3, 64, 257] {
                let tiles = 3;
                let a: Vec<f32> = (0..tiles * mr * kc)
                    .map(|_| super::super::convert::round_bf16(rng.symmetric_f32()))
                    .collect();
                let b: Vec<u16> = (0..kc * nr)
                    .map(|_| super::super::convert::to_bf16(rng.symmetric_f32()))
                    .collect();
                let bias: Vec<f32> = (0..nr).map(|_| rng.symmetric_f32()).collect();
                // Windows: every tile whole, then clipped rows and columns.
                for (rows, cols) in [(tiles * mr, nr), (tiles * mr - 1, nr - 3)] {
                    for (accumulate, act) in [(false, None), (true, Some(Act::Relu))] {
                        let mut c = vec![0.25f32; rows * cols];
                        let mut view = CView::new(&mut c, rows, cols, cols);
                        let ep = act.map(|act| TileEpilogue { bias: &bias, act });
                        uk.tiles(kc, &a, tiles, &b, &mut view, (0, 0), accumulate, ep);
                        for i in 0..rows {
                            for j in 0..cols {
                                let (t, r) = (i / mr, i % mr);
                                let (mut z, mut mag) = (0f64, 0f64);
                                for p in 0..kc {
                                    let x = a[(t * kc + p) * mr + r] as f64
                                        * from_bf16(b[p * nr + slot(j)]) as f64;
                                    z += x;
                                    mag += x.abs();
                                }
                                if accumulate {
                                    z += 0.25;
                                }
                                if let Some(act) = act {
                                    z = act.apply_f64(z + bias[j] as f64);
                                }
                                let tol = 1e-6 * (mag + 1.0) * (kc as f64).sqrt();
                                let got = c[i * cols + j] as f64;
                                assert!(
                                    (got - z).abs() <= tol,
                                    "{} kc {kc} {rows}x{cols} ({i}, {j}): {got} vs {z}",
                                    uk.name
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
