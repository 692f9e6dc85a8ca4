//! One post-LayerNorm transformer encoder layer (BERT's) over weights packed once: the
//! sequence of runtime calls the BERT encoder and the Python drop-in both run, so a layer is
//! one call from wherever it is served.
//!
//! ```text
//! qkv  = x·Wqkv + b            (one GEMM for the three projections)
//! ctx  = attention_qkv(qkv)    (heads split and merged around the tuned attention)
//! x    = LN1(x + ctx·Wo + bo)
//! x    = LN2(x + act(x·Wup + bup)·Wdown + bdown)   (act fused into the up projection)
//! ```

use kernels::cpu::pool::{self, on_workers};
use kernels::workload::Act;

use crate::layer::{add_layer_norm, AttentionRows};
use crate::{Level, PackedWeight, Runtime, RuntimeError};

/// A layer's stages, in order, as [`EncoderLayer::forward`] reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The fused Q, K, V projection (one GEMM with bias).
    Qkv,
    /// Attention over the projection's rows (masked where key lengths are given).
    Attention,
    /// The attention output projection.
    OutProj,
    /// The feed-forward up projection with its fused activation.
    FfnUp,
    /// The feed-forward down projection.
    FfnDown,
    /// A residual add and LayerNorm (after the output projection, and after the FFN).
    LayerNorm,
}

/// A projection: its packed weight and its bias.
pub type Projection<'a> = (&'a PackedWeight, &'a [f32]);

/// A layer's weights, borrowed: its four projections (the FFN's activation is the one
/// `ffn_up` was packed with) and its two LayerNorms `(γ, β)`.
#[derive(Debug, Clone, Copy)]
pub struct EncoderLayer<'a> {
    /// Q, K and V in one: `3·hidden × hidden` (out × in), its output rows Q, then K, then V,
    /// each `hidden` wide with the heads side by side.
    pub qkv: Projection<'a>,
    /// The attention output projection, `hidden × hidden`.
    pub out: Projection<'a>,
    /// The LayerNorm after attention, `(γ, β)` of `hidden` values each.
    pub ln1: (&'a [f32], &'a [f32]),
    /// The feed-forward up projection, `ffn × hidden`, packed with its activation.
    pub ffn_up: Projection<'a>,
    /// The feed-forward down projection, `hidden × ffn`.
    pub ffn_down: Projection<'a>,
    /// The LayerNorm after the feed-forward block, `(γ, β)` of `hidden` values each.
    pub ln2: (&'a [f32], &'a [f32]),
    /// Attention heads (they split the hidden width evenly).
    pub heads: usize,
    /// LayerNorm's epsilon.
    pub eps: f32,
}

/// The activations of one layer's forward pass, reused from call to call.
#[derive(Debug, Default)]
pub struct LayerScratch {
    qkv: Vec<f32>,
    ctx: Vec<f32>,
    proj: Vec<f32>,
    ffn: Vec<f32>,
}

fn sized(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buf.resize(len, 0.0);
    &mut buf[..len]
}

