//! Workloads: what is computed, at which shape.
//!
//! The text form (`gemm:MxNxK`) is the contract users type on the command line and the key
//! stored in the tuning database, so [`Workload::key`] and [`FromStr`] are exact inverses.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Largest accepted dimension. Anything above is almost surely a typo (and would not fit
/// in memory as a dense f32 matrix anyway).
pub const MAX_DIM: usize = 1 << 20;

/// Largest accepted total operand size in f32 elements (16 GiB of data).
pub const MAX_ELEMENTS: u128 = 1 << 32;

/// The operator families autokernel knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// `C = A·B`, f32, row-major; A is M×K, B is K×N, C is M×N.
    Gemm,
}

impl Op {
    /// Every op, for error messages and listings.
    pub const ALL: [Op; 1] = [Op::Gemm];

    /// The name used in workload strings.
    pub fn name(self) -> &'static str {
        match self {
            Op::Gemm => "gemm",
        }
    }
}

/// One problem instance: an op and its shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Workload {
    /// f32 row-major GEMM `C[m×n] = A[m×k] · B[k×n]`.
    Gemm { m: usize, n: usize, k: usize },
}

impl Workload {
    /// A GEMM workload, validated (every dim in `1..=MAX_DIM`).
    pub fn gemm(m: usize, n: usize, k: usize) -> Result<Self> {
        let w = Workload::Gemm { m, n, k };
        w.validate(&w.key())?;
        Ok(w)
    }

    /// The op this workload belongs to.
    pub fn op(&self) -> Op {
        match self {
            Workload::Gemm { .. } => Op::Gemm,
        }
    }

    /// The dimensions in the order of the text form (`gemm`: M, N, K).
    pub fn dims(&self) -> Vec<usize> {
        match *self {
            Workload::Gemm { m, n, k } => vec![m, n, k],
        }
    }

    /// The canonical text form, also the database key: `gemm:MxNxK`.
    pub fn key(&self) -> String {
        self.to_string()
    }

    /// Floating-point operations of one call, the numerator of every GFLOP/s figure.
    pub fn flops(&self) -> f64 {
        match *self {
            Workload::Gemm { m, n, k } => 2.0 * m as f64 * n as f64 * k as f64,
        }
    }

    /// Lengths of the input buffers, in order (`gemm`: A, B).
    pub fn input_lens(&self) -> Vec<usize> {
        match *self {
            Workload::Gemm { m, n, k } => vec![m * k, k * n],
        }
    }

    /// Length of the output buffer (`gemm`: C).
    pub fn output_len(&self) -> usize {
        match *self {
            Workload::Gemm { m, n, .. } => m * n,
        }
    }

    fn validate(&self, input: &str) -> Result<()> {
        let bad = |reason: String| Error::BadWorkload {
            input: input.to_string(),
            reason,
        };
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
        let elems: u128 =
            self.input_lens().iter().map(|&l| l as u128).sum::<u128>() + self.output_len() as u128;
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
            Workload::Gemm { m, n, k } => write!(f, "gemm:{m}x{n}x{k}"),
        }
    }
}

impl FromStr for Workload {
    type Err = Error;

    /// Parses `gemm:MxNxK` (surrounding white space is ignored).
    fn from_str(s: &str) -> Result<Self> {
        let input = s.trim();
        let bad = |reason: String| Error::BadWorkload {
            input: input.to_string(),
            reason,
        };
        let known = Op::ALL.map(Op::name).join(", ");
        let (op, shape) = input.split_once(':').ok_or_else(|| {
            bad(format!(
                "expected OP:SHAPE such as gemm:128x768x768 (ops: {known})"
            ))
        })?;
        let dims = shape
            .split('x')
            .map(|d| {
                d.trim().parse::<usize>().map_err(|_| {
                    bad(format!(
                        "'{d}' is not a positive whole number (shape is {shape})"
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let w = match op.trim() {
            "gemm" => match dims[..] {
                [m, n, k] => Workload::Gemm { m, n, k },
                _ => {
                    return Err(bad(format!(
                        "gemm takes MxNxK, got {} dimension(s)",
                        dims.len()
                    )))
                }
            },
            other => return Err(bad(format!("unknown op '{other}' (known ops: {known})"))),
        };
        w.validate(input)?;
        Ok(w)
    }
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
                k: 768
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
            ("gemm:1x1x", "not a positive"),
            ("conv:1x2x3", "unknown op 'conv'"),
            ("gemm:99999999x1x1", "exceeds the maximum"),
            ("gemm:1000000x1000000x1000", "more than the limit"),
            ("gemm:99999999999999999999999x1x1", "not a positive"),
        ] {
            let err = s.parse::<Workload>().unwrap_err().to_string();
            assert!(err.contains(needle), "{s}: {err}");
            assert!(err.contains(s.trim()), "error names the input: {err}");
        }
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
