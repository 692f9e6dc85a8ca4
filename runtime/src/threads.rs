//! Where a runtime's calls run when its user picks a thread count (the Python and C
//! bindings): rayon's process-wide pool for all CPUs, the caller's own thread for one, a
//! pool of its own otherwise — entered only by the calls that fork ([`pool::within`]). The
//! thread count is part of the hardware fingerprint, so it also picks the records served.

use std::sync::Arc;

use kernels::cpu::pool::{self, OwnPool, Workers};
use kernels::HardwareFingerprint;

/// The threads of one runtime. Made by [`Threads::new`]; calls go through [`Threads::run`].
///
/// ```
/// // Records tuned at one thread, each call on its caller's thread.
/// let (threads, hw) = runtime::Threads::new(Some(1))?;
/// let rt = runtime::Runtime::defaults_only_for(hw); // or Runtime::open_for("tuning.db", hw)?
/// let (a, b, mut c) = (vec![1.0; 6], vec![1.0; 6], vec![0.0; 4]);
/// threads.run(|| rt.gemm(2, 2, 3, &a, &b, &mut c))?;
/// assert_eq!(c, [3.0; 4]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Threads {
    pool: Pool,
    count: usize,
}

#[derive(Debug)]
enum Pool {
    /// Rayon's process-wide pool (all CPUs this process may use).
    Global,
    /// One thread (the caller's: no hand-over) or a pool of its own.
    Own(Workers),
}

/// A thread count that cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ThreadsError {
    /// 0, or more than the CPUs this process may use (rayon's process-wide pool:
    /// `RAYON_NUM_THREADS` where set).
    #[error("threads = {asked}: this process may use {cpus} CPU(s)")]
    OutOfRange {
        /// The threads asked for.
        asked: usize,
        /// The CPUs this process may use.
        cpus: usize,
    },
    /// The OS refused the pool's threads.
    #[error("starting {threads} threads: {why}")]
    Spawn {
        /// The threads the pool was to start.
        threads: usize,
        /// The OS's error.
        why: String,
    },
    /// A child forked after the library's worker threads started.
    #[error(transparent)]
    Forked(#[from] kernels::cpu::pool::ForkedChild),
}

impl Threads {
    /// The threads for `threads` (`None`, or this machine's count: the process-wide pool)
    /// and the fingerprint they serve (its thread count is part of it). Call it outside any
    /// rayon pool: the process-wide pool's size is the machine's count.
    pub fn new(threads: Option<usize>) -> Result<(Threads, HardwareFingerprint), ThreadsError> {
        kernels::cpu::pool::enter()?;
        let here = HardwareFingerprint::current();
        let Some(t) = threads.filter(|&t| t != here.cores) else {
            let count = here.cores;
            let all = Threads {
                pool: Pool::Global,
                count,
            };
            return Ok((all, here.clone()));
        };
        // The process-wide pool's size: the CPUs this process may use (what kernels check
        // configs against), `RAYON_NUM_THREADS` where set.
        let cpus = here.cores;
        if t == 0 || t > cpus {
            return Err(ThreadsError::OutOfRange { asked: t, cpus });
        }
        let workers = if t == 1 {
            Workers::Caller
        } else {
            let own = OwnPool::new(t).map_err(|e| ThreadsError::Spawn {
                threads: t,
                why: e.to_string(),
            })?;
            Workers::Pool(Arc::new(own))
        };
        let pool = Pool::Own(workers);
        Ok((Threads { pool, count: t }, here.with_cores(t)))
    }

    /// Threads the kernels use.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Runs `f` as a call on these threads, from this thread: the kernels and the runtime's
    /// steps that fork enter the process-wide pool or the runtime's own (once per call, at
    /// the first step that forks); serial ones run here. Concurrent callers of a one-thread
    /// runtime each compute on their own thread.
    pub fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Pool::Global => f(),
            Pool::Own(workers) => pool::within(workers, f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_thread_runs_here_serially_and_a_count_of_its_own_in_its_pool() {
        let here = HardwareFingerprint::current();
        let (one, hw) = Threads::new(Some(1)).unwrap();
        assert_eq!((one.count(), hw.cores), (1, 1));
        let caller = std::thread::current().id();
        one.run(|| {
            assert_eq!(std::thread::current().id(), caller, "no hand-over");
            assert_eq!(pool::threads(), 1);
        });
        let (all, hw) = Threads::new(None).unwrap();
        assert_eq!((all.count(), hw.id.clone()), (here.cores, here.id.clone()));
        all.run(|| assert_eq!(std::thread::current().id(), caller));
        // A count of its own: 2, where the machine has more CPUs.
        let own = 2;
        if own < here.cores {
            let (threads, _) = Threads::new(Some(own)).unwrap();
            threads.run(|| {
                assert_eq!(std::thread::current().id(), caller, "a call starts here");
                assert_eq!(pool::threads(), own);
                let forked = pool::on_workers(own, rayon::current_num_threads);
                assert_eq!(forked, own, "and forks on the runtime's pool");
            });
        } else {
            eprintln!("note: 2 CPUs or fewer: a pool of its own is not tested here");
        }
    }

    #[test]
    fn refuses_zero_and_more_than_the_cpus() {
        let cpus = HardwareFingerprint::current().cores;
        for asked in [0, cpus + 1] {
            let err = Threads::new(Some(asked)).unwrap_err();
            assert!(
                matches!(err, ThreadsError::OutOfRange { asked: a, cpus: c } if a == asked && c == cpus),
                "{err}"
            );
        }
    }
}
