//! Test problems: seeded random inputs, an f64 reference, and a tolerance-aware comparison.
//!
//! "Correct before fast": every candidate's output is compared with [`Problem::reference`]
//! before its time counts.

use rayon::prelude::*;

use crate::rng::Rng;
use crate::workload::{Act, Workload};

/// Inputs for one workload, filled with uniform values in `[-1, 1)` from a seed.
#[derive(Debug, Clone)]
pub struct Problem {
    /// The workload the inputs are for.
    pub workload: Workload,
    /// The f32 input buffers in [`Workload::input_lens`] order (A, B, then the bias for
    /// `gemm_bias_*`; Q, K, V for attention), each row-major, whatever the workload's precision.
    pub inputs: Vec<Vec<f32>>,
}

/// The reference result: exact-ish values and a per-element tolerance.
#[derive(Debug, Clone)]
pub struct Reference {
    /// The exact result, computed in f64, one value per output element.
    pub values: Vec<f64>,
    /// The largest accepted absolute error of each output element (same length as `values`).
    pub tolerance: Vec<f64>,
}

/// How far an output is from the exact (f64) result of the f32 problem: what a precision
/// costs. For an f32 variant both are rounding noise; for int8 or bf16, the quantisation.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Accuracy {
    /// `max |got − exact| / max |exact|`.
    pub max_rel_err: f64,
    /// `‖got − exact‖_F / ‖exact‖_F` (the normalised Frobenius error).
    pub fro_rel_err: f64,
}

/// The first output element outside the tolerance.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("wrong result at element {index} (row {row}, col {col}): got {got}, expected {expected} ± {tolerance:.3e}; {bad} of {total} elements out of tolerance")]
pub struct Mismatch {
    /// Index of the element in the output buffer.
    pub index: usize,
    /// Its row, with the output seen as a row-major matrix of [`Workload::output_cols`] columns.
    pub row: usize,
    /// Its column in that matrix.
    pub col: usize,
    /// The value the kernel wrote.
    pub got: f32,
    /// The reference value.
    pub expected: f64,
    /// The tolerance of that element: `|got − expected|` may be at most this much.
    pub tolerance: f64,
    /// How many output elements are out of tolerance (or not finite) in all.
    pub bad: usize,
    /// Number of output elements.
    pub total: usize,
}

impl Problem {
    /// [`Problem::random`], refused before anything is allocated when its buffers (inputs,
    /// two outputs, the f64 reference with its tolerances) cannot be allocated by this
    /// process: a one-line error instead of an abort under a memory limit (`ulimit -v`,
    /// overcommit off).
    pub fn try_random(w: &Workload, seed: u64) -> crate::Result<Self> {
        Problem::check_memory(w)?;
        Ok(Problem::random(w, seed))
    }

    /// The allocation check of [`Problem::try_random`]: reserves address space only;
    /// nothing is touched.
    pub fn check_memory(w: &Workload) -> crate::Result<()> {
        let out = w.output_len();
        let bytes = (|| {
            let floats =
                (w.input_lens().iter()).try_fold(out.checked_mul(2)?, |a, &l| a.checked_add(l))?;
            floats.checked_mul(4)?.checked_add(out.checked_mul(16)?)
        })();
        let mut probe: Vec<u8> = Vec::new();
        match bytes {
            Some(b) if probe.try_reserve_exact(b).is_ok() => Ok(()),
            _ => Err(crate::Error::BadWorkload {
                input: w.key(),
                reason: format!(
                    "its operands and f64 reference need {:.1} GB, more than this process can allocate",
                    bytes.map_or(f64::INFINITY, |b| b as f64 / 1e9)
                ),
            }),
        }
    }

    /// Random operands for `w`, fixed by `seed` (see [`Problem::try_random`] for huge
    /// workloads).
    pub fn random(w: &Workload, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let inputs = w
            .input_lens()
            .into_iter()
            .map(|len| (0..len).map(|_| rng.symmetric_f32()).collect())
            .collect();
        Problem {
            workload: *w,
            inputs,
        }
    }

