//! The whole Hugging Face `BertModel` path on a loaded [`Checkpoint`]: embeddings (projected
//! to the hidden size for ELECTRA and ALBERT), then the encoder with the padding masked; and the
//! reference output saved beside a checkpoint.

use std::borrow::Cow;
use std::path::Path;

use kernels::Act;
use runtime::{Level, PackedWeight, Runtime};
use safetensors::SafeTensors;

use crate::{
    BertError, Checkpoint, Embeddings, Encoder, LevelCounts, Scratch, StageTimes, TokenBatch,
};

/// A checkpoint ready to serve: its embedding tables, their projection (ELECTRA, ALBERT)
/// and its encoder, packed for the runtime.
#[derive(Debug)]
pub struct BertModel {
    /// The embedding tables, looked up per token.
    pub embeddings: Embeddings,
    projection: Option<(PackedWeight, Vec<f32>)>,
    /// The encoder layers, their weights packed.
    pub encoder: Encoder,
}

impl BertModel {
    /// The model of `ckpt`, its matrices packed through `rt` for the `(batch, seq)` of
    /// `shapes` (see [`Encoder::load`]).
    pub fn load(
        rt: &Runtime,
        ckpt: &Checkpoint,
        shapes: &[(usize, usize)],
    ) -> Result<BertModel, BertError> {
        let encoder =
            Encoder::from_shared_weights(rt, ckpt.config, &ckpt.layers, &ckpt.steps, shapes)?;
        let projection = match &ckpt.projection {
            Some((w, b)) => {
                let (h, e) = (ckpt.config.hidden, ckpt.config.embedding);
                let ms = crate::encoder::rows_of(shapes)?;
                Some((rt.pack_weight_for(h, e, Act::Identity, w, &ms)?, b.clone()))
            }
            None => None,
        };
        Ok(BertModel {
            embeddings: ckpt.embeddings.clone(),
            projection,
            encoder,
        })
    }

    /// Bytes of weights held: the encoder's ([`Encoder::weight_bytes`]), the embedding tables
    /// and their LayerNorm, and the projection.
    pub fn weight_bytes(&self) -> usize {
        let e = &self.embeddings;
        let tables = [&e.word, &e.position, &e.token_type, &e.ln_gamma, &e.ln_beta];
        let tables: usize = tables.iter().map(|t| 4 * t.len()).sum();
        let projection = self
            .projection
            .as_ref()
            .map_or(0, |(w, b)| w.bytes() + 4 * b.len());
        self.encoder.weight_bytes() + tables + projection
    }

    /// `last_hidden_state` of `tokens` (`batch × seq × hidden`, in [`Scratch::output`]):
    /// embeddings, then the encoder with every sequence's padding masked. Returns how many
    /// kernel calls each runtime level served.
    pub fn forward_with(
        &self,
        rt: &Runtime,
        tokens: &TokenBatch,
        scratch: &mut Scratch,
    ) -> Result<LevelCounts, BertError> {
        self.forward_inner(rt, tokens, scratch, None)
    }

    /// [`BertModel::forward_with`], adding the seconds of each stage to `times` (the
    /// embeddings and their projection count as `other`).
    pub fn forward_profiled(
        &self,
        rt: &Runtime,
        tokens: &TokenBatch,
        scratch: &mut Scratch,
        times: &mut StageTimes,
    ) -> Result<LevelCounts, BertError> {
        self.forward_inner(rt, tokens, scratch, Some(times))
    }

    fn forward_inner(
        &self,
        rt: &Runtime,
        tokens: &TokenBatch,
        scratch: &mut Scratch,
        times: Option<&mut StageTimes>,
    ) -> Result<LevelCounts, BertError> {
        let start = std::time::Instant::now();
        let mut embedded = std::mem::take(&mut scratch.embedded);
        let mut projected = std::mem::take(&mut scratch.projected);
        let r = self
            .embed(rt, tokens, &mut embedded, &mut projected)
            .and_then(|projection| {
                let input = match projection {
                    Some(_) => &projected,
                    None => &embedded,
                };
                let shape = (tokens.batch, tokens.seq);
                let lens = Some(tokens.lens.as_slice()).filter(|_| tokens.padded());
                let mut calls = match times {
                    Some(t) => {
                        t.0[5] += start.elapsed().as_secs_f64();
                        self.encoder
                            .forward_profiled(rt, shape, lens, input, scratch, t)
                    }
                    None => match lens {
                        Some(l) => self.encoder.forward_masked(rt, shape, l, input, scratch),
                        None => self
                            .encoder
                            .forward_with(rt, shape.0, shape.1, input, scratch),
                    },
                }?;
                if let Some(level) = projection {
                    calls.add(level);
                }
                Ok(calls)
            });
        scratch.embedded = embedded;
        scratch.projected = projected;
        r
    }

