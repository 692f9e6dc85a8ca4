//! CPU kernel families, and the SIMD level they run at ([`Isa`], detected once in `isa.rs`).

pub mod attention;
pub mod gemm;
mod isa;
pub(crate) mod knobs;
pub mod peak;
#[cfg(feature = "planted-faults")]
pub mod planted;

pub use isa::{announce_level, level_report, resolve_cap, Isa, ISA_ENV};
