//! The measured FMA peak: the GFLOP/s that GEMM efficiency is quoted against.
//!
//! Each thread runs independent chains of fused multiply-adds on registers (no memory
//! traffic) with the best ISA [`Isa::detect`] reports; enough chains hide the FMA latency on
//! every current core (latency 4–5 cycles × 2 FMA ports ≤ 10 < 12 chains).

use std::hint::black_box;
use std::time::Instant;

use super::Isa;

/// Independent accumulator chains per thread.
const CHAINS: usize = 12;
/// FMA rounds per timing check.
const ROUNDS: usize = 1 << 16;

/// Total GFLOP/s of `threads` threads each running an FMA loop for about `seconds`
/// (an FMA counts as 2 flops).
pub fn fma_peak_gflops(threads: usize, seconds: f64) -> f64 {
    let threads = threads.max(1);
    let start = Instant::now();
    let flops: f64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| s.spawn(move || one_thread(seconds)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("peak thread"))
            .sum()
    });
    flops / start.elapsed().as_secs_f64() / 1e9
}

/// Flops done by this thread in about `seconds`.
fn one_thread(seconds: f64) -> f64 {
    let isa = Isa::detect();
    let per_round = 2.0 * CHAINS as f64 * isa.f32_lanes() as f64;
    let start = Instant::now();
    let mut rounds = 0usize;
    let mut sink = 0.0f32;
    loop {
        sink += run(isa, black_box(ROUNDS));
        rounds += ROUNDS;
        if start.elapsed().as_secs_f64() >= seconds {
            break;
        }
    }
    black_box(sink);
    rounds as f64 * per_round
}

/// `rounds` rounds of `CHAINS` vector FMAs; returns a value derived from every chain.
fn run(isa: Isa, rounds: usize) -> f32 {
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
}
