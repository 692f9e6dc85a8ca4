//! bf16 on the host, as raw `u16` bits (the device side reads the same bits; no `half` crate).
//!
//! bf16 is the top half of an f32: 1 sign bit, 8 exponent bits, 7 mantissa bits. Conversion
//! from f32 rounds to nearest, ties to even, exactly as `__float2bfloat16_rn` does.

/// f32 → bf16 bits, round to nearest even; NaN stays a (quiet) NaN.
pub fn from_f32(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 0x0040) as u16;
    }
    let rounding = 0x7fff + ((u >> 16) & 1);
    (u.wrapping_add(rounding) >> 16) as u16
}

/// bf16 bits → f32 (exact).
pub fn to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// `x` rounded to the nearest bf16, as an f32.
pub fn round(x: f32) -> f32 {
    to_f32(from_f32(x))
}

/// Half the distance between adjacent bf16 values near 1: the relative rounding error bound.
pub const EPSILON_HALF: f64 = 1.0 / 256.0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(from_f32(1.0), 0x3f80);
        assert_eq!(from_f32(-2.0), 0xc000);
        assert_eq!(to_f32(0x3f80), 1.0);
        assert_eq!(from_f32(0.0), 0);
        assert_eq!(from_f32(f32::INFINITY), 0x7f80);
        assert!(to_f32(from_f32(f32::NAN)).is_nan());
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (down to 1).
        assert_eq!(from_f32(1.0 + 1.0 / 256.0), 0x3f80);
        // 1 + 3·2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (up).
        assert_eq!(from_f32(1.0 + 3.0 / 256.0), 0x3f82);
        // Just above the halfway point rounds up.
        assert_eq!(from_f32(1.0 + 1.0 / 256.0 + 1.0 / 65536.0), 0x3f81);
    }

    #[test]
    fn rounding_error_is_bounded() {
        let mut r = crate::Rng::new(5);
        for _ in 0..10_000 {
            let x = r.symmetric_f32() * 100.0;
            let y = round(x);
            assert!(((y - x) as f64).abs() <= EPSILON_HALF * x.abs() as f64 + 1e-30);
            assert_eq!(round(y), y, "idempotent");
        }
    }
}
