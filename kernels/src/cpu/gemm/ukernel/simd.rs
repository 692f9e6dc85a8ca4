//! The small SIMD vocabulary the micro-kernel bodies are written in, and the two generic
//! bodies (packed and direct) that every ISA instantiates.
//!
//! The bodies are `#[inline(always)]` and generic over [`Simd`] and the tile shape, so each
//! ISA module only wraps them in a `#[target_feature]` function: after inlining, the
//! intrinsics sit inside a function compiled for that ISA and the accumulator arrays, whose
//! sizes are compile-time constants, are promoted to registers.

use super::erf::{gelu_erf, gelu_erf_scalar};

/// One SIMD register type and the handful of operations a GEMM micro-kernel needs.
///
/// Implementations are zero-sized markers; every method is `#[inline(always)]` and must only
/// be called from code compiled with (or inlined into) the matching target features.
pub(crate) trait Simd {
    /// The register type.
    type V: Copy;
    /// Lanes per register.
    const W: usize;

    /// All lanes zero.
    ///
    /// # Safety
    /// The CPU supports the implementation's ISA.
    unsafe fn zero() -> Self::V;
    /// All lanes set to `*p`.
    ///
    /// # Safety
    /// The CPU supports the ISA; `p` is valid for reading one `f32`.
    unsafe fn splat(p: *const f32) -> Self::V;
    /// `W` lanes from `p` (no alignment needed).
    ///
    /// # Safety
    /// The CPU supports the ISA; `p` is valid for reading `W` `f32`s.
    unsafe fn load(p: *const f32) -> Self::V;
    /// Stores `W` lanes to `p` (no alignment needed).
    ///
    /// # Safety
    /// The CPU supports the ISA; `p` is valid for writing `W` `f32`s.
    unsafe fn store(p: *mut f32, v: Self::V);
    /// The first `n` lanes from `p`, the others zero; nothing past them is read.
    ///
    /// # Safety
    /// The CPU supports the ISA; `1 ≤ n ≤ W`, `p` is valid for reading `n` `f32`s.
    #[inline(always)]
    unsafe fn load_first(p: *const f32, n: usize) -> Self::V {
        debug_assert!(n <= Self::W && Self::W <= 16);
        let mut buf = [0.0f32; 16];
        // SAFETY: `p` is readable for `n ≤ 16` values (caller contract), `buf` holds 16.
        unsafe {
            std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), n);
            Self::load(buf.as_ptr())
        }
    }
    /// Stores the first `n` lanes of `v` to `p`; nothing past them is written.
    ///
    /// # Safety
    /// The CPU supports the ISA; `1 ≤ n ≤ W`, `p` is valid for writing `n` `f32`s.
    #[inline(always)]
    unsafe fn store_first(p: *mut f32, v: Self::V, n: usize) {
        debug_assert!(n <= Self::W && Self::W <= 16);
        let mut buf = [0.0f32; 16];
        // SAFETY: `buf` holds 16 ≥ W values; `p` is writable for `n ≤ 16` (caller contract).
        unsafe {
            Self::store(buf.as_mut_ptr(), v);
            std::ptr::copy_nonoverlapping(buf.as_ptr(), p, n);
        }
    }
    /// `a * b + c`, fused where the ISA has FMA.
    ///
    /// # Safety
    /// The CPU supports the ISA.
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `a + b`.
    ///
    /// # Safety
    /// The CPU supports the ISA.
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// Hints that the cache line holding `p` will be read soon (never faults).
    #[inline(always)]
    fn prefetch(p: *const f32) {
        let _ = p;
    }
    /// All lanes set to `x`.
    ///
    /// # Safety
    /// The CPU supports the ISA.
    unsafe fn set1(x: f32) -> Self::V;
    /// `a - b`.
    ///
    /// # Safety
    /// The CPU supports the ISA.
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    /// `a * b`.
    ///
    /// # Safety
    /// The CPU supports the ISA.
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// `a / b`.
    ///
    /// # Safety
    /// The CPU supports the ISA.
    unsafe fn div(a: Self::V, b: Self::V) -> Self::V;
    /// Lane-wise maximum (`b` where either is NaN).
    ///
    /// # Safety
    /// The CPU supports the ISA.
    unsafe fn max(a: Self::V, b: Self::V) -> Self::V;
    /// Lane-wise minimum (`b` where either is NaN).
    ///
    /// # Safety
    /// The CPU supports the ISA.
    unsafe fn min(a: Self::V, b: Self::V) -> Self::V;
    /// Rounds every lane to the nearest whole number (ties to even).
    ///
    /// # Safety
    /// The CPU supports the ISA.
    unsafe fn round(a: Self::V) -> Self::V;
    /// `2^n` for lanes holding whole numbers `n` in `[-127, 127]`, built in the exponent
    /// field (`n = -127` gives `0.0`).
    ///
    /// # Safety
    /// The CPU supports the ISA.
    unsafe fn pow2i(n: Self::V) -> Self::V;
    /// The bit pattern of every lane shifted left by 23 (into the exponent field).
    ///
    /// # Safety
    /// The CPU supports the ISA.
    unsafe fn shl23(a: Self::V) -> Self::V;
    /// Sum of the lanes.
    ///
    /// # Safety
    /// The CPU supports the ISA.
    unsafe fn hsum(a: Self::V) -> f32;
    /// Largest lane.
    ///
    /// # Safety
    /// The CPU supports the ISA.
    unsafe fn hmax(a: Self::V) -> f32;
    /// `|a|` lane-wise (the sign bit cleared).
    ///
    /// # Safety
    /// The CPU supports the ISA.
    unsafe fn abs(a: Self::V) -> Self::V;
    /// Lane-wise `if a < b { x } else { y }` (`y` where `a` or `b` is NaN).
    ///
    /// # Safety
    /// The CPU supports the ISA.
    unsafe fn select_lt(a: Self::V, b: Self::V, x: Self::V, y: Self::V) -> Self::V;
}