impl EncoderLayer<'_> {
    /// The hidden width, from the query/key/value projection (`3·hidden × hidden`).
    pub fn hidden(&self) -> usize {
        self.qkv.0.dims().1
    }

    /// Checks that the weights fit one another: an error naming the first that does not.
    pub fn check(&self) -> Result<(), RuntimeError> {
        let h = self.hidden();
        let f = self.ffn_up.0.dims().0;
        let bad = |reason: String| Err(RuntimeError::Layer { reason });
        for (name, (w, b), want) in [
            ("qkv", self.qkv, (3 * h, h)),
            ("out", self.out, (h, h)),
            ("ffn_up", self.ffn_up, (f, h)),
            ("ffn_down", self.ffn_down, (h, f)),
        ] {
            if w.dims() != want {
                return bad(format!(
                    "{name} weight is {:?} (out × in), expected {want:?} for hidden {h}",
                    w.dims()
                ));
            }
            if b.len() != want.0 {
                return bad(format!(
                    "{name} bias has {} values, expected {}",
                    b.len(),
                    want.0
                ));
            }
        }
        for (name, w) in [
            ("qkv", self.qkv.0),
            ("out", self.out.0),
            ("ffn_down", self.ffn_down.0),
        ] {
            if w.act() != Act::Identity {
                return bad(format!(
                    "{name} weight was packed with activation {}; only ffn_up's carries one",
                    w.act().name()
                ));
            }
        }
        for (name, (g, b)) in [("ln1", self.ln1), ("ln2", self.ln2)] {
            if g.len() != h || b.len() != h {
                return bad(format!(
                    "{name} has {} and {} values, expected {h} each",
                    g.len(),
                    b.len()
                ));
            }
        }
        if self.heads == 0 || !h.is_multiple_of(self.heads) {
            return bad(format!("{} heads do not split hidden {h}", self.heads));
        }
        crate::layer::check_eps(self.eps)
    }

    /// The layer over `batch` sequences of `seq` tokens, in place: `x` (`batch·seq ×
    /// hidden`) becomes the layer's output. `key_lens` masks a padded batch as
    /// [`Runtime::attention_masked`] does. `on_stage` hears of each stage as it ends, with the
    /// level that served it (`None` for LayerNorm). On an error `x` may be partly updated.
    /// Its parallel stages run from one entry into rayon's pool ([`on_workers`]), on whose
    /// thread `on_stage` is called.
    pub fn forward(
        &self,
        rt: &Runtime,
        shape: (usize, usize),
        key_lens: Option<&[i32]>,
        x: &mut [f32],
        scratch: &mut LayerScratch,
        on_stage: impl FnMut(Stage, Option<Level>) + Send,
    ) -> Result<(), RuntimeError> {
        on_workers(pool::threads(), || {
            self.forward_here(rt, shape, key_lens, x, scratch, on_stage)
        })
    }

    /// [`EncoderLayer::forward`] from this thread.
    fn forward_here(
        &self,
        rt: &Runtime,
        (batch, seq): (usize, usize),
        key_lens: Option<&[i32]>,
        x: &mut [f32],
        scratch: &mut LayerScratch,
        mut on_stage: impl FnMut(Stage, Option<Level>),
    ) -> Result<(), RuntimeError> {
        self.check()?;
        let h = self.hidden();
        let f = self.ffn_up.0.dims().0;
        // Saturating: a product past usize::MAX matches no buffer's length.
        let m = batch.saturating_mul(seq);
        if x.len() != m.saturating_mul(h) {
            return Err(RuntimeError::Layer {
                reason: format!(
                    "x has {} values, batch {batch} × seq {seq} × hidden {h} needs {}",
                    x.len(),
                    batch as u128 * seq as u128 * h as u128
                ),
            });
        }
        if m == 0 {
            return Ok(()); // an empty batch: nothing to compute (no GEMM takes M = 0)
        }
        let LayerScratch {
            qkv,
            ctx,
            proj,
            ffn,
        } = scratch;
        let (qkv, ctx) = (sized(qkv, 3 * m * h), sized(ctx, m * h));
        let (proj, ffn) = (sized(proj, m * h), sized(ffn, m * f));
        let dims = AttentionRows {
            batch,
            seq,
            heads: self.heads,
            d: h / self.heads,
            causal: false,
        };
        let gemm =
            |(w, b): Projection<'_>, a: &[f32], c: &mut [f32]| rt.gemm_bias_act_packed(w, a, b, c);
        on_stage(Stage::Qkv, Some(gemm(self.qkv, x, qkv)?));
        on_stage(
            Stage::Attention,
            Some(rt.attention_qkv(dims, key_lens, qkv, ctx)?),
        );
        on_stage(Stage::OutProj, Some(gemm(self.out, ctx, proj)?));
        add_layer_norm(x, Some(proj), self.ln1.0, self.ln1.1, self.eps)?;
        on_stage(Stage::LayerNorm, None);
        on_stage(Stage::FfnUp, Some(gemm(self.ffn_up, x, ffn)?));
        on_stage(Stage::FfnDown, Some(gemm(self.ffn_down, ffn, proj)?));
        add_layer_norm(x, Some(proj), self.ln2.0, self.ln2.1, self.eps)?;
        on_stage(Stage::LayerNorm, None);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels::Act;

    /// Deterministic values in about [-0.5, 0.5).
    fn vals(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + seed * 104_729) % 1000) as f32 / 1000.0 - 0.5)
            .collect()
    }

    #[test]
    fn a_layer_is_its_calls_in_order_and_checks_its_weights() {
        let rt = Runtime::defaults_only();
        let (h, f, heads, batch, seq) = (16, 40, 4, 2, 7);
        let pack = |n, k, act, seed| rt.pack_weight_for(n, k, act, &vals(n * k, seed), &[14]);
        let (wqkv, wo) = (
            pack(3 * h, h, Act::Identity, 1).unwrap(),
            pack(h, h, Act::Identity, 2).unwrap(),
        );
        let (wup, wdown) = (
            pack(f, h, Act::GeluErf, 3).unwrap(),
            pack(h, f, Act::Identity, 4).unwrap(),
        );
        let (bqkv, bo, bup, bdown) = (vals(3 * h, 5), vals(h, 6), vals(f, 7), vals(h, 8));
        let (g1, b1, g2, b2) = (vals(h, 9), vals(h, 10), vals(h, 11), vals(h, 12));
        let layer = EncoderLayer {
            qkv: (&wqkv, &bqkv),
            out: (&wo, &bo),
            ln1: (&g1, &b1),
            ffn_up: (&wup, &bup),
            ffn_down: (&wdown, &bdown),
            ln2: (&g2, &b2),
            heads,
            eps: 1e-12,
        };
        let x0 = vals(batch * seq * h, 13);
        let lens = [7, 3];
        let mut x = x0.clone();
        let mut stages = Vec::new();
        layer
            .forward(
                &rt,
                (batch, seq),
                Some(&lens),
                &mut x,
                &mut LayerScratch::default(),
                |s, _| stages.push(s),
            )
            .unwrap();
        use Stage::*;
        assert_eq!(
            stages,
            [Qkv, Attention, OutProj, LayerNorm, FfnUp, FfnDown, LayerNorm]
        );

        // The same calls made one by one.
        let m = batch * seq;
        let mut want = x0.clone();
        let (mut qkv, mut ctx, mut proj, mut ffn) = (
            vec![0.0; 3 * m * h],
            vec![0.0; m * h],
            vec![0.0; m * h],
            vec![0.0; m * f],
        );
        rt.gemm_bias_act_packed(&wqkv, &want, &bqkv, &mut qkv)
            .unwrap();
        let dims = AttentionRows {
            batch,
            seq,
            heads,
            d: h / heads,
            causal: false,
        };
        rt.attention_qkv(dims, Some(&lens), &qkv, &mut ctx).unwrap();
        rt.gemm_bias_act_packed(&wo, &ctx, &bo, &mut proj).unwrap();
        add_layer_norm(&mut want, Some(&proj), &g1, &b1, 1e-12).unwrap();
        rt.gemm_bias_act_packed(&wup, &want, &bup, &mut ffn)
            .unwrap();
        rt.gemm_bias_act_packed(&wdown, &ffn, &bdown, &mut proj)
            .unwrap();
        add_layer_norm(&mut want, Some(&proj), &g2, &b2, 1e-12).unwrap();
        assert_eq!(x, want);

        // An empty batch (no sequences, or sequences of no tokens) is nothing to compute.
        for shape in [(0, seq), (batch, 0)] {
            layer
                .forward(
                    &rt,
                    shape,
                    None,
                    &mut [],
                    &mut LayerScratch::default(),
                    |_, _| {},
                )
                .unwrap();
        }

        // Weights that do not fit, and a wrong x: errors naming what is wrong.
        let mut scratch = LayerScratch::default();
        let mut run = |l: EncoderLayer<'_>, x: &mut [f32]| {
            l.forward(&rt, (batch, seq), None, x, &mut scratch, |_, _| {})
                .unwrap_err()
                .to_string()
        };
        let short = vals(h - 1, 0);
        let relu_out = pack(h, h, Act::Relu, 2).unwrap();
        for (l, needle) in [
            (
                EncoderLayer {
                    out: (&relu_out, &bo),
                    ..layer
                },
                "out weight was packed with activation relu",
            ),
            (EncoderLayer { heads: 3, ..layer }, "3 heads"),
            (
                EncoderLayer {
                    eps: f32::NAN,
                    ..layer
                },
                "argument 'eps': NaN",
            ),
            (
                EncoderLayer {
                    out: (&wup, &bo),
                    ..layer
                },
                "out weight",
            ),
            (
                EncoderLayer {
                    ffn_down: (&wdown, &short),
                    ..layer
                },
                "ffn_down bias",
            ),
            (
                EncoderLayer {
                    ln2: (&g2, &short),
                    ..layer
                },
                "ln2",
            ),
        ] {
            let err = run(l, &mut x0.clone());
            assert!(err.contains(needle), "{err}");
        }
        assert!(run(layer, &mut x0[1..].to_vec()).contains("x has"));
    }
}
