//! Entering rayon's thread pool once per call.
//!
//! A parallel region started on a thread outside the pool (a user's thread, the CLI's main
//! thread, Python's) hands its work to the pool and puts the caller to sleep until it is
//! done; a call whose work forks several times pays that hand-over and wake-up for every
//! region. Entered once, every region inside starts from a worker, which takes part in it.
//! Measured on a 2-vCPU Zen 3 VM (`gemm_speed … --vs`, par over 2 threads against the serial
//! config, the calls made from outside the pool vs from inside it): `gemm:64x64x64` 0.11×
//! vs 0.93× the serial speed, `gemm:128x768x768` 0.92× vs 1.62×; BERT-base int8 batch 1×128
//! forward from inside the pool 4–11% faster (3 of 3 interleaved pairs). The one hand-over
//! left per call is [`handoff`](super::handoff)'s, whose caller waits awake for a moment
//! instead of going to sleep at once (1.08–1.19× on calls of 40–300 µs on the 2-vCPU Zen 4
//! VM).
//!
//! A runtime with a thread count of its own ([`Workers`]) enters its pool the same way, and
//! only then: [`within`] marks its calls on the caller's thread, a call that forks hops into
//! its pool once, and a serial one (a small GEMM) runs where it was made. One thread needs no
//! pool at all. (Entering the pool on every call cost a small GEMM from Python 30 µs on that
//! VM, against 3 µs here.) The runtime's own parallel steps ask [`threads`], not rayon.
//!
//! Worker threads do not survive `fork()`: in a child forked after they started, the first
//! parallel step would wait for them forever. The C and Python entry points call [`enter`]
//! first, which refuses such a child with [`ForkedChild`] (a child of a process that only
//! loaded the library is fine: the workers start in it).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once};

use super::handoff::hand_off;

/// Whether a call has entered the library in this process (so worker threads may exist).
static ENTERED: AtomicBool = AtomicBool::new(false);
/// Whether this process was forked from one where [`ENTERED`] was set.
static FORKED: AtomicBool = AtomicBool::new(false);
static WATCH_FORKS: Once = Once::new();

/// Runs in the child of a `fork()` (registered with `pthread_atfork`).
extern "C" fn after_fork_in_child() {
    if ENTERED.load(Ordering::Relaxed) {
        FORKED.store(true, Ordering::Relaxed);
    }
}

/// This process is a child forked after the library's worker threads may have started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "this process was forked after autokernel started its worker threads, which do not \
     survive fork(): use the library before forking only in the processes that go on using \
     it, or start the children fresh (exec; Python multiprocessing's 'spawn' or 'forkserver')"
)]
pub struct ForkedChild;

