//! Where a runtime's kernels run ([`runtime::Threads`]: the process-wide rayon pool, the
//! caller's thread for `threads=1`, or a pool of its own), always with the GIL released.

use kernels::HardwareFingerprint;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use runtime::ThreadsError;

/// The threads of one runtime (or one tuning job).
pub struct Threads(runtime::Threads);

impl Threads {
    /// The threads for `threads` (`None`: all CPUs this process may use) and the fingerprint
    /// they serve (its thread count is part of it).
    pub fn new(threads: Option<usize>) -> PyResult<(Threads, HardwareFingerprint)> {
        match runtime::Threads::new(threads) {
            Ok((t, hw)) => Ok((Threads(t), hw)),
            Err(ThreadsError::OutOfRange { asked, cpus }) => Err(PyValueError::new_err(format!(
                "threads={asked}: this process may use {cpus} CPU(s); give 1 to {cpus}, or None for all"
            ))),
            Err(e) => Err(PyValueError::new_err(e.to_string())),
        }
    }

    /// Threads the kernels use.
    pub fn count(&self) -> usize {
        self.0.count()
    }

    /// Runs `f` with the GIL released, on these threads.
    pub fn run<R: Send>(&self, py: Python<'_>, f: impl FnOnce() -> R + Send) -> R {
        py.detach(|| self.0.run(f))
    }
}
