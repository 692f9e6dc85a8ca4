//! Model sizes and the workloads they call.

use std::fmt;

use kernels::{Act, Workload};

/// The longest sequence a BERT model takes: its checkpoints carry 512 position embeddings.
pub const MAX_SEQ: usize = 512;

/// The sizes of a BERT encoder (post-LayerNorm) and its feed-forward activation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BertConfig {
    /// Name used in reports and on the command line (`bert-base`, `bert-large`, `bert-tiny`).
    pub name: &'static str,
    /// Encoder layers run per forward pass (ALBERT's share weights: see
    /// [`crate::Checkpoint::steps`]).
    pub layers: usize,
    /// Hidden size H (the width of every token's vector).
    pub hidden: usize,
    /// Width E of the embedding tables: `hidden`, but for ELECTRA's and ALBERT's
    /// `embedding_size`.
    pub embedding: usize,
    /// Whether a linear layer maps the embeddings (E wide) to `hidden` before the encoder:
    /// ELECTRA's `embeddings_project` when the widths differ, ALBERT's
    /// `embedding_hidden_mapping_in` always.
    pub projected: bool,
    /// Attention heads; `hidden` is a multiple of it.
    pub heads: usize,
    /// Width of the feed-forward block.
    pub ffn: usize,
    /// LayerNorm epsilon.
    pub ln_eps: f32,
    /// Standard deviation of the random weights (BERT's `initializer_range`).
    pub init_std: f32,
    /// The feed-forward activation: [`Act::GeluErf`] for `hidden_act: "gelu"` (published
    /// BERT checkpoints), [`Act::Gelu`] for `gelu_new` (the tanh form; the seeded models).
    pub act: Act,
}

impl BertConfig {
    /// BERT-base: 12 layers, hidden 768, 12 heads of 64, FFN 3072 (about 85 M encoder weights).
    pub fn bert_base() -> BertConfig {
        BertConfig {
            name: "bert-base",
            layers: 12,
            hidden: 768,
            embedding: 768,
            projected: false,
            heads: 12,
            ffn: 3072,
            ln_eps: 1e-12,
            init_std: 0.02,
            act: Act::Gelu,
        }
    }

    /// BERT-large: 24 layers, hidden 1024, 16 heads of 64, FFN 4096 (about 302 M encoder
    /// weights).
    pub fn bert_large() -> BertConfig {
        BertConfig {
            name: "bert-large",
            layers: 24,
            hidden: 1024,
            embedding: 1024,
            projected: false,
            heads: 16,
            ffn: 4096,
            ..BertConfig::bert_base()
        }
    }

    /// A 2-layer model for tests: hidden 64, 4 heads of 16, FFN 128. Its weights are drawn
    /// 5× wider than BERT's, so attention is far from uniform and every path matters.
    pub fn tiny() -> BertConfig {
        BertConfig {
            name: "bert-tiny",
            layers: 2,
            hidden: 64,
            embedding: 64,
            projected: false,
            heads: 4,
            ffn: 128,
            ln_eps: 1e-12,
            init_std: 0.1,
            act: Act::Gelu,
        }
    }

    /// The model called `name` (`bert-base`, `bert-large` or `bert-tiny`).
    pub fn by_name(name: &str) -> Option<BertConfig> {
        [
            BertConfig::bert_base(),
            BertConfig::bert_large(),
            BertConfig::tiny(),
        ]
        .into_iter()
        .find(|c| c.name == name)
    }

