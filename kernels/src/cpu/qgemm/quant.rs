//! Dynamic int8 quantisation, the scheme of ONNX Runtime's `quantize_dynamic` and PyTorch's
//! dynamic quantisation: activations (A) per row at run time, weights (B) per output column,
//! symmetric s8, once; and B's packing into the layout of the `u8 × s8 → i32` dot kernels.
//!
//! With `a ≈ sa_i · (qa − za_i)` and `b ≈ sb_j · qb`, an output is
//! `c_ij ≈ sa_i · sb_j · (Σ_k qa_ik·qb_kj − za_i · Σ_k qb_kj)`: the integer product is exact in
//! i32, and the zero-point correction uses B's column sums, computed once at pack time.

/// How activations are quantised (the `a_quant` knob).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AQuant {
    /// Asymmetric: the row's range `[min(lo, 0), max(hi, 0)]` onto `0..=max_code`.
    U8,
    /// Symmetric: `[-M, M]` (M = the row's largest magnitude) onto codes centred on
    /// `max_code / 2 + 1` (128 for 8-bit codes): s8 values stored offset as u8.
    S8,
}

impl AQuant {
    /// `u8` or `s8`, as the knob spells it.
    pub fn name(self) -> &'static str {
        match self {
            AQuant::U8 => "u8",
            AQuant::S8 => "s8",
        }
    }

    /// The knob's values.
    pub const ALL: [AQuant; 2] = [AQuant::U8, AQuant::S8];
}

/// Depth padded to the dot kernels' group of 4.
pub fn padded_k(k: usize) -> usize {
    k.div_ceil(4) * 4
}

/// Quantised activations: `m` rows of `kp` codes (padded with zeros), and per row the scale
/// and zero point.
#[derive(Debug, Clone, Default)]
pub struct QuantA {
    /// The codes, row-major: `m` rows of `kp`, the depths past `k` zero.
    pub codes: Vec<u8>,
    /// Each row's scale (1 for an all-zero row, NaN for one holding NaN or ±∞).
    pub scale: Vec<f32>,
    /// Each row's zero point, the code of 0.0.
    pub zero: Vec<i32>,
    /// Codes per row: the depth padded to a multiple of 4 ([`padded_k`]).
    pub kp: usize,
}

/// Quantises the `m × k` row-major `a` row by row into codes `0..=max_code` (255, or 127 for
/// kernels whose `u8 × s8` pair sums must stay below `i16::MAX`), reusing `q`'s buffers.
///
/// Runs on every call, so it is written to vectorise (compare-select min/max, ties-to-even
/// rounding); [`super::ukernel::quantize_rows_fast`] compiles it for AVX2 where the CPU has it.
#[inline(always)]
pub fn quantize_rows(a: &[f32], k: usize, scheme: AQuant, max_code: u8, q: &mut QuantA) {
    let m = a.len() / k.max(1);
    q.kp = padded_k(k);
    // Every code is written below, so the buffer is not cleared first (a pass over m·kp
    // bytes on every call); only the padding depths are zeroed.
    q.codes.resize(m * q.kp, 0);
    q.scale.resize(m, 1.0);
    q.zero.resize(m, 0);
    for (i, row) in a.chunks_exact(k).enumerate() {
        let stats = RowStats::of(row);
        let (scale, zero) = row_params(stats, scheme, max_code);
        // A row holding NaN or ±∞ gets a NaN scale: its outputs come out NaN, as from the
        // f32 product, instead of finite values of its clamped codes.
        let scale = if stats.finite { scale } else { f32::NAN };
        let inv = 1.0 / scale;
        q.codes[i * q.kp + k..(i + 1) * q.kp].fill(0);
        let codes = &mut q.codes[i * q.kp..i * q.kp + k];
        let (z, top) = (zero as f32, max_code as f32);
        for (c, &x) in codes.iter_mut().zip(row) {
            // Clamped to [0, top] (NaN to 0), then rounded to the nearest integer, ties to
            // even, by adding 2^23: the sum's last mantissa bits are that integer. A bit cast,
            // so the loop vectorises (a float-to-int `as` cast saturates and would not).
            let v = x * inv + z;
            let v = if v >= 0.0 { v } else { 0.0 };
            let v = if v > top { top } else { v };
            *c = ((v + 8_388_608.0).to_bits() - 0x4B00_0000) as u8;
        }
        q.scale[i] = scale;
        q.zero[i] = zero;
    }
}

