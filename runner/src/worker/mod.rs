//! Crash isolation: candidates run in a separate worker process, watched by the tuner.
//!
//! ```text
//!  tuner process                                   worker process (`autokernel worker`)
//!  ─────────────                                   ─────────────────────────────────────
//!  Isolated::setup ── {"op":"setup",...} ────────▶ Problem::random + f64 reference (cached)
//!  Isolated::evaluate ── {"op":"evaluate",...} ──▶ build → verify → time  (the in-process
//!                                                  evaluator's code, run by `serve`)
//!           ◀── "@autokernel-worker {"reply":"evaluated",...}" ──
//!  watchdog: no reply before the deadline → SIGKILL → `timeout`
//!            the pipe closes → wait(): killed by SIGSEGV/SIGBUS/SIGILL/SIGFPE/SIGABRT → `crashed`,
//!            "memory allocation of N bytes failed" on its stderr → `oom`
//!  then the worker is restarted (and set up again) before the next candidate.
//! ```
//!
//! **Protocol** (`wire`). One JSON [`Request`] per line on the worker's stdin; one JSON
//! [`Reply`] per line on its stdout, after [`REPLY_PREFIX`] (text without it is ignored, so
//! nothing a kernel or a test harness prints can be mistaken for a reply; [`serve_stdio`]
//! also points the worker's fd 1 at stderr so stray prints do not even reach the pipe). The
//! worker greets with [`Reply::Ready`] (its pid and hardware fingerprint id, checked against
//! the tuner's: a worker with another thread count would store timings under the wrong
//! fingerprint). [`Request::Setup`] carries the typed workload, once per set-up.
//!
//! **Serving** (`serve`). The worker answers with the same build → verify → time sequence
//! the in-process evaluator ([`InProcess`](crate::InProcess)) runs: one copy of that code.
//!
//! **Limits** (`process`), applied in the child between `fork` and `exec` ([`WorkerSpec`]):
//! `RLIMIT_DATA` (the memory limit: private writable memory — heap, anonymous mappings,
//! thread stacks — but not reserved address space, so glibc's per-thread arenas do not
//! count against it the way they would against `RLIMIT_AS`); an optional CPU affinity
//! (`--pin`, see [`crate::pin`]); and `PR_SET_PDEATHSIG = SIGKILL`, so a hanging worker never
//! outlives a tuner that was interrupted. The death signal fires when the *thread* that
//! spawned the worker ends, so spawn it from a thread that lives as long as the tuning job.
//!
//! **Evaluating** (`isolated`). [`Isolated`] is the [`Evaluator`](crate::Evaluator) over a
//! [`Worker`]: a candidate that kills the worker is an outcome, and the worker is restarted.
//!
//! Unix only (Linux for affinity and the death signal).

mod isolated;
mod process;
mod serve;
mod wire;

pub use isolated::Isolated;
pub use process::{
    Worker, WorkerError, WorkerSpec, DEFAULT_MEM_LIMIT_MB, SETUP_TIMEOUT, STARTUP_TIMEOUT,
};
pub use serve::{serve, serve_stdio, take_stdout_for_replies, Resolver};
pub use wire::{Reply, Request, WireCandidate, WireProtocol, REPLY_PREFIX};

#[cfg(target_os = "linux")]
pub use crate::pin::{allowed_cpus, pin_current_thread, pin_set};
