//! `erf` and the exact GELU `x·Φ(x) = 0.5·x·(1 + erf(x/√2))`, lane-wise over the [`Simd`]
//! vocabulary (so one body serves AVX-512, AVX2 and portable code) and in scalar.
//!
//! Two pieces, split at `|z| = T = 0.9`, both near-minimax polynomials fitted by
//! `scripts/fit-erf.py` (which prints these constants) against a 40-digit erf:
//!
//! - near, `|z| < T`: `erf(z) = z + z·P(z²)`, P of degree 6 (small, so its rounding errors
//!   are damped by the final add) — tiny arguments keep their relative precision;
//! - far, `T ≤ t = |z| < 4.5`: `erfc(t) = 2^(R(v) − t²·log2 e)` with `v = (t − 2.7)/1.8` in
//!   `[-1, 1]` and R of degree 10 fitted to `log2 erfc(t) + t²·log2 e` (a slowly varying
//!   function of about −1 to −4), then `erf(z) = ±(1 − erfc(t))`; from `t = 4.5` on,
//!   `erfc(t) < 2.1e-10` is taken as 0.
//!
//! Both polynomials are evaluated by Estrin's scheme ([`estrin7`], [`estrin11`]): the same
//! terms as Horner's rule, paired so that the dependent chain is 3 and 4 FMAs long instead
//! of 6 and 10. Measured in f32 arithmetic (the tests below, every ISA this CPU runs, against
//! `libm`'s f64 erf over `[-7, 7]` in steps of 2⁻¹³): absolute error 1.06e-7 at most (under
//! 2 ulp of the values in `[0.5, 1)`; 8.5e-8 with Horner's order), relative error 6.5e-8 at
//! most for `|z| < T` (both tested against 1.2e-7). The exact GELU computes Φ from the same pieces
//! (`Φ(x) = erfc(|z|)/2` for negative x, so its left tail keeps a small *relative* error
//! instead of cancelling in `1 + erf`). Abramowitz–Stegun 7.1.26 (max error 1.5e-7, and only
//! absolute) is not used.

use super::simd::{exp2_nonpos, Simd};

/// Where the near piece ends.
const T: f32 = 0.9;
/// Where erfc is taken as 0.
const TMAX: f32 = 4.5;
/// The far piece's variable: `v = (t − MID) / HALF`.
const MID: f32 = 2.7;
const HALF: f32 = 1.8;
/// `P(s)`, `erf(z) = z + z·P(z²)` for `|z| < T` (coefficients of `s⁰..s⁶`).
const NEAR: [f32; 7] = [
    0.128_379_17,
    -0.376_126_35,
    0.112_837_195,
    -0.026_860_753,
    0.005_204_436,
    -0.000_818_192_8,
    8.538_841e-5,
];
/// `R(v) ≈ log2 erfc(t) + t²·log2 e` on `[T, TMAX]` (coefficients of `v⁰..v¹⁰`).
const FAR: [f32; 11] = [
    -2.344_654_6,
    -0.860_791_5,
    0.234_086_63,
    -0.078_102_4,
    0.027_072_662,
    -0.009_215_703,
    0.002_984_253,
    -0.000_920_110_9,
    0.000_253_629_06,
    -2.637_100_8e-5,
    -1.188_092_2e-5,
];

/// `Σ c[i]·x^i` for 7 coefficients by Estrin's scheme: `(c0 + c1·x) + (c2 + c3·x)·x²`, and
/// so on with `x⁴` — 3 dependent FMAs instead of Horner's 6. The GELU epilogue is bound by
/// these chains' latency as much as by its FMAs: with Horner's order the exact GELU cost
/// 2.1–2.4 ns per value on Zen 3, with Estrin's 1.7–2.0 (`epilogue_speed`, alternating runs).
///
/// # Safety
/// The CPU supports `S`'s ISA.
#[inline(always)]
unsafe fn estrin7<S: Simd>(c: &[f32; 7], x: S::V) -> S::V {
    // SAFETY: the caller guarantees the ISA; only register operations follow.
    unsafe {
        let pair = |i: usize| S::fmadd(S::set1(c[i + 1]), x, S::set1(c[i]));
        let x2 = S::mul(x, x);
        let x4 = S::mul(x2, x2);
        let lo = S::fmadd(pair(2), x2, pair(0));
        let hi = S::fmadd(S::set1(c[6]), x2, pair(4));
        S::fmadd(hi, x4, lo)
    }
}

