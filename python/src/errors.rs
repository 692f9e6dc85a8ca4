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

/// The `TypeError` a native object's `__reduce__` raises (`class` names it, e.g.
/// `autokernel.Runtime`): it lives in native memory, and an optimized PyTorch model is saved
/// as its `state_dict` instead.
pub fn not_picklable(class: &str) -> PyErr {
    pyo3::exceptions::PyTypeError::new_err(format!(
        "{class} cannot be pickled (it lives in native memory; an optimized PyTorch model holds \
         one): save the model's state_dict (its parameters are the original ones) and optimize \
         the loaded model again"
    ))
}
