//! Workloads: what is computed, at which shape.
//!
//! The text form is the contract users type on the command line and the key stored in the
//! tuning database, so [`Workload::key`] and [`FromStr`] are exact inverses:
//!
//! | text form                       | computes                                              |
//! |---------------------------------|-------------------------------------------------------|
//! | `gemm:MxNxK`                    | `C = A·B`                                             |
//! | `gemm_bias:MxNxK`               | `C = A·B + bias`, bias of length N                    |
//! | `gemm_bias_relu:MxNxK`          | `C = relu(A·B + bias)`, bias of length N              |
//! | `gemm_bias_gelu:MxNxK`          | `C = gelu(A·B + bias)` (tanh form)                    |
//! | `gemm_bias_gelu_erf:MxNxK`      | `C = gelu(A·B + bias)` (exact form, with erf)         |
//! | `attention:BxHxSxD`             | `O = softmax(Q·Kᵀ/√D)·V` per batch and head           |
//! | `attention:BxHxSxD:causal`      | the same with key `j > i` masked out for query `i`    |
//!
//! Any of them may end in an element type, `:f32` (the default, printed without suffix),
//! `:bf16` or `:i8` ([`DType::PRECISIONS`]): `gemm:128x768x768:bf16`,
//! `attention:1x12x128x64:causal:bf16`. Without one a workload is f32, so every workload
//! string stored before element types existed keeps its meaning.
//!
//! ```
//! use kernels::{Act, DType, Workload};
//!
//! let w: Workload = "attention:1x12x128x64:causal".parse()?;
//! assert_eq!(w, Workload::Attention { b: 1, h: 12, s: 128, d: 64, causal: true, dtype: DType::F32 });
//! assert_eq!(w.key(), "attention:1x12x128x64:causal");
//! let g: Workload = "gemm_bias_gelu:128x3072x768".parse()?;
//! assert_eq!(g, Workload::GemmBiasAct { m: 128, n: 3072, k: 768, act: Act::Gelu, dtype: DType::F32 });
//! let p: Workload = "gemm_bias:128x2304x768".parse()?;
//! assert_eq!(p, Workload::GemmBiasAct { m: 128, n: 2304, k: 768, act: Act::Identity, dtype: DType::F32 });
//! assert_eq!(p.key(), "gemm_bias:128x2304x768");
//! assert!("attention:1x12x128x64:sideways".parse::<Workload>().is_err());
//! let b: Workload = "attention:1x12x128x64:causal:bf16".parse()?;
//! assert_eq!(b.dtype(), DType::Bf16);
//! assert_eq!(b.key(), "attention:1x12x128x64:causal:bf16");
//! assert_eq!("gemm:8x8x8:f32".parse::<Workload>()?.key(), "gemm:8x8x8");
//! # Ok::<(), kernels::Error>(())
//! ```

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::dtype::DType;
use crate::error::{Error, Result};

/// Largest accepted dimension. Anything above is almost surely a typo (and would not fit
/// in memory as a dense f32 matrix anyway).
pub const MAX_DIM: usize = 1 << 20;

/// Largest K of an int8 GEMM: its u8 × s8 products (at most 255 · 127 each) accumulate in
/// i32, exactly up to this depth (65536 · 32385 < 2^31); deeper ones could wrap.
pub const MAX_I8_DEPTH: usize = 1 << 16;

/// Largest accepted total operand size in f32 elements (16 GiB of data).
pub const MAX_ELEMENTS: u128 = 1 << 32;

/// The operator families autokernel knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// `C = A·B`, row-major; A is M×K, B is K×N, C is M×N (f32 operands and output; the
    /// workload's element type says what the kernel computes in).
    Gemm,
    /// `C = A·B + bias`; bias has N values, added to every row (no activation).
    GemmBias,
    /// `C = relu(A·B + bias)`; bias has N values, added to every row.
    GemmBiasRelu,
    /// `C = gelu(A·B + bias)`, GELU in its tanh form.
    GemmBiasGelu,
    /// `C = gelu(A·B + bias)`, GELU in its exact form `x·Φ(x)` (with erf).
    GemmBiasGeluErf,
    /// Scaled dot-product attention over `[B, H, S, D]` tensors.
    Attention,
}