/// `2^f` for `f ∈ [-0.5, 0.5]`: a degree-6 polynomial fitted for relative error (measured
/// maximum 0.81 ε_f32 in f32 Horner arithmetic), exactly 1 at `f = 0`.
const EXP2_POLY: [f32; 7] = [
    1.0,
    std::f32::consts::LN_2,
    0.240_226_46,
    0.055_503_286,
    0.009_618_489,
    0.001_339_993_1,
    0.000_153_458_1,
];

/// `2^x` lane-wise: `x` is clamped to `[-127, 127]`, split into `n + f` with `n` whole and
/// `|f| ≤ 0.5`, and `2^n · p(f)` returned. Relative error below 2 ε_f32 for `x ≥ -126`;
/// below that the result flushes to 0 (so `-∞` gives exactly 0).
///
/// # Safety
/// The CPU supports `S`'s ISA.
#[inline(always)]
pub(crate) unsafe fn exp2<S: Simd>(x: S::V) -> S::V {
    // SAFETY: the caller guarantees the ISA; only register operations follow.
    unsafe {
        let x = S::min(S::max(x, S::set1(-127.0)), S::set1(127.0));
        let n = S::round(x);
        let f = S::sub(x, n);
        let mut p = S::set1(EXP2_POLY[6]);
        for c in EXP2_POLY[..6].iter().rev() {
            p = S::fmadd(p, f, S::set1(*c));
        }
        S::mul(p, S::pow2i(n))
    }
}

/// `2^x` lane-wise for `x ≤ 0` (or `-∞`), as [`exp2`] without the upper clamp: the
/// softmax exponents and erfc's, which are never positive (it stays right for `x < 127.5`,
/// which lanes discarded after it may hold).
///
/// # Safety
/// The CPU supports `S`'s ISA.
#[inline(always)]
pub(crate) unsafe fn exp2_nonpos<S: Simd>(x: S::V) -> S::V {
    // 1.5·2^23 + 127: adding it rounds x ∈ [-127, 0] to a whole number n (the ulp there is
    // 1) and leaves n + 127 in the low mantissa bits, which `shl23` moves into the exponent
    // field of 2^n (the bit 2^22 of 1.5·2^23 is shifted out).
    const MAGIC: f32 = 12_583_039.0;
    // SAFETY: the caller guarantees the ISA; only register operations follow.
    unsafe {
        let x = S::max(x, S::set1(-127.0));
        let t = S::add(x, S::set1(MAGIC));
        let f = S::sub(x, S::sub(t, S::set1(MAGIC)));
        let mut p = S::set1(EXP2_POLY[6]);
        for c in EXP2_POLY[..6].iter().rev() {
            p = S::fmadd(p, f, S::set1(*c));
        }
        S::mul(p, S::shl23(t))
    }
}

