//! # kernels — the vocabulary of autokernel, and its CPU kernel families
//!
//! ```
//! use kernels::{default_for, HardwareFingerprint, Problem, Workload};
//!
//! let w: Workload = "gemm:64x48x33".parse()?;
//! let hw = HardwareFingerprint::current();
//! let (kernel, config) = default_for(&w, hw)?;
//! let exe = kernel.prepare(&w, &config)?;
//!
//! let problem = Problem::random(&w, 7);
//! let mut c = problem.output();
//! exe.run_f32(&problem.input_slices(), &mut c)?;
//! problem.check(&c, &problem.reference())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Why it exists: every other crate speaks in these terms. A [`Workload`] says what to compute
//! (`gemm:MxNxK`); a [`Kernel`] family declares a [`Space`] of [`Config`]s for it, a default
//! that is valid everywhere, and turns a config into an [`Executable`]; a
//! [`HardwareFingerprint`] says on what machine a measurement holds. The tuning database, the
//! runner, the search and the runtime all build on this crate and on nothing else of ours.
//!
//! Kernel families live in [`cpu`] and, with the `cuda` feature, `cuda`; each depends on the
//! vocabulary only, and [`registry()`] is the one place that lists them all ([`kernels_for`]
//! a workload on a fingerprint's device, its [`default_for`], [`registry::check_record`] for
//! stored records). A workload carries its element type ([`DType`], the `:bf16` / `:i8`
//! suffix); an [`Executable`] takes typed [`Operand`]s and refuses wrong ones with an error.
//! Unsafe SIMD code is confined to its leaf modules, behind one run-time CPU-feature
//! detection ([`isa::Isa::detect`]).

#![warn(missing_docs)]

pub mod alloc;
pub mod amx;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod dtype;
pub mod error;
pub mod hardware;
pub mod isa;
pub mod kernel;
pub mod measurement;
pub mod operand;
pub mod problem;
pub mod registry;
pub mod rng;
pub mod space;
#[doc(hidden)]
pub mod testing;
pub mod workload;

pub use device::{Device, DeviceKind, DeviceParseError};
pub use dtype::DType;
pub use error::{Error, Result};
pub use hardware::HardwareFingerprint;
pub use kernel::{Executable, Kernel, PreparedWeight, WeightFormat};
pub use measurement::{Measurement, Status};
pub use operand::{DeviceBuffer, Operand, OperandMut};
pub use problem::{Accuracy, Mismatch, Problem, Reference};
pub use registry::{default_for, kernel, kernels_for, registry};
pub use rng::Rng;
pub use space::{Config, Knob, Space, SpaceError, Value};
pub use workload::{Act, Op, Workload};
