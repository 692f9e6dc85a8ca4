//! The exact GELU `x·Φ(x) = 0.5·x·(1 + erf(x/√2))`, lane-wise over the [`Simd`] vocabulary
//! (so one body serves AVX-512, AVX2 and portable code) and in scalar, from one piece:
//!
//! `erfc(t) = 2^(R(v) − t²·log2 e)` for `0 ≤ t = |x|/√2 < 4.5`, with `v = t/2.25 − 1` in
//! `[-1, 1]` and R of degree 12, a near-minimax fit of `log2 erfc(t) + t²·log2 e` (a slowly
//! varying function from 0 to about −4) by `scripts/fit-erf.py` (which prints the
//! constants) against a 40-digit erfc; relative erfc error 4.1e-8 with the f32 coefficients in
//! f64 arithmetic. From `t = 4.5` on, `erfc(t) < 2.1e-10` is taken as 0. Then
//! `Φ = erfc(t)/2` for negative x — its left tail keeps a small *relative* error instead of
//! cancelling in `1 + erf` — and `1 − erfc(t)/2` otherwise, where `Φ ≥ 1/2` needs only an
//! absolute one. (An erf of relative precision for tiny arguments, which earlier versions
//! computed from a second polynomial below `|z| = 0.9` and selected lane by lane, is not
//! needed for Φ: with one piece the exact GELU epilogue went from 0.81–0.84 to 0.65–0.69 ns
//! a value, `epilogue_speed 768` on a Zen 4, alternating runs.)
//!
//! R is evaluated by Estrin's scheme ([`estrin13`]): the same terms as Horner's rule, paired
//! so that the dependent chain is 4 FMAs long instead of 12. Measured in f32 arithmetic (the
//! tests below, every ISA this CPU runs, against `libm`): erfc within 1.6e-7 absolute and
//! 2.8e-6 relative (the exponent `t²·log2 e`, up to 29, is rounded to f32), the GELU within
//! a few ε relative plus `5e-8·|x|`. Abramowitz–Stegun 7.1.26 (max error 1.5e-7, and only
//! absolute) is not used.

use super::simd::{exp2_nonpos, Simd};

/// Where erfc is taken as 0.
const TMAX: f32 = 4.5;
/// `R(v) ≈ log2 erfc(t) + t²·log2 e` on `[0, TMAX]`, `v = t·2/TMAX − 1` (coefficients of
/// `v⁰..v¹²`).
const ERFC: [f32; 13] = [
    -2.113_490_3,
    -1.242_962_8,
    0.475_703_92,
    -0.218_762_77,
    0.102_471_45,
    -0.046_201_13,
    0.019_203_026,
    -0.006_837_954,
    0.001_953_755_3,
    -0.000_434_401_53,
    -0.000_286_257_83,
    0.000_536_433_5,
    -0.000_218_179_35,
];

/// `Σ c[i]·x^i` for 13 coefficients by Estrin's scheme: `(c0 + c1·x) + (c2 + c3·x)·x²`, and
/// so on with `x⁴` and `x⁸` — 4 dependent FMAs instead of Horner's 12. The GELU epilogue is
/// bound by this chain's latency as much as by its FMAs (with Horner's order the former
/// two-piece exact GELU cost 2.1–2.4 ns per value on Zen 3, with Estrin's 1.7–2.0).
///
/// # Safety
/// The CPU supports `S`'s ISA.
#[inline(always)]
unsafe fn estrin13<S: Simd>(c: &[f32; 13], x: S::V) -> S::V {
    // SAFETY: the caller guarantees the ISA; only register operations follow.
    unsafe {
        let pair = |i: usize| S::fmadd(S::set1(c[i + 1]), x, S::set1(c[i]));
        let x2 = S::mul(x, x);
        let x4 = S::mul(x2, x2);
        let x8 = S::mul(x4, x4);
        let r0 = S::fmadd(pair(2), x2, pair(0));
        let r1 = S::fmadd(pair(6), x2, pair(4));
        let r2 = S::fmadd(pair(10), x2, pair(8));
        let hi = S::fmadd(S::set1(c[12]), x4, r2);
        S::fmadd(hi, x8, S::fmadd(r1, x4, r0))
    }
}

