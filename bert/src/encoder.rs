//! The encoder: weights packed once at load, a forward pass where every GEMM and attention
//! call goes through the runtime.

use std::time::Instant;

use kernels::cpu::pool::{self, on_workers};
use kernels::Act;
use rayon::prelude::*;
use runtime::{EncoderLayer, LayerScratch, Level, LevelCounts, PackedWeight, Runtime, Stage};

use crate::{BertConfig, BertError, LayerWeights};

/// One layer with its matrices packed for the runtime.
struct PackedLayer {
    qkv: PackedWeight,
    b_qkv: Vec<f32>,
    o: PackedWeight,
    b_o: Vec<f32>,
    ln1: (Vec<f32>, Vec<f32>),
    ffn1: PackedWeight,
    b_ffn1: Vec<f32>,
    ffn2: PackedWeight,
    b_ffn2: Vec<f32>,
    ln2: (Vec<f32>, Vec<f32>),
}

impl PackedLayer {
    /// `w`'s matrices packed through `rt` for the row counts `ms`.
    fn pack(
        rt: &Runtime,
        config: &BertConfig,
        w: LayerWeights,
        ms: &[usize],
    ) -> Result<PackedLayer, BertError> {
        let (h, f) = (config.hidden, config.ffn);
        Ok(PackedLayer {
            qkv: rt.pack_weight_for(3 * h, h, Act::Identity, &w.w_qkv, ms)?,
            b_qkv: w.b_qkv,
            o: rt.pack_weight_for(h, h, Act::Identity, &w.w_o, ms)?,
            b_o: w.b_o,
            ln1: (w.ln1_gamma, w.ln1_beta),
            ffn1: rt.pack_weight_for(f, h, config.act, &w.w_ffn1, ms)?,
            b_ffn1: w.b_ffn1,
            ffn2: rt.pack_weight_for(h, f, Act::Identity, &w.w_ffn2, ms)?,
            b_ffn2: w.b_ffn2,
            ln2: (w.ln2_gamma, w.ln2_beta),
        })
    }
}

impl PackedLayer {
    /// The layer as the runtime runs it.
    fn view<'a>(&'a self, c: &BertConfig) -> EncoderLayer<'a> {
        EncoderLayer {
            qkv: (&self.qkv, &self.b_qkv),
            out: (&self.o, &self.b_o),
            ln1: (&self.ln1.0, &self.ln1.1),
            ffn_up: (&self.ffn1, &self.b_ffn1),
            ffn_down: (&self.ffn2, &self.b_ffn2),
            ln2: (&self.ln2.0, &self.ln2.1),
            heads: c.heads,
            eps: c.ln_eps,
        }
    }
}

/// The distinct M = batch·seq of `shapes`: at least one, each at least 1.
pub(crate) fn rows_of(shapes: &[(usize, usize)]) -> Result<Vec<usize>, BertError> {
    // Checked: an M past usize::MAX never wraps to a small one. (Any M the machine can hold
    // is served: past one workload's rows, in blocks.)
    let mut ms = Vec::with_capacity(shapes.len());
    for &(b, s) in shapes {
        ms.push(b.checked_mul(s).ok_or_else(|| BertError::Shape {
            reason: format!("batch {b} × seq {s} overflows the row count"),
        })?);
    }
    if ms.is_empty() || ms.contains(&0) {
        return Err(BertError::Shape {
            reason: "load needs at least one (batch, seq) shape, each at least 1".into(),
        });
    }
    ms.dedup();
    Ok(ms)
}

/// A BERT encoder whose weights live packed in the layouts the runtime's tuned variants use.
pub struct Encoder {
    config: BertConfig,
    /// The distinct layers (ALBERT's shared ones once).
    layers: Vec<PackedLayer>,
    /// The layer each of `config.layers` steps runs.
    steps: Vec<usize>,
    load_s: f64,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder")
            .field("config", &self.config)
            .field("weight_bytes", &self.weight_bytes())
            .finish()
    }
}

/// Reusable activation buffers of one forward pass (sized for the largest batch × seq seen).
#[derive(Debug, Default)]
pub struct Scratch {
    x: Vec<f32>,
    layer: LayerScratch,
    /// The embedding block's output ([`crate::BertModel`]).
    pub(crate) embedded: Vec<f32>,
    /// Its projection to the hidden size (ELECTRA).
    pub(crate) projected: Vec<f32>,
}

impl Encoder {
    /// Generates the weights of `config` from `seed` and packs each matrix once, through
    /// `rt`, for every `(batch, seq)` of `shapes` (one copy per distinct panel layout among
    /// the variants the database picks for those M = batch·seq; other shapes work too, see
    /// [`runtime::PackedWeight`]). Layers are generated and packed in parallel.
    pub fn load(
        rt: &Runtime,
        config: BertConfig,
        seed: u64,
        shapes: &[(usize, usize)],
    ) -> Result<Encoder, BertError> {
        config.validate()?;
        let ms = rows_of(shapes)?;
        let start = Instant::now();
        let layers = (0..config.layers)
            .into_par_iter()
            .map(|l| PackedLayer::pack(rt, &config, LayerWeights::generate(&config, seed, l), &ms))
            .collect::<Result<Vec<_>, BertError>>()?;
        Ok(Encoder {
            config,
            layers,
            steps: (0..config.layers).collect(),
            load_s: start.elapsed().as_secs_f64(),
        })
    }

