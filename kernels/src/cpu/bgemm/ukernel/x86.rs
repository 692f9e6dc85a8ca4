//! The x86-64 implementations of the bf16 traits and the `#[target_feature]` tiles: AVX2 +
//! FMA and AVX-512F widening, AVX512_BF16 `vdpbf16ps`.
//!
//! The AVX-512 tiles ran and were verified on an AMD Zen 4 (AVX-512F/BW, AVX512_BF16); their
//! bodies are the generic ones that the emulation (`emulate.rs`) runs in tests on every
//! CPU; only the few intrinsics below are specific to them.

use std::arch::x86_64::*;

use super::body::{pair_body, widen_body, DotBf16, PairsA, WidenBf16};
use crate::cpu::gemm::ukernel::avx2::Avx2;
use crate::cpu::gemm::ukernel::avx512::Avx512;
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

impl WidenBf16 for Avx512 {
    #[inline(always)]
    unsafe fn widen_group(p: *const u16) -> (__m512, __m512) {
        // SAFETY: AVX-512F is available and `p` is readable for 32 values (caller contract).
        // Word j holds column j low, column j + 16 high: shifting the word left by 16 gives
        // the low column as an f32, clearing its low half gives the high one.
        unsafe {
            let raw = _mm512_loadu_si512(p.cast());
            let low = _mm512_slli_epi32::<16>(raw);
            let high = _mm512_and_si512(raw, _mm512_set1_epi32(0xFFFF_0000_u32 as i32));
            (_mm512_castsi512_ps(low), _mm512_castsi512_ps(high))
        }
    }
}

/// `vdpbf16ps` on zmm registers (AVX512_BF16), 16 lanes.
pub(crate) struct Vdpbf16ps;

impl DotBf16 for Vdpbf16ps {
    type S = Avx512;
    type P = __m512bh;

    #[inline(always)]
    unsafe fn load_pairs(p: *const u16) -> __m512bh {
        // SAFETY: AVX-512F is available and `p` is readable for 32 values (caller contract);
        // `__m512bh` and `__m512i` are both 64-byte vectors, every bit pattern valid in each.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(p.cast())) }
    }

    #[inline(always)]
    unsafe fn splat_pair(p: *const u32) -> __m512bh {
        // SAFETY: AVX-512F is available and `p` is readable for one word (caller contract);
        // the transmute as in `load_pairs`.
        unsafe {
            let word = _mm512_set1_epi32(p.read_unaligned() as i32);
            std::mem::transmute::<__m512i, __m512bh>(word)
        }
    }

    #[inline(always)]
    unsafe fn dot(acc: __m512, a: __m512bh, b: __m512bh) -> __m512 {
        // SAFETY: AVX-512F and AVX512_BF16 are available (caller contract).
        unsafe { _mm512_dpbf16_ps(acc, a, b) }
    }
}

/// The widening `MR × 8·NV` tile, compiled for AVX2 + FMA.
///
/// # Safety
/// The CPU has AVX2 and FMA; extents as for [`widen_body`] (f32 words in `a`).
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn avx2<const MR: usize, const NV: usize>(
    steps: usize,
    a: *const f32,
    b: *const u16,
    c: *mut f32,
    ldc: usize,
    tiles: usize,
    accumulate: bool,
    ep: Epi,
) {
    // SAFETY: forwarded caller contract; this function is compiled with the features `Avx2`
    // needs.
    unsafe { widen_body::<Avx2, MR, NV>(steps, a, b, c, ldc, tiles, accumulate, ep) }
}

/// The widening `MR × 16·NV` tile, compiled for AVX-512F.
///
/// # Safety
/// The CPU has AVX-512F; extents as for [`widen_body`] (f32 words in `a`).
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn avx512<const MR: usize, const NV: usize>(
    steps: usize,
    a: *const f32,
    b: *const u16,
    c: *mut f32,
    ldc: usize,
    tiles: usize,
    accumulate: bool,
    ep: Epi,
) {
    // SAFETY: forwarded caller contract; this function is compiled with the features
    // `Avx512` needs.
    unsafe { widen_body::<Avx512, MR, NV>(steps, a, b, c, ldc, tiles, accumulate, ep) }
}

/// The pair `MR × 16·NV` tile with `vdpbf16ps`, compiled for AVX-512F + AVX512_BF16 (which
/// implies AVX512BW: [`has_avx512bf16`] checks both).
///
/// # Safety
/// The CPU has AVX-512F, AVX512BW and AVX512_BF16; extents as for [`pair_body`], the 32-bit
/// words of `a` being bf16 pairs.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn avx512bf16<const MR: usize, const NV: usize>(
    steps: usize,
    a: *const f32,
    b: *const u16,
    c: *mut f32,
    ldc: usize,
    tiles: usize,
    accumulate: bool,
    ep: Epi,
) {
    // SAFETY: forwarded caller contract (`a`'s words are read as `u32`, same size and
    // alignment as `f32`); this function is compiled with the features `Vdpbf16ps` needs.
    unsafe {
        let a = PairsA::rows(a.cast(), steps, MR);
        pair_body::<Vdpbf16ps, MR, NV>(steps, a, b, c, ldc, tiles, accumulate, ep)
    }
}

/// Whether the CPU runs AVX512_BF16 code (and AVX512BW, which the target feature implies),
/// detected once; the ISA cap is checked by the caller.
pub(super) fn has_avx512bf16() -> bool {
    static BF16: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *BF16.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512bf16")
    })
}