    /// The inputs as slices, in the order kernels expect.
    pub fn input_slices(&self) -> Vec<&[f32]> {
        self.inputs.iter().map(|v| v.as_slice()).collect()
    }

    /// A zeroed output buffer of the right size.
    pub fn output(&self) -> Vec<f32> {
        vec![0.0; self.workload.output_len()]
    }

    /// The reference result, accumulated in f64, with a per-element tolerance.
    ///
    /// GEMM tolerance: `ε_f32 · (2√K + 4) · Σ_k |a_ik·b_kj|` — the rounding of a K-term f32
    /// sum grows like √K in practice (blocked or not), scaled by the magnitude of the terms;
    /// the margin is wide enough for any summation order, and far below the size of one
    /// dropped or doubled term.
    ///
    /// `gemm_bias_*`: `z = A·B + bias` as above (plus `2ε·|bias|`), then the activation in
    /// f64; identity and ReLU keep `z`'s tolerance (ReLU is 1-Lipschitz), GELU allows `1.2·tol(z)` (its
    /// slope stays below 1.13) plus `16ε·|z|` for a vectorised tanh/exp approximation.
    ///
    /// Attention: per query row, f64 scores `s_j = q·k_j/√D`, their f32 rounding bound
    /// `e_j = ε·(2√D + 8)·Σ|q·k_j|/√D` and `E = max_j e_j`; with the softmax weights `w_j`,
    /// `tol(o_c) = Σ_j w_j·|v_jc| · (3E + ε·(2√S + 32))`: a score error `e` moves a weight by
    /// a factor `e^(±e)`, the weighted sum of S terms rounds like a √S-term f32 sum, and the
    /// online rescaling and exp approximation add a few ε. Dropping one key moves an output
    /// by about `w_j·|v_jc - o_c|`, far outside that.
    ///
    /// bf16 attention (Q, K, V and the weights P rounded to bf16, f32 accumulation and
    /// softmax): each score term `q_c·k_c` is off by at most `r = 2·2⁻⁸ + 2⁻¹⁶` of itself
    /// (`operand_rel_err`), so `e_j` gains `r·Σ|q·k_j|/√D`; each weight (rounded, against
    /// the unrounded running sum) and each value by `2⁻⁸` of themselves, so `tol(o_c)` gains
    /// `Σ_j w_j·|v_jc| · r`.
    pub fn reference(&self) -> Reference {
        match self.workload {
            Workload::Gemm { m, n, k, dtype } => {
                let (a, b) = (&self.inputs[0], &self.inputs[1]);
                let mut r = gemm_reference(a, b, (m, n, k), operand_rel_err(dtype));
                widen_for_precision(&mut r, a, b, (m, n, k), dtype);
                r
            }
            Workload::GemmBiasAct {
                m,
                n,
                k,
                act,
                dtype,
                ..
            } => {
                let (a, b, bias) = (&self.inputs[0], &self.inputs[1], &self.inputs[2]);
                let mut r = gemm_reference(a, b, (m, n, k), operand_rel_err(dtype));
                widen_for_precision(&mut r, a, b, (m, n, k), dtype);
                let eps = f32::EPSILON as f64;
                r.values
                    .par_chunks_mut(n)
                    .zip(r.tolerance.par_chunks_mut(n))
                    .for_each(|(row, tol)| {
                        for j in 0..n {
                            let z = row[j] + bias[j] as f64;
                            let tz = tol[j] + 2.0 * eps * (bias[j] as f64).abs();
                            row[j] = act.apply_f64(z);
                            tol[j] = match act {
                                Act::Identity | Act::Relu => tz,
                                // Both GELU forms have slopes below 1.13.
                                Act::Gelu | Act::GeluErf => 1.2 * tz + 16.0 * eps * z.abs(),
                            };
                        }
                    });
                r
            }
            Workload::Attention {
                s,
                d,
                causal,
                dtype,
                ..
            } => {
                let (q, k, v) = (&self.inputs[0], &self.inputs[1], &self.inputs[2]);
                let rel = attention_rel_err(dtype);
                attention_reference(q, k, v, (s, d), causal, None, rel)
            }
        }
    }

