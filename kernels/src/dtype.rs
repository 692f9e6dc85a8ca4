//! Element types: of a workload (its precision, the `:bf16` / `:i8` suffix of its text form)
//! and of an operand ([`crate::operand`]).
//!
//! ```
//! use kernels::DType;
//!
//! assert_eq!("bf16".parse::<DType>()?, DType::Bf16);
//! assert_eq!(DType::I8.to_string(), "i8");
//! assert!(DType::I8.is_precision() && !DType::U8.is_precision());
//! assert_eq!(DType::precision_named("INT8"), Some(DType::I8));
//! assert_eq!(DType::Bf16.size(), 2);
//! # Ok::<(), kernels::Error>(())
//! ```

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// An element type.
///
/// A workload's element type is its precision: [`DType::F32`] (the default, no suffix),
/// [`DType::Bf16`] (bf16 operands, f32 accumulation and output) or [`DType::I8`] (int8
/// operands with their quantisation scales, i32 accumulation, f32 output). [`DType::U8`] and
/// [`DType::I32`] only appear as operand types (asymmetric activations, accumulators).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 32-bit IEEE 754 float: the default precision, written without suffix.
    #[default]
    F32,
    /// bfloat16 (the upper 16 bits of an f32), held as its `u16` bit pattern.
    Bf16,
    /// Signed 8-bit integer: as a precision (`:i8`), int8 products accumulated in i32; as an
    /// operand, symmetric quantised values (`value = scale · q`).
    I8,
    /// Unsigned 8-bit integer, asymmetric quantisation (`value = scale · (q − zero_point)`); an
    /// operand type only.
    U8,
    /// Signed 32-bit integer (accumulators, attention key lengths); an operand type only.
    I32,
}

impl DType {
    /// Every element type.
    pub const ALL: [DType; 5] = [DType::F32, DType::Bf16, DType::I8, DType::U8, DType::I32];

    /// The element types a workload may have (its precision).
    pub const PRECISIONS: [DType; 3] = [DType::F32, DType::Bf16, DType::I8];

    /// `f32`, `bf16`, `i8`, `u8` or `i32`: the workload suffix and the `--json` `dtype`.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
        }
    }

    /// The precision a user names: `f32` (or `fp32`), `bf16`, `int8` (or `i8`), in any case.
    /// The one list of these names; `auto` (a policy, not a type) is the callers'.
    pub fn precision_named(name: &str) -> Option<DType> {
        match name.trim().to_ascii_lowercase().as_str() {
            "f32" | "fp32" => Some(DType::F32),
            "bf16" => Some(DType::Bf16),
            "int8" | "i8" => Some(DType::I8),
            _ => None,
        }
    }

    /// The names [`DType::precision_named`] knows, as error messages list them.
    pub const PRECISION_NAMES: &'static str = "f32, bf16, int8";

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::Bf16 => 2,
            DType::I8 | DType::U8 => 1,
        }
    }

    /// Whether a workload can have this element type ([`DType::PRECISIONS`]).
    pub fn is_precision(self) -> bool {
        DType::PRECISIONS.contains(&self)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        DType::ALL
            .into_iter()
            .find(|d| d.name() == s.trim())
            .ok_or_else(|| Error::UnknownDtype {
                input: s.trim().to_string(),
                known: DType::ALL.map(DType::name).join(", "),
            })
    }
}
