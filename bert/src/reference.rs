//! The plain reference forward: naive loops, everything in f64, exact `tanh`, `erf` and
//! `exp`. From the seed it regenerates each layer's weights, so it needs no packed copy; a
//! checkpoint's row-major weights serve it as they are.

use std::borrow::Cow;

use kernels::Act;
use rayon::prelude::*;

use crate::{BertConfig, LayerWeights};

/// Largest accepted `|got − reference|` of any output value (outputs are LayerNorm'd, so
/// of unit scale): see [`check`] for why this bound.
pub const TOLERANCE: f64 = 2e-4;

/// `x·W + b` for `rows` rows, f64 (`W` is `k × n`, row-major).
fn linear(x: &[f64], k: usize, w: &[f32], b: &[f32], act: Act) -> Vec<f64> {
    let n = b.len();
    let mut out = vec![0.0f64; x.len() / k * n];
    out.par_chunks_mut(n)
        .zip(x.par_chunks(k))
        .for_each(|(o, xr)| {
            for (oj, bj) in o.iter_mut().zip(b) {
                *oj = *bj as f64;
            }
            for (p, &xp) in xr.iter().enumerate() {
                let wr = &w[p * n..(p + 1) * n];
                for (oj, &wj) in o.iter_mut().zip(wr) {
                    *oj += xp * wj as f64;
                }
            }
            o.iter_mut().for_each(|v| *v = act.apply_f64(*v));
        });
    out
}

/// `x = LayerNorm(x + r)` in f64.
fn add_layer_norm(x: &mut [f64], r: &[f64], gamma: &[f32], beta: &[f32], eps: f32) {
    let h = gamma.len();
    x.par_chunks_mut(h)
        .zip(r.par_chunks(h))
        .for_each(|(row, res)| {
            row.iter_mut().zip(res).for_each(|(v, r)| *v += r);
            let mean = row.iter().sum::<f64>() / h as f64;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / h as f64;
            let inv = 1.0 / (var + eps as f64).sqrt();
            for ((v, g), b) in row.iter_mut().zip(gamma).zip(beta) {
                *v = (*v - mean) * inv * *g as f64 + *b as f64;
            }
        });
}

/// Softmax attention of one sequence (`seq × 3H` rows of Q, K, V) into `seq × H` rows,
/// every query seeing the first `keys` keys (none: zeros).
fn attention(qkv: &[f64], seq: usize, heads: usize, d: usize, keys: usize) -> Vec<f64> {
    let hid = heads * d;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0f64; seq * hid];
    out.par_chunks_mut(hid).enumerate().for_each(|(i, o)| {
        let mut w = vec![0.0f64; keys];
        for h in 0..heads {
            let qi = &qkv[i * 3 * hid + h * d..][..d];
            for (j, wj) in w.iter_mut().enumerate() {
                let kj = &qkv[j * 3 * hid + hid + h * d..][..d];
                *wj = qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>() * scale;
            }
            let max = w.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mut sum = 0.0;
            for wj in w.iter_mut() {
                *wj = (*wj - max).exp();
                sum += *wj;
            }
            let oh = &mut o[h * d..(h + 1) * d];
            for (j, wj) in w.iter().enumerate() {
                let vj = &qkv[j * 3 * hid + 2 * hid + h * d..][..d];
                for (oc, vc) in oh.iter_mut().zip(vj) {
                    *oc += wj / sum * vc;
                }
            }
        }
    });
    out
}

/// The encoder output of ONE sequence (`input` is `seq × hidden`) with the weights of
/// `seed`, in f64. Attention never mixes sequences, so this is the reference for that
/// sequence in any batch.
pub fn reference_forward(config: &BertConfig, seed: u64, seq: usize, input: &[f32]) -> Vec<f64> {
    reference_forward_len(config, seed, seq, input, seq)
}

/// [`reference_forward`] of a sequence whose first `key_len` positions are real tokens:
/// attention sees only those keys (the rest is padding).
pub fn reference_forward_len(
    config: &BertConfig,
    seed: u64,
    seq: usize,
    input: &[f32],
    key_len: usize,
) -> Vec<f64> {
    let x = input.iter().map(|&v| v as f64).collect();
    reference_layers(config, seq, x, key_len.min(seq), |l| {
        Cow::Owned(LayerWeights::generate(config, seed, l))
    })
}

