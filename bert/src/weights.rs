//! Deterministic random weights and inputs (no download): every tensor is drawn from its own
//! seeded stream, so any layer can be regenerated alone (the reference forward does that).

use kernels::Rng;

use crate::BertConfig;

/// One layer's weights, row-major, matrices stored `in × out` (the K×N B operand of
/// `A·B`): `y = x·W + b`.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    /// `H × 3H`: the query, key and value projections side by side (columns `0..H` are Q,
    /// `H..2H` K, `2H..3H` V; inside each, head `h` owns columns `h·D..(h+1)·D`).
    pub w_qkv: Vec<f32>,
    /// `3H`: the Q, K and V biases, in `w_qkv`'s column order.
    pub b_qkv: Vec<f32>,
    /// `H × H`: the attention output projection.
    pub w_o: Vec<f32>,
    /// `H`: its bias.
    pub b_o: Vec<f32>,
    /// `H`: the scale γ of the LayerNorm after the attention block.
    pub ln1_gamma: Vec<f32>,
    /// `H`: its shift β.
    pub ln1_beta: Vec<f32>,
    /// `H × F`, followed by the model's activation (`hidden_act`).
    pub w_ffn1: Vec<f32>,
    /// `F`: its bias.
    pub b_ffn1: Vec<f32>,
    /// `F × H`.
    pub w_ffn2: Vec<f32>,
    /// `H`: its bias.
    pub b_ffn2: Vec<f32>,
    /// `H`: the scale γ of the LayerNorm after the feed-forward block.
    pub ln2_gamma: Vec<f32>,
    /// `H`: its shift β.
    pub ln2_beta: Vec<f32>,
}

/// A stream for tensor `tensor` of layer `layer` (SplitMix-style mixing of the three).
fn stream(seed: u64, layer: usize, tensor: u64) -> Rng {
    let mut z = seed ^ 0x9E37_79B9_7F4A_7C15u64.wrapping_mul((layer as u64).wrapping_add(1));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9)
        ^ tensor.wrapping_mul(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    Rng::new(z ^ (z >> 31))
}

/// `len` values with mean `mean` and standard deviation `std` (uniform, so bounded).
fn draw(rng: &mut Rng, len: usize, mean: f32, std: f32) -> Vec<f32> {
    // Uniform on [-1, 1) has standard deviation 1/√3.
    let scale = std * 3f32.sqrt();
    (0..len)
        .map(|_| mean + scale * rng.symmetric_f32())
        .collect()
}

impl LayerWeights {
    /// Layer `layer` of the model with weights seeded by `seed`: matrices and biases with
    /// standard deviation `init_std`, LayerNorm scales `1 ± init_std`, shifts `± init_std`.
    pub fn generate(config: &BertConfig, seed: u64, layer: usize) -> LayerWeights {
        let (h, f, sd) = (config.hidden, config.ffn, config.init_std);
        let t = |i: u64| stream(seed, layer, i);
        LayerWeights {
            w_qkv: draw(&mut t(0), h * 3 * h, 0.0, sd),
            b_qkv: draw(&mut t(1), 3 * h, 0.0, sd),
            w_o: draw(&mut t(2), h * h, 0.0, sd),
            b_o: draw(&mut t(3), h, 0.0, sd),
            ln1_gamma: draw(&mut t(4), h, 1.0, sd),
            ln1_beta: draw(&mut t(5), h, 0.0, sd),
            w_ffn1: draw(&mut t(6), h * f, 0.0, sd),
            b_ffn1: draw(&mut t(7), f, 0.0, sd),
            w_ffn2: draw(&mut t(8), f * h, 0.0, sd),
            b_ffn2: draw(&mut t(9), h, 0.0, sd),
            ln2_gamma: draw(&mut t(10), h, 1.0, sd),
            ln2_beta: draw(&mut t(11), h, 0.0, sd),
        }
    }
}

impl LayerWeights {
    /// Checks every tensor's length against `config`'s sizes, naming the first that differs.
    pub fn check(&self, config: &BertConfig) -> Result<(), crate::BertError> {
        let (h, f) = (config.hidden, config.ffn);
        let want = [
            ("w_qkv", self.w_qkv.len(), h * 3 * h),
            ("b_qkv", self.b_qkv.len(), 3 * h),
            ("w_o", self.w_o.len(), h * h),
            ("b_o", self.b_o.len(), h),
            ("ln1_gamma", self.ln1_gamma.len(), h),
            ("ln1_beta", self.ln1_beta.len(), h),
            ("w_ffn1", self.w_ffn1.len(), h * f),
            ("b_ffn1", self.b_ffn1.len(), f),
            ("w_ffn2", self.w_ffn2.len(), f * h),
            ("b_ffn2", self.b_ffn2.len(), h),
            ("ln2_gamma", self.ln2_gamma.len(), h),
            ("ln2_beta", self.ln2_beta.len(), h),
        ];
        match want.iter().find(|(_, got, want)| got != want) {
            Some((name, got, want)) => Err(crate::BertError::Config {
                reason: format!("layer weight {name} has {got} values, the config needs {want}"),
            }),
            None => Ok(()),
        }
    }
}

/// The encoder input of sequence `index` of length `seq` (`seq × hidden`, unit variance, as
/// the embedding block's LayerNorm would give): the same whatever batch it is part of, so
/// one reference per sequence serves every batch size.
pub fn sequence_input(config: &BertConfig, seed: u64, seq: usize, index: usize) -> Vec<f32> {
    let mut rng = stream(seed ^ 0x5EED_1A7E, usize::MAX - index, seq as u64);
    draw(&mut rng, seq * config.hidden, 0.0, 1.0)
}

/// The input of a batch: sequences `0..batch` of length `seq`, one after another
/// (`batch × seq × hidden`).
pub fn batch_input(config: &BertConfig, seed: u64, batch: usize, seq: usize) -> Vec<f32> {
    (0..batch)
        .flat_map(|i| sequence_input(config, seed, seq, i))
        .collect()
}