/// `Σ c[i]·x^i` for 11 coefficients by Estrin's scheme (4 dependent FMAs instead of 10):
/// see [`estrin7`].
///
/// # Safety
/// The CPU supports `S`'s ISA.
#[inline(always)]
unsafe fn estrin11<S: Simd>(c: &[f32; 11], x: S::V) -> S::V {
    // SAFETY: the caller guarantees the ISA; only register operations follow.
    unsafe {
        let pair = |i: usize| S::fmadd(S::set1(c[i + 1]), x, S::set1(c[i]));
        let x2 = S::mul(x, x);
        let x4 = S::mul(x2, x2);
        let x8 = S::mul(x4, x4);
        let r0 = S::fmadd(pair(2), x2, pair(0));
        let r1 = S::fmadd(pair(6), x2, pair(4));
        let r2 = S::fmadd(S::set1(c[10]), x2, pair(8));
        S::fmadd(r2, x8, S::fmadd(r1, x4, r0))
    }
}

/// `(P(z²), erfc(|z|), |z|)`: the near polynomial (erf = `z + z·P`, valid for `|z| < T`) and the
/// far piece (valid for `|z| ≥ T`; 0 from [`TMAX`] on).
///
/// # Safety
/// The CPU supports `S`'s ISA.
#[inline(always)]
unsafe fn pieces<S: Simd>(z: S::V) -> (S::V, S::V, S::V) {
    // SAFETY: the caller guarantees the ISA; only register operations follow.
    unsafe {
        let near = estrin7::<S>(&NEAR, S::mul(z, z));
        let t = S::abs(z);
        let tc = S::min(t, S::set1(TMAX));
        let v = S::fmadd(tc, S::set1(1.0 / HALF), S::set1(-MID / HALF));
        let r = estrin11::<S>(&FAR, v);
        // log2 erfc(t) < 0 for t ≥ T (other lanes are discarded below).
        let e = exp2_nonpos::<S>(S::fmadd(
            S::mul(tc, tc),
            S::set1(-std::f32::consts::LOG2_E),
            r,
        ));
        let erfc = S::select_lt(t, S::set1(TMAX), e, S::zero());
        (near, erfc, t)
    }
}

/// `erf(z)` lane-wise (NaN stays NaN, `±∞` gives `±1`). Only the tests call it: it checks the
/// pieces [`gelu_erf`] is made of against libm's erf.
///
/// # Safety
/// The CPU supports `S`'s ISA.
#[cfg(test)]
#[inline(always)]
pub(crate) unsafe fn erf<S: Simd>(z: S::V) -> S::V {
    // SAFETY: the caller guarantees the ISA; only register operations follow.
    unsafe {
        let (p, erfc, t) = pieces::<S>(z);
        let one = S::set1(1.0);
        let far = S::select_lt(z, S::zero(), S::sub(erfc, one), S::sub(one, erfc));
        S::select_lt(t, S::set1(T), S::fmadd(z, p, z), far)
    }
}

/// The exact GELU `x·Φ(x)` lane-wise, `Φ(x) = 0.5·(1 + erf(x/√2))`: near 0 from the near
/// piece, otherwise `Φ = erfc(|z|)/2` for `x < 0` and `1 − erfc(|z|)/2` for `x ≥ 0`.
///
/// # Safety
/// The CPU supports `S`'s ISA.
#[inline(always)]
pub(crate) unsafe fn gelu_erf<S: Simd>(x: S::V) -> S::V {
    // SAFETY: the caller guarantees the ISA; only register operations follow.
    unsafe {
        let z = S::mul(x, S::set1(std::f32::consts::FRAC_1_SQRT_2));
        let (p, erfc, t) = pieces::<S>(z);
        let half = S::set1(0.5);
        let h = S::mul(erfc, half);
        let far = S::select_lt(x, S::zero(), h, S::sub(S::set1(1.0), h));
        let near = S::fmadd(S::fmadd(z, p, z), half, half);
        S::mul(x, S::select_lt(t, S::set1(T), near, far))
    }
}

