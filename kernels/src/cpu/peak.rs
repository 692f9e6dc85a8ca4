//! The measured arithmetic peaks: the GFLOP/s (GOP/s for int8) that GEMM efficiency is
//! quoted against.
//!
//! Each thread runs independent chains of one multiply-add instruction on registers (no
//! memory traffic): the f32 FMA of the best ISA [`Isa::detect`] reports, AVX512_BF16's
//! `vdpbf16ps` or AVX512_VNNI's `vpdpbusd` on zmm registers. Enough chains hide the latency
//! on every current core (latency 4–6 cycles × 2 ports ≤ 12 chains). The AMX units run
//! `tdpbf16ps` / `tdpbusd` into four 16×16 accumulator tiles from four operand tiles
//! (register-resident, as the issue's ≥ 1750 GFLOP/s Sapphire Rapids figure was measured);
//! they have run only on the emulated tile unit (a test), never on a real one.

use std::hint::black_box;
use std::time::Instant;

use super::amx::{TileConfig, TileUnit, Tiles, BYTES_PER_ROW, MAX_ROWS, TILE_BYTES};
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
    /// AMX-BF16 `tdpbf16ps`: a 16×16 f32 tile gains 16 × 16 × 32 bf16 products.
    AmxBf16,
    /// AMX-INT8 `tdpbusd`: a 16×16 i32 tile gains 16 × 16 × 64 u8·s8 products.
    AmxInt8,
}

impl Unit {
    /// Every unit, in the order a report lists them.
    pub const ALL: [Unit; 5] = [
        Unit::F32Fma,
        Unit::Bf16Dot,
        Unit::I8Dot,
        Unit::AmxBf16,
        Unit::AmxInt8,
    ];

    /// What the report calls it.
    pub fn name(self) -> &'static str {
        match self {
            Unit::F32Fma => "f32 FMA",
            Unit::Bf16Dot => "bf16 vdpbf16ps",
            Unit::I8Dot => "int8 vpdpbusd",
            Unit::AmxBf16 => "bf16 AMX tdpbf16ps",
            Unit::AmxInt8 => "int8 AMX tdpbusd",
        }
    }

    /// Whether this process runs the instruction: the checks the bf16 and int8 kernel
    /// families make (the ISA cap included; for AMX, the tile state the OS granted).
    pub fn available(self) -> bool {
        use super::{bgemm::ukernel as bf16, qgemm::ukernel as int8};
        match self {
            Unit::F32Fma => true,
            Unit::Bf16Dot => Isa::Avx512.available() && bf16::has_avx512bf16(),
            Unit::I8Dot => int8::has_vnni(),
            Unit::AmxBf16 => bf16::has_amx_bf16(),
            Unit::AmxInt8 => int8::has_amx_int8(),
        }
    }

    /// Operations per round (a multiply-add counts as 2): [`CHAINS`] vector instructions, or
    /// [`ACC_TILES`] tile ones.
    fn ops_per_round(self) -> f64 {
        let tile = MAX_ROWS * MAX_ROWS * 2;
        match self {
            Unit::F32Fma => (CHAINS * 2 * Isa::detect().f32_lanes()) as f64,
            Unit::Bf16Dot => (CHAINS * 2 * 32) as f64,
            Unit::I8Dot => (CHAINS * 2 * 64) as f64,
            Unit::AmxBf16 => (ACC_TILES * tile * BYTES_PER_ROW / 2) as f64,
            Unit::AmxInt8 => (ACC_TILES * tile * BYTES_PER_ROW) as f64,
        }
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
        #[cfg(target_arch = "x86_64")]
        Unit::AmxBf16 | Unit::AmxInt8 => {
            use super::amx::AsmTiles;
            let mut unit_here = AsmTiles::open().expect("Unit::available: AMX granted");
            tile_dots(&mut unit_here, unit == Unit::AmxInt8, rounds)
        }
        _ => fma(Isa::detect(), rounds),
    }
}

