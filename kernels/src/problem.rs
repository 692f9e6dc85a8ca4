//! Test problems: seeded random inputs, an f64 reference, and a tolerance-aware comparison.
//!
//! "Correct before fast": every candidate's output is compared with [`Problem::reference`]
//! before its time counts.

use rayon::prelude::*;

use crate::rng::Rng;
use crate::workload::Workload;

/// Inputs for one workload, filled with uniform values in `[-1, 1)` from a seed.
#[derive(Debug, Clone)]
pub struct Problem {
    pub workload: Workload,
    pub inputs: Vec<Vec<f32>>,
}

/// The reference result: exact-ish values and a per-element tolerance.
#[derive(Debug, Clone)]
pub struct Reference {
    pub values: Vec<f64>,
    pub tolerance: Vec<f64>,
}

/// The first output element outside the tolerance.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("wrong result at element {index} (row {row}, col {col}): got {got}, expected {expected} ± {tolerance:.3e}; {bad} of {total} elements out of tolerance")]
pub struct Mismatch {
    pub index: usize,
    pub row: usize,
    pub col: usize,
    pub got: f32,
    pub expected: f64,
    pub tolerance: f64,
    pub bad: usize,
    pub total: usize,
}

impl Problem {
    /// Random inputs for `w`, fixed by `seed`.
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
    pub fn reference(&self) -> Reference {
        match self.workload {
            Workload::Gemm { m, n, k } => {
                let (a, b) = (&self.inputs[0], &self.inputs[1]);
                let scale = f32::EPSILON as f64 * (2.0 * (k as f64).sqrt() + 4.0);
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
        }
    }

    /// Compares `got` with `reference`; NaN and infinities always fail.
    pub fn check(&self, got: &[f32], reference: &Reference) -> Result<(), Mismatch> {
        assert_eq!(got.len(), reference.values.len(), "output length");
        let cols = match self.workload {
            Workload::Gemm { n, .. } => n,
        };
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

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(w: &Workload, p: &Problem) -> Vec<f32> {
        let Workload::Gemm { m, n, k } = *w;
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
}