/// GELU, tanh form, lane-wise: `0.5·x·(1 + tanh(u)) = x / (1 + e^(-2u))` with
/// `u = √(2/π)·(x + 0.044715·x³)`, using [`exp2`]. Relative error a few ε_f32 (the exp2
/// error enters damped by `σ(2u)·(1-σ(2u)) ≤ 1/4`); saturates to `x` and `-0` far from 0.
///
/// # Safety
/// The CPU supports `S`'s ISA.
#[inline(always)]
pub(crate) unsafe fn gelu<S: Simd>(x: S::V) -> S::V {
    // -2·√(2/π)·log2(e) and the cubic coefficient folded in: t = x·(c1 + c2·x²).
    const C1: f32 = -2.0 * 0.797_884_6 * std::f32::consts::LOG2_E;
    const C2: f32 = C1 * 0.044_715;
    // SAFETY: the caller guarantees the ISA; only register operations follow.
    unsafe {
        let x2 = S::mul(x, x);
        let t = S::mul(x, S::fmadd(x2, S::set1(C2), S::set1(C1)));
        S::div(x, S::add(S::set1(1.0), exp2::<S>(t)))
    }
}

/// GELU in scalar f32, the same formula as [`gelu`] (with `std`'s `exp2`).
pub(crate) fn gelu_scalar(x: f32) -> f32 {
    const C1: f32 = -2.0 * 0.797_884_6 * std::f32::consts::LOG2_E;
    const C2: f32 = C1 * 0.044_715;
    let t = x * (C1 + C2 * x * x);
    x / (1.0 + t.clamp(-127.0, 127.0).exp2())
}

/// The epilogue applied to a tile as it is stored: nothing, or `act(x + bias[col])`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Epi {
    /// Bias for the tile's first column (readable for the tile's width); unused for `NONE`.
    pub bias: *const f32,
    /// [`Epi::NONE_ACT`], [`Epi::BIAS`], [`Epi::RELU`], [`Epi::GELU`] or [`Epi::GELU_ERF`].
    pub act: u8,
}

impl Epi {
    pub const NONE_ACT: u8 = 0;
    pub const RELU: u8 = 1;
    pub const GELU: u8 = 2;
    /// Bias only, no activation.
    pub const BIAS: u8 = 3;
    /// The exact (erf) GELU.
    pub const GELU_ERF: u8 = 4;
    /// No epilogue: plain store.
    pub const NONE: Epi = Epi {
        bias: std::ptr::null(),
        act: Epi::NONE_ACT,
    };
}

/// `act(x + bias)` for one vector, `ACT` one of the [`Epi`] codes.
///
/// # Safety
/// The CPU supports `S`'s ISA; for `ACT ≠ NONE`, `bias` is readable for `W` values.
#[inline(always)]
pub(crate) unsafe fn epilogue<S: Simd, const ACT: u8>(x: S::V, bias: *const f32) -> S::V {
    // SAFETY: the caller guarantees the ISA and `bias`'s extent.
    unsafe {
        match ACT {
            Epi::BIAS => S::add(x, S::load(bias)),
            Epi::RELU => S::max(S::add(x, S::load(bias)), S::zero()),
            Epi::GELU => gelu::<S>(S::add(x, S::load(bias))),
            Epi::GELU_ERF => gelu_erf::<S>(S::add(x, S::load(bias))),
            _ => x,
        }
    }
}

/// [`store_tile_first`] of whole vectors.
///
/// # Safety
/// As [`store_tile_first`] with `last = W`.
#[inline(always)]
pub(crate) unsafe fn store_tile_epi<S: Simd, const R: usize, const V: usize>(
    acc: &[[S::V; V]; R],
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    ep: Epi,
) {
    // SAFETY: forwarded caller contract.
    unsafe { store_tile_first::<S, R, V>(acc, c, ldc, accumulate, ep, S::W) }
}