/// The encoder output of ONE sequence of `seq` positions whose first `key_len` are real
/// tokens (attention sees only those keys), with the given layers' weights (a
/// checkpoint's), from an f64 `input` (`seq × hidden`, e.g. [`crate::Embeddings::reference`]).
pub fn reference_forward_with(
    config: &BertConfig,
    layers: &[LayerWeights],
    seq: usize,
    input: Vec<f64>,
    key_len: usize,
) -> Vec<f64> {
    reference_layers(config, seq, input, key_len.min(seq), |l| {
        Cow::Borrowed(&layers[l])
    })
}

/// The layers over `x` (`seq × hidden`), layer `l`'s weights from `weights(l)`; attention
/// sees the first `keys` (at most `seq`) of each sequence.
pub(crate) fn reference_layers<'w>(
    config: &BertConfig,
    seq: usize,
    mut x: Vec<f64>,
    keys: usize,
    weights: impl Fn(usize) -> Cow<'w, LayerWeights>,
) -> Vec<f64> {
    let (h, heads, d) = (config.hidden, config.heads, config.head_dim());
    assert_eq!(x.len(), seq * h, "input must be seq × hidden");
    for l in 0..config.layers {
        let w = weights(l);
        let qkv = linear(&x, h, &w.w_qkv, &w.b_qkv, Act::Identity);
        let ctx = attention(&qkv, seq, heads, d, keys);
        let proj = linear(&ctx, h, &w.w_o, &w.b_o, Act::Identity);
        add_layer_norm(&mut x, &proj, &w.ln1_gamma, &w.ln1_beta, config.ln_eps);
        let ffn = linear(&x, h, &w.w_ffn1, &w.b_ffn1, config.act);
        let proj = linear(&ffn, config.ffn, &w.w_ffn2, &w.b_ffn2, Act::Identity);
        add_layer_norm(&mut x, &proj, &w.ln2_gamma, &w.ln2_beta, config.ln_eps);
    }
    x
}

/// How far an output is from its reference.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Agreement {
    /// Largest `|got − reference|`.
    pub max_abs_err: f64,
    /// Where it is (index into the output).
    pub at: usize,
    /// Values compared.
    pub values: usize,
}

/// Compares an output with its reference: every value finite and within [`TOLERANCE`].
///
/// Why `2e-4` absolute: the outputs come out of a LayerNorm with `γ ≈ 1`, so they are of
/// unit scale and an absolute bound is a relative one. Each f32 GEMM rounds like a
/// `√K`-term sum (relative `ε·√K ≈ 7e-6` at K = 3072), GELU and the softmax's `exp` are
/// approximated to a few ε, and LayerNorm re-scales the error of every layer instead of
/// letting it grow: BERT-base (12 layers, seq 128) measured `max |err|` ≈ 3e-6 (the `infer`
/// command prints it for every shape), so the bound leaves ~50× for other summation orders
/// and kernels. A wrong result is far outside it: a bias value off by 0.02 (the model's
/// weight scale) moves an output by ~0.02, a dropped key in attention or a swapped head by
/// more.
pub fn check(got: &[f32], reference: &[f64]) -> Result<Agreement, Agreement> {
    let mut worst = Agreement {
        max_abs_err: 0.0,
        at: 0,
        values: got.len(),
    };
    if got.len() != reference.len() {
        worst.max_abs_err = f64::INFINITY;
        return Err(worst);
    }
    for (i, (&g, &r)) in got.iter().zip(reference).enumerate() {
        let e = if g.is_finite() {
            (g as f64 - r).abs()
        } else {
            f64::INFINITY
        };
        if e > worst.max_abs_err || (e.is_nan() && !worst.max_abs_err.is_nan()) {
            worst.max_abs_err = e;
            worst.at = i;
        }
    }
    if worst.max_abs_err <= TOLERANCE {
        Ok(worst)
    } else {
        Err(worst)
    }
}