/// `Σ c[i]·x^i` in scalar f32, in the order of [`estrin7`] / [`estrin11`] (pairs, then
/// pairs of pairs with `x²`, `x⁴`, `x⁸`); no allocation: it runs for the tail of every row.
fn estrin_scalar<const N: usize>(c: &[f32; N], x: f32) -> f32 {
    let mut t = [0.0f32; 8];
    let mut n = N.div_ceil(2);
    for (i, v) in t.iter_mut().take(n).enumerate() {
        *v = match c.get(2 * i + 1) {
            Some(hi) => hi * x + c[2 * i],
            None => c[2 * i],
        };
    }
    let mut p = x;
    while n > 1 {
        p *= p;
        for i in 0..n / 2 {
            t[i] = t[2 * i + 1] * p + t[2 * i];
        }
        if n % 2 == 1 {
            t[n / 2] = t[n - 1];
        }
        n = n.div_ceil(2);
    }
    t[0]
}

/// `(P(z²), erfc(|z|), |z|)` in scalar, as [`pieces`].
fn pieces_scalar(z: f32) -> (f32, f32, f32) {
    let t = z.abs();
    let tc = t.min(TMAX);
    let r = estrin_scalar(&FAR, tc * (1.0 / HALF) - MID / HALF);
    let erfc = if t < TMAX {
        (r - tc * tc * std::f32::consts::LOG2_E).exp2()
    } else {
        0.0
    };
    (estrin_scalar(&NEAR, z * z), erfc, t)
}

/// `erf(z)` in scalar f32, the same pieces as [`erf`] (for the tests, as it).
#[cfg(test)]
pub(crate) fn erf_scalar(z: f32) -> f32 {
    let (p, erfc, t) = pieces_scalar(z);
    if t < T {
        z + z * p
    } else if z < 0.0 {
        erfc - 1.0
    } else {
        1.0 - erfc
    }
}