    /// The encoder of `config` with the given layers' weights (a checkpoint's), each matrix
    /// packed once as [`Encoder::load`] does. An error if there are not `config.layers` of
    /// them or one does not have `config`'s sizes.
    pub fn from_weights(
        rt: &Runtime,
        config: BertConfig,
        weights: &[LayerWeights],
        shapes: &[(usize, usize)],
    ) -> Result<Encoder, BertError> {
        if weights.len() != config.layers {
            return Err(BertError::Config {
                reason: format!(
                    "{} layers of weights for {} layers",
                    weights.len(),
                    config.layers
                ),
            });
        }
        let steps: Vec<usize> = (0..config.layers).collect();
        Encoder::from_shared_weights(rt, config, weights, &steps, shapes)
    }

    /// [`Encoder::from_weights`] with weights shared between layers (ALBERT's): step `i` of
    /// the `config.layers` runs `weights[steps[i]]`. Each of `weights` is packed once.
    pub fn from_shared_weights(
        rt: &Runtime,
        config: BertConfig,
        weights: &[LayerWeights],
        steps: &[usize],
        shapes: &[(usize, usize)],
    ) -> Result<Encoder, BertError> {
        config.validate()?;
        if steps.len() != config.layers || steps.iter().any(|&l| l >= weights.len()) {
            return Err(BertError::Config {
                reason: format!(
                    "{} steps over {} layers of weights for {} layers (each step one of them)",
                    steps.len(),
                    weights.len(),
                    config.layers
                ),
            });
        }
        weights.iter().try_for_each(|w| w.check(&config))?;
        let ms = rows_of(shapes)?;
        let start = Instant::now();
        let layers = weights
            .par_iter()
            .map(|w| PackedLayer::pack(rt, &config, w.clone(), &ms))
            .collect::<Result<Vec<_>, BertError>>()?;
        Ok(Encoder {
            config,
            layers,
            steps: steps.to_vec(),
            load_s: start.elapsed().as_secs_f64(),
        })
    }

    /// The model's sizes.
    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    /// Seconds [`Encoder::load`] took (generating and packing).
    pub fn load_seconds(&self) -> f64 {
        self.load_s
    }