/// `(erfc(|z|), |z|)` lane-wise (0 from [`TMAX`] on; NaN gives 0).
///
/// # Safety
/// The CPU supports `S`'s ISA.
#[inline(always)]
unsafe fn erfc_abs<S: Simd>(z: S::V) -> (S::V, S::V) {
    // SAFETY: the caller guarantees the ISA; only register operations follow.
    unsafe {
        let t = S::abs(z);
        let tc = S::min(t, S::set1(TMAX));
        let v = S::fmadd(tc, S::set1(2.0 / TMAX), S::set1(-1.0));
        let r = estrin13::<S>(&ERFC, v);
        // log2 erfc(t) ≤ 0 (up to R's error at t = 0, which exp2_nonpos takes).
        let e = exp2_nonpos::<S>(S::fmadd(
            S::mul(tc, tc),
            S::set1(-std::f32::consts::LOG2_E),
            r,
        ));
        (S::select_lt(t, S::set1(TMAX), e, S::zero()), t)
    }
}

/// The exact GELU `x·Φ(x)` lane-wise, `Φ(x) = 0.5·(1 + erf(x/√2))`: `Φ = erfc(|z|)/2` for
/// `x < 0` and `1 − erfc(|z|)/2` for `x ≥ 0`.
///
/// # Safety
/// The CPU supports `S`'s ISA.
#[inline(always)]
pub(crate) unsafe fn gelu_erf<S: Simd>(x: S::V) -> S::V {
    // SAFETY: the caller guarantees the ISA; only register operations follow.
    unsafe {
        let z = S::mul(x, S::set1(std::f32::consts::FRAC_1_SQRT_2));
        let (erfc, _) = erfc_abs::<S>(z);
        let h = S::mul(erfc, S::set1(0.5));
        S::mul(x, S::select_lt(x, S::zero(), h, S::sub(S::set1(1.0), h)))
    }
}

/// `Σ c[i]·x^i` in scalar f32, in the order of [`estrin13`] (pairs, then
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

/// `erfc(|z|)` in scalar, as [`erfc_abs`].
fn erfc_abs_scalar(z: f32) -> f32 {
    let t = z.abs();
    if t < TMAX {
        let r = estrin_scalar(&ERFC, t * (2.0 / TMAX) - 1.0);
        (r - t * t * std::f32::consts::LOG2_E).exp2()
    } else {
        0.0
    }
}

/// The exact GELU in scalar f32, as [`gelu_erf`].
pub(crate) fn gelu_erf_scalar(x: f32) -> f32 {
    let h = 0.5 * erfc_abs_scalar(x * std::f32::consts::FRAC_1_SQRT_2);
    x * if x < 0.0 { h } else { 1.0 - h }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::gemm::ukernel::portable::Portable;
    use crate::cpu::Isa;

    /// erfc(|x|) (or with `GELU` the exact GELU) of `x` in vectors of `S::W` lanes (the tail
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
                let y = if GELU {
                    gelu_erf::<S>(v)
                } else {
                    erfc_abs::<S>(v).0
                };
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
        let scalar: fn(f32) -> f32 = if GELU {
            gelu_erf_scalar
        } else {
            erfc_abs_scalar
        };
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

    /// `[-7, 7]` in steps of 2⁻¹³, plus the end of the erfc piece (in z and in x = √2·z) and
    /// its neighbours.
    fn dense() -> Vec<f32> {
        let mut x: Vec<f32> = (-7 * 8192..=7 * 8192).map(|i| i as f32 / 8192.0).collect();
        for b in [TMAX, TMAX * std::f32::consts::SQRT_2] {
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
    fn erfc_matches_libm_on_every_isa() {
        let x = dense();
        for (isa, got) in every_isa::<false>(&x) {
            let (mut worst_abs, mut worst_rel) = (0f64, 0f64);
            for (&z, &g) in x.iter().zip(&got) {
                let want = libm::erfc((z as f64).abs());
                let e = (g as f64 - want).abs();
                worst_abs = worst_abs.max(e);
                assert!(e <= 2e-7, "{isa}: erfc(|{z}|) = {g}, libm says {want}");
                if z.abs() < TMAX {
                    // Relative: R's rounding, and the exponent t²·log2 e (up to 29) rounded
                    // to f32.
                    worst_rel = worst_rel.max(e / want);
                    let t2 = (z as f64) * (z as f64);
                    let bound = 3e-7 + 3.0 * f32::EPSILON as f64 * t2;
                    assert!(e <= bound * want, "{isa}: erfc(|{z}|) = {g} vs {want}");
                }
            }
            eprintln!("{isa}: max |err| {worst_abs:.3e}, max rel err below TMAX {worst_rel:.3e}");
        }
        for (isa, got) in every_isa::<false>(&[f32::NAN, f32::INFINITY, -0.0]) {
            assert_eq!(got[..2], [0.0, 0.0], "{isa}");
            assert_eq!(got[2], 1.0, "{isa}");
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