    /// The reference of an attention problem whose batch `b` sees only its first
    /// `key_lens[b]` keys (the optional key-lengths operand,
    /// [`crate::operand::host_attention`]); a query that sees no key is exactly zero.
    /// An error for another workload, or lengths that are not one per batch in `0..=S`.
    pub fn reference_with_key_lens(&self, key_lens: &[i32]) -> crate::Result<Reference> {
        let bad = |reason: String| crate::Error::BadWorkload {
            input: self.workload.key(),
            reason,
        };
        let Workload::Attention {
            b,
            h,
            s,
            d,
            causal,
            dtype,
        } = self.workload
        else {
            return Err(bad("key lengths are for attention workloads".into()));
        };
        if key_lens.len() != b || key_lens.iter().any(|&l| l < 0 || l as usize > s) {
            return Err(bad(format!(
                "key lengths {key_lens:?} are not {b} values in 0..={s}"
            )));
        }
        let (q, k, v) = (&self.inputs[0], &self.inputs[1], &self.inputs[2]);
        let lens = (key_lens, h);
        let rel = attention_rel_err(dtype);
        Ok(attention_reference(
            q,
            k,
            v,
            (s, d),
            causal,
            Some(lens),
            rel,
        ))
    }

    /// The [`Accuracy`] of `got` against `reference`'s exact values (0 when they are all 0).
    pub fn accuracy(&self, got: &[f32], reference: &Reference) -> Accuracy {
        let (mut max_err, mut max_ref, mut err2, mut ref2) = (0f64, 0f64, 0f64, 0f64);
        for (&g, &e) in got.iter().zip(&reference.values) {
            let d = (g as f64 - e).abs();
            max_err = max_err.max(d);
            max_ref = max_ref.max(e.abs());
            err2 += d * d;
            ref2 += e * e;
        }
        let ratio = |num: f64, den: f64| if den > 0.0 { num / den } else { 0.0 };
        Accuracy {
            max_rel_err: ratio(max_err, max_ref),
            fro_rel_err: ratio(err2.sqrt(), ref2.sqrt()),
        }
    }

    /// Compares `got` with `reference`; NaN and infinities always fail.
    ///
    /// # Panics
    /// If `got` is not as long as the reference (a buffer not made by [`Problem::output`]).
    pub fn check(&self, got: &[f32], reference: &Reference) -> Result<(), Mismatch> {
        assert_eq!(got.len(), reference.values.len(), "output length");
        let cols = self.workload.output_cols();
        let bad = |(g, (e, t)): (&f32, (&f64, &f64))| !g.is_finite() || (*g as f64 - e).abs() > *t;
        let mut iter = got
            .iter()
            .zip(reference.values.iter().zip(&reference.tolerance));
        let Some(index) = iter.position(bad) else {
            return Ok(());
        };
        let total_bad = got
            .iter()
            .zip(reference.values.iter().zip(&reference.tolerance))
            .filter(|x| bad(*x))
            .count();
        Err(Mismatch {
            index,
            row: index / cols,
            col: index % cols,
            got: got[index],
            expected: reference.values[index],
            tolerance: reference.tolerance[index],
            bad: total_bad,
            total: got.len(),
        })
    }
}