/// Stores the `R × V` accumulator tile at `c` (row stride `ldc`), adding what is there
/// with `accumulate`, then applies the epilogue `ep` (bias and activation, chosen at run
/// time) over the stored rows. Of the last vector of each row only the first `last` lanes
/// are read and written (`last = W`: all of them).
///
/// The epilogue is a pass of its own over the tile's rows, in L1, rather than applied to the
/// accumulators on their way out: its loops are too long for the compiler to unroll across
/// a whole tile, and accumulators indexed by a loop live in memory — zeroed by a `memset`
/// call before the depth loop and spilled after it, on every tile. Stored plainly, they stay
/// in registers (measured on a Zen 4, one thread, alternating runs: `gemm:64x64x64`
/// 1.08×, `100x100x100` 1.04×, the fused GELU epilogue at `128x3072x768` unchanged).
///
/// # Safety
/// The CPU supports `S`'s ISA; `1 ≤ last ≤ W`; `c + r·ldc + j` is readable and writable for
/// `r < R`, `j < (V-1)·W + last`; unless `ep.act` is none, `ep.bias` is readable for
/// `(V-1)·W + last` values.
#[inline(always)]
unsafe fn store_tile_first<S: Simd, const R: usize, const V: usize>(
    acc: &[[S::V; V]; R],
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    ep: Epi,
    last: usize,
) {
    // SAFETY: the caller guarantees the ISA and the extents (r < R, v < V; the last vector
    // only through its first `last` lanes).
    unsafe {
        for (r, row) in acc.iter().enumerate() {
            let cr = c.add(r * ldc);
            for (v, x) in row.iter().enumerate() {
                let p = cr.add(v * S::W);
                let whole = v + 1 < V || last == S::W;
                let x = match (whole, accumulate) {
                    (true, true) => S::add(S::load(p), *x),
                    (false, true) => S::add(S::load_first(p, last), *x),
                    (_, false) => *x,
                };
                match whole {
                    true => S::store(p, x),
                    false => S::store_first(p, x, last),
                }
            }
        }
        if ep.act != Epi::NONE_ACT {
            let cols = (V - 1) * S::W + last;
            for r in 0..R {
                bias_act_body::<S>(c.add(r * ldc), ep.bias, cols, ep.act);
            }
        }
    }
}

/// `row[j] = act(row[j] + bias[j])` for `j < n`: whole vectors, then the tail in scalar.
///
/// # Safety
/// The CPU supports `S`'s ISA; `row` is readable and writable and `bias` readable for `n`
/// values; `act` is `Epi::BIAS`, `Epi::RELU`, `Epi::GELU` or `Epi::GELU_ERF`.
#[inline(always)]
pub(crate) unsafe fn bias_act_body<S: Simd>(row: *mut f32, bias: *const f32, n: usize, act: u8) {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        match act {
            Epi::GELU => bias_act_rows::<S, { Epi::GELU }>(row, bias, n),
            Epi::GELU_ERF => bias_act_rows::<S, { Epi::GELU_ERF }>(row, bias, n),
            Epi::BIAS => bias_act_rows::<S, { Epi::BIAS }>(row, bias, n),
            _ => bias_act_rows::<S, { Epi::RELU }>(row, bias, n),
        }
    }
}

/// [`bias_act_body`] for the activation `ACT`.
///
/// # Safety
/// As [`bias_act_body`].
#[inline(always)]
unsafe fn bias_act_rows<S: Simd, const ACT: u8>(row: *mut f32, bias: *const f32, n: usize) {
    // SAFETY: the caller guarantees the ISA and the extents; j + 2·W ≤ n, j + W ≤ n in the
    // vector loops.
    unsafe {
        let mut j = 0;
        // Two vectors at a time: GELU's dependency chains are long and the FP scheduler
        // holds about one of them, so independent work must sit side by side in the stream.
        while j + 2 * S::W <= n {
            let p = row.add(j);
            let y0 = epilogue::<S, ACT>(S::load(p), bias.add(j));
            let y1 = epilogue::<S, ACT>(S::load(p.add(S::W)), bias.add(j + S::W));
            S::store(p, y0);
            S::store(p.add(S::W), y1);
            j += 2 * S::W;
        }
        if j + S::W <= n {
            let p = row.add(j);
            S::store(p, epilogue::<S, ACT>(S::load(p), bias.add(j)));
            j += S::W;
        }
        while j < n {
            let z = *row.add(j) + *bias.add(j);
            *row.add(j) = match ACT {
                Epi::GELU => gelu_scalar(z),
                Epi::GELU_ERF => gelu_erf_scalar(z),
                Epi::BIAS => z,
                _ => z.max(0.0),
            };
            j += 1;
        }
    }
}

