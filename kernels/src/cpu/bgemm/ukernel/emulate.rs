//! The AVX-512 vocabulary of the bf16 kernels emulated in plain Rust (tests only), so the
//! AVX-512 tiles' bodies, with their tile shapes and layouts, run on every CPU.
//!
//! - [`Emu16`]: 16 f32 lanes, every operation done on two halves by the portable 8-lane
//!   vocabulary (so the epilogues compute exactly what the portable kernels do).
//! - `WidenBf16 for Emu16`: a group of 32 bf16 values to two 16-lane vectors, as
//!   `vpslld 16` / `vpandd` do on the zmm load of [`super::x86`].
//! - [`EmuDp`]: `vdpbf16ps` lane by lane, [`dpbf16_lane`].
//! - The AMX twins: the AMX tile body ([`super::amx`]) on the emulated tile unit
//!   ([`crate::cpu::amx::Emulated`], whose `tdpbf16ps` follows the SDM the same way).
//!
//! `vdpbf16ps` as emulated, from the Intel SDM (Vol. 2, "VDPBF16PS — Dot Product of BF16
//! Pairs Accumulated into Packed Single Precision"; the same text is on felixcloutier.com):
//! for each f32 lane `i`, with `make_fp32(x)` the bf16 `x` in the upper 16 bits of an f32,
//!
//! ```text
//! srcdest.fp32[i] += make_fp32(src1.bf16[2i+1]) * make_fp32(src2.bf16[2i+1])
//! srcdest.fp32[i] += make_fp32(src1.bf16[2i+0]) * make_fp32(src2.bf16[2i+0])
//! ```
//!
//! each line an FP32 FMA (the product is exact: two 8-bit significands) rounded to nearest
//! even, "with DAZ in, FTZ out": input denormals are treated as zero, output denormals are
//! flushed to zero, MXCSR is neither consulted nor updated. So the high pair is added first,
//! then the low pair, with one rounding each. Here, "input" covers the bf16 operands and the
//! accumulator; a flushed value keeps its sign; an output is flushed when its rounded value
//! is subnormal. Not emulated: which NaN's payload propagates (the SDM's priority table) —
//! a NaN in gives a NaN out, which is all the kernels' tests look at.
//!
//! The real instruction is checked against the f64 reference on AVX512_BF16 machines, not
//! against this emulation bit for bit (the development machine could not confirm that the
//! hardware matches the SDM's text in every rounding).

use super::amx::tile;
use super::body::{pair_body, widen_body, DotBf16, PairsA, WidenBf16};
use super::{Bf16Kernel, TileFn};
use crate::cpu::amx::tiled::{Square, Tall, Wide};
use crate::cpu::amx::Emulated;
use crate::cpu::bgemm::convert::from_bf16;
use crate::cpu::bgemm::layout::Layout;
use crate::cpu::gemm::ukernel::portable::Portable;
use crate::cpu::gemm::ukernel::simd::{Epi, Simd};
use crate::cpu::Isa;

/// A 16-lane f32 "register" in plain Rust (the zmm width).
pub(crate) struct Emu16;

type V16 = [f32; 16];

fn lo(v: V16) -> [f32; 8] {
    std::array::from_fn(|i| v[i])
}

fn hi(v: V16) -> [f32; 8] {
    std::array::from_fn(|i| v[8 + i])
}

fn join(l: [f32; 8], h: [f32; 8]) -> V16 {
    std::array::from_fn(|i| if i < 8 { l[i] } else { h[i - 8] })
}

/// A lane-wise operation of [`Emu16`] done by [`Portable`] on each half.
macro_rules! by_halves {
    ($name:ident($($arg:ident),+)) => {
        #[inline(always)]
        unsafe fn $name($($arg: V16),+) -> V16 {
            // SAFETY: `Portable` needs no CPU feature.
            unsafe { join(Portable::$name($(lo($arg)),+), Portable::$name($(hi($arg)),+)) }
        }
    };
}

impl Simd for Emu16 {
    type V = V16;
    const W: usize = 16;

