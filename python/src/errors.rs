//! Rust errors as Python exceptions: a bad operand is a `ValueError` or `TypeError` (raised
//! where it is checked, naming the argument); what the runtime or the database refuses is an
//! `autokernel.AutokernelError`, except buffer-size, workload and argument errors
//! (`ValueError`) and a weight the memory left cannot hold (`MemoryError`).

use pyo3::create_exception;
use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyValueError};
use pyo3::PyErr;

create_exception!(
    autokernel,
    AutokernelError,
    PyRuntimeError,
    "An error of the autokernel runtime, database or tuner (not of an argument's type or shape)."
);

/// The Python exception for a runtime error.
pub fn runtime_err(e: runtime::RuntimeError) -> PyErr {
    use runtime::RuntimeError as E;
    match e {
        E::BufferSize { .. }
        | E::Argument { .. }
        | E::Kernel(kernels::Error::BadWorkload { .. }) => PyValueError::new_err(e.to_string()),
        E::Kernel(kernels::Error::OutOfMemory { .. }) => PyMemoryError::new_err(e.to_string()),
        e => AutokernelError::new_err(e.to_string()),
    }
}

/// The Python exception for a kernel-vocabulary error (a workload string that does not parse
/// is a `ValueError`).
pub fn kernel_err(e: kernels::Error) -> PyErr {
    match e {
        kernels::Error::BadWorkload { .. } => PyValueError::new_err(e.to_string()),
        kernels::Error::OutOfMemory { .. } => PyMemoryError::new_err(e.to_string()),
        e => AutokernelError::new_err(e.to_string()),
    }
}

/// Any other error, as `AutokernelError` with its message.
pub fn other_err(e: impl std::fmt::Display) -> PyErr {
    AutokernelError::new_err(e.to_string())
}