/// Packed micro-kernel: `tiles` tiles stacked vertically, tile `t` computing
/// `C[t·MR.., MR × NV·W] (+)= A[t] · B_panel` against the same B micro-panel (which stays in
/// L1 while the A tiles stream by).
///
/// With `PA` (packed A), `a` holds `tiles` packed A micro-panels one after the other (each
/// `k` groups of `MR` values, one per row) and `lda` is unused; without, `a` points at
/// `A[i, p0]` of row-major A with row stride `lda`, and tile `t` reads rows `t·MR..` in
/// place (no packing: small problems where the copy costs more than it saves). With `PB`
/// (packed B), `b` is a packed B micro-panel (`k` groups of `NV·W` values) and `ldb` is
/// unused; without, `b` points at `B[p0, j]` of row-major B with row stride `ldb`, read in
/// place. With `accumulate` the tiles are added to C, otherwise C is overwritten; then the
/// epilogue `ep` is applied as each tile is stored.
///
/// # Safety
/// The CPU supports `S`'s ISA; with `PA`, `a` is readable for `tiles·k·MR` values, without,
/// `a + r·lda + p` is readable for `r < tiles·MR`, `p < k`; with `PB`, `b` is readable for
/// `k·NV·W` values, without, `b + p·ldb + j` for `p < k`, `j < NV·W`; `c + r·ldc + j` is
/// writable for every `r < tiles·MR`, `j < NV·W`; unless `ep.act` is none, `ep.bias` is
/// readable for `NV·W` values.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn packed_body<
    S: Simd,
    const MR: usize,
    const NV: usize,
    const PA: bool,
    const PB: bool,
>(
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
    let nr = NV * S::W;
    // Strides of A between rows, between depth steps and between tiles; of B between depth
    // steps.
    let (a_rs, a_ps, a_ts) = if PA {
        (1, MR, MR * k)
    } else {
        (lda, 1, MR * lda)
    };
    let b_ps = if PB { nr } else { ldb };
    // SAFETY (whole body): the caller guarantees the ISA and the extents documented above;
    // every pointer below stays inside them (t < tiles, p < k, r < MR, v < NV).
    unsafe {
        for t in 0..tiles {
            let c = c.add(t * MR * ldc);
            // Fetch the C tile while the k loop runs: its rows are a whole row stride apart
            // and would otherwise miss in every cache at the final update.
            for r in 0..MR {
                S::prefetch(c.add(r * ldc));
                S::prefetch(c.add(r * ldc + nr - 1));
            }
            let mut acc = [[S::zero(); NV]; MR];
            let (mut a, mut b) = (a.add(t * a_ts), b);
            for _ in 0..k / 4 {
                packed_step_strided::<S, MR, NV>(&mut acc, a, a_rs, b);
                packed_step_strided::<S, MR, NV>(&mut acc, a.add(a_ps), a_rs, b.add(b_ps));
                packed_step_strided::<S, MR, NV>(&mut acc, a.add(2 * a_ps), a_rs, b.add(2 * b_ps));
                packed_step_strided::<S, MR, NV>(&mut acc, a.add(3 * a_ps), a_rs, b.add(3 * b_ps));
                a = a.add(4 * a_ps);
                b = b.add(4 * b_ps);
            }
            for _ in 0..k % 4 {
                packed_step_strided::<S, MR, NV>(&mut acc, a, a_rs, b);
                a = a.add(a_ps);
                b = b.add(b_ps);
            }
            store_tile_epi::<S, MR, NV>(&acc, c, ldc, accumulate, ep);
        }
    }
}

/// One k step of [`packed_body`] and the attention scores tile: NV vectors of B, MR
/// broadcasts of A `a_rs` apart (1 for a packed A micro-panel, the row stride for A in
/// place), MR·NV FMAs ([`direct_step`] of whole vectors).
///
/// # Safety
/// The CPU supports `S`'s ISA; `a + r·a_rs` is readable for `r < MR` and `b` for `NV·W`
/// values.
#[inline(always)]
pub(crate) unsafe fn packed_step_strided<S: Simd, const MR: usize, const NV: usize>(
    acc: &mut [[S::V; NV]; MR],
    a: *const f32,
    a_rs: usize,
    b: *const f32,
) {
    // SAFETY: forwarded caller contract (whole vectors: nothing clipped).
    unsafe { direct_step::<S, MR, NV, false>(acc, a, a_rs, b, S::W) }
}

/// Below this many accumulators a direct tile splits its depth over two sets of them: one
/// FMA chain per accumulator, and two FMA pipes of 4-cycle latency need 8 chains in flight.
const DIRECT_CHAINS: usize = 8;

