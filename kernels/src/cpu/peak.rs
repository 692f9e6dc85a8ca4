//! The measured arithmetic peaks: the GFLOP/s (GOP/s for int8) that GEMM efficiency is
//! quoted against.
//!
//! Each thread runs independent chains of one multiply-add instruction on registers (no
//! memory traffic): the f32 FMA of the best ISA [`Isa::detect`] reports, AVX512_BF16's
//! `vdpbf16ps` or AVX512_VNNI's `vpdpbusd` on zmm registers. Enough chains hide the latency
//! on every current core (latency 4–6 cycles × 2 ports ≤ 12 chains).

use std::hint::black_box;
use std::time::Instant;

use super::Isa;

/// Independent accumulator chains per thread.
const CHAINS: usize = 12;
/// FMA rounds per timing check.
const ROUNDS: usize = 1 << 16;

/// The multiply-add instruction a peak is measured with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// f32 fused multiply-add of the best ISA level (portable `mul_add` below AVX2).
    F32Fma,
    /// AVX512_BF16 `vdpbf16ps` on zmm: 16 lanes × 2 bf16 products added to an f32 lane.
    Bf16Dot,
    /// AVX512_VNNI `vpdpbusd` on zmm: 16 lanes × 4 u8·s8 products added to an i32 lane.
    I8Dot,
}

impl Unit {
    /// Every unit, in the order a report lists them.
    pub const ALL: [Unit; 3] = [Unit::F32Fma, Unit::Bf16Dot, Unit::I8Dot];

    /// What the report calls it.
    pub fn name(self) -> &'static str {
        match self {
            Unit::F32Fma => "f32 FMA",
            Unit::Bf16Dot => "bf16 vdpbf16ps",
            Unit::I8Dot => "int8 vpdpbusd",
        }
    }

    /// Whether this CPU runs the instruction (under the process's ISA cap for the FMA).
    pub fn available(self) -> bool {
        match self {
            Unit::F32Fma => true,
            #[cfg(target_arch = "x86_64")]
            Unit::Bf16Dot => {
                Isa::Avx512.available() && std::arch::is_x86_feature_detected!("avx512bf16")
            }
            #[cfg(target_arch = "x86_64")]
            Unit::I8Dot => {
                Isa::Avx512.available() && std::arch::is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Operations per round of [`CHAINS`] instructions (a multiply-add counts as 2).
    fn ops_per_round(self) -> f64 {
        let per_instruction = match self {
            Unit::F32Fma => 2 * Isa::detect().f32_lanes(),
            Unit::Bf16Dot => 2 * 32,
            Unit::I8Dot => 2 * 64,
        };
        (CHAINS * per_instruction) as f64
    }
}

/// Total GFLOP/s of `threads` threads each running an FMA loop for about `seconds`
/// (an FMA counts as 2 flops).
pub fn fma_peak_gflops(threads: usize, seconds: f64) -> f64 {
    peak_gflops(Unit::F32Fma, threads, seconds).unwrap_or(0.0)
}

/// Total GFLOP/s (GOP/s for [`Unit::I8Dot`]) of `threads` threads each running `unit`'s
/// loop for about `seconds`; `None` where the CPU lacks the instruction.
pub fn peak_gflops(unit: Unit, threads: usize, seconds: f64) -> Option<f64> {
    if !unit.available() {
        return None;
    }
    let threads = threads.max(1);
    let start = Instant::now();
    let ops: f64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| s.spawn(move || one_thread(unit, seconds)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("peak thread"))
            .sum()
    });
    Some(ops / start.elapsed().as_secs_f64() / 1e9)
}

/// Operations done by this thread in about `seconds`.
fn one_thread(unit: Unit, seconds: f64) -> f64 {
    let start = Instant::now();
    let mut rounds = 0usize;
    let mut sink = 0.0f32;
    loop {
        sink += run(unit, black_box(ROUNDS));
        rounds += ROUNDS;
        if start.elapsed().as_secs_f64() >= seconds {
            break;
        }
    }
    black_box(sink);
    rounds as f64 * unit.ops_per_round()
}