/// Widens a GEMM tolerance by what rounding the operands to `dtype` may cost, a bound that
/// holds for every scheme the families use:
/// - i8: activations quantised per row with a step of at most `2·M_i/127` (`M_i` the row's
///   largest magnitude; the 7-bit asymmetric codes of the AVX2 kernels are the coarsest),
///   so each is off by at most `δa_i = M_i/127`; weights per column, symmetric, by at most
///   `δb_j = Mb_j/254`. Then `|Δc_ij| ≤ Σ_k |b_kj|·δa_i + |a_ik|·δb_j + δa_i·δb_j`.
/// - bf16 is a per-term relative bound, so [`gemm_reference`] adds it ([`operand_rel_err`]).
///
/// Both are far below the error of a dropped or doubled term, which the check still catches.
fn widen_for_precision(
    r: &mut Reference,
    a: &[f32],
    b: &[f32],
    (m, n, k): (usize, usize, usize),
    dtype: crate::DType,
) {
    if dtype != crate::DType::I8 {
        return;
    }
    // Per row of A: its magnitude sum and `δa_i`; per column of B: the same with `δb_j`.
    let rows: Vec<(f64, f64)> = a
        .chunks_exact(k)
        .map(|row| {
            let abs = row.iter().map(|v| v.abs() as f64);
            (abs.clone().sum(), abs.fold(0f64, f64::max) / 127.0)
        })
        .collect();
    let mut cols = vec![(0f64, 0f64); n];
    for row in b.chunks_exact(n) {
        for ((sum, db), v) in cols.iter_mut().zip(row) {
            let v = (*v as f64).abs();
            *sum += v;
            *db = db.max(v / 254.0);
        }
    }
    for (i, &(row_abs, da)) in rows.iter().enumerate().take(m) {
        for (j, &(col_abs, db)) in cols.iter().enumerate() {
            r.tolerance[i * n + j] += col_abs * da + row_abs * db + k as f64 * da * db;
        }
    }
}

/// How far a product of two operands rounded to `dtype` may be from the f32 one, relative to
/// it: bf16 keeps 8 significant bits, so rounding to nearest moves each operand by at most
/// `2⁻⁸` of itself (half its spacing of `2⁻⁷` relative; e.g. `1 + 2⁻⁸` rounds to 1), and the
/// product by `2·2⁻⁸ + 2⁻¹⁶`; 0 otherwise (int8 is bounded per row and column by
/// [`widen_for_precision`]).
fn operand_rel_err(dtype: crate::DType) -> f64 {
    match dtype {
        crate::DType::Bf16 => {
            let unit = 2f64.powi(-8);
            2.0 * unit + unit * unit
        }
        _ => 0.0,
    }
}

/// What rounding to `dtype` adds to the attention bound, `(score_rel, out_rel)` of
/// [`attention_reference`]: for bf16, [`operand_rel_err`] for the scores (Q and K rounded)
/// and for the outputs (P and V rounded); nothing otherwise.
fn attention_rel_err(dtype: crate::DType) -> (f64, f64) {
    let r = operand_rel_err(dtype);
    (r, r)
}

/// `A·B` in f64 with the GEMM tolerance (see [`Problem::reference`]), widened by `rel` of
/// every term's magnitude for operands rounded to a narrower type ([`operand_rel_err`]).
fn gemm_reference(a: &[f32], b: &[f32], (m, n, k): (usize, usize, usize), rel: f64) -> Reference {
    let scale = f32::EPSILON as f64 * (2.0 * (k as f64).sqrt() + 4.0) + rel;
    let mut values = vec![0.0f64; m * n];
    let mut tolerance = vec![0.0f64; m * n];
    values
        .par_chunks_mut(n)
        .zip(tolerance.par_chunks_mut(n))
        .enumerate()
        .for_each(|(i, (row, tol))| {
            for p in 0..k {
                let aip = a[i * k + p] as f64;
                let brow = &b[p * n..(p + 1) * n];
                for j in 0..n {
                    let t = aip * brow[j] as f64;
                    row[j] += t;
                    tol[j] += t.abs();
                }
            }
            tol.iter_mut().for_each(|t| *t *= scale);
        });
    Reference { values, tolerance }
}