/// Direct (unpacked) micro-kernel: `tiles` tiles side by side, each
/// `C[R × V·W] (+)= A[R × k] · B[k × V·W]`, reading row-major A (row stride `lda`) and B
/// (row stride `ldb`) in place. Tile `t` covers columns `t·V·W..(t+1)·V·W` of B, C and the
/// bias; sweeping them in one call keeps the per-tile cost to the loop itself. Of the last
/// tile's last vector only the first `last` lanes are read (B, C, bias) and written (an
/// edge `(V-1)·W + last` columns wide, without a copy); `last = W` for whole tiles.
///
/// # Safety
/// The CPU supports `S`'s ISA; `1 ≤ last ≤ W`; with `cols = tiles·V·W - (W - last)`:
/// `a + r·lda + p` is readable for `r < R`, `p < k`; `b + p·ldb + j` is readable for
/// `p < k`, `j < cols`; `c + r·ldc + j` is writable for `r < R`, `j < cols`; unless `ep.act`
/// is none, `ep.bias` is readable for `cols` values.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn direct_body<S: Simd, const R: usize, const V: usize>(
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    (tiles, last): (usize, usize),
    accumulate: bool,
    ep: Epi,
) {
    // SAFETY (whole body): the caller guarantees the ISA and the extents documented above;
    // every pointer below stays inside them (t < tiles, p < k, r < R, v < V).
    unsafe {
        let whole = if last == S::W { tiles } else { tiles - 1 };
        for t in 0..tiles {
            let off = t * V * S::W;
            let ep_t = Epi {
                bias: ep.bias.wrapping_add(off),
                act: ep.act,
            };
            let (b, c) = (b.add(off), c.add(off));
            if t < whole {
                direct_tile::<S, R, V, false>(k, a, lda, b, ldb, c, ldc, S::W, accumulate, ep_t);
            } else {
                direct_tile::<S, R, V, true>(k, a, lda, b, ldb, c, ldc, last, accumulate, ep_t);
            }
        }
    }
}

/// One tile of [`direct_body`]; with `CLIP`, the last vector is read and written through
/// its first `last` lanes only.
///
/// # Safety
/// As [`direct_body`] for one tile.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn direct_tile<S: Simd, const R: usize, const V: usize, const CLIP: bool>(
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    last: usize,
    accumulate: bool,
    ep: Epi,
) {
    let last = if CLIP { last } else { S::W };
    // SAFETY: forwarded caller contract (p < k, r < R, v < V, the last vector clipped).
    unsafe {
        let mut acc = [[S::zero(); V]; R];
        let mut bp = b;
        let mut p = 0;
        if R * V < DIRECT_CHAINS {
            // Too few accumulators to cover the FMA latency: even and odd depths go to
            // two sets, added at the end (measured on a Zen 4: the 6×1 edge tile of a
            // 100-column GEMM took 21% of `gemm:100x100x100` for 4% of its columns).
            let mut odd = [[S::zero(); V]; R];
            while p + 1 < k {
                direct_step::<S, R, V, CLIP>(&mut acc, a.add(p), lda, bp, last);
                direct_step::<S, R, V, CLIP>(&mut odd, a.add(p + 1), lda, bp.add(ldb), last);
                (p, bp) = (p + 2, bp.add(2 * ldb));
            }
            for (row, o) in acc.iter_mut().zip(&odd) {
                for (x, y) in row.iter_mut().zip(o) {
                    *x = S::add(*x, *y);
                }
            }
        }
        for p in p..k {
            direct_step::<S, R, V, CLIP>(&mut acc, a.add(p), lda, bp, last);
            bp = bp.add(ldb);
        }
        store_tile_first::<S, R, V>(&acc, c, ldc, accumulate, ep, last);
    }
}

/// One k step of a tile: V vectors of B, R broadcasts of A `a_rs` apart, R·V FMAs; under
/// `CLIP`, the last B vector read through its first `last` lanes (the others zero).
///
/// # Safety
/// The CPU supports `S`'s ISA; `a + r·a_rs` is readable for `r < R` and `b` for V·W values,
/// `(V-1)·W + last` under `CLIP`.
#[inline(always)]
unsafe fn direct_step<S: Simd, const R: usize, const V: usize, const CLIP: bool>(
    acc: &mut [[S::V; V]; R],
    a: *const f32,
    a_rs: usize,
    b: *const f32,
    last: usize,
) {
    // SAFETY: the caller guarantees the ISA and the extents (r < R, v < V).
    unsafe {
        let mut bv = [S::zero(); V];
        for (v, x) in bv.iter_mut().enumerate() {
            *x = if CLIP && v + 1 == V {
                S::load_first(b.add(v * S::W), last)
            } else {
                S::load(b.add(v * S::W))
            };
        }
        for (r, row) in acc.iter_mut().enumerate() {
            let ar = S::splat(a.add(r * a_rs));
            for v in 0..V {
                row[v] = S::fmadd(ar, bv[v], row[v]);
            }
        }
    }
}
