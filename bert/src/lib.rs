//! # bert — a BERT encoder served by the autokernel runtime
//!
//! ```
//! use bert::{batch_input, check, reference_forward, sequence_input, BertConfig, Encoder};
//! use runtime::Runtime;
//!
//! let rt = Runtime::defaults_only(); // or Runtime::open("tuning.db")?
//! let config = BertConfig::tiny(); // BertConfig::bert_base() for the real thing
//! let (batch, seq, seed) = (2, 7, 42);
//! // Weights from the seed, every matrix packed once for M = batch·seq.
//! let encoder = Encoder::load(&rt, config, seed, &[(batch, seq)])?;
//! let input = batch_input(&config, seed, batch, seq);
//! let (out, calls) = encoder.forward(&rt, batch, seq, &input)?;
//! assert_eq!(calls.default, 5 * config.layers as u64); // no database: all defaults
//! // Sequence 1 against the f64 reference forward.
//! let h = config.hidden;
//! let want = reference_forward(&config, seed, seq, &sequence_input(&config, seed, seq, 1));
//! check(&out[seq * h..2 * seq * h], &want).expect("within tolerance");
//! # Ok::<(), bert::BertError>(())
//! ```
//!
//! Why it exists: a tuning database only matters if it makes a real model faster. This
//! crate is the proof — an encoder-only transformer (BERT-base: 12 layers, hidden 768, 12
//! heads, FFN 3072, post-LayerNorm, GELU) where **every** GEMM (the fused
//! QKV projection `gemm_bias:M×2304×768`, the attention output `gemm_bias:M×768×768`, the
//! FFN `gemm_bias_gelu[_erf]:M×3072×768` and `gemm_bias:M×768×3072`, M = batch·seq) and every
//! attention (`attention:B×12×S×64`) is a [`runtime::Runtime`] call, so the database
//! decides each variant, and [`LevelCounts`] says which level (exact, same_arch,
//! nearest_shape, default) served them. It is not a framework: one config struct, seeded
//! weights (no download, no tokenizer), where the input is the embedding block's output.
//!
//! **Real checkpoints**: [`Checkpoint::load`] reads a Hugging Face BERT, RoBERTa, DistilBERT,
//! ELECTRA or ALBERT directory (`config.json` + `model.safetensors`; [`NAMINGS`]), and
//! [`BertModel`] runs the whole `BertModel` path —
//! token, position and token-type embeddings with their LayerNorm (ELECTRA's and ALBERT's projected to the
//! hidden size), then the encoder — on a
//! [`TokenBatch`] of right-padded sequences of different lengths: attention masks the
//! padding by each sequence's key length ([`runtime::Runtime::attention_masked`]). GELU in
//! both forms: exact erf for `hidden_act: "gelu"` (`gemm_bias_gelu_erf`), tanh for
//! `gelu_new` (`gemm_bias_gelu`, also what the seeded models use).
//!
//! The weights are **packed once at load** ([`runtime::Runtime::pack_weight_for`]): one
//! copy per distinct panel layout among the variants the database picks for the shapes
//! given, usually one (BERT-base: ~340 MB of f32). Attention runs on the QKV
//! GEMM's rows ([`runtime::Runtime::attention_qkv`]); residual adds and LayerNorm are
//! [`runtime::add_layer_norm`].
//!
//! [`reference_forward`] recomputes one sequence with naive f64 loops; [`check`] compares
//! within [`TOLERANCE`] (its documentation says why that bound).
#![warn(missing_docs)]

mod checkpoint;
mod config;
mod embeddings;
mod encoder;
mod model;
mod reference;
mod tensor_files;
mod tokens;
mod weights;

pub use checkpoint::{to_f32, Checkpoint, Naming, HIDDEN_ACTS, NAMINGS};
pub use config::{BertConfig, MAX_SEQ};
pub use embeddings::{Embeddings, Positions};
pub use encoder::{Encoder, Scratch, StageTimes};
pub use model::{BertModel, Expected};
pub use reference::{
    check, reference_forward, reference_forward_len, reference_forward_with, Agreement, TOLERANCE,
};
pub use runtime::LevelCounts;
pub use tokens::TokenBatch;
pub use weights::{batch_input, sequence_input, LayerWeights};

/// Errors of the model.
#[derive(Debug, thiserror::Error)]
pub enum BertError {
    /// A runtime call failed (a bad buffer or workload).
    #[error(transparent)]
    Runtime(#[from] runtime::RuntimeError),
    /// The model sizes are inconsistent.
    #[error("bad model config: {reason}")]
    Config {
        /// Which sizes do not fit, and why.
        reason: String,
    },
    /// A batch / sequence shape or input that does not fit (a token id outside the
    /// vocabulary, a sequence longer than the positions).
    #[error("bad input: {reason}")]
    Shape {
        /// What does not fit, and why.
        reason: String,
    },
    /// A checkpoint file (or a file beside it) that cannot be used: which file, and why
    /// (naming the tensor or the `config.json` field).
    #[error("{}: {reason}", .path.display())]
    Checkpoint {
        /// The file (or the directory, for a file it lacks).
        path: std::path::PathBuf,
        /// What is wrong with it, naming the tensor or field.
        reason: String,
    },
}