/// Called by an entry point before its work: [`ForkedChild`] in a child forked after a call
/// had entered the library, else notes that one has (its workers may start now).
pub fn enter() -> Result<(), ForkedChild> {
    WATCH_FORKS.call_once(|| {
        // SAFETY: registers a handler that only touches two atomics (async-signal-safe, as
        // a child-side fork handler must be); it stays valid for the process's life.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    });
    if FORKED.load(Ordering::Relaxed) {
        return Err(ForkedChild);
    }
    ENTERED.store(true, Ordering::Relaxed);
    Ok(())
}

/// Where the calls of a runtime with its own thread count fork.
#[derive(Debug, Clone)]
pub enum Workers {
    /// Nowhere: every step runs on the calling thread (a one-thread runtime).
    Caller,
    /// The runtime's own pool, entered by the calls that fork.
    Pool(Arc<rayon::ThreadPool>),
}

thread_local! {
    /// The workers of the runtime call this thread is in ([`within`]).
    static WORKERS: RefCell<Option<Workers>> = const { RefCell::new(None) };
}

/// Runs `f` here as a call of a runtime whose threads are `workers`: inside it, [`threads`]
/// counts them and [`on_workers`] forks there. Nests; restored on unwinding.
pub fn within<R>(workers: &Workers, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Workers>);
    impl Drop for Restore {
        fn drop(&mut self) {
            WORKERS.with(|w| *w.borrow_mut() = self.0.take());
        }
    }
    let _restore = Restore(WORKERS.with(|w| w.borrow_mut().replace(workers.clone())));
    f()
}

/// Threads a parallel step started on this thread may use: the runtime's ([`within`]), else
/// the size of rayon's current pool.
pub fn threads() -> usize {
    WORKERS.with(|w| match &*w.borrow() {
        Some(Workers::Caller) => 1,
        Some(Workers::Pool(pool)) => pool.current_num_threads(),
        None => rayon::current_num_threads(),
    })
}

/// Runs `f` on a worker when it may fork (`threads > 1`) and this thread is not one of the
/// pool's already: the runtime's pool inside [`within`], else rayon's current one (handed
/// over by [`hand_off`] from a thread outside every pool). Otherwise here, directly (a serial
/// call never hops). A panic in `f` propagates to the caller.
pub fn on_workers<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    if threads <= 1 {
        return f();
    }
    // A worker of any pool (the runtime's called from another pool's job) must not park:
    // its own pool may need it, so it hops with rayon's install, which keeps it working.
    let outside = rayon::current_thread_index().is_none();
    match WORKERS.with(|w| w.borrow().clone()) {
        Some(Workers::Caller) => f(),
        Some(Workers::Pool(pool)) if pool.current_thread_index().is_none() => match outside {
            true => hand_off(|job| pool.spawn(job), f),
            false => pool.install(f),
        },
        None if outside => hand_off(rayon::spawn, f),
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtimes_calling_each_other_from_their_workers_do_not_deadlock() {
        // Both workers of pool B call a runtime on pool C, whose job calls one on B: a B
        // worker waiting for C must go on running B's jobs (had it parked, nobody would run
        // the job sent back to B).
        use rayon::prelude::*;
        let pool = || {
            Arc::new(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(2)
                    .build()
                    .unwrap(),
            )
        };
        let (b, c) = (pool(), pool());
        let (wb, wc) = (Workers::Pool(b.clone()), Workers::Pool(c.clone()));
        let calls: usize = b.install(|| {
            (0..2)
                .into_par_iter()
                .map(|_| {
                    within(&wc, || {
                        on_workers(2, || within(&wb, || on_workers(2, || 1)))
                    })
                })
                .sum()
        });
        assert_eq!(calls, 2);
    }

    #[test]
    fn a_parallel_call_runs_on_a_worker_and_a_serial_one_here() {
        let outside = rayon::current_thread_index();
        assert!(outside.is_none(), "tests run outside the pool");
        assert!(on_workers(2, rayon::current_thread_index).is_some());
        assert!(on_workers(1, rayon::current_thread_index).is_none());
        // Already on a worker: no second hop.
        let nested = on_workers(2, || {
            let here = std::thread::current().id();
            on_workers(2, move || std::thread::current().id() == here)
        });
        assert!(nested);
        let caught = std::panic::catch_unwind(|| on_workers(2, || panic!("inside")));
        assert!(caught.is_err());
    }

    #[test]
    fn within_a_runtime_calls_fork_on_its_workers_or_stay_here() {
        assert!(threads() >= 1);
        within(&Workers::Caller, || {
            assert_eq!(threads(), 1);
            assert!(on_workers(2, rayon::current_thread_index).is_none());
        });
        let own = Arc::new(
            rayon::ThreadPoolBuilder::new()
                .num_threads(3)
                .build()
                .unwrap(),
        );
        within(&Workers::Pool(own.clone()), || {
            assert_eq!(threads(), 3);
            // A serial call stays here; one that forks runs on the runtime's pool, and
            // inside it on_workers does not hop again.
            assert!(on_workers(1, || own.current_thread_index()).is_none());
            let inside = on_workers(3, || {
                (
                    own.current_thread_index(),
                    rayon::current_num_threads(),
                    on_workers(3, threads),
                )
            });
            assert!(inside.0.is_some());
            assert_eq!((inside.1, inside.2), (3, 3));
            within(&Workers::Caller, || assert_eq!(threads(), 1));
            assert_eq!(
                threads(),
                3,
                "an inner call restores the outer one's workers"
            );
        });
        assert_eq!(threads(), rayon::current_num_threads());
        let caught = std::panic::catch_unwind(|| within(&Workers::Caller, || panic!("inside")));
        assert!(caught.is_err());
        assert_eq!(
            threads(),
            rayon::current_num_threads(),
            "restored after a panic"
        );
    }

    /// A child forked after a call entered the library is refused; the parent goes on.
    #[test]
    fn a_child_forked_after_entering_is_refused() {
        assert_eq!(enter(), Ok(()));
        // SAFETY: the child only reads atomics and leaves with _exit (no allocation, no
        // locks: what a child of a multithreaded process may do).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = if enter() == Err(ForkedChild) { 0 } else { 1 };
            // SAFETY: leaves the child at once, running nothing of the parent's.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked; `status` is a valid out-pointer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "child status {status}");
        assert_eq!(libc::WEXITSTATUS(status), 0, "the child was not refused");
        assert_eq!(enter(), Ok(()), "the parent goes on");
    }
}