    /// Names accepted by [`BertConfig::by_name`].
    pub const NAMES: [&'static str; 3] = ["bert-base", "bert-large", "bert-tiny"];

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// Encoder weights (matrices, biases and LayerNorm parameters).
    pub fn parameters(&self) -> usize {
        let (h, f) = (self.hidden, self.ffn);
        self.layers * (h * 3 * h + 3 * h + h * h + h + h * f + f + f * h + h + 4 * h)
    }

    /// Floating-point operations of one forward pass over `batch` sequences of `seq`
    /// tokens, counted as the kernels count them (`2·M·N·K` per GEMM, `4·B·H·S²·D` per
    /// attention).
    pub fn flops(&self, batch: usize, seq: usize) -> f64 {
        let layer: f64 = self.workloads(batch, seq).iter().map(|w| w.flops()).sum();
        let projection = self.projection(batch, seq).map_or(0.0, |w| w.flops());
        layer * self.layers as f64 + projection
    }

    /// The embeddings' projection from `embedding` to `hidden` at `batch × seq`, once per
    /// forward pass before the layers; `None` for a model without one (all but ELECTRA and
    /// ALBERT: see [`BertConfig::projected`]).
    pub fn projection(&self, batch: usize, seq: usize) -> Option<Workload> {
        self.projected.then_some(Workload::GemmBiasAct {
            m: batch.saturating_mul(seq),
            n: self.hidden,
            k: self.embedding,
            act: Act::Identity,
            dtype: kernels::DType::F32,
        })
    }

    /// The five kernel calls of one layer at `batch × seq`, in call order: fused QKV
    /// projection, attention, output projection, FFN up (+ activation), FFN down. Every layer
    /// makes the same calls.
    pub fn workloads(&self, batch: usize, seq: usize) -> Vec<Workload> {
        // Saturating: an M past usize::MAX makes workloads their check refuses.
        let (h, f, m) = (self.hidden, self.ffn, batch.saturating_mul(seq));
        vec![
            Workload::GemmBiasAct {
                m,
                n: 3 * h,
                k: h,
                act: Act::Identity,
                dtype: kernels::DType::F32,
            },
            Workload::Attention {
                b: batch,
                h: self.heads,
                s: seq,
                d: self.head_dim(),
                causal: false,
                dtype: kernels::DType::F32,
            },
            Workload::GemmBiasAct {
                m,
                n: h,
                k: h,
                act: Act::Identity,
                dtype: kernels::DType::F32,
            },
            Workload::GemmBiasAct {
                m,
                n: f,
                k: h,
                act: self.act,
                dtype: kernels::DType::F32,
            },
            Workload::GemmBiasAct {
                m,
                n: h,
                k: f,
                act: Act::Identity,
                dtype: kernels::DType::F32,
            },
        ]
    }

    /// Every kernel call's workload at `batch × seq`: the embeddings' projection, if any, then
    /// one layer's (the other layers make the same calls).
    fn calls(&self, batch: usize, seq: usize) -> impl Iterator<Item = Workload> {
        self.projection(batch, seq)
            .into_iter()
            .chain(self.workloads(batch, seq))
    }

    /// The distinct workloads of every `(batch, seq)` in `shapes`, in first-use order (the
    /// embeddings' projection, if any, then a layer's): the list to tune for this model.
    pub fn workload_list(&self, shapes: &[(usize, usize)]) -> Vec<Workload> {
        let mut out: Vec<Workload> = Vec::new();
        for &(b, s) in shapes {
            for w in self.calls(b, s) {
                if !out.contains(&w) {
                    out.push(w);
                }
            }
        }
        out
    }

    /// Checks the sizes: every one at least 1, `hidden` a multiple of `heads`, embeddings of
    /// another width projected, and the layer's workloads valid ones (the fused QKV
    /// projection's `3·hidden` columns within the workloads' dimension limit, for one).
    pub fn validate(&self) -> Result<(), crate::BertError> {
        let bad = |reason: String| Err(crate::BertError::Config { reason });
        if [
            self.layers,
            self.hidden,
            self.embedding,
            self.heads,
            self.ffn,
        ]
        .contains(&0)
        {
            return bad("every size must be at least 1".into());
        }
        if !self.projected && self.embedding != self.hidden {
            return bad(format!(
                "embeddings {} wide need a projection to hidden {}",
                self.embedding, self.hidden
            ));
        }
        if !self.hidden.is_multiple_of(self.heads) {
            return bad(format!(
                "hidden {} is not a multiple of heads {}",
                self.hidden, self.heads
            ));
        }
        match self.calls(1, 1).try_for_each(|w| w.check()) {
            Ok(()) => Ok(()),
            Err(e) => bad(e.to_string()),
        }
    }
}

impl fmt::Display for BertConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({} layers, hidden {}",
            self.name, self.layers, self.hidden
        )?;
        if self.projected {
            write!(f, ", embeddings {} projected", self.embedding)?;
        }
        write!(f, ", {} heads, FFN {})", self.heads, self.ffn)
    }
}
