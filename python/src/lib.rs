//! `autokernel._native`: the Python extension module of the `autokernel` package.
//!
//! Wraps [`runtime::Runtime`] (dispatch to the tuned variant of each call) and the tuning loop
//! of the `search` crate for Python: numpy arrays and CPU torch tensors are read in place
//! (zero-copy, checked for element type, layout and shape), kernels run with the GIL
//! released, and every error becomes a Python exception naming the argument at fault. The
//! pure-Python half of the package (`python/autokernel/`) re-exports these classes and adds
//! the PyTorch integration.

mod args;
mod errors;
mod json;
mod layer;
mod operand;
mod packed;
mod runtime_py;
mod threads;
mod tune;

use pyo3::prelude::*;

/// The extension module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add(
        "AutokernelError",
        m.py().get_type::<errors::AutokernelError>(),
    )?;
    m.add_class::<runtime_py::PyRuntime>()?;
    m.add_class::<packed::PyPackedWeight>()?;
    m.add_class::<layer::PyEncoderLayer>()?;
    m.add_function(wrap_pyfunction!(tune::tune, m)?)?;
    m.add_function(wrap_pyfunction!(tune::serve_worker, m)?)?;
    m.add_function(wrap_pyfunction!(runtime_py::fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(runtime_py::row_blocks, m)?)?;
    m.add_function(wrap_pyfunction!(runtime_py::sequence_blocks, m)?)?;
    Ok(())
}
