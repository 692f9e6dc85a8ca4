//! Parallel loops started on a thread outside the pool: the caller takes part, helpers join
//! when they can, and stay awake a moment after.
//!
//! Handing a whole call to the pool ([`hand_off`](super::handoff)) costs two wake-ups in
//! a row when the workers have gone to sleep — the worker's and, at the end, the caller's —
//! and on a VM waking an idle vCPU takes tens of µs. rayon's workers sleep ~20 µs after their
//! last job, so calls separated by a little work of the caller's (a LayerNorm between two
//! `Linear`s) paid both every time. Measured on the 2-vCPU Zen 4 VM, a 1×768×768 f32 GEMV on
//! 2 threads from Python: 40 µs back to back, 85 µs after 20 µs of the caller's work, 164 µs
//! after 160 µs (one thread: 57–63 µs), and GPT-2 decoding was slower on 2 threads than on 1.
//!
//! Here the caller claims items itself from the start, so a call never waits for a wake-up: a
//! helper that is late finds fewer items left, and at worst the caller does them all, at the
//! speed of one thread. A helper that runs out of items lingers ([`linger`], 300 µs unless
//! [`LINGER_ENV`] says otherwise), polling for the next loop (and running the pool's other
//! jobs), so calls close together find it awake. Lingering spends CPU time that another
//! process on the same cores could use: `AUTOKERNEL_LINGER_US=0` turns it off, as
//! `KMP_BLOCKTIME=0` does OpenMP's spin-waiting.

use std::any::Any;
use std::cell::UnsafeCell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// The environment variable that sets how long, in µs, a helper that ran out of items stays
/// awake for the next loop: `0` to `1000000`, 300 when unset or empty.
pub const LINGER_ENV: &str = "AUTOKERNEL_LINGER_US";

/// How long a helper lingers when [`LINGER_ENV`] does not say.
const DEFAULT_LINGER: Duration = Duration::from_micros(300);

/// How long a helper that ran out of items stays awake for the next loop: [`LINGER_ENV`],
/// read once per process; an error for a value that is not a whole number of µs up to a
/// second.
pub fn linger() -> Result<Duration, crate::Error> {
    static LINGER: OnceLock<Result<Duration, crate::Error>> = OnceLock::new();
    LINGER
        .get_or_init(|| parse_linger(&std::env::var(LINGER_ENV).unwrap_or_default()))
        .clone()
}

/// The linger `value` of [`LINGER_ENV`] asks for (`""`: the default).
fn parse_linger(value: &str) -> Result<Duration, crate::Error> {
    let text = value.trim();
    if text.is_empty() {
        return Ok(DEFAULT_LINGER);
    }
    match text.parse::<u64>() {
        Ok(us) if us <= 1_000_000 => Ok(Duration::from_micros(us)),
        _ => Err(crate::Error::Linger {
            value: value.to_string(),
            reason: "expected whole microseconds from 0 (no lingering) to 1000000".into(),
        }),
    }
}

/// [`linger`] as the helpers use it: an invalid value is ignored, with one warning on stderr
/// (the CLI and `Runtime::open` refuse it up front).
fn linger_or_default() -> Duration {
    static USED: OnceLock<Duration> = OnceLock::new();
    *USED.get_or_init(|| {
        linger().unwrap_or_else(|e| {
            eprintln!("warning: {e}; lingering {} µs", DEFAULT_LINGER.as_micros());
            DEFAULT_LINGER
        })
    })
}

/// How long the caller, its own items done, yields before it parks until the helpers finish
/// theirs.
const SPIN: Duration = Duration::from_micros(50);