impl Op {
    /// Every op, for error messages and listings.
    pub const ALL: [Op; 6] = [
        Op::Gemm,
        Op::GemmBias,
        Op::GemmBiasRelu,
        Op::GemmBiasGelu,
        Op::GemmBiasGeluErf,
        Op::Attention,
    ];

    /// The name used in workload strings.
    pub fn name(self) -> &'static str {
        match self {
            Op::Gemm => "gemm",
            Op::GemmBias => "gemm_bias",
            Op::GemmBiasRelu => "gemm_bias_relu",
            Op::GemmBiasGelu => "gemm_bias_gelu",
            Op::GemmBiasGeluErf => "gemm_bias_gelu_erf",
            Op::Attention => "attention",
        }
    }
}

/// The activation of a fused GEMM epilogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Act {
    /// No activation: `C = A·B + bias` (the `gemm_bias` op).
    Identity,
    /// `max(x, 0)`.
    Relu,
    /// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, the tanh form of GELU (Hugging Face's
    /// `gelu_new` / `gelu_pytorch_tanh`).
    Gelu,
    /// `x·Φ(x) = 0.5·x·(1 + erf(x/√2))`, the exact form of GELU (Hugging Face's `gelu`, what
    /// BERT checkpoints use).
    GeluErf,
}

impl Act {
    /// The op of `gemm_bias_<act>`.
    pub fn op(self) -> Op {
        match self {
            Act::Identity => Op::GemmBias,
            Act::Relu => Op::GemmBiasRelu,
            Act::Gelu => Op::GemmBiasGelu,
            Act::GeluErf => Op::GemmBiasGeluErf,
        }
    }

    /// Every activation, in op order.
    pub const ALL: [Act; 4] = [Act::Identity, Act::Relu, Act::Gelu, Act::GeluErf];

    /// `identity`, `relu`, `gelu` or `gelu_erf`.
    pub fn name(self) -> &'static str {
        match self {
            Act::Identity => "identity",
            Act::Relu => "relu",
            Act::Gelu => "gelu",
            Act::GeluErf => "gelu_erf",
        }
    }

    /// The activation in f64, the reference the kernels are checked against.
    pub fn apply_f64(self, x: f64) -> f64 {
        match self {
            Act::Identity => x,
            Act::Relu => x.max(0.0),
            Act::Gelu => {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
            }
            Act::GeluErf => 0.5 * x * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2)),
        }
    }
}

impl fmt::Display for Act {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One problem instance: an op, its shape and its element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Workload {
    /// Row-major GEMM `C[m×n] = A[m×k] · B[k×n]`.
    Gemm {
        /// Rows of A and C.
        m: usize,
        /// Columns of B and C.
        n: usize,
        /// The reduction depth: columns of A, rows of B.
        k: usize,
        /// The precision: the element type A and B are multiplied in (C is f32 in every one).
        dtype: DType,
    },
    /// `C[m×n] = act(A[m×k] · B[k×n] + bias[n])`, row-major. Inputs: A, B, bias.
    GemmBiasAct {
        /// Rows of A and C.
        m: usize,
        /// Columns of B and C, and the length of the bias.
        n: usize,
        /// The reduction depth: columns of A, rows of B.
        k: usize,
        /// The activation applied after the bias.
        act: Act,
        /// The precision: the element type A and B are multiplied in (the bias and C are f32 in
        /// every one).
        dtype: DType,
    },
    /// Scaled dot-product attention, Q, K, V and O laid out `[b, h, s, d]` (row-major):
    /// `O = softmax(Q·Kᵀ/√d)·V` for each of the `b·h` heads; with `causal`, query `i` only
    /// sees keys `j ≤ i`. Inputs: Q, K, V, and optionally the key lengths of a padded batch
    /// (an i32 per batch: [`crate::operand::host_attention`]) — an operand, not part of the
    /// workload, so a variant tuned on full sequences serves padded batches too.
    Attention {
        /// Batch size.
        b: usize,
        /// Heads per batch entry.
        h: usize,
        /// Sequence length, of the queries and the keys alike.
        s: usize,
        /// Head dimension; scores are scaled by `1/√d`.
        d: usize,
        /// Whether query `i` sees only keys `j ≤ i`.
        causal: bool,
        /// The precision: the element type Q, K, V (and the softmax weights) are multiplied in
        /// (O is f32 in every one).
        dtype: DType,
    },
}

impl Workload {
    /// An f32 GEMM workload, validated (every dim in `1..=MAX_DIM`).
    pub fn gemm(m: usize, n: usize, k: usize) -> Result<Self> {
        let w = Workload::Gemm {
            m,
            n,
            k,
            dtype: DType::F32,
        };
        w.validate(&w.key())?;
        Ok(w)
    }