/// Softmax attention in f64 over `[heads, s, d]` tensors (see [`Problem::reference`]).
/// The attention reference over heads of `s × d`; with `lens = (key_lens, heads)`, head
/// `hd` sees the first `key_lens[hd / heads]` keys.
/// `(score_rel, out_rel)` widen the score bound `e_j` by `score_rel·Σ|q·k_j|/√D` and the
/// output bound by `out_rel·Σ_j w_j·|v_jc|` ([`attention_rel_err`]).
pub(crate) fn attention_reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    (s, d): (usize, usize),
    causal: bool,
    lens: Option<(&[i32], usize)>,
    (score_rel, out_rel): (f64, f64),
) -> Reference {
    let eps = f32::EPSILON as f64;
    let scale = 1.0 / (d as f64).sqrt();
    let score_eps = eps * (2.0 * (d as f64).sqrt() + 8.0) + score_rel;
    let sum_eps = eps * (2.0 * (s as f64).sqrt() + 32.0);
    let mut values = vec![0.0f64; q.len()];
    let mut tolerance = vec![0.0f64; q.len()];
    // One task per (head, query row): rows of `d` outputs.
    values
        .par_chunks_mut(d)
        .zip(tolerance.par_chunks_mut(d))
        .enumerate()
        .for_each_init(
            || (Vec::new(), Vec::new()),
            |(scores, bounds): &mut (Vec<f64>, Vec<f64>), (row, (out, tol))| {
                let (head, i) = (row / s, row % s);
                let base = head * s * d;
                let qi = &q[base + i * d..][..d];
                let seen = lens.map_or(s, |(l, heads)| l[head / heads] as usize);
                let keys = if causal { i + 1 } else { s }.min(seen);
                scores.clear();
                bounds.clear();
                for j in 0..keys {
                    let kj = &k[base + j * d..][..d];
                    let (mut dot, mut mag) = (0.0f64, 0.0f64);
                    for c in 0..d {
                        let t = qi[c] as f64 * kj[c] as f64;
                        dot += t;
                        mag += t.abs();
                    }
                    scores.push(dot * scale);
                    bounds.push(mag * scale * score_eps);
                }
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let big_e = bounds.iter().copied().fold(0.0, f64::max);
                let mut sum = 0.0;
                for x in scores.iter_mut() {
                    *x = (*x - max).exp();
                    sum += *x;
                }
                out.fill(0.0);
                tol.fill(0.0);
                for (j, w) in scores.iter().enumerate() {
                    let w = w / sum;
                    let vj = &v[base + j * d..][..d];
                    for c in 0..d {
                        out[c] += w * vj[c] as f64;
                        tol[c] += w * (vj[c] as f64).abs();
                    }
                }
                let rel = 3.0 * big_e + sum_eps + out_rel;
                tol.iter_mut().for_each(|t| *t *= rel);
            },
        );
    Reference { values, tolerance }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(w: &Workload, p: &Problem) -> Vec<f32> {
        let (m, n, k) = w.gemm_dims().unwrap();
        let mut c = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k)
                    .map(|p2| p.inputs[0][i * k + p2] * p.inputs[1][p2 * n + j])
                    .sum();
            }
        }
        c
    }

    #[test]
    fn naive_f32_passes_and_a_dropped_term_fails() {
        for (m, n, k) in [(1, 1, 1), (3, 5, 7), (17, 13, 300), (2, 3, 3072)] {
            let w = Workload::gemm(m, n, k).unwrap();
            let p = Problem::random(&w, 42);
            let r = p.reference();
            let mut c = naive(&w, &p);
            assert_eq!(p.check(&c, &r), Ok(()), "{w}");
            // Drop the last k-term of one element: must be caught.
            let (i, j) = (m - 1, n - 1);
            c[i * n + j] -= p.inputs[0][i * k + k - 1] * p.inputs[1][(k - 1) * n + j];
            let dropped = (p.inputs[0][i * k + k - 1] * p.inputs[1][(k - 1) * n + j]).abs();
            if dropped as f64 > 10.0 * r.tolerance[i * n + j] {
                let e = p.check(&c, &r).unwrap_err();
                assert_eq!((e.row, e.col, e.bad), (i, j, 1), "{w}");
            }
            c[0] = f32::NAN;
            assert_eq!(p.check(&c, &r).unwrap_err().index, 0);
        }
    }

    #[test]
    fn inputs_are_seeded() {
        let w = Workload::gemm(4, 5, 6).unwrap();
        assert_eq!(Problem::random(&w, 1).inputs, Problem::random(&w, 1).inputs);
        assert_ne!(Problem::random(&w, 1).inputs, Problem::random(&w, 2).inputs);
        assert_eq!(Problem::random(&w, 1).inputs[1].len(), 30);
    }

    /// Plain f32 attention (two passes per row), optionally skipping key `skip` of row `row`.
    fn naive_attention(p: &Problem, skip: Option<(usize, usize)>) -> Vec<f32> {
        let Workload::Attention { s, d, causal, .. } = p.workload else {
            unreachable!()
        };
        let (q, k, v) = (&p.inputs[0], &p.inputs[1], &p.inputs[2]);
        let scale = 1.0 / (d as f32).sqrt();
        let mut o = vec![0.0f32; q.len()];
        for (row, out) in o.chunks_mut(d).enumerate() {
            let (head, i) = (row / s, row % s);
            let base = head * s * d;
            let keys = if causal { i + 1 } else { s };
            let sc: Vec<f32> = (0..keys)
                .map(|j| {
                    if skip == Some((row, j)) {
                        return f32::NEG_INFINITY;
                    }
                    (0..d)
                        .map(|c| q[base + i * d + c] * k[base + j * d + c])
                        .sum::<f32>()
                        * scale
                })
                .collect();
            let m = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = sc.iter().map(|x| (x - m).exp()).collect();
            let l: f32 = e.iter().sum();
            for (j, w) in e.iter().enumerate() {
                for c in 0..d {
                    out[c] += w / l * v[base + j * d + c];
                }
            }
        }
        o
    }

    #[test]
    fn attention_reference_accepts_f32_and_catches_a_dropped_key() {
        for text in [
            "attention:1x1x1x1",
            "attention:2x3x17x32",
            "attention:1x2x40x80:causal",
            "attention:1x1x300x64",
        ] {
            let w: Workload = text.parse().unwrap();
            let p = Problem::random(&w, 9);
            let r = p.reference();
            assert_eq!(p.check(&naive_attention(&p, None), &r), Ok(()), "{w}");
            let Workload::Attention { s, d, .. } = w else {
                unreachable!()
            };
            if s > 1 {
                // Row s-1 of head 0 sees every key; drop key 0.
                let e = p
                    .check(&naive_attention(&p, Some((s - 1, 0))), &r)
                    .unwrap_err();
                assert_eq!(e.row, s - 1, "{w}: {e}");
                assert!(e.col < d);
            }
        }
    }

    #[test]
    fn gemm_bias_act_reference_accepts_f32_and_catches_a_missing_bias() {
        for act in Act::ALL {
            let w = Workload::gemm_bias_act(5, 7, 300, act).unwrap();
            let p = Problem::random(&w, 3);
            let r = p.reference();
            let mut c = naive(&w, &p);
            let bias = &p.inputs[2];
            let gelu = |x: f32| 0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044715 * x * x * x)).tanh());
            let gelu_erf = |x: f32| Act::GeluErf.apply_f64(x as f64) as f32;
            let out: Vec<f32> = c
                .iter()
                .enumerate()
                .map(|(i, z)| {
                    let z = z + bias[i % 7];
                    match act {
                        Act::Identity => z,
                        Act::Relu => z.max(0.0),
                        Act::Gelu => gelu(z),
                        Act::GeluErf => gelu_erf(z),
                    }
                })
                .collect();
            assert_eq!(p.check(&out, &r), Ok(()), "{w}");
            // Without the bias: wrong (bias values are O(1), tolerances O(1e-4)).
            for (i, x) in c.iter_mut().enumerate() {
                *x = match act {
                    Act::Identity => *x,
                    Act::Relu => x.max(0.0),
                    Act::Gelu => gelu(*x),
                    Act::GeluErf => gelu_erf(*x),
                };
                let _ = i;
            }
            assert!(p.check(&c, &r).is_err(), "{w}");
        }
    }
}