thread_local! {
    /// Whether this thread is inside a loop's item or a lingering helper (further down its
    /// stack): a helper job it runs there does not linger.
    static BUSY: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The helpers of one pool: where loops are posted, and how many helpers wait for one.
#[derive(Default)]
pub(crate) struct Crew {
    /// The loop posted last (helpers take part in it while it has items).
    posted: Mutex<Option<Arc<Loop>>>,
    /// Counts the loops posted: a helper polls it.
    posts: AtomicU64,
    /// Helpers awake and waiting for a loop.
    lingering: AtomicUsize,
    /// Helper jobs queued and not started yet (not spawned again while they wait).
    pending: AtomicUsize,
}

/// Marks this thread [`BUSY`] while alive.
struct Busy;

impl Busy {
    fn enter() -> Busy {
        BUSY.set(BUSY.get() + 1);
        Busy
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        BUSY.set(BUSY.get() - 1);
    }
}

impl std::fmt::Debug for Crew {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Crew")
            .field("posts", &self.posts)
            .field("lingering", &self.lingering)
            .field("pending", &self.pending)
            .finish_non_exhaustive()
    }
}

/// One parallel loop: items `0..len`, claimed in order by the caller and its helpers.
struct Loop {
    next: AtomicUsize,
    finished: AtomicUsize,
    len: usize,
    /// Helpers that may still join (the loop's thread count, less the caller).
    seats: AtomicUsize,
    /// Runs item `i` of the loop at `body`.
    run: unsafe fn(*const (), usize),
    body: *const (),
    /// Set once an item panicked: the items after it are skipped.
    failed: AtomicBool,
    /// The first panic's payload, for the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    caller: Thread,
}

// SAFETY: `body` points to the caller's `Body`, whose items are `Send` and whose function is
// `Sync`; it is dereferenced only by whoever claimed an item below `len`, and the caller does
// not leave its frame before every claimed item finished (`Close`).
unsafe impl Send for Loop {}
// SAFETY: as for `Send`; the rest is atomics and a mutex.
unsafe impl Sync for Loop {}

/// The caller's side of a loop: the items, each taken once, and what to do with them.
struct Body<T, F> {
    items: Vec<UnsafeCell<Option<T>>>,
    f: F,
}

/// Runs item `i` of the `Body<T, F>` at `body`.
///
/// # Safety
/// `body` is a live `Body<T, F>` and `i` an index claimed once, by this caller.
unsafe fn run_item<T, F: Fn(T)>(body: *const (), i: usize) {
    // SAFETY: per this function's contract; the claim makes this the only access to slot i.
    let (item, f) = unsafe {
        let body = &*(body as *const Body<T, F>);
        ((*body.items[i].get()).take(), &body.f)
    };
    f(item.expect("a loop's item runs once"));
}

impl Loop {
    /// Claims and runs items until none are left. A panicking item is kept for the caller
    /// and the items after it are skipped.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.len {
                return;
            }
            if !self.failed.load(Ordering::Relaxed) {
                let _busy = Busy::enter();
                // SAFETY: `i` is claimed, so `body` is alive until it is finished below.
                let ran =
                    panic::catch_unwind(AssertUnwindSafe(|| unsafe { (self.run)(self.body, i) }));
                if let Err(payload) = ran {
                    let mut slot = self.panic.lock().unwrap_or_else(PoisonError::into_inner);
                    slot.get_or_insert(payload);
                    self.failed.store(true, Ordering::Relaxed);
                }
            }
            if self.finished.fetch_add(1, Ordering::AcqRel) + 1 == self.len {
                self.caller.unpark();
            }
        }
    }

    /// Whether a helper may join (taking a seat).
    fn take_seat(&self) -> bool {
        self.seats
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| s.checked_sub(1))
            .is_ok()
    }
}

/// Held by the caller while its loop is posted: when dropped (returning or unwinding), ends
/// the claims and waits for the items already claimed, so no helper touches the caller's
/// frame after it is left.
struct Close<'a>(&'a Loop);

impl Drop for Close<'_> {
    fn drop(&mut self) {
        let lp = self.0;
        let claimed = lp.next.swap(lp.len, Ordering::Relaxed).min(lp.len);
        let start = Instant::now();
        while lp.finished.load(Ordering::Acquire) < claimed {
            if start.elapsed() < SPIN {
                thread::yield_now();
            } else {
                // Unparked by the last item, or spuriously (an earlier loop's token).
                thread::park_timeout(Duration::from_millis(1));
            }
        }
    }
}