    /// An f32 fused `act(A·B + bias)` workload, validated.
    pub fn gemm_bias_act(m: usize, n: usize, k: usize, act: Act) -> Result<Self> {
        let w = Workload::GemmBiasAct {
            m,
            n,
            k,
            act,
            dtype: DType::F32,
        };
        w.validate(&w.key())?;
        Ok(w)
    }

    /// An f32 attention workload, validated.
    pub fn attention(b: usize, h: usize, s: usize, d: usize, causal: bool) -> Result<Self> {
        let w = Workload::Attention {
            b,
            h,
            s,
            d,
            causal,
            dtype: DType::F32,
        };
        w.validate(&w.key())?;
        Ok(w)
    }

    /// The element type of its operands (its precision): f32 unless the text form says.
    pub fn dtype(&self) -> DType {
        match *self {
            Workload::Gemm { dtype, .. }
            | Workload::GemmBiasAct { dtype, .. }
            | Workload::Attention { dtype, .. } => dtype,
        }
    }

    /// The same op and shape in element type `dtype`.
    pub fn with_dtype(mut self, dt: DType) -> Workload {
        match &mut self {
            Workload::Gemm { dtype, .. }
            | Workload::GemmBiasAct { dtype, .. }
            | Workload::Attention { dtype, .. } => *dtype = dt,
        }
        self
    }

    /// The op this workload belongs to.
    pub fn op(&self) -> Op {
        match self {
            Workload::Gemm { .. } => Op::Gemm,
            Workload::GemmBiasAct { act, .. } => act.op(),
            Workload::Attention { .. } => Op::Attention,
        }
    }

    /// The dimensions in the order of the text form (`gemm*`: M, N, K; `attention`: B, H, S, D).
    pub fn dims(&self) -> Vec<usize> {
        match *self {
            Workload::Gemm { m, n, k, .. } | Workload::GemmBiasAct { m, n, k, .. } => vec![m, n, k],
            Workload::Attention { b, h, s, d, .. } => vec![b, h, s, d],
        }
    }

    /// `(m, n, k)` of the matrix product inside a `gemm` or `gemm_bias_*` workload.
    pub fn gemm_dims(&self) -> Option<(usize, usize, usize)> {
        match *self {
            Workload::Gemm { m, n, k, .. } | Workload::GemmBiasAct { m, n, k, .. } => {
                Some((m, n, k))
            }
            Workload::Attention { .. } => None,
        }
    }

    /// The canonical text form, also the database key: `gemm:MxNxK`,
    /// `attention:BxHxSxD[:causal]`, followed by `:bf16` / `:i8` unless the workload is f32.
    pub fn key(&self) -> String {
        self.to_string()
    }

    /// Floating-point operations of one call, the numerator of every GFLOP/s figure:
    /// `2·M·N·K` for the GEMMs (the epilogue is not counted), `4·B·H·S²·D` for attention,
    /// halved when causal, whatever a variant actually computes.
    pub fn flops(&self) -> f64 {
        match *self {
            Workload::Gemm { m, n, k, .. } | Workload::GemmBiasAct { m, n, k, .. } => {
                2.0 * m as f64 * n as f64 * k as f64
            }
            Workload::Attention {
                b, h, s, d, causal, ..
            } => {
                let full = 4.0 * (b * h) as f64 * s as f64 * s as f64 * d as f64;
                if causal {
                    full / 2.0
                } else {
                    full
                }
            }
        }
    }

