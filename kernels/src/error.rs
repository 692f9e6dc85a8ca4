//! Typed errors of the vocabulary crate.

use thiserror::Error;

/// Everything that can go wrong while parsing, validating or preparing a kernel.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Error {
    /// A workload string that does not parse, or whose dimensions are out of range.
    #[error("bad workload '{input}': {reason}")]
    BadWorkload {
        /// The workload as given (its text form, or the key of a workload built in code).
        input: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A config that does not belong to a kernel's space for this workload.
    #[error("config {config} is not valid for kernel '{kernel}': {reason}")]
    InvalidConfig {
        /// The kernel family's name.
        kernel: String,
        /// The config, as JSON ([`crate::Config::to_json`]).
        config: String,
        /// Which knob is wrong, and why.
        reason: String,
    },
    /// A kernel that was asked to run a workload it does not support.
    #[error("kernel '{kernel}' does not support workload '{workload}'")]
    Unsupported {
        /// The kernel family's name.
        kernel: String,
        /// The workload's key.
        workload: String,
    },
    /// A family asked to run a workload of an element type it does not serve.
    #[error(
        "kernel '{kernel}' does not serve {dtype} workloads ('{workload}'); it serves {served}"
    )]
    UnsupportedDtype {
        /// The kernel family's name.
        kernel: String,
        /// The workload's key.
        workload: String,
        /// The workload's element type.
        dtype: crate::DType,
        /// The element types the family serves ([`crate::Kernel::dtypes`]), comma-separated.
        served: String,
    },
    /// An element type name that is not one of [`crate::DType::ALL`].
    #[error("unknown element type '{input}' (known: {known})")]
    UnknownDtype {
        /// The name as given (trimmed).
        input: String,
        /// Every element type name, comma-separated.
        known: String,
    },
    /// No registered family runs this workload on this device (the message says what does).
    #[error("no kernel family runs '{workload}' on {device}: {reason}")]
    NoFamily {
        /// The workload's key.
        workload: String,
        /// The device kind asked for (`cpu`, `cuda`).
        device: String,
        /// Why none does, and which families serve the workload's element type elsewhere.
        reason: String,
    },
    /// A device family (CUDA) asked for a host executable: it runs through a device session.
    #[error(
        "kernel '{kernel}' runs on a CUDA device through a device session \
         (kernels::cuda::GpuTask), not as a host executable ('{workload}')"
    )]
    DeviceOnly {
        /// The kernel family's name.
        kernel: String,
        /// The workload's key.
        workload: String,
    },
    /// An operand that does not match the workload an executable was prepared for: count,
    /// element type, length or device.
    #[error("operand '{operand}' of {workload}: {reason}")]
    Operand {
        /// The key of the workload the executable was prepared for.
        workload: String,
        /// The operand's name (`a`, `b`, `bias`, `c`, `q`, `key_lens`, ...), or `inputs`
        /// when their count is wrong.
        operand: String,
        /// What was expected and what was given.
        reason: String,
    },
    /// A kernel name that no registered family answers to.
    #[error("unknown kernel '{0}'")]
    UnknownKernel(String),
    /// An allocation sized by an operand (a packed weight) that the memory left cannot hold.
    #[error("out of memory: {what} needs {bytes} bytes")]
    OutOfMemory {
        /// What was being allocated, e.g. `packed B`.
        what: String,
        /// The size asked for, in bytes.
        bytes: u64,
    },
    /// An `AUTOKERNEL_ISA` cap that names no level, or one the CPU does not run.
    #[error("AUTOKERNEL_ISA={value}: {reason}")]
    IsaCap {
        /// The value of `AUTOKERNEL_ISA` as set.
        value: String,
        /// Why it is refused.
        reason: String,
    },
    /// An `AUTOKERNEL_LINGER_US` that is not a whole number of microseconds up to a second.
    #[error("AUTOKERNEL_LINGER_US={value}: {reason}")]
    Linger {
        /// The value of `AUTOKERNEL_LINGER_US` as set.
        value: String,
        /// Why it is refused.
        reason: String,
    },
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