impl Crew {
    /// Runs `f` on every item of `items`, on this thread and up to `helpers` others from the
    /// pool that `spawn` queues jobs on. A panic in `f` resumes here once the loop is done.
    pub(crate) fn for_each<T: Send, F: Fn(T) + Sync>(
        self: &Arc<Self>,
        spawn: impl Fn(Box<dyn FnOnce() + Send + 'static>),
        helpers: usize,
        items: Vec<T>,
        f: F,
    ) {
        let body = Body {
            items: items
                .into_iter()
                .map(|t| UnsafeCell::new(Some(t)))
                .collect(),
            f,
        };
        let lp = Arc::new(Loop {
            next: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            len: body.items.len(),
            seats: AtomicUsize::new(helpers),
            run: run_item::<T, F>,
            body: &body as *const Body<T, F> as *const (),
            failed: AtomicBool::new(false),
            panic: Mutex::new(None),
            caller: thread::current(),
        });
        {
            // Declared after `body`: dropped (waiting) before it, unwinding included.
            let _close = Close(&lp);
            self.post(lp.clone());
            let awake = self.lingering.load(Ordering::SeqCst) + self.pending.load(Ordering::SeqCst);
            for _ in awake..helpers {
                self.pending.fetch_add(1, Ordering::SeqCst);
                let (crew, lp) = (self.clone(), lp.clone());
                spawn(Box::new(move || crew.help(lp)));
            }
            lp.work();
        }
        self.unpost(&lp);
        let payload = lp
            .panic
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(payload) = payload {
            panic::resume_unwind(payload);
        }
    }

    fn post(&self, lp: Arc<Loop>) {
        *self.posted.lock().unwrap_or_else(PoisonError::into_inner) = Some(lp);
        self.posts.fetch_add(1, Ordering::SeqCst);
    }

    /// Takes `lp` down if it is still the loop posted (it has no items left).
    fn unpost(&self, lp: &Arc<Loop>) {
        let mut posted = self.posted.lock().unwrap_or_else(PoisonError::into_inner);
        if posted.as_ref().is_some_and(|p| Arc::ptr_eq(p, lp)) {
            *posted = None;
        }
    }

    /// A helper's job: items of `first`, then of each loop posted while it lingers. A helper
    /// job run further up a worker's stack — by a lingering helper (through
    /// `rayon::yield_now`) or while the worker waits inside an item — does not linger itself:
    /// nested, each would run the next and the stack would grow without bound, and the item
    /// below would wait for it.
    fn help(&self, first: Arc<Loop>) {
        self.pending.fetch_sub(1, Ordering::SeqCst);
        let mut seen = self.posts.load(Ordering::Acquire);
        if first.take_seat() {
            first.work();
        }
        drop(first);
        let linger = linger_or_default();
        if BUSY.get() > 0 || linger.is_zero() {
            return;
        }
        let _busy = Busy::enter();
        self.lingering.fetch_add(1, Ordering::SeqCst);
        let mut until = Instant::now() + linger;
        loop {
            let posts = self.posts.load(Ordering::Acquire);
            if posts != seen {
                seen = posts;
                let lp = self
                    .posted
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                if let Some(lp) = lp.filter(|lp| lp.take_seat()) {
                    self.lingering.fetch_sub(1, Ordering::SeqCst);
                    lp.work();
                    self.lingering.fetch_add(1, Ordering::SeqCst);
                    // Only loops it took part in keep it awake, so a helper is never held
                    // past its linger by posts or jobs alone.
                    until = Instant::now() + linger;
                }
            } else if let Some(rayon::Yield::Executed) = rayon::yield_now() {
                continue;
            } else if Instant::now() >= until {
                // Leaves, unless a loop was posted as it left (its caller counted it).
                self.lingering.fetch_sub(1, Ordering::SeqCst);
                if self.posts.load(Ordering::SeqCst) == seen {
                    return;
                }
                self.lingering.fetch_add(1, Ordering::SeqCst);
            } else {
                // Yields rather than spins: a thread that shares this CPU (the caller's
                // work between its calls) comes first.
                thread::yield_now();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spawner_that_unwinds_after_queueing_is_waited_for() {
        // The helper is inside an item when the spawner unwinds: the caller must not leave
        // its frame (the items and `f` live there) before every item begun has finished.
        let crew = Arc::new(Crew::default());
        let begun: Vec<AtomicUsize> = (0..4).map(|_| AtomicUsize::new(0)).collect();
        let ended: Vec<AtomicUsize> = (0..4).map(|_| AtomicUsize::new(0)).collect();
        let caught = panic::catch_unwind(AssertUnwindSafe(|| {
            crew.for_each(
                |job| {
                    thread::spawn(job);
                    thread::sleep(Duration::from_millis(20));
                    panic!("the spawner failed after queueing");
                },
                1,
                (0..4).collect(),
                |i: usize| {
                    begun[i].store(1, Ordering::Relaxed);
                    thread::sleep(Duration::from_millis(50));
                    ended[i].store(1, Ordering::Relaxed);
                },
            )
        }));
        assert!(caught.is_err());
        let count = |v: &[AtomicUsize]| v.iter().map(|x| x.load(Ordering::Relaxed)).sum::<usize>();
        assert!(count(&begun) >= 1, "the helper took an item");
        assert_eq!(count(&begun), count(&ended), "an item was still running");
    }

    #[test]
    fn a_linger_is_whole_microseconds_up_to_a_second() {
        assert_eq!(parse_linger(""), Ok(DEFAULT_LINGER));
        assert_eq!(parse_linger(" 0 "), Ok(Duration::ZERO));
        assert_eq!(parse_linger("1000000"), Ok(Duration::from_secs(1)));
        for bad in ["-1", "1000001", "300us", "0.5", "lots"] {
            let e = parse_linger(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("{LINGER_ENV}={bad}:")), "{e}");
        }
    }

    #[test]
    fn helper_jobs_do_not_pile_up_behind_busy_helpers() {
        // Eight callers share one crew whose pool has one worker; each item is long enough
        // that the helper is inside one when the other callers post. Queued helper jobs
        // count as awake, so no more are queued than callers (each spawns at most one while
        // none is awake); before that was counted, thousands queued and nested on the
        // worker's stack until it overflowed.
        let pool = Arc::new(
            rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .unwrap(),
        );
        let crew = Arc::new(Crew::default());
        let most = AtomicUsize::new(0);
        thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..300 {
                        let spawn = |job: Box<dyn FnOnce() + Send>| {
                            most.fetch_max(crew.pending.load(Ordering::SeqCst), Ordering::SeqCst);
                            pool.spawn(job);
                        };
                        let sum = AtomicUsize::new(0);
                        crew.for_each(spawn, 1, (0..4).collect(), |i: usize| {
                            thread::sleep(Duration::from_micros(20));
                            sum.fetch_add(i, Ordering::Relaxed);
                        });
                        assert_eq!(sum.into_inner(), 6);
                    }
                });
            }
        });
        let most = most.into_inner();
        assert!(most <= 8, "{most} helper jobs queued at once for 8 callers");
    }

    #[test]
    fn a_loop_with_no_helper_is_the_callers() {
        let crew = Arc::new(Crew::default());
        let mut out = vec![0usize; 9];
        let here = thread::current().id();
        crew.for_each(drop, 0, out.iter_mut().enumerate().collect(), |(i, o)| {
            assert_eq!(thread::current().id(), here);
            *o = i * i;
        });
        assert_eq!(out, (0..9).map(|i| i * i).collect::<Vec<_>>());
    }
}
