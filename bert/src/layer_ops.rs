//! The non-GEMM work of a layer, in plain Rust the compiler vectorises: residual add +
//! LayerNorm, and the head split / merge around attention. Rayon over rows or heads.

use rayon::prelude::*;

/// Rows per rayon task: enough work (≈ 16 K values at H = 768) to outweigh a task's cost.
fn rows_per_task(width: usize) -> usize {
    (16_384 / width.max(1)).max(1)
}

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

/// `x = LayerNorm(x + r)` row by row (rows of `gamma.len()` values): mean and variance
/// over the row (two passes, so no cancellation), then `γ·(v − μ)/√(σ² + eps) + β`.
pub fn add_layer_norm(x: &mut [f32], r: &[f32], gamma: &[f32], beta: &[f32], eps: f32) {
    let h = gamma.len();
    debug_assert_eq!(x.len(), r.len());
    x.par_chunks_mut(h)
        .zip(r.par_chunks(h))
        .with_min_len(rows_per_task(h))
        .for_each(|(row, res)| {
            row.iter_mut().zip(res).for_each(|(v, r)| *v += r);
            let mean = sum8(row, |v| v) / h as f32;
            let var = sum8(row, |v| (v - mean) * (v - mean)) / h as f32;
            let inv = 1.0 / (var + eps).sqrt();
            for ((v, g), b) in row.iter_mut().zip(gamma).zip(beta) {
                *v = (*v - mean) * inv * g + b;
            }
        });
}

/// Splits `qkv` (`[B·S, 3H]`, Q then K then V, head `h` at columns `h·D..`) into
/// `q`, `k`, `v`, each `[B, heads, S, D]`.
pub fn split_heads(
    qkv: &[f32],
    (batch, seq, heads, d): (usize, usize, usize, usize),
    q: &mut [f32],
    k: &mut [f32],
    v: &mut [f32],
) {
    let hid = heads * d;
    let per_head = seq * d;
    debug_assert_eq!(qkv.len(), batch * seq * 3 * hid);
    let outs = [q, k, v];
    for (part, out) in outs.into_iter().enumerate() {
        out.par_chunks_mut(per_head)
            .enumerate()
            .for_each(|(bh, dst)| {
                let (b, h) = (bh / heads, bh % heads);
                for s in 0..seq {
                    let src = &qkv[(b * seq + s) * 3 * hid + part * hid + h * d..][..d];
                    dst[s * d..(s + 1) * d].copy_from_slice(src);
                }
            });
    }
}

/// Merges `ctx` (`[B, heads, S, D]`) back into rows: `out[b·S + s, h·D + j]`.
pub fn merge_heads(
    ctx: &[f32],
    (_batch, seq, heads, d): (usize, usize, usize, usize),
    out: &mut [f32],
) {
    let hid = heads * d;
    out.par_chunks_mut(hid)
        .with_min_len(rows_per_task(hid))
        .enumerate()
        .for_each(|(row, dst)| {
            let (b, s) = (row / seq, row % seq);
            for h in 0..heads {
                let src = &ctx[((b * heads + h) * seq + s) * d..][..d];
                dst[h * d..(h + 1) * d].copy_from_slice(src);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_norm_matches_f64() {
        let h = 37;
        let x0: Vec<f32> = (0..3 * h)
            .map(|i| ((i * 7 % 13) as f32) * 0.3 - 1.0)
            .collect();
        let r: Vec<f32> = (0..3 * h).map(|i| (i % 5) as f32 * 0.1).collect();
        let gamma: Vec<f32> = (0..h).map(|i| 1.0 + i as f32 * 0.01).collect();
        let beta: Vec<f32> = (0..h).map(|i| i as f32 * -0.02).collect();
        let mut x = x0.clone();
        add_layer_norm(&mut x, &r, &gamma, &beta, 1e-12);
        for row in 0..3 {
            let v: Vec<f64> = (0..h)
                .map(|j| x0[row * h + j] as f64 + r[row * h + j] as f64)
                .collect();
            let mean = v.iter().sum::<f64>() / h as f64;
            let var = v.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / h as f64;
            for j in 0..h {
                let want = (v[j] - mean) / var.sqrt() * gamma[j] as f64 + beta[j] as f64;
                assert!((x[row * h + j] as f64 - want).abs() < 1e-5, "{row} {j}");
            }
        }
    }

    #[test]
    fn split_then_merge_round_trips_each_part() {
        let (b, s, heads, d) = (2, 3, 4, 5);
        let hid = heads * d;
        let qkv: Vec<f32> = (0..b * s * 3 * hid).map(|i| i as f32).collect();
        let n = b * heads * s * d;
        let (mut q, mut k, mut v) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
        split_heads(&qkv, (b, s, heads, d), &mut q, &mut k, &mut v);
        // q[b=1, h=2, s=1, j=3] = qkv[row 1·3+1, col 0·hid + 2·5 + 3]
        assert_eq!(q[((4 + 2) * s + 1) * d + 3], qkv[4 * 3 * hid + 13]);
        assert_eq!(
            v[((4 + 2) * s + 1) * d + 3],
            qkv[4 * 3 * hid + 2 * hid + 13]
        );
        for (part, t) in [&q, &k, &v].into_iter().enumerate() {
            let mut rows = vec![0.0; b * s * hid];
            merge_heads(t, (b, s, heads, d), &mut rows);
            for r in 0..b * s {
                assert_eq!(
                    rows[r * hid..(r + 1) * hid],
                    qkv[r * 3 * hid + part * hid..][..hid]
                );
            }
        }
    }
}