/// The exact GELU in scalar f32, the same pieces as [`gelu_erf`].
pub(crate) fn gelu_erf_scalar(x: f32) -> f32 {
    let z = x * std::f32::consts::FRAC_1_SQRT_2;
    let (p, erfc, t) = pieces_scalar(z);
    let phi = if t < T {
        0.5 + 0.5 * (z + z * p)
    } else if x < 0.0 {
        0.5 * erfc
    } else {
        1.0 - 0.5 * erfc
    };
    x * phi
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::gemm::ukernel::portable::Portable;
    use crate::cpu::Isa;

    /// erf (or with `GELU` the exact GELU) of `x` in vectors of `S::W` lanes (the tail
    /// padded with zeros).
    ///
    /// # Safety
    /// The CPU supports `S`'s ISA.
    #[inline(always)]
    unsafe fn map<S: Simd, const GELU: bool>(x: &[f32]) -> Vec<f32> {
        let mut out = vec![0.0f32; x.len().div_ceil(S::W) * S::W];
        let mut buf = vec![0.0f32; S::W];
        for (i, chunk) in x.chunks(S::W).enumerate() {
            buf.fill(0.0);
            buf[..chunk.len()].copy_from_slice(chunk);
            // SAFETY: the caller guarantees the ISA; `buf` and `out[i·W..]` hold W values.
            unsafe {
                let v = S::load(buf.as_ptr());
                let y = if GELU { gelu_erf::<S>(v) } else { erf::<S>(v) };
                S::store(out[i * S::W..].as_mut_ptr(), y);
            }
        }
        out.truncate(x.len());
        out
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn map_avx2<const GELU: bool>(x: &[f32]) -> Vec<f32> {
        // SAFETY: compiled for AVX2 + FMA, which the caller checked.
        unsafe { map::<crate::cpu::gemm::ukernel::avx2::Avx2, GELU>(x) }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn map_avx512<const GELU: bool>(x: &[f32]) -> Vec<f32> {
        // SAFETY: compiled for AVX-512F, which the caller checked.
        unsafe { map::<crate::cpu::gemm::ukernel::avx512::Avx512, GELU>(x) }
    }

    /// `(name, outputs)` of every implementation this CPU runs: scalar, portable, AVX2,
    /// AVX-512.
    fn every_isa<const GELU: bool>(x: &[f32]) -> Vec<(&'static str, Vec<f32>)> {
        let scalar: fn(f32) -> f32 = if GELU { gelu_erf_scalar } else { erf_scalar };
        let mut out = vec![("scalar", x.iter().map(|&v| scalar(v)).collect())];
        // SAFETY: portable code needs no CPU feature.
        out.push(("portable", unsafe { map::<Portable, GELU>(x) }));
        #[cfg(target_arch = "x86_64")]
        {
            if Isa::Avx2.available() {
                // SAFETY: the CPU runs AVX2 + FMA (checked).
                out.push(("avx2", unsafe { map_avx2::<GELU>(x) }));
            }
            if Isa::Avx512.available() {
                // SAFETY: the CPU runs AVX-512F (checked).
                out.push(("avx512", unsafe { map_avx512::<GELU>(x) }));
            }
        }
        out
    }

    /// `[-7, 7]` in steps of 2⁻¹³, plus the piece boundaries and their neighbours.
    fn dense() -> Vec<f32> {
        let mut x: Vec<f32> = (-7 * 8192..=7 * 8192).map(|i| i as f32 / 8192.0).collect();
        let sqrt2 = std::f32::consts::SQRT_2;
        for b in [T, TMAX, T * sqrt2, TMAX * sqrt2] {
            for v in [b, -b] {
                x.extend([
                    v,
                    f32::from_bits(v.to_bits() + 1),
                    f32::from_bits(v.to_bits() - 1),
                ]);
            }
        }
        x.extend([1e-30, -1e-30, 1e-8, -3e-5, 20.0, -20.0, 1e6, -1e6]);
        x
    }

    #[test]
    fn erf_matches_libm_on_every_isa() {
        let x = dense();
        for (isa, got) in every_isa::<false>(&x) {
            let (mut worst_abs, mut worst_rel) = (0f64, 0f64);
            for (&z, &g) in x.iter().zip(&got) {
                let want = libm::erf(z as f64);
                let e = (g as f64 - want).abs();
                worst_abs = worst_abs.max(e);
                assert!(e <= 1.2e-7, "{isa}: erf({z}) = {g}, libm says {want}");
                if z.abs() < T && z != 0.0 {
                    worst_rel = worst_rel.max(e / want.abs());
                    assert!(e <= 1.2e-7 * want.abs(), "{isa}: erf({z}) = {g} vs {want}");
                }
            }
            eprintln!("{isa}: max |err| {worst_abs:.3e}, max rel err below T {worst_rel:.3e}");
        }
    }

    #[test]
    fn exact_gelu_matches_the_f64_formula_on_every_isa() {
        let x = dense();
        for (isa, got) in every_isa::<true>(&x) {
            for (&v, &g) in x.iter().zip(&got) {
                let want = crate::Act::GeluErf.apply_f64(v as f64);
                let e = (g as f64 - want).abs();
                // A few ε relative, plus erf's absolute error halved (Φ's error) scaled by x.
                let bound = 4.0 * f32::EPSILON as f64 * want.abs() + 5e-8 * (v as f64).abs();
                assert!(e <= bound, "{isa}: gelu({v}) = {g}, want {want}");
            }
        }
        // Signs, zero, NaN and infinities.
        for (isa, got) in every_isa::<true>(&[0.0, f32::NAN, f32::INFINITY, 3.0]) {
            assert_eq!(got[0], 0.0, "{isa}");
            assert!(got[1].is_nan(), "{isa}");
            assert_eq!(got[2], f32::INFINITY, "{isa}");
            assert!((got[3] - 2.995_950_5).abs() < 1e-6, "{isa}: {}", got[3]);
        }
    }

    #[test]
    fn exact_gelu_differs_from_the_tanh_form() {
        // The two forms differ by up to 4.7e-4 (at |x| ≈ 2.7): a kernel serving the wrong one
        // fails the reference check, whose tolerance is far below that.
        let d = (crate::Act::GeluErf.apply_f64(2.7) - crate::Act::Gelu.apply_f64(2.7)).abs();
        assert!(d > 4e-4, "{d}");
        assert!((gelu_erf_scalar(2.7) as f64 - crate::Act::Gelu.apply_f64(2.7)).abs() > 4e-4);
    }
}
