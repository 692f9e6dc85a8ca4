//! Where a call's parallel work runs: its loops ([`for_each`]), or a whole multi-step op
//! ([`on_workers`]).
//!
//! A kernel's parallel step is one loop over independent items (column panels, row blocks,
//! heads). Started on a thread outside the pool (a user's thread, the CLI's main thread,
//! Python's), [`for_each`] lets the caller claim items itself while helpers from the pool
//! join as they wake and linger a moment after ([`fanout`](super::fanout)), so a call never
//! waits for a sleeping worker. Handing the call over instead cost two wake-ups whenever the
//! workers had gone to sleep, i.e. whenever the caller did a little work between calls:
//! measured on the 2-vCPU Zen 4 VM, 2 threads, `runtime/examples/call_gaps.rs`, an f32
//! 1×768×3072 GEMV took 249 µs after 160 µs of the caller's work (96 µs back to back); with
//! [`for_each`] 100 µs after any gap.
//!
//! An op of several steps (an encoder layer) enters the pool once with [`on_workers`]: its
//! steps then start on a worker, and their loops are rayon tasks of that pool (BERT-base
//! int8 batch 1×128 forward from inside the pool 4–11% faster, measured on a 2-vCPU Zen 3
//! VM). That one hand-over is [`handoff`](super::handoff)'s, whose caller waits awake for a
//! moment before it sleeps.
//!
//! A runtime with a thread count of its own ([`Workers`]) uses its own pool the same way:
//! [`within`] marks its calls on the caller's thread, and a serial call (a small GEMM) runs
//! where it was made. One thread needs no pool at all. The runtime's own parallel steps ask
//! [`threads`], not rayon.
//!
//! Worker threads do not survive `fork()`: in a child forked after they started, the first
//! parallel step would wait for them forever. The C and Python entry points call [`enter`]
//! first, which refuses such a child with [`ForkedChild`] (a child of a process that only
//! loaded the library is fine: the workers start in it).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Once, PoisonError};

use super::fanout::Crew;
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
    Pool(Arc<OwnPool>),
}

/// A runtime's own pool of worker threads, and the helpers its [`for_each`] loops take from it.
#[derive(Debug)]
pub struct OwnPool {
    pool: rayon::ThreadPool,
    crew: Arc<Crew>,
}

impl OwnPool {
    /// Starts `threads` worker threads, named `autokernel-<i>`.
    pub fn new(threads: usize) -> Result<OwnPool, rayon::ThreadPoolBuildError> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("autokernel-{i}"))
            .build()?;
        Ok(OwnPool {
            pool,
            crew: Arc::default(),
        })
    }

    /// Its worker threads.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// The index of the current thread among this pool's workers, if it is one.
    pub fn current_thread_index(&self) -> Option<usize> {
        self.pool.current_thread_index()
    }
}

/// The helpers [`for_each`] takes from rayon's process-wide pool.
static GLOBAL_CREW: LazyLock<Arc<Crew>> = LazyLock::new(Arc::default);

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
        Some(Workers::Pool(own)) => own.threads(),
        None => rayon::current_num_threads(),
    })
}

/// Where a parallel step started on this thread runs, decided the same way for
/// [`on_workers`] and [`for_each`].
enum Place {
    /// Here, serially: one thread, or a runtime of one ([`Workers::Caller`]).
    Here,
    /// On this thread, a worker of the pool the step runs on: its tasks fork there.
    Worker,
    /// A worker of another pool (a runtime called from another pool's job): it enters the
    /// runtime's pool with rayon's `install`, which keeps it working while it waits (parked,
    /// its own pool might wait on it).
    Install(Arc<OwnPool>),
    /// A thread outside every pool, sending work to the runtime's pool or, outside any
    /// runtime (`None`), to rayon's process-wide one.
    Outside(Option<Arc<OwnPool>>),
}

