//! CPU kernel families, and the SIMD level they run at ([`Isa`], detected once in
//! `kernels/src/isa.rs`, part of the vocabulary because the hardware fingerprint records it).

pub mod amx;
pub mod attention;
pub mod bgemm;
mod fanout;
pub mod gemm;
mod handoff;
pub(crate) mod knobs;
pub mod peak;
#[cfg(feature = "planted-faults")]
pub mod planted;
pub mod pool;
pub mod qgemm;
pub(crate) mod weights;

pub use crate::isa::{announce_level, level_report, resolve_cap, Isa, ISA_ENV};
pub use fanout::{linger, LINGER_ENV};
