//! # The CUDA backend: NVRTC-compiled kernel templates, run through cudarc's safe API
//!
//! ```no_run
//! use kernels::cuda::{gemm_f32::GemmF32, Arch, GemmShape, Template};
//!
//! let shape = GemmShape::new(1024, 1024, 1024)?;
//! let config = GemmF32.default_config(&shape, Arch::SM90);
//! let ptx = GemmF32.compile(&shape, &config, Arch::SM90)?; // needs libnvrtc, not a GPU
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Three template families, each a CUDA C source in `templates/` rendered with its config as
//! `#define` compile-time constants and compiled by NVRTC, in parallel (rayon), cached per
//! (source, arch):
//! - [`gemm_f32`]: f32 GEMM — block tile (BM, BN, BK), warp tile (WM, WN), thread tile (TM, TN),
//!   `cp.async` multi-stage shared-memory pipeline, vectorised global loads, split-K;
//! - [`gemm_bf16`]: bf16 inputs, f32 accumulation and output, on tensor cores
//!   (`ldmatrix` + `mma.sync.m16n8k16`), the same knobs where they apply;
//! - [`attention`]: flash-style fused attention (online softmax over key tiles), f32 and bf16,
//!   causal or not, knobs Br / Bc / warps.
//!
//! Every template predicates its edges, so every config of a space is correct for every shape;
//! each family's default config fits every shape and every arch it supports.
//!
//! [`Gpu`] runs them: device discovery and fingerprint ([`GpuFingerprint`]), module loading,
//! launches, CUDA-event timing with an L2 flush between samples ([`GpuTiming`]), and
//! verification — GEMM against cuBLAS, attention against an f64 CPU reference.
//!
//! ## How the CUDA libraries are found (no CUDA at build time)
//!
//! cudarc is built with `dynamic-loading`: nothing links against CUDA, so the workspace builds
//! and its tests pass on machines with no CUDA at all. At run time cudarc `dlopen()`s each
//! library on first use, trying the names `cudarc::get_lib_name_candidates(name)` lists —
//! for NVRTC `libnvrtc.so`, …, `libnvrtc.so.12`, …; for the driver `libcuda.so`,
//! `libcuda.so.1`; for cuBLAS `libcublas.so.12`, … — through the system loader. So the
//! library must be on the loader's path: `LD_LIBRARY_PATH`, `/etc/ld.so.conf` (ldconfig), or
//! the default system directories. `CUDA_PATH` / `CUDA_HOME` / `CUDA_ROOT` are **not** consulted
//! at run time (cudarc's build script reads them only for the link-time modes we do not use).
//!
//! cudarc panics when a library it needs cannot be loaded, so this module probes first
//! ([`nvrtc_version`], [`device_count`]) and turns a missing library into a typed error:
//! [`CudaError::NoDriver`], [`CudaError::NoDevice`], [`CompileError::NvrtcUnavailable`].
//!
//! NVRTC needs no GPU. CI installs the `nvidia-cuda-nvrtc-cu12` wheel from PyPI into
//! `.ci/nvrtc` and puts `.ci/nvrtc/nvidia/cuda_nvrtc/lib` (holding `libnvrtc.so.12` and the
//! `libnvrtc-builtins.so.12.*` it loads in turn) on `LD_LIBRARY_PATH`; the test
//! `kernels/tests/cuda_templates.rs` then compiles every template, over a sample of each
//! space, for sm_80 and sm_90. To do the same by hand:
//!
//! ```sh
//! python3 -m pip install --target .ci/nvrtc nvidia-cuda-nvrtc-cu12==12.2.140
//! export LD_LIBRARY_PATH=$PWD/.ci/nvrtc/nvidia/cuda_nvrtc/lib:$LD_LIBRARY_PATH
//! AUTOKERNEL_REQUIRE_NVRTC=1 cargo test -p kernels --features cuda --test cuda_templates
//! ```
//!
//! NVRTC's PTX carries the PTX ISA version of the NVRTC release, and a driver only JIT-compiles
//! PTX up to its own CUDA version: with NVRTC 12.2, any driver for CUDA ≥ 12.2 works. A newer
//! NVRTC on an older driver fails at module load with a [`CudaError::Driver`] that says so.

