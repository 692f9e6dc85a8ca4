//! Typed errors of the vocabulary crate.

use thiserror::Error;

/// Everything that can go wrong while parsing, validating or preparing a kernel.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Error {
    /// A workload string that does not parse, or whose dimensions are out of range.
    #[error("bad workload '{input}': {reason}")]
    BadWorkload { input: String, reason: String },
    /// A config that does not belong to a kernel's space for this workload.
    #[error("config {config} is not valid for kernel '{kernel}': {reason}")]
    InvalidConfig {
        kernel: String,
        config: String,
        reason: String,
    },
    /// A kernel that was asked to run a workload it does not support.
    #[error("kernel '{kernel}' does not support workload '{workload}'")]
    Unsupported { kernel: String, workload: String },
    /// A family asked to run a workload of an element type it does not serve.
    #[error(
        "kernel '{kernel}' does not serve {dtype} workloads ('{workload}'); it serves {served}"
    )]
    UnsupportedDtype {
        kernel: String,
        workload: String,
        dtype: crate::DType,
        served: String,
    },
    /// An element type name that is not one of [`crate::DType::ALL`].
    #[error("unknown element type '{input}' (known: {known})")]
    UnknownDtype { input: String, known: String },
    /// No registered family runs this workload on this device (the message says what does).
    #[error("no kernel family runs '{workload}' on {device}: {reason}")]
    NoFamily {
        workload: String,
        device: String,
        reason: String,
    },
    /// A device family (CUDA) asked for a host executable: it runs through a device session.
    #[error(
        "kernel '{kernel}' runs on a CUDA device through a device session \
         (kernels::cuda::GpuTask), not as a host executable ('{workload}')"
    )]
    DeviceOnly { kernel: String, workload: String },
    /// An operand that does not match the workload an executable was prepared for: count,
    /// element type, length or device.
    #[error("operand '{operand}' of {workload}: {reason}")]
    Operand {
        workload: String,
        operand: String,
        reason: String,
    },
    /// A kernel name that no registered family answers to.
    #[error("unknown kernel '{0}'")]
    UnknownKernel(String),
    /// An allocation sized by an operand (a packed weight) that the memory left cannot hold.
    #[error("out of memory: {what} needs {bytes} bytes")]
    OutOfMemory { what: String, bytes: u64 },
    /// An `AUTOKERNEL_ISA` cap that names no level, or one the CPU does not run.
    #[error("AUTOKERNEL_ISA={value}: {reason}")]
    IsaCap { value: String, reason: String },
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