/// `(scale, zero point)` of one row, from its [`RowStats`].
#[inline(always)]
fn row_params(stats: RowStats, scheme: AQuant, max_code: u8) -> (f32, i32) {
    let top = max_code as f32;
    match scheme {
        AQuant::U8 => {
            let (lo, hi) = (-stats.neg, stats.pos);
            let scale = nonzero((hi - lo) / top);
            (
                scale,
                ((-lo / scale).round() as i32).clamp(0, max_code as i32),
            )
        }
        AQuant::S8 => {
            let half = (max_code / 2) as f32;
            let mag = stats.pos.max(stats.neg);
            (nonzero(mag / half), max_code as i32 / 2 + 1)
        }
    }
}

/// Dequantises one column panel's i32 sums into C: for each row `i` of `c` (rows `ld`
/// apart, the panel's columns at `at..at + cols`), with its activation scale and zero point
/// `a_scale[i]`, `a_zero[i]` (those rows' of [`QuantA`]),
/// `c_ij = a_scale_i · scale_j · (Σ_ij − a_zero_i · colsum_j)`; the sums of row `i` start at
/// `acc[i·nr]`. `colsum` and `scale` are the panel's columns of [`QuantB`].
///
/// Runs on every output, so it is written to vectorise (slices zipped, no indexing);
/// [`super::ukernel::dequantize_fast`] compiles it for AVX2 where the CPU has it.
#[inline(always)]
pub fn dequantize(
    (a_scale, a_zero): (&[f32], &[i32]),
    (colsum, scale): (&[i32], &[f32]),
    (acc, nr): (&[i32], usize),
    c: &mut [f32],
    (ld, at): (usize, usize),
) {
    let cols = colsum.len();
    for (i, row) in c.chunks_exact_mut(ld).enumerate() {
        let (sa, za) = (a_scale[i], a_zero[i]);
        let sums = &acc[i * nr..i * nr + cols];
        let row = &mut row[at..at + cols];
        for (((x, &s), &cs), &sb) in row.iter_mut().zip(sums).zip(colsum).zip(scale) {
            *x = sa * sb * s.wrapping_sub(za.wrapping_mul(cs)) as f32;
        }
    }
}

/// What quantising a row needs to know of it, found in one pass.
#[derive(Clone, Copy)]
struct RowStats {
    /// `max(0, max x)` and `max(0, max −x)` (NaNs ignored).
    pos: f32,
    neg: f32,
    /// Whether every value is finite.
    finite: bool,
}

impl RowStats {
    /// One pass in 16 independent lanes (element-wise compare-selects and sums vectorise
    /// without reassociating anything; a single running maximum would not). A value is
    /// finite iff `x·0` is 0 (NaN otherwise), so the lanes sum those.
    #[inline(always)]
    fn of(row: &[f32]) -> RowStats {
        let (mut pos, mut neg, mut zero) = ([0.0f32; 16], [0.0f32; 16], [0.0f32; 16]);
        let chunks = row.chunks_exact(16);
        let tail = chunks.remainder();
        for ch in chunks {
            for i in 0..16 {
                let x = ch[i];
                pos[i] = if x > pos[i] { x } else { pos[i] };
                neg[i] = if -x > neg[i] { -x } else { neg[i] };
                zero[i] += x * 0.0;
            }
        }
        let max = |lanes: &[f32; 16], init: f32| {
            lanes.iter().fold(init, |m, &x| if x > m { x } else { m })
        };
        let tail_max = |f: fn(f32) -> f32| {
            tail.iter()
                .fold(0.0f32, |m, &x| if f(x) > m { f(x) } else { m })
        };
        let tail_zero = tail.iter().fold(0.0f32, |s, &x| s + x * 0.0);
        RowStats {
            pos: max(&pos, tail_max(|x| x)),
            neg: max(&neg, tail_max(|x| -x)),
            finite: zero.iter().sum::<f32>() + tail_zero == 0.0,
        }
    }
}

/// A scale that dequantises an all-zero row to zeros and never divides by zero.
fn nonzero(scale: f32) -> f32 {
    if scale > 0.0 && scale.is_finite() {
        scale
    } else {
        1.0
    }
}

/// Weights quantised per column (symmetric s8 in `-127..=127`) and packed for the dot
/// kernels: panels of `nr` columns; in a panel, for each group of 4 depths, `nr` columns of 4
/// consecutive depth codes (the layout `vpdpbusd` reads). Columns past `n` and depths past
/// `k` are zero.
#[derive(Debug, Clone)]
pub struct QuantB {
    /// The codes in panels of `nr` columns, `kp·nr` codes per panel.
    pub panels: Vec<i8>,
    /// Each column's scale, `max_k |b_kj| / 127` (1 for an all-zero column, NaN for one holding
    /// NaN or ±∞).
    pub scale: Vec<f32>,
    /// `Σ_k qb_kj`, for the zero-point correction.
    pub colsum: Vec<i32>,
    /// Depth: rows of B.
    pub k: usize,
    /// Columns of B.
    pub n: usize,
    /// Depth padded to a multiple of 4 ([`padded_k`]).
    pub kp: usize,
    /// Columns per panel, the micro-kernel's NR.
    pub nr: usize,
}