    /// Lengths of the input buffers, in order (`gemm`: A, B; `gemm_bias_*`: A, B, bias;
    /// `attention`: Q, K, V).
    pub fn input_lens(&self) -> Vec<usize> {
        match *self {
            Workload::Gemm { m, n, k, .. } => vec![m * k, k * n],
            Workload::GemmBiasAct { m, n, k, .. } => vec![m * k, k * n, n],
            Workload::Attention { b, h, s, d, .. } => vec![b * h * s * d; 3],
        }
    }

    /// Names of the input buffers, in order (for error messages).
    pub fn input_names(&self) -> &'static [&'static str] {
        match self {
            Workload::Gemm { .. } => &["a", "b"],
            Workload::GemmBiasAct { .. } => &["a", "b", "bias"],
            Workload::Attention { .. } => &["q", "k", "v"],
        }
    }

    /// Name of the output buffer (for error messages): `c`, or `o` for attention.
    pub fn output_name(&self) -> &'static str {
        match self {
            Workload::Attention { .. } => "o",
            _ => "c",
        }
    }

    /// Length of the output buffer (`gemm*`: C; `attention`: O).
    pub fn output_len(&self) -> usize {
        match *self {
            Workload::Gemm { m, n, .. } | Workload::GemmBiasAct { m, n, .. } => m * n,
            Workload::Attention { b, h, s, d, .. } => b * h * s * d,
        }
    }

    /// Columns of the output seen as a row-major matrix (`n`, or `d` for attention): how
    /// an element index maps to (row, col) in error messages.
    pub fn output_cols(&self) -> usize {
        match *self {
            Workload::Gemm { n, .. } | Workload::GemmBiasAct { n, .. } => n,
            Workload::Attention { d, .. } => d,
        }
    }

    /// Checks a workload built as a literal, as the constructors and the parser do: a
    /// workload precision, every dimension in `1..=MAX_DIM` (an int8 GEMM's K up to
    /// [`MAX_I8_DEPTH`]), operands that fit in memory.
    pub fn check(&self) -> Result<()> {
        self.validate(&self.key())
    }

    fn validate(&self, input: &str) -> Result<()> {
        let bad = |reason: String| Error::BadWorkload {
            input: input.to_string(),
            reason,
        };
        if !self.dtype().is_precision() {
            return Err(bad(format!(
                "element type '{}' is not a workload precision (workloads take {})",
                self.dtype(),
                DType::PRECISIONS.map(DType::name).join(", ")
            )));
        }
        for d in self.dims() {
            if d == 0 {
                return Err(bad("dimensions must be at least 1".into()));
            }
            if d > MAX_DIM {
                return Err(bad(format!(
                    "dimension {d} exceeds the maximum of {MAX_DIM}"
                )));
            }
        }
        if let (DType::I8, Some((_, _, k))) = (self.dtype(), self.gemm_dims()) {
            if k > MAX_I8_DEPTH {
                return Err(bad(format!(
                    "K = {k} is deeper than int8 GEMM takes ({MAX_I8_DEPTH}: its products \
                     accumulate in i32, which could wrap); serve it in f32 or bf16"
                )));
            }
        }
        // Checked products: B·H·S·D of four dimensions up to 2^20 overflows usize.
        let elems: u128 = match *self {
            Workload::Attention { b, h, s, d, .. } => {
                4 * b as u128 * h as u128 * s as u128 * d as u128
            }
            _ => {
                let (m, n, k) = self.gemm_dims().expect("a gemm workload");
                let (m, n, k) = (m as u128, n as u128, k as u128);
                m * k + k * n + m * n + n
            }
        };
        if elems > MAX_ELEMENTS {
            return Err(bad(format!(
                "operands need {elems} f32 elements, more than the limit of {MAX_ELEMENTS}"
            )));
        }
        Ok(())
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Workload::Gemm { m, n, k, .. } => write!(f, "gemm:{m}x{n}x{k}")?,
            Workload::GemmBiasAct { m, n, k, act, .. } => {
                write!(f, "{}:{m}x{n}x{k}", act.op().name())?
            }
            Workload::Attention {
                b, h, s, d, causal, ..
            } => {
                write!(f, "attention:{b}x{h}x{s}x{d}")?;
                if causal {
                    f.write_str(":causal")?;
                }
            }
        }
        match self.dtype() {
            DType::F32 => Ok(()),
            dt => write!(f, ":{dt}"),
        }
    }
}