pub mod arch;
pub mod attention;
pub mod bf16;
pub mod compile;
pub mod fingerprint;
pub mod gemm;
pub mod gemm_bf16;
pub mod gemm_f32;
pub mod gpu;
pub mod shape;
pub mod task;
pub mod template;

use std::sync::OnceLock;

use cudarc::driver::{sys::cudaError_enum, DriverError};

pub use arch::Arch;
pub use attention::{Attention, AttentionProblem, AttnDtype};
pub use compile::{compile_many, compile_source, CompileError, Ptx};
pub use fingerprint::GpuFingerprint;
pub use gemm::{GemmDtype, GemmProblem};
pub use gemm_bf16::GemmBf16;
pub use gemm_f32::GemmF32;
pub use gpu::{Gpu, GpuOutcome, GpuTiming};
pub use shape::{AttentionShape, GemmShape};
pub use task::{gpu_arch, GpuFamily, GpuTask, FAMILIES};
pub use template::Template;

/// Everything that can go wrong on the CUDA side.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CudaError {
    /// `libcuda` could not be loaded or initialised.
    #[error("no CUDA driver found (libcuda.so not loadable): {reason}")]
    NoDriver {
        /// Why: the library is not on the loader's path, or the driver failed to initialise.
        reason: String,
    },
    /// The driver works but has no device with this ordinal.
    #[error("no CUDA device {ordinal} (found {found})")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices the driver has.
        found: usize,
    },
    /// A driver call failed.
    #[error("CUDA driver error while {context}: {cause}")]
    Driver {
        /// What was being done, e.g. `creating a context`.
        context: String,
        /// The driver's error.
        cause: DriverError,
    },
    /// cuBLAS (the GEMM reference) could not be loaded or failed.
    #[error("cuBLAS error while {context}: {reason}")]
    Cublas {
        /// What was being done, e.g. `loading cuBLAS`, `sgemm`.
        context: String,
        /// cuBLAS's error, or why it could not be loaded.
        reason: String,
    },
    /// A template did not compile (the NVRTC log is inside), or its config is not valid.
    #[error(transparent)]
    Compile(#[from] CompileError),
    /// A shape outside what the kernels accept.
    #[error("bad shape: {0}")]
    BadShape(String),
    /// A workload no CUDA family runs (the message names what does).
    #[error("{0}")]
    Unsupported(String),
    /// Buffers that do not match the shape a kernel was prepared for.
    #[error("buffer '{name}' holds {got} elements, the shape needs {need}")]
    BufferSize {
        /// The buffer's name (`A`, `B`, `C`, `Q`, `K`, `V`, `O`).
        name: &'static str,
        /// Its length, in elements.
        got: usize,
        /// The length the shape needs, in elements.
        need: usize,
    },
    /// The kernel ran but its output is not within tolerance of the reference.
    #[error(transparent)]
    WrongResult(#[from] crate::problem::Mismatch),
}

impl CudaError {
    /// Wraps a driver error with what was being done.
    pub(crate) fn driver(context: impl Into<String>) -> impl FnOnce(DriverError) -> CudaError {
        let context = context.into();
        move |source| {
            let context = if source.0 == cudaError_enum::CUDA_ERROR_UNSUPPORTED_PTX_VERSION {
                format!(
                    "{context} (the PTX comes from NVRTC {}, newer than this driver's CUDA \
                     version: put an NVRTC no newer than the driver on LD_LIBRARY_PATH)",
                    nvrtc_version()
                        .map(|(a, b)| format!("{a}.{b}"))
                        .unwrap_or_else(|_| "?".into())
                )
            } else {
                context
            };
            CudaError::Driver {
                context,
                cause: source,
            }
        }
    }
}

/// The file names cudarc tries for library `name`, deduplicated, for error messages (on Unix
/// without the Windows-style `name64_*` variants, which it also tries).
pub(crate) fn lib_names(name: &str) -> String {
    let mut names: Vec<String> = Vec::new();
    for n in cudarc::get_lib_name_candidates(name) {
        let skip = cfg!(unix) && n.contains(&format!("{name}64"));
        if !skip && !names.contains(&n) {
            names.push(n);
        }
    }
    names.join(", ")
}

/// Whether the driver library loads and initialises: `Ok` or the reason it does not.
/// Probed once per process.
fn driver_init() -> Result<(), CudaError> {
    static INIT: OnceLock<Result<(), CudaError>> = OnceLock::new();
    INIT.get_or_init(|| {
        // SAFETY: `is_culib_present` only dlopen()s the candidate names of the driver library
        // and closes them again; loading the NVIDIA driver library runs its initialisers, which
        // is what any use of CUDA does. It touches no memory of ours.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(CudaError::NoDriver {
                reason: format!(
                    "none of {} is on the loader's path (LD_LIBRARY_PATH, ldconfig); \
                     is the NVIDIA driver installed?",
                    lib_names("cuda")
                ),
            });
        }
        match cudarc::driver::result::init() {
            Ok(()) => Ok(()),
            // The driver loads but sees no GPU (none installed, or CUDA_VISIBLE_DEVICES="").
            Err(e) if e.0 == cudaError_enum::CUDA_ERROR_NO_DEVICE => Ok(()),
            Err(e) => Err(CudaError::NoDriver {
                reason: format!("cuInit failed: {e}"),
            }),
        }
    })
    .clone()
}

