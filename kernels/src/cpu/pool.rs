//! Entering rayon's thread pool once per call.
//!
//! A parallel region started on a thread outside the pool (a user's thread, the CLI's main
//! thread, Python's) hands its work to the pool and puts the caller to sleep until it is
//! done; a call whose work forks several times pays that hand-over and wake-up for every
//! region. Entered once, every region inside starts from a worker, which takes part in it.
//! Measured on a 2-vCPU Zen 3 VM (`gemm_speed … --vs`, par over 2 threads against the serial
//! config, the calls made from outside the pool vs from inside it): `gemm:64x64x64` 0.11×
//! vs 0.93× the serial speed, `gemm:128x768x768` 0.92× vs 1.62×; BERT-base int8 batch 1×128
//! forward from inside the pool 4–11% faster (3 of 3 interleaved pairs).
//!
//! A runtime that may use one thread needs no pool at all: [`serial`] runs its calls on the
//! caller's thread, and the parallel helpers above the kernels ask [`threads`] instead of
//! rayon (a one-thread pool of its own would cost every call that hand-over: 25–40 µs for a
//! small GEMM from Python on that VM, against 3 µs here).

use std::cell::Cell;

thread_local! {
    /// Whether this thread is inside [`serial`].
    static SERIAL: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` on this thread as a one-thread runtime's call: inside it [`threads`] is 1, so
/// the runtime's own parallel steps run here, and [`on_workers`] never hops. (The kernels
/// fork by their configs' thread counts, which for such a runtime are 1.) Nests; restored
/// on unwinding.
pub fn serial<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SERIAL.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SERIAL.with(|s| s.replace(true)));
    f()
}

/// Threads a parallel step started on this thread may use: 1 inside [`serial`], else the
/// size of rayon's current pool.
pub fn threads() -> usize {
    if SERIAL.with(Cell::get) {
        1
    } else {
        rayon::current_num_threads()
    }
}

/// Runs `f` on a worker of rayon's current pool when it may fork (`threads > 1`) and this
/// thread is not a worker already (nor inside [`serial`]); otherwise here, directly (a
/// serial call never hops). A panic in `f` propagates to the caller.
pub fn on_workers<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    if threads > 1 && rayon::current_thread_index().is_none() && !SERIAL.with(Cell::get) {
        rayon::scope(|_| f())
    } else {
        f()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn serial_keeps_calls_here_and_restores_on_unwinding() {
        assert!(threads() >= 1);
        serial(|| {
            assert_eq!(threads(), 1);
            assert!(on_workers(2, rayon::current_thread_index).is_none());
            serial(|| assert_eq!(threads(), 1));
            assert_eq!(threads(), 1, "an inner serial leaves the outer one on");
        });
        assert_eq!(threads(), rayon::current_num_threads());
        let caught = std::panic::catch_unwind(|| serial(|| panic!("inside")));
        assert!(caught.is_err());
        assert_eq!(
            threads(),
            rayon::current_num_threads(),
            "restored after a panic"
        );
    }
}