    /// Bytes of weights held (packed copies, row-major copies, biases and LayerNorm).
    pub fn weight_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| {
                let small = l.b_qkv.len()
                    + l.b_o.len()
                    + l.b_ffn1.len()
                    + l.b_ffn2.len()
                    + 2 * (l.ln1.0.len() + l.ln2.0.len());
                l.qkv.bytes() + l.o.bytes() + l.ffn1.bytes() + l.ffn2.bytes() + 4 * small
            })
            .sum()
    }

    /// The largest number of packed copies of any weight (1 when every M the encoder was
    /// loaded for agrees on the panel layout).
    pub fn max_layouts(&self) -> usize {
        self.packed().map(|w| w.layouts().len()).max().unwrap_or(0)
    }

    /// The largest number of copies of any weight it holds (f32 panel layouts,
    /// reduced-precision forms, row-major copies: [`runtime::PackedWeight::copies`]).
    pub fn max_copies(&self) -> usize {
        self.packed().map(PackedWeight::copies).max().unwrap_or(0)
    }

    /// Every layer's packed weights.
    fn packed(&self) -> impl Iterator<Item = &PackedWeight> {
        self.layers
            .iter()
            .flat_map(|l| [&l.qkv, &l.o, &l.ffn1, &l.ffn2])
    }

    /// Adds `delta` to one bias value of the last layer's FFN down projection: a planted
    /// fault, to show that the reference check catches a wrong result.
    pub fn plant_fault(&mut self, delta: f32) {
        if let Some(l) = self.layers.last_mut() {
            l.b_ffn2[0] += delta;
        }
    }

    /// The encoder over `batch` sequences of `seq` tokens: `input` is `batch × seq × hidden`
    /// (the embedding block's output); returns the last layer's hidden states (same shape)
    /// and how many kernel calls each runtime level served.
    pub fn forward(
        &self,
        rt: &Runtime,
        batch: usize,
        seq: usize,
        input: &[f32],
    ) -> Result<(Vec<f32>, LevelCounts), BertError> {
        let mut scratch = Scratch::default();
        let counts = self.forward_with(rt, batch, seq, input, &mut scratch)?;
        Ok((scratch.x, counts))
    }

    /// [`Encoder::forward`] reusing `scratch` (no allocation once it has grown); the result
    /// is [`Scratch::output`].
    pub fn forward_with(
        &self,
        rt: &Runtime,
        batch: usize,
        seq: usize,
        input: &[f32],
        scratch: &mut Scratch,
    ) -> Result<LevelCounts, BertError> {
        self.forward_inner(rt, (batch, seq, None), input, scratch, None)
    }

    /// [`Encoder::forward_with`] over a padded batch: sequence `i` has `key_lens[i]` real
    /// tokens (one per sequence, each in `0..=seq`), and attention masks the keys past
    /// them. Padded positions are computed too (they attend to their sequence's tokens).
    pub fn forward_masked(
        &self,
        rt: &Runtime,
        (batch, seq): (usize, usize),
        key_lens: &[i32],
        input: &[f32],
        scratch: &mut Scratch,
    ) -> Result<LevelCounts, BertError> {
        self.forward_inner(rt, (batch, seq, Some(key_lens)), input, scratch, None)
    }

    /// [`Encoder::forward_masked`] (or unmasked, with `None`), adding the seconds spent in
    /// each stage to `times`.
    pub fn forward_profiled(
        &self,
        rt: &Runtime,
        (batch, seq): (usize, usize),
        key_lens: Option<&[i32]>,
        input: &[f32],
        scratch: &mut Scratch,
        times: &mut StageTimes,
    ) -> Result<LevelCounts, BertError> {
        self.forward_inner(rt, (batch, seq, key_lens), input, scratch, Some(times))
    }

    fn forward_inner(
        &self,
        rt: &Runtime,
        (batch, seq, key_lens): (usize, usize, Option<&[i32]>),
        input: &[f32],
        scratch: &mut Scratch,
        times: Option<&mut StageTimes>,
    ) -> Result<LevelCounts, BertError> {
        let c = &self.config;
        let h = c.hidden;
        // Saturating: a product past usize::MAX matches no input's length.
        let m = batch.saturating_mul(seq);
        if batch == 0 || seq == 0 {
            return Err(BertError::Shape {
                reason: format!("batch {batch} and seq {seq} must be at least 1"),
            });
        }
        if input.len() != m.saturating_mul(h) {
            return Err(BertError::Shape {
                reason: format!(
                    "input has {} values, batch {batch} × seq {seq} × hidden {h} needs {}",
                    input.len(),
                    batch as u128 * seq as u128 * h as u128
                ),
            });
        }
        if let Some(l) = key_lens.filter(|l| l.len() != batch) {
            return Err(BertError::Shape {
                reason: format!("{} key lengths for a batch of {batch}", l.len()),
            });
        }
        // Every layer's stages from one entry into rayon's pool (see `on_workers`).
        on_workers(pool::threads(), || {
            self.layers_here(rt, (batch, seq, key_lens), input, scratch, times)
        })
    }

    /// The layers of [`Encoder::forward_inner`], from this thread.
    fn layers_here(
        &self,
        rt: &Runtime,
        (batch, seq, key_lens): (usize, usize, Option<&[i32]>),
        input: &[f32],
        scratch: &mut Scratch,
        mut times: Option<&mut StageTimes>,
    ) -> Result<LevelCounts, BertError> {
        let c = &self.config;
        let mut counts = LevelCounts::default();
        let Scratch { x, layer, .. } = scratch;
        x.clear();
        x.extend_from_slice(input);
        let mut t = Instant::now();
        for l in self.steps.iter().map(|&i| &self.layers[i]) {
            let on_stage = |stage: Stage, level: Option<Level>| {
                if let Some(level) = level {
                    counts.add(level);
                }
                if let Some(times) = times.as_deref_mut() {
                    let now = Instant::now();
                    times.0[StageTimes::index(stage)] += (now - t).as_secs_f64();
                    t = now;
                }
            };
            l.view(c)
                .forward(rt, (batch, seq), key_lens, x, layer, on_stage)?;
        }
        Ok(counts)
    }
}

/// Seconds per stage of the forward pass, summed over layers and calls: see
/// [`StageTimes::NAMES`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageTimes(pub [f64; 6]);

impl StageTimes {
    /// The stages: the four GEMMs, attention (with its head split and merge), and everything
    /// else (residual adds and LayerNorm).
    pub const NAMES: [&'static str; 6] = [
        "qkv",
        "attention",
        "out_proj",
        "ffn_up",
        "ffn_down",
        "other",
    ];

    /// The index in [`StageTimes::NAMES`] of a layer's `stage`.
    fn index(stage: Stage) -> usize {
        match stage {
            Stage::Qkv => 0,
            Stage::Attention => 1,
            Stage::OutProj => 2,
            Stage::FfnUp => 3,
            Stage::FfnDown => 4,
            Stage::LayerNorm => 5,
        }
    }

    /// `(name, seconds)` per stage.
    pub fn by_stage(&self) -> impl Iterator<Item = (&'static str, f64)> + '_ {
        Self::NAMES.into_iter().zip(self.0)
    }
}

impl Scratch {
    /// The output of the last [`Encoder::forward_with`].
    pub fn output(&self) -> &[f32] {
        &self.x
    }
}