    #[inline(always)]
    unsafe fn zero() -> V16 {
        [0.0; 16]
    }
    #[inline(always)]
    unsafe fn splat(p: *const f32) -> V16 {
        // SAFETY: `p` is readable (caller contract).
        [unsafe { *p }; 16]
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> V16 {
        // SAFETY: `p` is readable for 16 values (caller contract).
        unsafe { p.cast::<V16>().read_unaligned() }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: V16) {
        // SAFETY: `p` is writable for 16 values (caller contract).
        unsafe { p.cast::<V16>().write_unaligned(v) }
    }
    #[inline(always)]
    unsafe fn set1(x: f32) -> V16 {
        [x; 16]
    }
    by_halves!(fmadd(a, b, c));
    by_halves!(add(a, b));
    by_halves!(sub(a, b));
    by_halves!(mul(a, b));
    by_halves!(div(a, b));
    by_halves!(max(a, b));
    by_halves!(min(a, b));
    by_halves!(round(a));
    by_halves!(pow2i(a));
    by_halves!(shl23(a));
    by_halves!(abs(a));
    by_halves!(select_lt(a, b, x, y));
    #[inline(always)]
    unsafe fn hsum(a: V16) -> f32 {
        // SAFETY: `Portable` needs no CPU feature.
        unsafe { Portable::hsum(lo(a)) + Portable::hsum(hi(a)) }
    }
    #[inline(always)]
    unsafe fn hmax(a: V16) -> f32 {
        // SAFETY: `Portable` needs no CPU feature.
        unsafe { Portable::hmax(lo(a)).max(Portable::hmax(hi(a))) }
    }
}

impl WidenBf16 for Emu16 {
    #[inline(always)]
    unsafe fn widen_group(p: *const u16) -> (V16, V16) {
        // SAFETY: `p` is readable for 32 values (caller contract).
        let g = unsafe { p.cast::<[u16; 32]>().read_unaligned() };
        // Word j = g[2j] (low half) | g[2j + 1] (high half), little-endian as on x86.
        let word = |j: usize| u32::from(g[2 * j]) | u32::from(g[2 * j + 1]) << 16;
        (
            std::array::from_fn(|j| f32::from_bits(word(j) << 16)),
            std::array::from_fn(|j| f32::from_bits(word(j) & 0xFFFF_0000)),
        )
    }
}

/// `x`, or a zero of its sign if it is subnormal (DAZ on an input, FTZ on an output).
fn flush(x: f32) -> f32 {
    if x.is_subnormal() {
        f32::from_bits(x.to_bits() & 0x8000_0000)
    } else {
        x
    }
}

/// One f32 lane of `vdpbf16ps` (see the module docs): `acc` plus the products of the high
/// halves of the 32-bit words `a` and `b`, then of their low halves, each step one FMA
/// rounded to nearest even, denormal inputs read as zero and denormal results flushed.
pub(crate) fn dpbf16_lane(acc: f32, a: u32, b: u32) -> f32 {
    let bf = |w: u32, shift: u32| flush(from_bf16((w >> shift) as u16));
    let t = flush(bf(a, 16).mul_add(bf(b, 16), flush(acc)));
    flush(bf(a, 0).mul_add(bf(b, 0), t))
}

/// `vdpbf16ps` on a 16-lane [`Emu16`] accumulator.
pub(crate) struct EmuDp;

impl DotBf16 for EmuDp {
    type S = Emu16;
    type P = [u32; 16];