fn place(threads: usize) -> Place {
    if threads <= 1 {
        return Place::Here;
    }
    let outside = rayon::current_thread_index().is_none();
    match WORKERS.with(|w| w.borrow().clone()) {
        Some(Workers::Caller) => Place::Here,
        Some(Workers::Pool(own)) if own.current_thread_index().is_none() => match outside {
            true => Place::Outside(Some(own)),
            false => Place::Install(own),
        },
        None if outside => Place::Outside(None),
        _ => Place::Worker,
    }
}

/// Runs `f` on a worker when it may fork (`threads > 1`) and this thread is not one of the
/// pool's already: the runtime's pool inside [`within`], else rayon's current one (handed
/// over by [`hand_off`] from a thread outside every pool). Otherwise here, directly (a serial
/// call never hops). A panic in `f` propagates to the caller.
pub fn on_workers<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    match place(threads) {
        Place::Here | Place::Worker => f(),
        Place::Install(own) => own.pool.install(f),
        Place::Outside(Some(own)) => hand_off(|job| own.pool.spawn(job), f),
        Place::Outside(None) => hand_off(rayon::spawn, f),
    }
}

/// Runs `f` on every item, each once, on up to `threads` threads that take the next item
/// whenever they are free (so a core slowed down by a neighbour does fewer). On a thread
/// outside every pool the caller is one of them, and helpers from the pool (the runtime's
/// inside [`within`], else rayon's process-wide one) join as they wake
/// ([`fanout`](super::fanout)): a call never waits for a sleeping worker. On a worker, rayon
/// tasks of its pool. Serial where `threads` is 1 or there is one item. A panic in `f`
/// propagates to the caller once no item is running.
pub fn for_each<T: Send>(threads: usize, items: Vec<T>, f: impl Fn(T) + Sync + Send) {
    if items.len() <= 1 {
        return items.into_iter().for_each(f);
    }
    match place(threads) {
        Place::Here => items.into_iter().for_each(f),
        Place::Worker => self_scheduled(threads, items, f),
        Place::Install(own) => own.pool.install(|| self_scheduled(threads, items, f)),
        Place::Outside(Some(own)) => {
            own.crew
                .for_each(|job| own.pool.spawn(job), threads - 1, items, f)
        }
        Place::Outside(None) => GLOBAL_CREW.for_each(rayon::spawn, threads - 1, items, f),
    }
}

/// Values a task of [`each_chunk`] takes at least: enough work (≈ 21 rows at H = 768) to
/// outweigh a task's cost.
pub(crate) const TASK_VALUES: usize = 1 << 14;

/// Calls `f(i, chunk)` on each `len`-long piece `i` of `data` (the last may be shorter), in
/// tasks of at least [`TASK_VALUES`] values over the threads this call may use
/// ([`for_each`], [`threads`]): all on this thread when that is one task's work.
pub fn each_chunk(data: &mut [f32], len: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if len == 0 {
        return;
    }
    let per = TASK_VALUES.div_ceil(len);
    let tasks: Vec<_> = data.chunks_mut(per * len).enumerate().collect();
    for_each(threads(), tasks, |(t, part)| {
        for (i, piece) in part.chunks_mut(len).enumerate() {
            f(t * per + i, piece);
        }
    });
}