    /// The embeddings of `tokens` into `embedded` and, for a model with a projection, their
    /// projection to the hidden size into `projected`: the level that served it, if one ran.
    fn embed(
        &self,
        rt: &Runtime,
        tokens: &TokenBatch,
        embedded: &mut Vec<f32>,
        projected: &mut Vec<f32>,
    ) -> Result<Option<Level>, BertError> {
        self.embeddings.forward(tokens, embedded)?;
        let Some((w, b)) = &self.projection else {
            return Ok(None);
        };
        projected.resize(tokens.batch * tokens.seq * b.len(), 0.0);
        Ok(Some(rt.gemm_bias_act_packed(w, embedded, b, projected)?))
    }
}

impl Checkpoint {
    /// The f64 reference of sequence `i` of `tokens` (`seq × hidden`): embeddings and every
    /// layer in f64, attention over the sequence's real tokens.
    pub fn reference(&self, tokens: &TokenBatch, i: usize) -> Vec<f64> {
        let mut input = self.embeddings.reference(tokens, i);
        if let Some((w, b)) = &self.projection {
            let (e, h) = (self.config.embedding, self.config.hidden);
            input = input
                .chunks_exact(e)
                .flat_map(|x| {
                    (0..h).map(move |o| {
                        let dot: f64 = x
                            .iter()
                            .enumerate()
                            .map(|(i, &v)| v * w[i * h + o] as f64)
                            .sum();
                        dot + b[o] as f64
                    })
                })
                .collect();
        }
        let len = tokens.lens[i].max(0) as usize;
        let keys = len.min(tokens.seq);
        crate::reference::reference_layers(&self.config, tokens.seq, input, keys, |l| {
            Cow::Borrowed(&self.layers[self.steps[l]])
        })
    }
}

/// A model's output computed elsewhere (by `transformers`), saved beside a checkpoint as
/// `expected.safetensors` with one f32 tensor `last_hidden_state` of shape
/// `[batch, seq, hidden]`.
#[derive(Debug, Clone)]
pub struct Expected {
    /// Sequences.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// Values per token.
    pub hidden: usize,
    /// `last_hidden_state`, row-major `[batch, seq, hidden]`.
    pub values: Vec<f32>,
}

impl Expected {
    /// Reads `path`.
    pub fn load(path: &Path) -> Result<Expected, BertError> {
        let bad = |reason: String| BertError::Checkpoint {
            path: path.to_path_buf(),
            reason,
        };
        let bytes = crate::checkpoint::read_file(path, u64::MAX).map_err(bad)?;
        let st = SafeTensors::deserialize(&bytes)
            .map_err(|e| bad(format!("not a safetensors file: {e}")))?;
        let t = st
            .tensor("last_hidden_state")
            .map_err(|_| bad("tensor 'last_hidden_state' is missing".into()))?;
        let &[batch, seq, hidden] = t.shape() else {
            return Err(bad(format!(
                "tensor 'last_hidden_state' has shape {:?}, not [batch, seq, hidden]",
                t.shape()
            )));
        };
        let values = crate::to_f32(t.dtype(), t.data())
            .ok_or_else(|| bad(format!("tensor 'last_hidden_state' is {:?}", t.dtype())))?;
        Ok(Expected {
            batch,
            seq,
            hidden,
            values,
        })
    }

    /// Largest `|got − expected|` over every value (padded positions too), or an error
    /// when the shapes differ.
    pub fn max_abs_err(&self, got: &[f32]) -> Result<f64, BertError> {
        if got.len() != self.values.len() {
            return Err(BertError::Shape {
                reason: format!(
                    "{} output values, the expected output is [{}, {}, {}]",
                    got.len(),
                    self.batch,
                    self.seq,
                    self.hidden
                ),
            });
        }
        Ok(got
            .iter()
            .zip(&self.values)
            .map(|(&g, &e)| (g as f64 - e as f64).abs())
            .fold(0.0, |m, e| if e.is_nan() || e > m { e } else { m }))
    }
}