/// Accumulator tiles of the AMX loop (tmm0..tmm3; tmm4, tmm5 hold A, tmm6, tmm7 B).
const ACC_TILES: usize = 4;

/// `rounds` rounds of [`ACC_TILES`] tile dot products (`tdpbusd` with `int8`, else
/// `tdpbf16ps`) on full 16 × 64-byte tiles of ones: every element of `tmm0` gains 64
/// (int8) or 32 (bf16) a round. Returns element 0 of `tmm0`.
fn tile_dots<U: TileUnit>(unit: &mut U, int8: bool, rounds: usize) -> f32 {
    let cfg = (0..8).fold(TileConfig::new(), |c, t| c.tile(t, MAX_ROWS, BYTES_PER_ROW));
    // Bytes of 1 (int8), or bf16 1.0 (0x3f80, little-endian) pairs.
    let ones: Vec<u8> = match int8 {
        true => vec![1; TILE_BYTES],
        false => [0x80u8, 0x3f].repeat(TILE_BYTES / 2),
    };
    let mut t = Tiles::configure(unit, cfg);
    t.load::<4>(&ones, BYTES_PER_ROW);
    t.load::<5>(&ones, BYTES_PER_ROW);
    t.load::<6>(&ones, BYTES_PER_ROW);
    t.load::<7>(&ones, BYTES_PER_ROW);
    for _ in 0..rounds {
        if int8 {
            t.dpbusd::<0, 4, 6>();
            t.dpbusd::<1, 4, 7>();
            t.dpbusd::<2, 5, 6>();
            t.dpbusd::<3, 5, 7>();
        } else {
            t.dpbf16ps::<0, 4, 6>();
            t.dpbf16ps::<1, 4, 7>();
            t.dpbf16ps::<2, 5, 6>();
            t.dpbf16ps::<3, 5, 7>();
        }
    }
    let mut out = vec![0u8; TILE_BYTES];
    t.store::<0>(&mut out, BYTES_PER_ROW);
    let first = [out[0], out[1], out[2], out[3]];
    match int8 {
        true => i32::from_le_bytes(first) as f32,
        false => f32::from_le_bytes(first),
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

/// The portable level's multiply-add, `a·b + c` over 8-lane arrays as its GEMM kernels
/// compute it (`f32::mul_add` measured a libm `fmaf` call per element on a build without
/// FMA: ~1 GFLOP/s where the portable GEMM runs at 28; this loop: 38, on the Zen 4 under
/// `AUTOKERNEL_ISA=portable`). The same operations per round as [`Unit::ops_per_round`]
/// counts: `CHAINS / 4` passes over 4 chains.
fn portable(rounds: usize) -> f32 {
    // 4 × 8 lanes: what 16 SSE registers hold without spilling, enough to hide the latency.
    let mut acc = [[1.0f32; 8]; 4];
    let (x, y) = (black_box(0.999_999f32), black_box(1e-7f32));
    for _ in 0..rounds * (CHAINS / 4) {
        for a in acc.iter_mut() {
            *a = std::array::from_fn(|i| a[i] * x + y);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::amx::Emulated;

    #[test]
    fn the_tile_loop_accumulates_what_its_operation_count_says() {
        // On the emulated unit (every CPU): a round adds K products of ones to each element,
        // K = 64 (int8) or 32 (bf16) — the count ops_per_round is made of.
        for (int8, k) in [(true, 64.0), (false, 32.0)] {
            let got = tile_dots(&mut Emulated::default(), int8, 3);
            assert_eq!(got, 3.0 * k, "int8 {int8}");
        }
        let tile_products = (MAX_ROWS * MAX_ROWS) as f64;
        assert_eq!(
            Unit::AmxInt8.ops_per_round(),
            4.0 * tile_products * 64.0 * 2.0
        );
        assert_eq!(
            Unit::AmxBf16.ops_per_round(),
            4.0 * tile_products * 32.0 * 2.0
        );
    }
}