/// Writes the codes of the `k × n` row-major `b` (`x · inv[j]`, rounded to nearest even,
/// clamped to ±127) into `q`'s panels, and their column sums. `#[inline(always)]`, so the
/// AVX2 build of it ([`super::ukernel::codes_fast`]) rounds in registers (the baseline
/// build calls libm's `rintf` per weight).
#[inline(always)]
pub fn codes(b: &[f32], inv: &[f32], q: &mut QuantB) {
    let (n, nr) = (q.n, q.nr);
    let panel_len = q.kp * nr;
    for (p, row) in b.chunks_exact(n).enumerate() {
        let within = (p / 4 * nr) * 4 + p % 4;
        for (panel, cols) in row.chunks(nr).enumerate() {
            let dst = &mut q.panels[panel * panel_len + within..];
            for (c, &x) in cols.iter().enumerate() {
                let j = panel * nr + c;
                let code = (x * inv[j]).round_ties_even().clamp(-127.0, 127.0) as i8;
                dst[c * 4] = code;
                q.colsum[j] += code as i32;
            }
        }
    }
}

impl QuantB {
    /// Quantises and packs the `k × n` row-major `b` ([`crate::Error::OutOfMemory`] when it
    /// does not fit).
    pub fn new(b: &[f32], k: usize, n: usize, nr: usize) -> crate::Result<QuantB> {
        let kp = padded_k(k);
        let panels_n = n.div_ceil(nr);
        let mut q = QuantB {
            panels: crate::alloc::filled(panels_n * nr * kp, 0, "a quantised int8 weight")?,
            scale: vec![1.0; n],
            colsum: vec![0; n],
            k,
            n,
            kp,
            nr,
        };
        // Row by row (B is row-major): the column magnitudes (∞ once a column holds NaN or
        // ±∞), then the codes.
        let mut mag = vec![0.0f32; n];
        for row in b.chunks_exact(n) {
            for (m, x) in mag.iter_mut().zip(row) {
                *m = if x.is_finite() {
                    m.max(x.abs())
                } else {
                    f32::INFINITY
                };
            }
        }
        // A column holding NaN or ±∞ gets zero codes and a NaN scale: its outputs come out
        // NaN, as from the f32 product, instead of finite values of clamped codes.
        let inv: Vec<f32> = mag
            .iter()
            .zip(&mut q.scale)
            .map(|(&m, s)| {
                if m.is_finite() {
                    *s = nonzero(m / 127.0);
                    1.0 / *s
                } else {
                    *s = f32::NAN;
                    0.0
                }
            })
            .collect();
        super::ukernel::codes_fast(b, &inv, &mut q);
        Ok(q)
    }

    /// Index of depth `p`, column `j` in [`QuantB::panels`].
    pub fn offset(&self, p: usize, j: usize) -> usize {
        let (panel, c) = (j / self.nr, j % self.nr);
        ((panel * self.kp / 4 + p / 4) * self.nr + c) * 4 + p % 4
    }

    /// Panel `i` (columns `i·nr ..`): `kp · nr` codes.
    pub fn panel(&self, i: usize) -> &[i8] {
        let len = self.kp * self.nr;
        &self.panels[i * len..(i + 1) * len]
    }

