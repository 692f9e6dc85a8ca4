//! The glue of a transformer layer around the tuned ops, in the row layout the GEMMs use:
//! attention straight from a fused QKV projection's rows ([`Runtime::attention_qkv`]: head
//! split, the tuned attention, head merge) and the residual add + LayerNorm
//! ([`add_layer_norm`]). Plain Rust the compiler vectorises, parallel over rows or heads
//! ([`pool::each_chunk`]), so callers (the BERT encoder, the Python drop-in, C) need no copies of their
//! own between the GEMMs.

use kernels::cpu::pool;

use crate::ops::{buffer, by_batch_blocks, AttentionCall};
use crate::{Level, Runtime, RuntimeError};

/// Sum of a slice with 8 independent accumulators (a vectorisable reduction).
#[inline]
fn sum8(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            acc[i] += f(c[i]);
        }
    }
    acc.iter().sum::<f32>() + tail.iter().map(|&v| f(v)).sum::<f32>()
}

/// `x = LayerNorm(x + r)` row by row (rows of `gamma.len()` values; without `r`, plain
/// LayerNorm): mean and variance over the row (two passes, so no cancellation), then
/// `γ·(v − μ)/√(σ² + eps) + β`. Errors (nothing written) if a length does not fit or
/// `eps` is not a positive finite number.
pub fn add_layer_norm(
    x: &mut [f32],
    r: Option<&[f32]>,
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
) -> Result<(), RuntimeError> {
    check_eps(eps)?;
    let h = gamma.len();
    let what = LayerNormOf(h);
    if h == 0 {
        return buffer(what, "gamma", 0, 1);
    }
    buffer(what, "x", x.len(), x.len().div_ceil(h) * h)?;
    buffer(what, "beta", beta.len(), h)?;
    if let Some(r) = r {
        buffer(what, "residual", r.len(), x.len())?;
    }
    if x.is_empty() {
        return Ok(());
    }
    pool::each_chunk(x, h, |i, row| {
        if let Some(r) = r {
            row.iter_mut()
                .zip(&r[i * h..][..h])
                .for_each(|(v, r)| *v += r);
        }
        let mean = sum8(row, |v| v) / h as f32;
        let var = sum8(row, |v| (v - mean) * (v - mean)) / h as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for ((v, g), b) in row.iter_mut().zip(gamma).zip(beta) {
            *v = (*v - mean) * inv * g + b;
        }
    });
    Ok(())
}

/// Refuses a LayerNorm epsilon that is not a positive finite number: zero divides a constant
/// row by zero, a negative or NaN one gives NaN rows.
pub fn check_eps(eps: f32) -> Result<(), RuntimeError> {
    if eps > 0.0 && eps.is_finite() {
        return Ok(());
    }
    Err(RuntimeError::Argument {
        name: "eps",
        reason: format!("{eps} is not a positive finite number"),
    })
}

/// How a LayerNorm call is named in its errors.
#[derive(Clone, Copy)]
struct LayerNormOf(usize);

impl std::fmt::Display for LayerNormOf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "layer_norm of rows of {}", self.0)
    }
}

/// The dimensions of attention over rows: `batch` sequences of `seq` tokens, `heads` heads
/// of `d` values (the rows hold `heads·d` values per projection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionRows {
    /// Sequences.
    pub batch: usize,
    /// Tokens per sequence (padded ones included).
    pub seq: usize,
    /// Attention heads.
    pub heads: usize,
    /// Values per head.
    pub d: usize,
    /// Whether a token attends only to itself and the tokens before it.
    pub causal: bool,
}

impl AttentionRows {
    /// Values of one projection: `batch·seq·heads·d` (`usize::MAX` past it: no buffer's
    /// length).
    pub fn len(self) -> usize {
        [self.seq, self.heads, self.d]
            .into_iter()
            .fold(self.batch, usize::saturating_mul)
    }

    /// Whether there is no value at all.
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }
}