impl FromStr for Workload {
    type Err = Error;

    /// Parses `gemm:MxNxK`, `gemm_bias:MxNxK`, `gemm_bias_relu:MxNxK`, `gemm_bias_gelu:MxNxK`,
    /// `gemm_bias_gelu_erf:MxNxK`, `attention:BxHxSxD` and `attention:BxHxSxD:causal`, each with an optional element-type
    /// suffix (`:bf16`); surrounding white space is ignored.
    fn from_str(s: &str) -> Result<Self> {
        let input = s.trim();
        let bad = |reason: String| Error::BadWorkload {
            input: input.to_string(),
            reason,
        };
        let known = Op::ALL.map(Op::name).join(", ");
        let (op, rest) = input.split_once(':').ok_or_else(|| {
            bad(format!(
                "expected OP:SHAPE such as gemm:128x768x768 (ops: {known})"
            ))
        })?;
        let op = op.trim();
        let op = Op::ALL
            .into_iter()
            .find(|o| o.name() == op)
            .ok_or_else(|| bad(format!("unknown op '{op}' (known ops: {known})")))?;
        let mut parts = rest.split(':');
        let shape = parts.next().unwrap_or_default();
        let (causal, dtype) = suffixes(op, parts, &bad)?;
        let dims = parse_dims(shape, &bad)?;
        let arity = |name: &str, want: &str, n: usize| {
            bad(format!("{name} takes {want}, got {n} dimension(s)"))
        };
        let w = match (op, &dims[..]) {
            (Op::Gemm, &[m, n, k]) => Workload::Gemm { m, n, k, dtype },
            (
                Op::GemmBias | Op::GemmBiasRelu | Op::GemmBiasGelu | Op::GemmBiasGeluErf,
                &[m, n, k],
            ) => {
                let act = Act::ALL
                    .into_iter()
                    .find(|a| a.op() == op)
                    .expect("every gemm_bias op has an activation");
                Workload::GemmBiasAct {
                    m,
                    n,
                    k,
                    act,
                    dtype,
                }
            }
            (Op::Attention, &[b, h, s, d]) => Workload::Attention {
                b,
                h,
                s,
                d,
                causal,
                dtype,
            },
            (Op::Attention, _) => return Err(arity("attention", "BxHxSxD", dims.len())),
            _ => return Err(arity(op.name(), "MxNxK", dims.len())),
        };
        w.validate(input)?;
        Ok(w)
    }
}

/// The options after the shape: `causal` (attention only) and an element type, each at most
/// once, in any order.
fn suffixes<'a>(
    op: Op,
    parts: impl Iterator<Item = &'a str>,
    bad: &dyn Fn(String) -> Error,
) -> Result<(bool, DType)> {
    let (mut causal, mut dtype) = (None, None);
    let takes = match op {
        Op::Attention => "':causal' and an element type",
        _ => "only an element type",
    };
    for part in parts {
        let part = part.trim();
        let slot_taken = match (part, part.parse::<DType>()) {
            ("causal", _) if op == Op::Attention => causal.replace(true).is_some(),
            (_, Ok(dt)) if dt.is_precision() => match dtype.replace(dt) {
                Some(first) if first != dt => {
                    return Err(bad(format!(
                        "two element types, ':{first}' and ':{dt}' (a workload has one)"
                    )))
                }
                first => first.is_some(),
            },
            (_, Ok(dt)) => {
                return Err(bad(format!(
                    "element type '{dt}' is not a workload precision (workloads take {})",
                    DType::PRECISIONS.map(DType::name).join(", ")
                )))
            }
            _ => {
                return Err(bad(format!(
                    "unknown suffix ':{part}' ({} takes {takes}: {})",
                    op.name(),
                    DType::PRECISIONS.map(DType::name).join(", ")
                )))
            }
        };
        if slot_taken {
            return Err(bad(format!("suffix ':{part}' given twice")));
        }
    }
    Ok((causal.unwrap_or(false), dtype.unwrap_or_default()))
}