/// `rounds` rounds of `CHAINS` instructions of `unit` (which this CPU runs); returns a value
/// derived from every chain.
fn run(unit: Unit, rounds: usize) -> f32 {
    match unit {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Unit::available` reported AVX-512F and AVX512_BF16.
        Unit::Bf16Dot => unsafe { x86::bf16_dot(rounds) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Unit::available` reported AVX-512F and AVX512_VNNI.
        Unit::I8Dot => unsafe { x86::i8_dot(rounds) },
        _ => fma(Isa::detect(), rounds),
    }
}

/// `rounds` rounds of `CHAINS` vector FMAs of `isa`; returns a value derived from every chain.
fn fma(isa: Isa, rounds: usize) -> f32 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` reported AVX-512F.
        Isa::Avx512 => unsafe { x86::avx512(rounds) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` reported AVX2 and FMA.
        Isa::Avx2 => unsafe { x86::avx2(rounds) },
        _ => portable(rounds),
    }
}

fn portable(rounds: usize) -> f32 {
    let mut acc = [[1.0f32; 8]; CHAINS];
    let (x, y) = (black_box(0.999_999f32), black_box(1e-7f32));
    for _ in 0..rounds {
        for a in acc.iter_mut() {
            for l in a.iter_mut() {
                *l = l.mul_add(x, y);
            }
        }
    }
    acc.iter().flatten().sum()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::hint::black_box;
    use std::mem::transmute;

    use super::CHAINS;

    /// # Safety
    /// The CPU supports AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn avx2(rounds: usize) -> f32 {
        let x = _mm256_set1_ps(black_box(0.999_999));
        let y = _mm256_set1_ps(black_box(1e-7));
        let mut acc = [_mm256_set1_ps(1.0); CHAINS];
        for _ in 0..rounds {
            for a in acc.iter_mut() {
                *a = _mm256_fmadd_ps(*a, x, y);
            }
        }
        let mut s = _mm256_setzero_ps();
        for a in acc {
            s = _mm256_add_ps(s, a);
        }
        let mut out = [0.0f32; 8];
        // SAFETY: `out` holds 8 writable f32s; AVX is enabled for this function.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), s) };
        out.iter().sum()
    }

    /// # Safety
    /// The CPU supports AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn avx512(rounds: usize) -> f32 {
        let x = _mm512_set1_ps(black_box(0.999_999));
        let y = _mm512_set1_ps(black_box(1e-7));
        let mut acc = [_mm512_set1_ps(1.0); CHAINS];
        for _ in 0..rounds {
            for a in acc.iter_mut() {
                *a = _mm512_fmadd_ps(*a, x, y);
            }
        }
        let mut s = _mm512_setzero_ps();
        for a in acc {
            s = _mm512_add_ps(s, a);
        }
        _mm512_reduce_add_ps(s)
    }

    /// # Safety
    /// The CPU supports AVX-512F and AVX512_BF16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn bf16_dot(rounds: usize) -> f32 {
        // Pairs of bf16 1.0 (0x3f80): every product is 1.
        let one = _mm512_set1_epi32(black_box(0x3f80_3f80));
        // SAFETY: both are 64-byte vectors of plain bits.
        let a = unsafe { transmute::<__m512i, __m512bh>(one) };
        let b = a;
        let mut acc = [_mm512_setzero_ps(); CHAINS];
        for _ in 0..rounds {
            for x in acc.iter_mut() {
                *x = _mm512_dpbf16_ps(*x, a, b);
            }
        }
        let mut s = _mm512_setzero_ps();
        for x in acc {
            s = _mm512_add_ps(s, x);
        }
        _mm512_reduce_add_ps(s)
    }

    /// # Safety
    /// The CPU supports AVX-512F and AVX512_VNNI.
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub(super) unsafe fn i8_dot(rounds: usize) -> f32 {
        let a = _mm512_set1_epi8(black_box(1));
        let b = _mm512_set1_epi8(black_box(1));
        let mut acc = [_mm512_setzero_si512(); CHAINS];
        for _ in 0..rounds {
            for x in acc.iter_mut() {
                *x = _mm512_dpbusd_epi32(*x, a, b);
            }
        }
        let mut s = _mm512_setzero_si512();
        for x in acc {
            s = _mm512_add_epi32(s, x);
        }
        _mm512_reduce_add_epi32(s) as f32
    }
}