    /// The code of depth `p`, column `j` (for references and tests).
    pub fn code(&self, p: usize, j: usize) -> i8 {
        self.panels[self.offset(p, j)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weight_codes_are_the_same_in_every_build() {
        // The AVX2 build (QuantB::new on this CPU) against the baseline one, code for code.
        let (k, n, nr) = (9, 13, 8);
        let b: Vec<f32> = (0..k * n)
            .map(|i| (i as f32 - 60.0) * 0.5 + if i % 7 == 0 { 0.25 } else { 0.0 })
            .collect();
        let fast = QuantB::new(&b, k, n, nr).unwrap();
        let mut portable = QuantB::new(&b, k, n, nr).unwrap();
        portable.panels.fill(0);
        portable.colsum.fill(0);
        let inv: Vec<f32> = portable.scale.iter().map(|s| 1.0 / s).collect();
        codes(&b, &inv, &mut portable);
        assert_eq!(fast.panels, portable.panels);
        assert_eq!(fast.colsum, portable.colsum);
        for p in 0..k {
            for j in 0..n {
                let want = (b[p * n + j] * inv[j])
                    .round_ties_even()
                    .clamp(-127.0, 127.0);
                assert_eq!(fast.code(p, j) as f32, want, "({p}, {j})");
            }
        }
    }

    #[test]
    fn activation_codes_and_dequantisation_are_the_same_in_every_build() {
        // The AVX2 build (where this CPU has it) against the baseline one, bit for bit:
        // k not a multiple of any vector width, rows with ties, a constant row, a NaN row.
        let k = 37;
        let mut a: Vec<f32> = (0..6 * k)
            .map(|i| ((i * 29 % 41) as f32 - 17.0) * 0.25)
            .collect();
        a[2 * k..3 * k].fill(1.5);
        a[4 * k + 5] = f32::NAN;
        for scheme in [AQuant::U8, AQuant::S8] {
            for max_code in [255, 127] {
                let (mut fast, mut base) = (QuantA::default(), QuantA::default());
                super::super::ukernel::quantize_rows_fast(&a, k, scheme, max_code, &mut fast);
                quantize_rows(&a, k, scheme, max_code, &mut base);
                assert_eq!(fast.codes, base.codes, "{scheme:?} {max_code}");
                assert_eq!(fast.zero, base.zero);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&fast.scale), bits(&base.scale));
            }
        }
        let (m, cols, nr) = (3usize, 21usize, 24usize);
        let acc: Vec<i32> = (0..m * nr)
            .map(|i| (i as i32 * 7919) % 100_003 - 50_000)
            .collect();
        let colsum: Vec<i32> = (0..cols as i32).map(|j| j * 13 - 100).collect();
        let scale: Vec<f32> = (0..cols).map(|j| 0.01 + j as f32 * 1e-3).collect();
        let (a_scale, a_zero) = (vec![0.02, 0.5, f32::NAN], vec![3, 128, 0]);
        let (mut fast, mut base) = (vec![0f32; m * 30], vec![0f32; m * 30]);
        let args = (
            (&a_scale[..], &a_zero[..]),
            (&colsum[..], &scale[..]),
            (&acc[..], nr),
        );
        super::super::ukernel::dequantize_fast(args.0, args.1, args.2, &mut fast, (30, 4));
        dequantize(args.0, args.1, args.2, &mut base, (30, 4));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fast), bits(&base));
    }

    #[test]
    fn codes_round_trip_within_half_a_step() {
        let a: Vec<f32> = (0..3 * 7)
            .map(|i| ((i * 37 % 23) as f32 - 9.0) / 4.0)
            .collect();
        for scheme in AQuant::ALL {
            for max_code in [255u8, 127] {
                let mut q = QuantA::default();
                quantize_rows(&a, 7, scheme, max_code, &mut q);
                assert_eq!(q.kp, 8);
                for i in 0..3 {
                    for p in 0..7 {
                        let code = q.codes[i * 8 + p];
                        assert!(code <= max_code);
                        let back = q.scale[i] * (code as i32 - q.zero[i]) as f32;
                        let x = a[i * 7 + p];
                        assert!(
                            (back - x).abs() <= q.scale[i] / 2.0 + 1e-6,
                            "{scheme:?} {x} {back}"
                        );
                    }
                    assert_eq!(q.codes[i * 8 + 7], 0, "padding");
                }
            }
        }
        // An all-zero row dequantises to zeros.
        let mut q = QuantA::default();
        quantize_rows(&[0.0; 5], 5, AQuant::U8, 255, &mut q);
        assert!(q.codes[..5].iter().all(|&c| c as i32 == q.zero[0]));
    }

    #[test]
    fn weights_pack_in_groups_of_four_depths_with_column_sums() {
        let (k, n, nr) = (6, 5, 4);
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 - 13.0) / 7.0).collect();
        let q = QuantB::new(&b, k, n, nr).unwrap();
        assert_eq!((q.kp, q.panels.len()), (8, 2 * 4 * 8));
        for j in 0..n {
            let mut sum = 0;
            for p in 0..k {
                let code = q.code(p, j);
                sum += code as i32;
                assert!((q.scale[j] * code as f32 - b[p * n + j]).abs() <= q.scale[j] / 2.0 + 1e-6);
            }
            assert_eq!(sum, q.colsum[j]);
            assert_eq!((q.code(6, j), q.code(7, j)), (0, 0));
        }
        // Depths 0..4 of column 1 are contiguous, then column 2's.
        assert_eq!(q.offset(0, 1) + 1, q.offset(1, 1));
        assert_eq!(q.offset(3, 1) + 1, q.offset(0, 2));
        assert_eq!(
            q.offset(0, 4),
            q.panel(1).as_ptr() as usize - q.panels.as_ptr() as usize
        );
    }
}