/// `AxBx…` as whole numbers written as the key prints them: decimal digits, no sign, no
/// spaces, no leading zeros (so a key stores as it was typed).
fn parse_dims(shape: &str, bad: &dyn Fn(String) -> Error) -> Result<Vec<usize>> {
    shape
        .split('x')
        .map(|d| {
            let digits = !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
            if digits && d.len() > 1 && d.starts_with('0') {
                let plain = match d.trim_start_matches('0') {
                    "" => "0",
                    v => v,
                };
                return Err(bad(format!(
                    "'{d}' has a leading zero: write {plain} (shape is {shape})"
                )));
            }
            if !digits {
                return Err(bad(format!(
                    "'{d}' is not a positive whole number (shape is {shape})"
                )));
            }
            d.parse::<usize>().map_err(|e| {
                bad(match e.kind() {
                    std::num::IntErrorKind::PosOverflow => format!(
                        "dimension '{d}' exceeds the maximum of {MAX_DIM} (shape is {shape})"
                    ),
                    _ => format!("'{d}' is not a positive whole number (shape is {shape})"),
                })
            })
        })
        .collect()
}

impl Serialize for Workload {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.key())
    }
}

impl<'de> Deserialize<'de> for Workload {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_round_trip() {
        let w: Workload = "gemm:128x3072x768".parse().unwrap();
        assert_eq!(
            w,
            Workload::Gemm {
                m: 128,
                n: 3072,
                k: 768,
                dtype: crate::DType::F32
            }
        );
        assert_eq!(w.key(), "gemm:128x3072x768");
        assert_eq!(
            " gemm:1x2x3 ".parse::<Workload>().unwrap().key(),
            "gemm:1x2x3"
        );
        assert_eq!(w.flops(), 2.0 * 128.0 * 3072.0 * 768.0);
        assert_eq!(w.input_lens(), vec![128 * 768, 768 * 3072]);
        assert_eq!(w.output_len(), 128 * 3072);
    }

    #[test]
    fn rejects_bad_input_with_a_reason() {
        for (s, needle) in [
            ("gemm", "expected OP:SHAPE"),
            ("gemm:12x12", "MxNxK"),
            ("gemm:12x12x12x12", "MxNxK"),
            ("gemm:0x12x12", "at least 1"),
            ("gemm:-3x12x12", "not a positive"),
            ("gemm:axbxc", "not a positive"),
            ("gemm:+5x5x5", "not a positive"),
            ("gemm:5 x5x5", "not a positive"),
            ("gemm: 5x5x5", "not a positive"),
            ("gemm:05x5x5", "'05' has a leading zero: write 5"),
            ("gemm:5x00x5", "'00' has a leading zero: write 0"),
            ("attention:1x2x+3x4", "not a positive"),
            ("gemm:1x1x", "not a positive"),
            ("conv:1x2x3", "unknown op 'conv'"),
            ("gemm:99999999x1x1", "exceeds the maximum"),
            ("gemm:1000000x1000000x1000", "more than the limit"),
            ("gemm:99999999999999999999999x1x1", "exceeds the maximum"),
        ] {
            let err = s.parse::<Workload>().unwrap_err().to_string();
            assert!(err.contains(needle), "{s}: {err}");
            assert!(err.contains(s.trim()), "error names the input: {err}");
        }
    }