impl Runtime {
    /// Self-attention from a fused QKV projection's output: `qkv` is `[batch·seq, 3·heads·d]`
    /// rows (Q, then K, then V; head `h` at columns `h·d..` of each), `out` gets
    /// `[batch·seq, heads·d]` rows (head `h` at columns `h·d..`), ready for the output
    /// projection. `key_lens` (one per sequence, each in `0..=seq`) masks a padded batch as
    /// in [`Runtime::attention_masked`]. The tuned variant reads and writes the rows in
    /// place where it can (the fused CPU families do); for one that cannot, the heads are
    /// split out and merged back in buffers the thread keeps. Returns the level that
    /// answered.
    pub fn attention_qkv(
        &self,
        dims: AttentionRows,
        key_lens: Option<&[i32]>,
        qkv: &[f32],
        out: &mut [f32],
    ) -> Result<Level, RuntimeError> {
        let AttentionRows {
            batch,
            seq,
            heads,
            d,
            causal,
        } = dims;
        let call = AttentionCall::of(batch, heads, seq, d, causal)?;
        let n = dims.len();
        buffer(&call, "qkv", qkv.len(), n.saturating_mul(3))?;
        buffer(&call, "o", out.len(), n)?;
        if let Some(lens) = key_lens {
            buffer(&call, "key_lens", lens.len(), batch)?;
        }
        let w = match call {
            AttentionCall::One(w) => w,
            AttentionCall::Blocks { per_call, .. } => {
                let per = seq * heads * d;
                return by_batch_blocks(batch, per_call, |first, count| {
                    let block = AttentionRows {
                        batch: count,
                        ..dims
                    };
                    let lens = key_lens.map(|l| &l[first..first + count]);
                    let qkv = &qkv[3 * first * per..3 * (first + count) * per];
                    let out = &mut out[first * per..(first + count) * per];
                    self.attention_qkv(block, lens, qkv, out)
                });
            }
        };
        let w = self.serve_as(&w);
        self.serve(&w, |c| c.run_qkv_rows((qkv, key_lens), out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels::cpu::attention::layout::{merge_heads, split_heads, Layout, Rows};

    #[test]
    fn layer_norm_refuses_an_eps_that_is_not_positive_and_finite() {
        let (g, b) = (vec![1.0f32; 4], vec![0.0f32; 4]);
        let mut x = vec![1.0f32, 2.0, 3.0, 4.0];
        for eps in [0.0, -1e-5, f32::NAN, f32::INFINITY] {
            let err = add_layer_norm(&mut x, None, &g, &b, eps).unwrap_err();
            assert!(
                matches!(err, RuntimeError::Argument { name: "eps", .. }),
                "{eps}: {err}"
            );
            assert_eq!(x, [1.0, 2.0, 3.0, 4.0]);
        }
        add_layer_norm(&mut x, None, &g, &b, 1e-12).unwrap();
    }

    #[test]
    fn layer_norm_matches_f64() {
        let h = 37;
        let x0: Vec<f32> = (0..3 * h)
            .map(|i| ((i * 7 % 13) as f32) * 0.3 - 1.0)
            .collect();
        let r: Vec<f32> = (0..3 * h).map(|i| (i % 5) as f32 * 0.1).collect();
        let gamma: Vec<f32> = (0..h).map(|i| 1.0 + i as f32 * 0.01).collect();
        let beta: Vec<f32> = (0..h).map(|i| i as f32 * -0.02).collect();
        for residual in [true, false] {
            let mut x = x0.clone();
            let res = residual.then_some(&r[..]);
            add_layer_norm(&mut x, res, &gamma, &beta, 1e-12).unwrap();
            for row in 0..3 {
                let v: Vec<f64> = (0..h)
                    .map(|j| x0[row * h + j] as f64 + res.map_or(0.0, |r| r[row * h + j] as f64))
                    .collect();
                let mean = v.iter().sum::<f64>() / h as f64;
                let var = v.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / h as f64;
                for j in 0..h {
                    let want = (v[j] - mean) / var.sqrt() * gamma[j] as f64 + beta[j] as f64;
                    assert!((x[row * h + j] as f64 - want).abs() < 1e-5, "{row} {j}");
                }
            }
        }
    }

    #[test]
    fn layer_norm_refuses_wrong_lengths_and_writes_nothing() {
        let (g, b) = (vec![1.0f32; 4], vec![0.0f32; 4]);
        let mut x = vec![2.0f32; 10]; // not whole rows of 4
        assert!(add_layer_norm(&mut x, None, &g, &b, 1e-5).is_err());
        let mut x = vec![2.0f32; 8];
        assert!(add_layer_norm(&mut x, None, &g, &b[..3], 1e-5).is_err());
        assert!(add_layer_norm(&mut x, Some(&[1.0; 4]), &g, &b, 1e-5).is_err());
        assert!(add_layer_norm(&mut x, None, &[], &[], 1e-5).is_err());
        assert_eq!(x, vec![2.0; 8]);
        add_layer_norm(&mut [], None, &g, &b, 1e-5).unwrap();
    }

    #[test]
    fn attention_qkv_is_split_attention_merge() {
        let rt = Runtime::defaults_only();
        for (dims, lens) in [
            ((2, 13, 3, 8, false), None),
            ((3, 17, 2, 16, true), None),
            ((3, 9, 2, 5, false), Some(vec![9, 4, 0])),
        ] {
            let (b, s, h, d, causal) = dims;
            let rows = AttentionRows {
                batch: b,
                seq: s,
                heads: h,
                d,
                causal,
            };
            let n = rows.len();
            let qkv: Vec<f32> = (0..3 * n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0)
                .collect();
            let w = kernels::Workload::attention(b, h, s, d, causal).unwrap();
            let layout = Rows::of(&w, Layout::QkvRows);
            let mut heads = vec![0.0; 3 * n];
            split_heads(&layout, &qkv, &mut heads);
            let (q, kv) = heads.split_at(n);
            let (k, v) = kv.split_at(n);
            let mut ctx = vec![0.0; n];
            match &lens {
                Some(l) => rt.attention_masked(b, h, s, d, causal, l, q, k, v, &mut ctx),
                None => rt.attention(b, h, s, d, causal, q, k, v, &mut ctx),
            }
            .unwrap();
            let mut want = vec![0.0; n];
            merge_heads(&layout, &ctx, &mut want);
            let mut got = vec![f32::NAN; n];
            rt.attention_qkv(rows, lens.as_deref(), &qkv, &mut got)
                .unwrap();
            assert_eq!(got, want, "{dims:?}");
        }
        let rows = AttentionRows {
            batch: 1,
            seq: 4,
            heads: 2,
            d: 3,
            causal: false,
        };
        let mut out = vec![0.0; 24];
        let err = rt
            .attention_qkv(rows, None, &[0.0; 71], &mut out)
            .unwrap_err();
        assert!(err.to_string().contains("'qkv' has 71 elements"), "{err}");
        assert!(rt
            .attention_qkv(rows, None, &[0.0; 72], &mut out[..23])
            .is_err());
        assert!(rt
            .attention_qkv(rows, Some(&[5]), &[0.0; 72], &mut out)
            .is_err());
    }

    #[test]
    fn layer_norm_in_parallel_matches_row_by_row() {
        let h = 37;
        let rows = 1000; // past one task's work
        let x0: Vec<f32> = (0..rows * h).map(|i| ((i * 7 % 13) as f32) * 0.3).collect();
        let r: Vec<f32> = (0..rows * h).map(|i| (i % 5) as f32 * 0.1).collect();
        let (gamma, beta) = (vec![1.5f32; h], vec![0.25f32; h]);
        let mut all = x0.clone();
        add_layer_norm(&mut all, Some(&r), &gamma, &beta, 1e-12).unwrap();
        for i in [0, 1, 499, 999] {
            let mut row = x0[i * h..][..h].to_vec();
            add_layer_norm(&mut row, Some(&r[i * h..][..h]), &gamma, &beta, 1e-12).unwrap();
            assert_eq!(row, all[i * h..][..h], "row {i}");
        }
    }
}
