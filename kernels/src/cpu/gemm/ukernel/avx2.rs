//! AVX2 + FMA micro-kernels (16 ymm registers, 8 lanes).

use std::arch::x86_64::*;

use super::simd::{bias_act_body, direct_body, packed_body, Epi, Simd};
use super::{DirectFn, PackedFns};

/// Marker for 256-bit AVX2 + FMA code.
pub(crate) struct Avx2;

impl Simd for Avx2 {
    type V = __m256;
    const W: usize = 8;

    #[inline(always)]
    unsafe fn zero() -> __m256 {
        // SAFETY: the caller runs on a CPU with AVX (implied by AVX2).
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(p: *const f32) -> __m256 {
        // SAFETY: AVX is available and `p` is readable (caller contract).
        unsafe { _mm256_broadcast_ss(&*p) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        // SAFETY: AVX is available and `p` is readable for 8 values (caller contract).
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        // SAFETY: AVX is available and `p` is writable for 8 values (caller contract).
        unsafe { _mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn load_first(p: *const f32, n: usize) -> __m256 {
        // SAFETY: AVX2 is available and `p` is readable for `n ≤ 8` values (caller
        // contract); `vmaskmovps` neither reads nor faults on masked-off lanes.
        unsafe { _mm256_maskload_ps(p, first_lanes(n)) }
    }
    #[inline(always)]
    unsafe fn store_first(p: *mut f32, v: __m256, n: usize) {
        // SAFETY: AVX2 is available and `p` is writable for `n ≤ 8` values (caller
        // contract); masked-off lanes are not written.
        unsafe { _mm256_maskstore_ps(p, first_lanes(n), v) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: FMA is available (caller contract).
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX is available (caller contract).
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    fn prefetch(p: *const f32) {
        // SAFETY: SSE is part of the x86_64 baseline, and a prefetch never faults, whatever
        // the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
    }
    #[inline(always)]
    unsafe fn set1(x: f32) -> __m256 {
        // SAFETY: AVX is available (caller contract).
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn sub(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX is available (caller contract).
        unsafe { _mm256_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX is available (caller contract).
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn div(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX is available (caller contract).
        unsafe { _mm256_div_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn max(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX is available (caller contract).
        unsafe { _mm256_max_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn min(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX is available (caller contract).
        unsafe { _mm256_min_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn round(a: __m256) -> __m256 {
        // SAFETY: AVX is available (caller contract).
        unsafe { _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(a) }
    }
    #[inline(always)]
    unsafe fn pow2i(n: __m256) -> __m256 {
        // SAFETY: AVX2 is available (caller contract); whole numbers in [-127, 127] convert
        // exactly, and n + 127 in [0, 254] shifted into the exponent field is 2^n (0.0 for 0).
        unsafe {
            let e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
            _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e))
        }
    }
    #[inline(always)]
    unsafe fn shl23(a: __m256) -> __m256 {
        // SAFETY: AVX2 is available (caller contract).
        unsafe { _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_castps_si256(a))) }
    }
    #[inline(always)]
    unsafe fn hsum(a: __m256) -> f32 {
        // SAFETY: AVX is available (caller contract).
        unsafe {
            let x = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
            let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
            let x = _mm_add_ss(x, _mm_movehdup_ps(x));
            _mm_cvtss_f32(x)
        }
    }
    #[inline(always)]
    unsafe fn hmax(a: __m256) -> f32 {
        // SAFETY: AVX is available (caller contract).
        unsafe {
            let x = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
            let x = _mm_max_ps(x, _mm_movehl_ps(x, x));
            let x = _mm_max_ss(x, _mm_movehdup_ps(x));
            _mm_cvtss_f32(x)
        }
    }
    #[inline(always)]
    unsafe fn abs(a: __m256) -> __m256 {
        // SAFETY: AVX is available (caller contract).
        unsafe { _mm256_andnot_ps(_mm256_set1_ps(-0.0), a) }
    }
    #[inline(always)]
    unsafe fn select_lt(a: __m256, b: __m256, x: __m256, y: __m256) -> __m256 {
        // SAFETY: AVX is available (caller contract). Ordered, quiet: false for NaN.
        unsafe { _mm256_blendv_ps(y, x, _mm256_cmp_ps::<_CMP_LT_OQ>(a, b)) }
    }
}

/// The mask (sign bits) of the first `n ≤ 8` lanes.
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn first_lanes(n: usize) -> __m256i {
    // SAFETY: AVX2 is available (caller contract).
    unsafe {
        _mm256_cmpgt_epi32(
            _mm256_set1_epi32(n as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        )
    }
}

/// Packed `MR × 8·NV` tile, compiled for AVX2 + FMA.
///
/// # Safety
/// The CPU has AVX2 and FMA, and the pointers satisfy [`packed_body`]'s contract.
#[target_feature(enable = "avx2,fma")]
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
    // SAFETY: forwarded caller contract; this function is compiled with the features `Avx2` needs.
    unsafe { packed_body::<Avx2, MR, NV, PA, PB>(k, a, lda, b, ldb, c, ldc, tiles, accumulate, ep) }
}

/// Direct `R × 8·V` tile, compiled for AVX2 + FMA.
///
/// # Safety
/// The CPU has AVX2 and FMA, and the pointers satisfy [`direct_body`]'s contract.
#[target_feature(enable = "avx2,fma")]
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
    // SAFETY: forwarded caller contract; this function is compiled with the features `Avx2` needs.
    unsafe { direct_body::<Avx2, R, V>(k, a, lda, b, ldb, c, ldc, tiles, accumulate, ep) }
}

/// `row[j] = act(row[j] + bias[j])`, compiled for AVX2 + FMA.
///
/// # Safety
/// The CPU has AVX2 and FMA, and the pointers satisfy [`bias_act_body`]'s contract.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn bias_act(row: *mut f32, bias: *const f32, n: usize, act: u8) {
    // SAFETY: forwarded caller contract; this function is compiled with the features `Avx2` needs.
    unsafe { bias_act_body::<Avx2>(row, bias, n, act) }
}

packed_builds!();

/// The packed shapes: (MR, NR, the kernel's builds). Each keeps
/// MR·NR/8 accumulators, NR/8 B vectors
/// and a broadcast within the 16 registers (4×24 and 3×32 need all 16 or 17, and LLVM
/// spills one accumulator into the loop, halving their speed, so they are not offered).
pub(super) const PACKED: &[(usize, usize, PackedFns)] = &[
    (6, 16, builds::<6, 2>()),
    (5, 16, builds::<5, 2>()),
    (4, 16, builds::<4, 2>()),
    (8, 8, builds::<8, 1>()),
];

/// The direct tile shapes offered as knob values: (rows, vectors).
pub(super) const DIRECT: &[(usize, usize)] = &[(1, 8), (1, 4), (2, 4), (4, 3), (4, 2), (6, 2)];

/// Largest direct tile (rows, vectors) [`direct_fn`] serves.
pub(super) const DIRECT_MAX: (usize, usize) = (6, 8);

/// The direct kernel for an `r × v` tile (`r ≤ 6`, `v ≤ 8`).
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
        _ => None,
    }
}