    #[test]
    fn new_ops_parse_print_and_count() {
        for (text, w) in [
            (
                "attention:1x12x128x64",
                Workload::Attention {
                    b: 1,
                    h: 12,
                    s: 128,
                    d: 64,
                    causal: false,
                    dtype: crate::DType::F32,
                },
            ),
            (
                "attention:2x3x5x7:causal",
                Workload::Attention {
                    b: 2,
                    h: 3,
                    s: 5,
                    d: 7,
                    causal: true,
                    dtype: crate::DType::F32,
                },
            ),
            (
                "gemm_bias:4x5x6",
                Workload::GemmBiasAct {
                    m: 4,
                    n: 5,
                    k: 6,
                    act: Act::Identity,
                    dtype: crate::DType::F32,
                },
            ),
            (
                "gemm_bias_relu:4x5x6",
                Workload::GemmBiasAct {
                    m: 4,
                    n: 5,
                    k: 6,
                    act: Act::Relu,
                    dtype: crate::DType::F32,
                },
            ),
            (
                "gemm_bias_gelu:128x3072x768",
                Workload::GemmBiasAct {
                    m: 128,
                    n: 3072,
                    k: 768,
                    act: Act::Gelu,
                    dtype: crate::DType::F32,
                },
            ),
            (
                "gemm_bias_gelu_erf:128x3072x768",
                Workload::GemmBiasAct {
                    m: 128,
                    n: 3072,
                    k: 768,
                    act: Act::GeluErf,
                    dtype: crate::DType::F32,
                },
            ),
        ] {
            assert_eq!(text.parse::<Workload>().unwrap(), w, "{text}");
            assert_eq!(w.key(), text);
            assert_eq!(w.key().parse::<Workload>().unwrap(), w);
        }
        let a: Workload = "attention:2x3x5x7".parse().unwrap();
        assert_eq!(a.flops(), 4.0 * 6.0 * 25.0 * 7.0);
        assert_eq!(a.input_lens(), vec![210; 3]);
        assert_eq!(a.output_len(), 210);
        assert_eq!(a.op().name(), "attention");
        let c: Workload = " attention:2x3x5x7:causal ".parse().unwrap();
        assert_eq!(c.flops(), a.flops() / 2.0);
        let g: Workload = "gemm_bias_gelu:4x5x6".parse().unwrap();
        assert_eq!(g.flops(), 2.0 * 120.0);
        assert_eq!(g.input_lens(), vec![24, 30, 5]);
        assert_eq!(g.output_len(), 20);
        assert_eq!(g.op().name(), "gemm_bias_gelu");
        assert_eq!(
            Workload::attention(1, 1, 1, 1, true).unwrap().key(),
            "attention:1x1x1x1:causal"
        );
        assert_eq!(
            Workload::gemm_bias_act(1, 2, 3, Act::Relu).unwrap().key(),
            "gemm_bias_relu:1x2x3"
        );
    }

    #[test]
    fn new_ops_reject_bad_input_with_a_reason() {
        for (s, needle) in [
            ("attention:1x12x128", "BxHxSxD"),
            ("attention:1x12x128x64x2", "BxHxSxD"),
            (
                "attention:1x12x128x64:sideways",
                "unknown suffix ':sideways'",
            ),
            ("attention:1x12x128x64:", "unknown suffix"),
            ("attention:1x0x128x64", "at least 1"),
            (
                "attention:1048576x1048576x1048576x1048576",
                "more than the limit",
            ),
            ("gemm:2x2x2:causal", "takes only an element type"),
            ("gemm_bias_gelu:2x2", "MxNxK"),
            ("gemm_bias_relu:2x2x2:fast", "unknown suffix ':fast'"),
            ("gemm_bias_tanh:2x2x2", "unknown op 'gemm_bias_tanh'"),
        ] {
            let err = s.parse::<Workload>().unwrap_err().to_string();
            assert!(err.contains(needle), "{s}: {err}");
            assert!(err.contains(s.trim()), "error names the input: {err}");
        }
    }