    #[inline(always)]
    unsafe fn load_pairs(p: *const u16) -> [u32; 16] {
        // SAFETY: `p` is readable for 32 values (caller contract).
        let g = unsafe { p.cast::<[u16; 32]>().read_unaligned() };
        std::array::from_fn(|j| u32::from(g[2 * j]) | u32::from(g[2 * j + 1]) << 16)
    }
    #[inline(always)]
    unsafe fn splat_pair(p: *const u32) -> [u32; 16] {
        // SAFETY: `p` is readable for one word (caller contract).
        [unsafe { p.read_unaligned() }; 16]
    }
    #[inline(always)]
    unsafe fn dot(acc: V16, a: [u32; 16], b: [u32; 16]) -> V16 {
        std::array::from_fn(|i| dpbf16_lane(acc[i], a[i], b[i]))
    }
}

/// The emulated widening `MR × 16·NV` tile.
///
/// # Safety
/// As [`widen_body`] with `NV·16` columns.
#[allow(clippy::too_many_arguments)]
unsafe fn widen<const MR: usize, const NV: usize>(
    steps: usize,
    a: *const f32,
    b: *const u16,
    c: *mut f32,
    ldc: usize,
    tiles: usize,
    accumulate: bool,
    ep: Epi,
) {
    // SAFETY: forwarded caller contract; the emulation needs no CPU feature.
    unsafe { widen_body::<Emu16, MR, NV>(steps, a, b, c, ldc, tiles, accumulate, ep) }
}

/// The emulated `vdpbf16ps` `MR × 16·NV` tile.
///
/// # Safety
/// As [`pair_body`] with `NV·16` columns, `a`'s words being bf16 pairs.
#[allow(clippy::too_many_arguments)]
unsafe fn pairs<const MR: usize, const NV: usize>(
    steps: usize,
    a: *const f32,
    b: *const u16,
    c: *mut f32,
    ldc: usize,
    tiles: usize,
    accumulate: bool,
    ep: Epi,
) {
    // SAFETY: forwarded caller contract (words read as `u32`, same size and alignment as
    // `f32`); the emulation needs no CPU feature.
    unsafe {
        let a = PairsA::rows(a.cast(), steps, MR);
        pair_body::<EmuDp, MR, NV>(steps, a, b, c, ldc, tiles, accumulate, ep)
    }
}

const fn twin(name: &'static str, mr: usize, nr: usize, layout: Layout, f: TileFn) -> Bf16Kernel {
    Bf16Kernel::new(name, mr, nr, Isa::Portable, false, layout, f)
}

/// An emulated AMX twin: the AMX tile body on the emulated tile unit (which follows the SDM's
/// `tdpbf16ps`: [`crate::cpu::amx::Emulated`]).
const fn amx_twin(name: &'static str, mr: usize, nr: usize, f: TileFn) -> Bf16Kernel {
    Bf16Kernel::tiled(name, mr, nr, Isa::Portable, false, f)
}

/// The emulated twin of every AVX-512 and AMX kernel: `emu_` and the kernel's name, the same
/// tile shape and layouts, the same body over the emulated vocabulary or tile unit. Runs on
/// every CPU; never offered.
pub(crate) static EMULATED: &[Bf16Kernel] = &[
    amx_twin("emu_amx_bf16_32x32", 32, 32, tile::<Emulated, Square, 16>),
    amx_twin("emu_amx_bf16_16x64", 16, 64, tile::<Emulated, Wide, 16>),
    amx_twin("emu_amx_bf16_64x16", 64, 16, tile::<Emulated, Tall, 16>),
    amx_twin("emu_amx_bf16_8x64", 8, 64, tile::<Emulated, Wide, 8>),
    twin(
        "emu_avx512bf16_12x32",
        12,
        32,
        Layout::Pairs,
        pairs::<12, 2>,
    ),
    twin("emu_avx512bf16_4x64", 4, 64, Layout::Pairs, pairs::<4, 4>),
    twin("emu_avx512bf16_2x64", 2, 64, Layout::Pairs, pairs::<2, 4>),
    twin("emu_avx512bf16_1x128", 1, 128, Layout::Pairs, pairs::<1, 8>),
    twin("emu_avx512bf16_1x64", 1, 64, Layout::Pairs, pairs::<1, 4>),
    twin("emu_avx512_12x32", 12, 32, Layout::Widen32, widen::<12, 2>),
    twin("emu_avx512_4x64", 4, 64, Layout::Widen32, widen::<4, 4>),
    twin("emu_avx512_2x64", 2, 64, Layout::Widen32, widen::<2, 4>),
    twin("emu_avx512_1x128", 1, 128, Layout::Widen32, widen::<1, 8>),
    twin("emu_avx512_1x64", 1, 64, Layout::Widen32, widen::<1, 4>),
];

/// The emulated twin of `k`, if it has one.
pub(crate) fn twin_of(k: &Bf16Kernel) -> Option<&'static Bf16Kernel> {
    EMULATED
        .iter()
        .find(|e| e.name.strip_prefix("emu_") == Some(k.name))
}

/// The AMX body on the emulated tile unit with tile rows the real kernels do not use (odd
/// counts, one row): the same body, other accumulator-tile shapes.
pub(crate) static AMX_ODD_ROWS: &[Bf16Kernel] = &[
    amx_twin(
        "emu_amx_bf16_6x32 (rows 3)",
        6,
        32,
        tile::<Emulated, Square, 3>,
    ),
    amx_twin(
        "emu_amx_bf16_1x64 (rows 1)",
        1,
        64,
        tile::<Emulated, Wide, 1>,
    ),
    amx_twin(
        "emu_amx_bf16_20x16 (rows 5)",
        20,
        16,
        tile::<Emulated, Tall, 5>,
    ),
];
