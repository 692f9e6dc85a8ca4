//! Plain-Rust micro-kernels for CPUs without a SIMD ISA we target (8-lane arrays that the
//! compiler vectorises for the baseline target).

use super::simd::{bias_act_body, direct_body, packed_body, Epi, Simd};
use super::{DirectFn, PackedFns};

/// Marker for portable code: a "register" is `[f32; 8]`.
pub(crate) struct Portable;

impl Simd for Portable {
    type V = [f32; 8];
    const W: usize = 8;

    #[inline(always)]
    unsafe fn zero() -> [f32; 8] {
        [0.0; 8]
    }
    #[inline(always)]
    unsafe fn splat(p: *const f32) -> [f32; 8] {
        // SAFETY: `p` is readable (caller contract).
        [unsafe { *p }; 8]
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> [f32; 8] {
        // SAFETY: `p` is readable for 8 values (caller contract); `read_unaligned` needs no
        // alignment beyond `f32`'s.
        unsafe { p.cast::<[f32; 8]>().read_unaligned() }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: [f32; 8]) {
        // SAFETY: `p` is writable for 8 values (caller contract).
        unsafe { p.cast::<[f32; 8]>().write_unaligned(v) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: [f32; 8], b: [f32; 8], c: [f32; 8]) -> [f32; 8] {
        std::array::from_fn(|i| a[i] * b[i] + c[i])
    }
    #[inline(always)]
    unsafe fn add(a: [f32; 8], b: [f32; 8]) -> [f32; 8] {
        std::array::from_fn(|i| a[i] + b[i])
    }
    #[inline(always)]
    unsafe fn set1(x: f32) -> [f32; 8] {
        [x; 8]
    }
    #[inline(always)]
    unsafe fn sub(a: [f32; 8], b: [f32; 8]) -> [f32; 8] {
        std::array::from_fn(|i| a[i] - b[i])
    }
    #[inline(always)]
    unsafe fn mul(a: [f32; 8], b: [f32; 8]) -> [f32; 8] {
        std::array::from_fn(|i| a[i] * b[i])
    }
    #[inline(always)]
    unsafe fn div(a: [f32; 8], b: [f32; 8]) -> [f32; 8] {
        std::array::from_fn(|i| a[i] / b[i])
    }
    #[inline(always)]
    unsafe fn max(a: [f32; 8], b: [f32; 8]) -> [f32; 8] {
        // `b` where either is NaN, like the x86 instruction.
        std::array::from_fn(|i| if a[i] > b[i] { a[i] } else { b[i] })
    }
    #[inline(always)]
    unsafe fn min(a: [f32; 8], b: [f32; 8]) -> [f32; 8] {
        std::array::from_fn(|i| if a[i] < b[i] { a[i] } else { b[i] })
    }
    #[inline(always)]
    unsafe fn round(a: [f32; 8]) -> [f32; 8] {
        std::array::from_fn(|i| a[i].round_ties_even())
    }
    #[inline(always)]
    unsafe fn pow2i(n: [f32; 8]) -> [f32; 8] {
        std::array::from_fn(|i| f32::from_bits((((n[i] as i32) + 127) as u32) << 23))
    }
    #[inline(always)]
    unsafe fn shl23(a: [f32; 8]) -> [f32; 8] {
        std::array::from_fn(|i| f32::from_bits(a[i].to_bits() << 23))
    }
    #[inline(always)]
    unsafe fn hsum(a: [f32; 8]) -> f32 {
        a.iter().sum()
    }
    #[inline(always)]
    unsafe fn hmax(a: [f32; 8]) -> f32 {
        a.iter().copied().fold(f32::NEG_INFINITY, f32::max)
    }
    #[inline(always)]
    unsafe fn abs(a: [f32; 8]) -> [f32; 8] {
        std::array::from_fn(|i| a[i].abs())
    }
    #[inline(always)]
    unsafe fn select_lt(a: [f32; 8], b: [f32; 8], x: [f32; 8], y: [f32; 8]) -> [f32; 8] {
        std::array::from_fn(|i| if a[i] < b[i] { x[i] } else { y[i] })
    }
}

/// Packed `MR × 8·NV` tile in plain Rust.
///
/// # Safety
/// The pointers satisfy [`packed_body`]'s contract.
#[allow(clippy::too_many_arguments)]
unsafe fn packed<const MR: usize, const NV: usize, const PA: bool, const PB: bool>(
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    tiles: usize,
    accumulate: bool,
    ep: Epi,
) {
    // SAFETY: forwarded caller contract; `Portable` needs no CPU feature.
    unsafe {
        packed_body::<Portable, MR, NV, PA, PB>(k, a, lda, b, ldb, c, ldc, tiles, accumulate, ep)
    }
}

/// Direct `R × 8·V` tile in plain Rust.
///
/// # Safety
/// The pointers satisfy [`direct_body`]'s contract.
#[allow(clippy::too_many_arguments)]
unsafe fn direct<const R: usize, const V: usize>(
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    tiles: (usize, usize),
    accumulate: bool,
    ep: Epi,
) {
    // SAFETY: forwarded caller contract; `Portable` needs no CPU feature.
    unsafe { direct_body::<Portable, R, V>(k, a, lda, b, ldb, c, ldc, tiles, accumulate, ep) }
}

/// `row[j] = act(row[j] + bias[j])` in plain Rust.
///
/// # Safety
/// The pointers satisfy [`bias_act_body`]'s contract.
pub(super) unsafe fn bias_act(row: *mut f32, bias: *const f32, n: usize, act: u8) {
    // SAFETY: forwarded caller contract; `Portable` needs no CPU feature.
    unsafe { bias_act_body::<Portable>(row, bias, n, act) }
}

packed_builds!();

/// The packed shapes: (MR, NR, the kernel's builds).
pub(super) const PACKED: &[(usize, usize, PackedFns)] =
    &[(4, 8, builds::<4, 1>()), (4, 16, builds::<4, 2>())];

/// The direct tile shapes offered as knob values: (rows, vectors).
pub(super) const DIRECT: &[(usize, usize)] = &[(1, 4), (4, 1), (2, 2)];

/// Largest direct tile (rows, vectors) [`direct_fn`] serves.
pub(super) const DIRECT_MAX: (usize, usize) = (4, 4);

/// The direct kernel for an `r × v` tile (`r ≤ 4`, `v ≤ 4`).
pub(super) fn direct_fn(r: usize, v: usize) -> Option<DirectFn> {
    fn by_v<const R: usize>(v: usize) -> Option<DirectFn> {
        Some(match v {
            1 => direct::<R, 1>,
            2 => direct::<R, 2>,
            3 => direct::<R, 3>,
            4 => direct::<R, 4>,
            _ => return None,
        })
    }
    match r {
        1 => by_v::<1>(v),
        2 => by_v::<2>(v),
        3 => by_v::<3>(v),
        4 => by_v::<4>(v),
        _ => None,
    }
}