    #[test]
    fn element_type_suffixes_parse_print_and_round_trip() {
        for (text, key, dtype) in [
            ("gemm:2x3x4:bf16", "gemm:2x3x4:bf16", DType::Bf16),
            ("gemm:2x3x4:f32", "gemm:2x3x4", DType::F32),
            (
                "gemm_bias_gelu:2x3x4:i8",
                "gemm_bias_gelu:2x3x4:i8",
                DType::I8,
            ),
            (
                "attention:1x2x3x4:causal:bf16",
                "attention:1x2x3x4:causal:bf16",
                DType::Bf16,
            ),
            (
                "attention:1x2x3x4:bf16:causal",
                "attention:1x2x3x4:causal:bf16",
                DType::Bf16,
            ),
            ("attention:1x2x3x4:i8", "attention:1x2x3x4:i8", DType::I8),
        ] {
            let w: Workload = text.parse().unwrap();
            assert_eq!(w.dtype(), dtype, "{text}");
            assert_eq!(w.key(), key, "{text}");
            assert_eq!(key.parse::<Workload>().unwrap(), w, "{text}");
            let j = serde_json::to_string(&w).unwrap();
            assert_eq!(serde_json::from_str::<Workload>(&j).unwrap(), w);
            // The same op and shape in f32 is another workload, with the suffix-free key.
            let f = w.with_dtype(DType::F32);
            assert_ne!(f, w.with_dtype(DType::Bf16));
            assert!(!f.key().ends_with(dtype.name()) || dtype == DType::F32);
            assert_eq!((f.flops(), f.input_lens()), (w.flops(), w.input_lens()));
        }
        for (s, needle) in [
            ("gemm:2x3x4:u8", "not a workload precision"),
            ("gemm:2x3x4:i32", "not a workload precision"),
            ("gemm:2x3x4:fp16", "unknown suffix ':fp16'"),
            ("gemm:2x3x4:bf16:bf16", "given twice"),
            ("gemm:2x3x4:bf16:i8", "two element types, ':bf16' and ':i8'"),
            ("gemm:2x3x4:causal", "only an element type"),
            ("attention:1x2x3x4:causal:causal", "given twice"),
            ("attention:1x2x3x4:causal:", "unknown suffix"),
        ] {
            let err = s.parse::<Workload>().unwrap_err().to_string();
            assert!(err.contains(needle), "{s}: {err}");
            assert!(err.contains(s), "error names the input: {err}");
        }
    }

    #[test]
    fn gelu_reference_matches_known_values() {
        assert_eq!(Act::Gelu.apply_f64(0.0), 0.0);
        assert!((Act::Gelu.apply_f64(1.0) - 0.841_191_990_608_276_8).abs() < 1e-12);
        assert!((Act::Gelu.apply_f64(-1.0) + 0.158_808_009_391_723_2).abs() < 1e-12);
        // Φ(1) = 0.841344746068543; GELU(x) = x·Φ(x).
        assert!((Act::GeluErf.apply_f64(1.0) - 0.841_344_746_068_543).abs() < 1e-14);
        assert!((Act::GeluErf.apply_f64(-1.0) + 0.158_655_253_931_457).abs() < 1e-14);
        assert_eq!(Act::GeluErf.apply_f64(0.0), 0.0);
        assert_eq!(Act::Relu.apply_f64(-2.0), 0.0);
        assert_eq!(Act::Relu.apply_f64(2.5), 2.5);
        assert_eq!(Act::Identity.apply_f64(-2.5), -2.5);
    }

    #[test]
    fn serde_uses_the_text_form() {
        let w = Workload::gemm(2, 3, 4).unwrap();
        let j = serde_json::to_string(&w).unwrap();
        assert_eq!(j, "\"gemm:2x3x4\"");
        assert_eq!(serde_json::from_str::<Workload>(&j).unwrap(), w);
        assert!(serde_json::from_str::<Workload>("\"gemm:0x1x1\"").is_err());
    }
}
