//! Where a runtime's kernels run ([`runtime::Threads`]: the process-wide rayon pool, the
//! caller's thread for `threads=1`, or a pool of its own), always with the GIL released.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kernels::HardwareFingerprint;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use runtime::ThreadsError;

use crate::args::IntArg;

/// The threads of one runtime (or one tuning job).
pub struct Threads(runtime::Threads);

impl Threads {
    /// The threads for `threads` (`None`: all CPUs this process may use) and the fingerprint
    /// they serve (its thread count is part of it). Out of range (negatives included):
    /// `ValueError` naming `threads` and the counts allowed.
    pub fn new(threads: Option<IntArg>) -> PyResult<(Threads, HardwareFingerprint)> {
        let out_of_range = |asked: &dyn std::fmt::Display, cpus: usize| {
            PyValueError::new_err(format!(
                "threads={asked}: this process may use {cpus} CPU(s); give 1 to {cpus}, or None for all"
            ))
        };
        let asked = match threads {
            None => None,
            Some(t) => match crate::args::refuse_bool(t.1, "threads", "an integer", t.0 != 0)
                .map(|()| usize::try_from(t.0))?
            {
                Ok(t) => Some(t),
                Err(_) => return Err(out_of_range(&t, HardwareFingerprint::current().cores)),
            },
        };
        match runtime::Threads::new(asked) {
            Ok((t, hw)) => Ok((Threads(t), hw)),
            Err(ThreadsError::OutOfRange { asked, cpus }) => Err(out_of_range(&asked, cpus)),
            Err(e @ ThreadsError::Forked(_)) => Err(PyRuntimeError::new_err(e.to_string())),
            Err(e) => Err(PyValueError::new_err(e.to_string())),
        }
    }

    /// Threads the kernels use.
    pub fn count(&self) -> usize {
        self.0.count()
    }

    /// Runs `f` with the GIL released, on these threads: a `RuntimeError` instead in a child
    /// forked after the library's worker threads started (they are not there to run it).
    pub fn run<R: Send>(&self, py: Python<'_>, f: impl FnOnce() -> R + Send) -> PyResult<R> {
        not_forked()?;
        Ok(py.detach(|| self.0.run(f)))
    }

    /// Runs `f` (given a stop flag) on these threads, from another OS thread, while this one
    /// answers Python's signals every 50 ms: a Ctrl-C (any exception a signal handler
    /// raises) sets the flag, and is raised once `f` has returned — for long jobs that stop
    /// at their next check of the flag ([`search::TuneOptions::stop`]). Python runs signal
    /// handlers in its main thread only: called from another thread, `f` runs to its end.
    pub fn run_interruptible<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(Arc<AtomicBool>) -> R + Send,
    ) -> PyResult<R> {
        not_forked()?;
        let stop = Arc::new(AtomicBool::new(false));
        let job_stop = stop.clone();
        std::thread::scope(|s| {
            let job = s.spawn(|| self.0.run(|| f(job_stop)));
            let mut raised = None;
            while !job.is_finished() {
                py.detach(|| std::thread::sleep(Duration::from_millis(50)));
                if raised.is_none() {
                    if let Err(e) = py.check_signals() {
                        stop.store(true, Ordering::Relaxed);
                        raised = Some(e);
                    }
                }
            }
            let out = job.join().map_err(|panic| {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                crate::errors::other_err(format!("internal error: the job panicked: {what}"))
            })?;
            match raised {
                Some(e) => Err(e),
                None => Ok(out),
            }
        })
    }
}

/// A `RuntimeError` in a child forked after the library's worker threads started.
fn not_forked() -> PyResult<()> {
    kernels::cpu::pool::enter().map_err(|e| PyRuntimeError::new_err(e.to_string()))
}
