//! AVX-512F micro-kernels (32 zmm registers, 16 lanes).
//!
//! Only compile-checked on machines without AVX-512; they are offered (and run) only where
//! [`Isa::detect`](crate::cpu::Isa::detect) reports `Avx512`.

use std::arch::x86_64::*;

use super::simd::{bias_act_body, direct_body, packed_body, Epi, Simd};
use super::{DirectFn, PackedFns};

/// Marker for 512-bit AVX-512F code.
pub(crate) struct Avx512;

impl Simd for Avx512 {
    type V = __m512;
    const W: usize = 16;

    #[inline(always)]
    unsafe fn zero() -> __m512 {
        // SAFETY: the caller runs on a CPU with AVX-512F.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(p: *const f32) -> __m512 {
        // SAFETY: AVX-512F is available and `p` is readable (caller contract).
        unsafe { _mm512_set1_ps(*p) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        // SAFETY: AVX-512F is available and `p` is readable for 16 values (caller contract).
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        // SAFETY: AVX-512F is available and `p` is writable for 16 values (caller contract).
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn load_first(p: *const f32, n: usize) -> __m512 {
        // SAFETY: AVX-512F is available and `p` is readable for `n ≤ 16` values (caller
        // contract); masked-off lanes are neither read nor able to fault.
        unsafe { _mm512_maskz_loadu_ps(first_lanes(n), p) }
    }
    #[inline(always)]
    unsafe fn store_first(p: *mut f32, v: __m512, n: usize) {
        // SAFETY: AVX-512F is available and `p` is writable for `n ≤ 16` values (caller
        // contract); masked-off lanes are not written.
        unsafe { _mm512_mask_storeu_ps(p, first_lanes(n), v) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: AVX-512F (which includes FMA) is available (caller contract).
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        // SAFETY: AVX-512F is available (caller contract).
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    fn prefetch(p: *const f32) {
        // SAFETY: SSE is part of the x86_64 baseline, and a prefetch never faults, whatever
        // the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
    }
    #[inline(always)]
    unsafe fn set1(x: f32) -> __m512 {
        // SAFETY: AVX-512F is available (caller contract).
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn sub(a: __m512, b: __m512) -> __m512 {
        // SAFETY: AVX-512F is available (caller contract).
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        // SAFETY: AVX-512F is available (caller contract).
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn div(a: __m512, b: __m512) -> __m512 {
        // SAFETY: AVX-512F is available (caller contract).
        unsafe { _mm512_div_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn max(a: __m512, b: __m512) -> __m512 {
        // SAFETY: AVX-512F is available (caller contract).
        unsafe { _mm512_max_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn min(a: __m512, b: __m512) -> __m512 {
        // SAFETY: AVX-512F is available (caller contract).
        unsafe { _mm512_min_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn round(a: __m512) -> __m512 {
        // SAFETY: AVX-512F is available (caller contract).
        unsafe { _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(a) }
    }
    #[inline(always)]
    unsafe fn pow2i(n: __m512) -> __m512 {
        // SAFETY: AVX-512F is available (caller contract); whole numbers in [-127, 127]
        // convert exactly, and n + 127 in [0, 254] shifted into the exponent field is 2^n.
        unsafe {
            let e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
            _mm512_castsi512_ps(_mm512_slli_epi32::<23>(e))
        }
    }
    #[inline(always)]
    unsafe fn shl23(a: __m512) -> __m512 {
        // SAFETY: AVX-512F is available (caller contract).
        unsafe { _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_castps_si512(a))) }
    }
    #[inline(always)]
    unsafe fn hsum(a: __m512) -> f32 {
        // SAFETY: AVX-512F is available (caller contract).
        unsafe { _mm512_reduce_add_ps(a) }
    }
    #[inline(always)]
    unsafe fn hmax(a: __m512) -> f32 {
        // SAFETY: AVX-512F is available (caller contract).
        unsafe { _mm512_reduce_max_ps(a) }
    }
    #[inline(always)]
    unsafe fn abs(a: __m512) -> __m512 {
        // SAFETY: AVX-512F is available (caller contract).
        unsafe { _mm512_abs_ps(a) }
    }
    #[inline(always)]
    unsafe fn select_lt(a: __m512, b: __m512, x: __m512, y: __m512) -> __m512 {
        // SAFETY: AVX-512F is available (caller contract). Ordered, quiet: false for NaN.
        unsafe { _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b), y, x) }
    }
}

/// The mask of the first `n ≤ 16` lanes.
#[inline(always)]
fn first_lanes(n: usize) -> __mmask16 {
    ((1u32 << n) - 1) as __mmask16
}

/// Packed `MR × 16·NV` tile, compiled for AVX-512F.
///
/// # Safety
/// The CPU has AVX-512F, and the pointers satisfy [`packed_body`]'s contract.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn packed<const MR: usize, const NV: usize, const PA: bool, const PB: bool>(
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
    // SAFETY: forwarded caller contract; this function is compiled with the features `Avx512` needs.
    unsafe {
        packed_body::<Avx512, MR, NV, PA, PB>(k, a, lda, b, ldb, c, ldc, tiles, accumulate, ep)
    }
}

/// Direct `R × 16·V` tile, compiled for AVX-512F.
///
/// # Safety
/// The CPU has AVX-512F, and the pointers satisfy [`direct_body`]'s contract.
#[target_feature(enable = "avx512f")]
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
    // SAFETY: forwarded caller contract; this function is compiled with the features `Avx512` needs.
    unsafe { direct_body::<Avx512, R, V>(k, a, lda, b, ldb, c, ldc, tiles, accumulate, ep) }
}

/// `row[j] = act(row[j] + bias[j])`, compiled for AVX-512F.
///
/// # Safety
/// The CPU has AVX-512F, and the pointers satisfy [`bias_act_body`]'s contract.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn bias_act(row: *mut f32, bias: *const f32, n: usize, act: u8) {
    // SAFETY: forwarded caller contract; this function is compiled with the features `Avx512` needs.
    unsafe { bias_act_body::<Avx512>(row, bias, n, act) }
}

packed_builds!();

/// The packed shapes: (MR, NR, the kernel's builds), best first.
/// 6×64 leads: the fewest instructions per multiply-add (6 broadcasts and 4 loads per 24
/// FMAs), the most frequent winner of tuning on an Intel AVX-512 VM, and 1.03–1.08× 14×32 on
/// a Zen 4 (A/B at 128×768×768 and 1024³, one thread).
pub(super) const PACKED: &[(usize, usize, PackedFns)] = &[
    (6, 64, builds::<6, 4>()),
    (14, 32, builds::<14, 2>()),
    (12, 32, builds::<12, 2>()),
    (8, 48, builds::<8, 3>()),
];

/// The direct tile shapes offered as knob values: (rows, vectors).
pub(super) const DIRECT: &[(usize, usize)] = &[(1, 8), (2, 8), (4, 6), (6, 4), (8, 3)];

/// Largest direct tile (rows, vectors) [`direct_fn`] serves.
pub(super) const DIRECT_MAX: (usize, usize) = (8, 8);

/// The direct kernel for an `r × v` tile (`r ≤ 8`, `v ≤ 8`).
pub(super) fn direct_fn(r: usize, v: usize) -> Option<DirectFn> {
    fn by_v<const R: usize>(v: usize) -> Option<DirectFn> {
        Some(match v {
            1 => direct::<R, 1>,
            2 => direct::<R, 2>,
            3 => direct::<R, 3>,
            4 => direct::<R, 4>,
            5 => direct::<R, 5>,
            6 => direct::<R, 6>,
            7 => direct::<R, 7>,
            8 => direct::<R, 8>,
            _ => return None,
        })
    }
    match r {
        1 => by_v::<1>(v),
        2 => by_v::<2>(v),
        3 => by_v::<3>(v),
        4 => by_v::<4>(v),
        5 => by_v::<5>(v),
        6 => by_v::<6>(v),
        7 => by_v::<7>(v),
        8 => by_v::<8>(v),
        _ => None,
    }
}