/// Number of CUDA devices, or why CUDA cannot be used at all. Never panics, also when no
/// driver library exists.
pub fn device_count() -> Result<usize, CudaError> {
    driver_init()?;
    match cudarc::driver::result::device::get_count() {
        Ok(n) => Ok(n.max(0) as usize),
        Err(e) if e.0 == cudaError_enum::CUDA_ERROR_NO_DEVICE => Ok(0),
        Err(e) => Err(CudaError::driver("counting devices")(e)),
    }
}

/// The (major, minor) version of the NVRTC library cudarc loads, or why it cannot be loaded.
/// Probed once per process; never panics.
pub fn nvrtc_version() -> Result<(u32, u32), CompileError> {
    static VERSION: OnceLock<Result<(u32, u32), CompileError>> = OnceLock::new();
    VERSION
        .get_or_init(|| {
            // SAFETY: as for the driver above: dlopen()s the candidate names and closes them.
            if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                return Err(CompileError::NvrtcUnavailable {
                    reason: format!(
                        "none of {} is on the loader's path; install the \
                         nvidia-cuda-nvrtc-cu12 wheel or a CUDA toolkit and add its lib \
                         directory to LD_LIBRARY_PATH",
                        lib_names("nvrtc")
                    ),
                });
            }
            let (mut major, mut minor) = (0, 0);
            // SAFETY: nvrtcVersion writes one int through each pointer, both of which point to
            // live locals; the library is present (checked above), so cudarc finds the symbol.
            let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
            if status != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
                return Err(CompileError::NvrtcUnavailable {
                    reason: format!("nvrtcVersion failed: {status:?}"),
                });
            }
            Ok((major.max(0) as u32, minor.max(0) as u32))
        })
        .clone()
}

#[cfg(test)]
mod gpu_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_never_panic_and_errors_name_the_cause() {
        match device_count() {
            Ok(n) => println!("CUDA driver present, {n} device(s)"),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.starts_with("no CUDA driver found"), "{msg}");
                assert!(
                    msg.contains("libcuda.so") || msg.contains("cuInit"),
                    "{msg}"
                );
            }
        }
        match nvrtc_version() {
            Ok((a, b)) => println!("NVRTC {a}.{b}"),
            Err(e) => assert!(e.to_string().contains("libnvrtc"), "{e}"),
        }
    }

    #[test]
    fn error_texts() {
        let e = CudaError::NoDevice {
            ordinal: 3,
            found: 1,
        };
        assert_eq!(e.to_string(), "no CUDA device 3 (found 1)");
        let e = CudaError::NoDriver { reason: "x".into() };
        assert_eq!(
            e.to_string(),
            "no CUDA driver found (libcuda.so not loadable): x"
        );
    }
}
