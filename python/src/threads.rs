//! Where a runtime's kernels run: the process-wide rayon pool, or a pool of its own when
//! `threads` asks for another count; either way with the GIL released.

use kernels::HardwareFingerprint;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// The threads of one runtime (or one tuning job).
pub struct Threads {
    pool: Option<rayon::ThreadPool>,
    count: usize,
}

impl Threads {
    /// The pool for `threads` (`None`: the process-wide one, all CPUs this process may use)
    /// and the fingerprint it serves (its thread count is part of it).
    pub fn new(threads: Option<usize>) -> PyResult<(Threads, HardwareFingerprint)> {
        // Detected outside any pool: the process-wide pool's size is this machine's count.
        let here = HardwareFingerprint::current();
        let Some(t) = threads.filter(|&t| t != here.cores) else {
            let count = here.cores;
            return Ok((Threads { pool: None, count }, here.clone()));
        };
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        if t == 0 || t > cpus {
            return Err(PyValueError::new_err(format!(
                "threads={t}: this process may use {cpus} CPU(s); give 1 to {cpus}, or None for all"
            )));
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .thread_name(|i| format!("autokernel-{i}"))
            .build()
            .map_err(|e| PyValueError::new_err(format!("starting {t} threads: {e}")))?;
        Ok((
            Threads {
                pool: Some(pool),
                count: t,
            },
            here.with_cores(t),
        ))
    }

    /// Threads the kernels use.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Runs `f` with the GIL released, on this pool.
    pub fn run<R: Send>(&self, py: Python<'_>, f: impl FnOnce() -> R + Send) -> R {
        py.detach(|| match &self.pool {
            Some(pool) => pool.install(f),
            None => f(),
        })
    }
}