/// [`for_each`] on a worker: this thread and up to `threads - 1` rayon tasks of its pool,
/// each taking the next item from a shared queue when it is done with the previous one.
fn self_scheduled<T: Send>(threads: usize, items: Vec<T>, f: impl Fn(T) + Sync) {
    let tasks = threads.min(items.len());
    let queue = Mutex::new(items.into_iter());
    let work = || loop {
        let item = queue.lock().unwrap_or_else(PoisonError::into_inner).next();
        match item {
            Some(item) => f(item),
            None => break,
        }
    };
    rayon::scope(|s| {
        for _ in 1..tasks {
            s.spawn(|_| work());
        }
        work();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtimes_calling_each_other_from_their_workers_do_not_deadlock() {
        use rayon::prelude::*;
        // Both workers of pool B call a runtime on pool C, whose job calls one on B: a B
        // worker waiting for C must go on running B's jobs (had it parked, nobody would run
        // the job sent back to B).
        let pool = || Arc::new(OwnPool::new(2).unwrap());
        let (b, c) = (pool(), pool());
        let (wb, wc) = (Workers::Pool(b.clone()), Workers::Pool(c.clone()));
        let calls: usize = b.pool.install(|| {
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
        let own = Arc::new(OwnPool::new(3).unwrap());
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

    #[test]
    fn for_each_runs_every_item_once_borrowing_from_the_caller() {
        let own = Arc::new(OwnPool::new(3).unwrap());
        for threads in [1, 2, 3] {
            for len in [0, 1, 2, 7, 1000] {
                let data: Vec<u64> = (0..len).collect();
                let mut out = vec![0u64; len as usize];
                let items = out.iter_mut().zip(&data).collect();
                for_each(threads, items, |(o, d)| *o += d * 2);
                assert!(
                    out.iter().zip(&data).all(|(o, d)| *o == d * 2),
                    "{threads} {len}"
                );
                // The same from a runtime's own pool, and from one of its workers.
                within(&Workers::Pool(own.clone()), || {
                    for_each(threads, out.iter_mut().collect(), |o| *o += 1);
                    own.pool
                        .install(|| for_each(threads, out.iter_mut().collect(), |o| *o += 1));
                });
                assert!(
                    out.iter().zip(&data).all(|(o, d)| *o == d * 2 + 2),
                    "{threads} {len}"
                );
            }
        }
    }

    #[test]
    fn for_each_takes_no_more_threads_than_asked() {
        use std::collections::HashSet;
        let own = Arc::new(OwnPool::new(4).unwrap());
        let seen = Mutex::new(HashSet::new());
        let item = |_: usize| {
            seen.lock().unwrap().insert(std::thread::current().id());
            std::thread::sleep(std::time::Duration::from_micros(200));
        };
        within(&Workers::Pool(own.clone()), || {
            // Four threads' helpers are awake for the next loop, which asks for two.
            for_each(4, (0..64).collect(), item);
            seen.lock().unwrap().clear();
            for_each(2, (0..64).collect(), item);
            assert!(seen.lock().unwrap().len() <= 2, "outside the pool");
            seen.lock().unwrap().clear();
            own.pool.install(|| for_each(2, (0..64).collect(), item));
            assert!(seen.lock().unwrap().len() <= 2, "on a worker");
        });
    }

    #[test]
    fn a_panic_in_for_each_comes_back_to_its_caller_and_the_pool_goes_on() {
        for _ in 0..20 {
            let caught = std::panic::catch_unwind(|| {
                for_each(2, (0..50).collect(), |i: usize| {
                    if i == 5 {
                        panic!("item five");
                    }
                })
            });
            let payload = caught.unwrap_err();
            assert_eq!(payload.downcast_ref::<&str>(), Some(&"item five"));
        }
        let sum = std::sync::atomic::AtomicUsize::new(0);
        for_each(2, (0..100).collect(), |i: usize| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.into_inner(), 4950);
    }

    #[test]
    fn concurrent_and_nested_for_each_loops_each_see_all_their_items() {
        use std::sync::atomic::AtomicUsize;
        std::thread::scope(|s| {
            for t in 0..8 {
                s.spawn(move || {
                    for round in 0..100 {
                        let sum = AtomicUsize::new(0);
                        for_each(2, (0..16).collect(), |i: usize| {
                            // Some items start loops of their own (from the caller's thread,
                            // or from a worker).
                            let inner = AtomicUsize::new(0);
                            if (i + round + t).is_multiple_of(5) {
                                for_each(2, (0..4).collect(), |j: usize| {
                                    inner.fetch_add(j, Ordering::Relaxed);
                                });
                            } else {
                                inner.store(6, Ordering::Relaxed);
                            }
                            sum.fetch_add(i + inner.into_inner(), Ordering::Relaxed);
                        });
                        assert_eq!(sum.into_inner(), 120 + 16 * 6, "thread {t} round {round}");
                    }
                });
            }
        });
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
