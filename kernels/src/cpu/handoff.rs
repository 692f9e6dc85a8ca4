//! Handing one call from a thread outside a pool to the pool's workers, and waiting for it
//! awake for a moment before going to sleep.
//!
//! rayon's own hand-over (`install`, or `scope` from outside the pool) puts the caller to
//! sleep on a lock at once. The caller here yields its CPU in a loop (so a worker that needs
//! it gets it) for up to [`SPIN`], and only then parks until the job unparks it.
//!
//! Measured on the 2-vCPU Zen 4 VM, 2 threads, `scripts/ab-binaries.py` (the CLI's `run` of
//! the same records by both builds, alternating; `bench_results/8b4b41305960a7a6/`): 1.08–1.19×
//! rayon's hand-over on calls of 40–300 µs (GEMV f32, bf16 and an int8 `8x3072x768`,
//! `32x768x768`), the same on a 0.9 ms one. A longer spin is worse: at 250 µs a process would
//! now and then run every call at half speed for its whole life (3 of 7 runs), the caller
//! counted as a busy CPU and both workers left to share the other.

use std::cell::UnsafeCell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// How long the caller stays awake (yielding) before it parks: the start of the call, while
/// a worker picks the job up (see the module docs for why not longer).
const SPIN: Duration = Duration::from_micros(10);

/// The call, on the caller's stack while a worker runs it.
struct Call<F, R> {
    f: UnsafeCell<Option<F>>,
    out: UnsafeCell<Option<thread::Result<R>>>,
}

/// Runs the call at address `call` (a `Call<F, R>`) on the worker.
fn execute<F: FnOnce() -> R, R>(call: usize) {
    let call = call as *const Call<F, R>;
    // SAFETY: `call` is the caller's `Call`, which outlives this function: the caller does
    // not return or unwind past it ([`Wait`]) until the job's [`Done`] is dropped, after this
    // returns, and touches neither cell meanwhile, so these are the only accesses.
    unsafe {
        let f = (*(*call).f.get())
            .take()
            .expect("a handed-over call runs once");
        *(*call).out.get() = Some(panic::catch_unwind(AssertUnwindSafe(f)));
    }
}

/// Owned by the job: says it is done when dropped, whether the job ran or was dropped unrun
/// (a spawner that failed), so the caller never waits for nothing.
struct Done {
    flag: Arc<AtomicBool>,
    caller: Thread,
}

impl Drop for Done {
    fn drop(&mut self) {
        self.flag.store(true, Ordering::Release);
        self.caller.unpark();
    }
}

/// Held by the caller from before the job exists: waits for [`Done`] when dropped, so the
/// caller's frame outlives the job even if `spawn` unwinds after queueing it.
struct Wait<'a>(&'a AtomicBool);

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        let start = Instant::now();
        while !self.0.load(Ordering::Acquire) {
            if start.elapsed() < SPIN {
                thread::yield_now();
            } else {
                // Returns on the job's unpark, or spuriously (a token left by an earlier
                // call): the loop looks again.
                thread::park();
            }
        }
    }
}

/// Runs `f` through `spawn` (which runs the job it is given on another thread, or drops it)
/// and returns its result when done; a panic in `f` resumes on this thread, and a job dropped
/// unrun is a panic here.
pub(crate) fn hand_off<R: Send>(
    spawn: impl FnOnce(Box<dyn FnOnce() + Send + 'static>),
    f: impl FnOnce() -> R + Send,
) -> R {
    let call = Call {
        f: UnsafeCell::new(Some(f)),
        out: UnsafeCell::new(None),
    };
    let flag = Arc::new(AtomicBool::new(false));
    // Declared after `call`: dropped (waiting) before it, unwinding included.
    let wait = Wait(&flag);
    let job = {
        let run: fn(usize) = execute_of(&call);
        let addr = &call as *const _ as usize;
        let done = Done {
            flag: flag.clone(),
            caller: thread::current(),
        };
        move || {
            run(addr);
            drop(done);
        }
    };
    spawn(Box::new(job));
    drop(wait);
    match call.out.into_inner() {
        Some(Ok(r)) => r,
        Some(Err(payload)) => panic::resume_unwind(payload),
        None => panic!("the thread pool dropped a handed-over call without running it"),
    }
}

/// `execute` for this call's types, as a plain function pointer (which, unlike a closure
/// over `F`, is `'static`).
fn execute_of<F: FnOnce() -> R, R>(_: &Call<F, R>) -> fn(usize) {
    execute::<F, R>
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handed_off_call_borrows_from_the_caller_and_returns_its_result() {
        let data = [1u64, 2, 3];
        let sum = hand_off(rayon::spawn, || data.iter().sum::<u64>());
        assert_eq!(sum, 6);
        let on_worker = hand_off(rayon::spawn, rayon::current_thread_index);
        assert!(on_worker.is_some());
    }

    #[test]
    fn a_panic_resumes_on_the_caller() {
        let caught = panic::catch_unwind(|| hand_off(rayon::spawn, || -> u32 { panic!("inside") }));
        let payload = caught.unwrap_err();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"inside"));
    }

    #[test]
    fn a_long_call_is_waited_for_past_the_spin() {
        let slept = hand_off(rayon::spawn, || {
            thread::sleep(SPIN * 100);
            7
        });
        assert_eq!(slept, 7);
    }

    #[test]
    fn a_spawner_that_unwinds_after_queueing_is_waited_for() {
        let mut written = [0u8; 4];
        let caught = panic::catch_unwind(AssertUnwindSafe(|| {
            hand_off(
                |job| {
                    thread::spawn(move || {
                        thread::sleep(Duration::from_millis(50));
                        job()
                    });
                    panic!("the spawner failed after queueing");
                },
                || written[0] = 1,
            )
        }));
        assert!(caught.is_err());
        assert_eq!(
            written[0], 1,
            "the job ran before the caller's frame was left"
        );
    }

    #[test]
    fn a_job_dropped_unrun_is_a_panic_not_a_hang() {
        assert!(panic::catch_unwind(|| hand_off(drop, || 1)).is_err());
        let refused = |job: Box<dyn FnOnce() + Send>| {
            drop(job);
            panic!("no threads");
        };
        assert!(panic::catch_unwind(|| hand_off(refused, || 1)).is_err());
    }
}
