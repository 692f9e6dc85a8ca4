//! Crash isolation: candidates run in a separate worker process, watched by the tuner.
//!
//! ```text
//!  tuner process                                   worker process (`autokernel worker`)
//!  ─────────────                                   ─────────────────────────────────────
//!  Isolated::setup ── {"op":"setup",...} ────────▶ Problem::random + f64 reference (cached)
//!  Isolated::evaluate ── {"op":"evaluate",...} ──▶ build → verify → time  (runner::evaluate)
//!           ◀── "@autokernel-worker {"reply":"evaluated",...}" ──
//!  watchdog: no reply before the deadline → SIGKILL → `timeout`
//!            the pipe closes → wait(): killed by SIGSEGV/SIGBUS/SIGILL/SIGFPE/SIGABRT → `crashed`,
//!            "memory allocation of N bytes failed" on its stderr → `oom`
//!  then the worker is restarted (and set up again) before the next candidate.
//! ```
//!
//! **Protocol.** One JSON [`Request`] per line on the worker's stdin; one JSON [`Reply`] per
//! line on its stdout, after [`REPLY_PREFIX`] (text without it is ignored, so nothing a
//! kernel or a test harness prints can be mistaken for a reply; [`serve_stdio`] also points
//! the worker's fd 1 at stderr so stray prints do not even reach the pipe). The worker greets
//! with [`Reply::Ready`] (its pid and hardware fingerprint id, checked against the tuner's:
//! a worker with another thread count would store timings under the wrong fingerprint).
//!
//! **Limits**, applied in the child between `fork` and `exec` ([`WorkerSpec`]):
//! `RLIMIT_DATA` (the memory limit: private writable memory — heap, anonymous mappings,
//! thread stacks — but not reserved address space, so glibc's per-thread arenas do not
//! count against it the way they would against `RLIMIT_AS`); an optional CPU affinity
//! (`--pin`); and `PR_SET_PDEATHSIG = SIGKILL`, so a hanging worker never outlives a tuner
//! that was interrupted. The death signal fires when the *thread* that spawned the worker
//! ends, so spawn it from a thread that lives as long as the tuning job.
//!
//! Unix only (Linux for affinity and the death signal).

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use kernels::{
    Config, Executable, HardwareFingerprint, Kernel, Measurement, Problem, Reference, Status,
    Workload,
};

use crate::evaluator::{EvalError, Evaluation, Evaluator};
use crate::interleaved::measure_interleaved;
use crate::protocol::Protocol;
use crate::{evaluate, verify, Outcome};

/// Every reply line of the worker starts with this.
pub const REPLY_PREFIX: &str = "@autokernel-worker ";

/// How long a (re)started worker may take to greet.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the worker may take to build a problem and its reference.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(600);

/// The most of a worker's stderr kept for failure messages.
const STDERR_TAIL: usize = 16 * 1024;

// ---- wire format ----------------------------------------------------------------------

/// [`Protocol`] on the wire (durations in seconds).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WireProtocol {
    pub warmup_s: f64,
    pub min_sample_s: f64,
    pub min_samples: usize,
    pub max_samples: usize,
    pub max_time_s: f64,
    pub target_ci: f64,
}

impl From<&Protocol> for WireProtocol {
    fn from(p: &Protocol) -> Self {
        WireProtocol {
            warmup_s: p.warmup.as_secs_f64(),
            min_sample_s: p.min_sample.as_secs_f64(),
            min_samples: p.min_samples,
            max_samples: p.max_samples,
            max_time_s: p.max_time.as_secs_f64(),
            target_ci: p.target_ci,
        }
    }
}

impl WireProtocol {
    /// The protocol, or why these numbers are not one.
    pub fn to_protocol(&self) -> Result<Protocol, String> {
        let secs = |name: &str, s: f64| {
            Duration::try_from_secs_f64(s).map_err(|e| format!("protocol {name} {s}: {e}"))
        };
        Ok(Protocol {
            warmup: secs("warmup_s", self.warmup_s)?,
            min_sample: secs("min_sample_s", self.min_sample_s)?,
            min_samples: self.min_samples,
            max_samples: self.max_samples,
            max_time: secs("max_time_s", self.max_time_s)?,
            target_ci: self.target_ci,
        })
    }
}

/// A kernel family and config, named as the worker's registry knows them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WireCandidate {
    pub kernel: String,
    pub version: u32,
    pub config: Config,
}

impl WireCandidate {
    pub fn new(kernel: &dyn Kernel, config: &Config) -> Self {
        WireCandidate {
            kernel: kernel.name().to_string(),
            version: kernel.version(),
            config: config.clone(),
        }
    }
}

/// What the tuner asks the worker, one JSON object per line.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Make the test problem (`Problem::random(workload, seed)`) and its reference.
    Setup { workload: String, seed: u64 },
    /// Build, verify and time one candidate on the current problem.
    Evaluate {
        candidate: WireCandidate,
        protocol: WireProtocol,
    },
    /// Re-verify, then time the candidates interleaved for `rounds` rounds.
    Interleave {
        candidates: Vec<WireCandidate>,
        protocol: WireProtocol,
        rounds: usize,
    },
}

/// What the worker answers, one JSON object per line after [`REPLY_PREFIX`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    /// Sent once, at start.
    Ready {
        pid: u32,
        fingerprint: String,
    },
    SetupDone {
        workload: String,
        elapsed_s: f64,
    },
    Evaluated {
        status: Status,
        message: Option<String>,
        measurement: Option<Measurement>,
        elapsed_s: f64,
    },
    Interleaved {
        measurements: Vec<Measurement>,
        elapsed_s: f64,
    },
    /// The request could not be served (malformed, no problem set up, a finalist failed).
    Failed {
        message: String,
    },
}

// ---- worker side ----------------------------------------------------------------------

/// Resolves a kernel family by name in the worker (normally [`kernels::kernel`]).
pub type Resolver<'a> = &'a dyn Fn(&str) -> Option<&'static dyn Kernel>;

/// The worker's loop: greets, then answers every request line of `input` on `output` until
/// `input` ends. Candidate failures that the process survives (wrong results, panics, build
/// errors) are answered as outcomes; the others end the process, which is the point.
pub fn serve(input: impl BufRead, mut output: impl Write, resolve: Resolver<'_>) -> io::Result<()> {
    send(
        &mut output,
        &Reply::Ready {
            pid: std::process::id(),
            fingerprint: HardwareFingerprint::current().id.clone(),
        },
    )?;
    let mut problem: Option<(Problem, Reference)> = None;
    for line in input.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<Request>(&line) {
            Err(e) => Reply::Failed {
                message: format!("malformed request: {e}"),
            },
            Ok(req) => answer(req, &mut problem, resolve),
        };
        send(&mut output, &reply)?;
    }
    Ok(())
}

fn send(output: &mut impl Write, reply: &Reply) -> io::Result<()> {
    let json = serde_json::to_string(reply).map_err(io::Error::other)?;
    writeln!(output, "{REPLY_PREFIX}{json}")?;
    output.flush()
}

fn answer(
    req: Request,
    problem: &mut Option<(Problem, Reference)>,
    resolve: Resolver<'_>,
) -> Reply {
    let start = Instant::now();
    let failed = |message: String| Reply::Failed { message };
    match req {
        Request::Setup { workload, seed } => {
            let w: Workload = match workload.parse() {
                Ok(w) => w,
                Err(e) => return failed(format!("bad workload {workload:?}: {e}")),
            };
            let p = Problem::random(&w, seed);
            let r = p.reference();
            *problem = Some((p, r));
            Reply::SetupDone {
                workload,
                elapsed_s: start.elapsed().as_secs_f64(),
            }
        }
        Request::Evaluate {
            candidate,
            protocol,
        } => {
            let Some((p, r)) = problem.as_ref() else {
                return failed("evaluate before setup".into());
            };
            let protocol = match protocol.to_protocol() {
                Ok(pr) => pr,
                Err(e) => return failed(e),
            };
            let outcome = match resolve_candidate(&candidate, resolve) {
                Ok(kernel) => evaluate(kernel, &p.workload, &candidate.config, p, r, &protocol),
                Err(message) => Outcome::failed(Status::BuildFailed, message),
            };
            Reply::Evaluated {
                status: outcome.status,
                message: outcome.message,
                measurement: outcome.measurement,
                elapsed_s: start.elapsed().as_secs_f64(),
            }
        }
        Request::Interleave {
            candidates,
            protocol,
            rounds,
        } => {
            let Some((p, r)) = problem.as_ref() else {
                return failed("interleave before setup".into());
            };
            let protocol = match protocol.to_protocol() {
                Ok(pr) => pr,
                Err(e) => return failed(e),
            };
            let mut exes: Vec<Box<dyn Executable>> = Vec::with_capacity(candidates.len());
            for c in &candidates {
                let what = format!("{} {}", c.kernel, c.config);
                let kernel = match resolve_candidate(c, resolve) {
                    Ok(k) => k,
                    Err(m) => return failed(format!("{what}: {m}")),
                };
                let exe = match kernel.prepare(&p.workload, &c.config) {
                    Ok(e) => e,
                    Err(e) => return failed(format!("{what}: build_failed: {e}")),
                };
                if let Err(o) = verify(exe.as_ref(), p, r) {
                    return failed(format!(
                        "{what}: {}: {}",
                        o.status,
                        o.message.unwrap_or_default()
                    ));
                }
                exes.push(exe);
            }
            let refs: Vec<&dyn Executable> = exes.iter().map(|e| e.as_ref()).collect();
            Reply::Interleaved {
                measurements: measure_interleaved(&refs, p, &protocol, rounds),
                elapsed_s: start.elapsed().as_secs_f64(),
            }
        }
    }
}

fn resolve_candidate(
    c: &WireCandidate,
    resolve: Resolver<'_>,
) -> Result<&'static dyn Kernel, String> {
    let kernel = resolve(&c.kernel)
        .ok_or_else(|| format!("the worker has no kernel family '{}'", c.kernel))?;
    if kernel.version() != c.version {
        return Err(format!(
            "the worker has {} version {}, the tuner asked for version {}",
            c.kernel,
            kernel.version(),
            c.version
        ));
    }
    Ok(kernel)
}

/// Moves the process's stdout out of the way: returns a file on a duplicate of fd 1 for the
/// replies, and points fd 1 at stderr, so whatever a kernel prints cannot reach the pipe.
pub fn take_stdout_for_replies() -> io::Result<std::fs::File> {
    io::stdout().flush()?;
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) on fd 1 only creates a new descriptor (≥ 3) for the
    // same open file; it touches no memory of ours.
    let fd = unsafe { libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 3) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created above, is open, and nothing else owns it: the File takes
    // sole ownership and closes it on drop.
    let file = unsafe { std::fs::File::from_raw_fd(fd) };
    // SAFETY: dup2(2, 1) atomically makes fd 1 another descriptor of stderr's open file; Rust's
    // `Stdout` only ever refers to fd 1 by number, so it keeps working (now onto stderr).
    if unsafe { libc::dup2(2, 1) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(file)
}

/// [`serve`] on this process's stdin and (moved, see [`take_stdout_for_replies`]) stdout.
pub fn serve_stdio(resolve: Resolver<'_>) -> io::Result<()> {
    let out = io::BufWriter::new(take_stdout_for_replies()?);
    serve(io::stdin().lock(), out, resolve)
}

// ---- CPU affinity ----------------------------------------------------------------------

/// The CPUs this thread may run on (Linux `sched_getaffinity`), ascending.
#[cfg(target_os = "linux")]
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is a plain bit array, for which all-zero bits are the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity writes at most `size_of::<cpu_set_t>()` bytes into `set`.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: every index is below CPU_SETSIZE, inside the set.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect())
}

/// The CPUs `--pin` uses for `threads` threads: the last `threads` CPUs this process may run
/// on (CPU 0 usually takes more interrupts), or all of them if there are not that many.
#[cfg(target_os = "linux")]
pub fn pin_set(threads: usize) -> io::Result<Vec<usize>> {
    let allowed = allowed_cpus()?;
    let keep = threads.clamp(1, allowed.len().max(1));
    Ok(allowed[allowed.len().saturating_sub(keep)..].to_vec())
}

/// Pins the calling thread (and the threads it starts afterwards) to `cpus`.
#[cfg(target_os = "linux")]
pub fn pin_current_thread(cpus: &[usize]) -> Result<(), WorkerError> {
    let spec = WorkerSpec {
        cpus: cpus.to_vec(),
        ..WorkerSpec::new("", Vec::<OsString>::new())
    };
    let limits = ChildLimits::new(&spec)?;
    if let Some(set) = &limits.cpus {
        // SAFETY: sched_setaffinity reads `size_of::<cpu_set_t>()` bytes from a valid set.
        let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) };
        if rc != 0 {
            return Err(WorkerError::Pin(io::Error::last_os_error()));
        }
    }
    Ok(())
}

// ---- tuner side -----------------------------------------------------------------------

/// Errors of the worker machinery itself (a candidate's crash is not one: it is an outcome).
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("cannot start the worker process {program}: {source}")]
    Spawn { program: String, source: io::Error },
    #[error("the worker process {program} did not start: {detail}")]
    Handshake { program: String, detail: String },
    #[error(
        "the worker runs as hardware fingerprint {got} but the tuner as {expected} \
         (a different thread count or CPU affinity?)"
    )]
    FingerprintMismatch { expected: String, got: String },
    #[error("the worker could not set up {workload}: {detail}")]
    Setup { workload: String, detail: String },
    #[error("CPU {cpu} cannot be pinned to (the affinity mask holds CPUs 0 to {max})")]
    BadCpu { cpu: usize, max: usize },
    #[error("the worker broke the protocol: {0}")]
    Protocol(String),
    #[error("cannot pin to the chosen CPUs: {0}")]
    Pin(io::Error),
}

/// How to start a worker and what to confine it to.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// The worker executable (the CLI passes its own path, `std::env::current_exe()`).
    pub program: PathBuf,
    /// Its arguments (the CLI: `worker --threads T`).
    pub args: Vec<OsString>,
    /// Environment variables set for it, on top of the tuner's own environment.
    pub env: Vec<(OsString, OsString)>,
    /// `RLIMIT_DATA` of the worker, in bytes; `None` for no limit.
    pub mem_limit_bytes: Option<u64>,
    /// CPUs the worker is pinned to (Linux `sched_setaffinity`); empty: not pinned.
    pub cpus: Vec<usize>,
    /// The fingerprint id the worker must report; `None` to accept any.
    pub fingerprint: Option<String>,
    /// How long a (re)started worker may take to greet.
    pub startup_timeout: Duration,
}

impl WorkerSpec {
    /// `program args...`, no memory limit, not pinned, any fingerprint.
    pub fn new(
        program: impl Into<PathBuf>,
        args: impl IntoIterator<Item = impl Into<OsString>>,
    ) -> Self {
        WorkerSpec {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            mem_limit_bytes: None,
            cpus: Vec::new(),
            fingerprint: None,
            startup_timeout: STARTUP_TIMEOUT,
        }
    }

    fn program_name(&self) -> String {
        self.program.display().to_string()
    }
}

/// Limits applied in the child between fork and exec: all plain data, prepared beforehand so
/// the child allocates nothing.
#[derive(Clone, Copy)]
struct ChildLimits {
    mem: Option<libc::rlim_t>,
    #[cfg(target_os = "linux")]
    cpus: Option<libc::cpu_set_t>,
}

impl ChildLimits {
    fn new(spec: &WorkerSpec) -> Result<Self, WorkerError> {
        #[cfg(target_os = "linux")]
        let cpus = if spec.cpus.is_empty() {
            None
        } else {
            // SAFETY: cpu_set_t is a plain bit array, for which all-zero bits are the empty set.
            let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            let max = libc::CPU_SETSIZE as usize - 1;
            for &cpu in &spec.cpus {
                if cpu > max {
                    return Err(WorkerError::BadCpu { cpu, max });
                }
                // SAFETY: `cpu` < CPU_SETSIZE (checked above), so the bit is inside `set`.
                unsafe { libc::CPU_SET(cpu, &mut set) };
            }
            Some(set)
        };
        #[cfg(not(target_os = "linux"))]
        if let Some(&cpu) = spec.cpus.first() {
            return Err(WorkerError::BadCpu { cpu, max: 0 });
        }
        Ok(ChildLimits {
            mem: spec.mem_limit_bytes.map(|b| b as libc::rlim_t),
            #[cfg(target_os = "linux")]
            cpus,
        })
    }

    /// Runs in the forked child before exec: only async-signal-safe system calls.
    fn apply(&self) -> io::Result<()> {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: prctl(PR_SET_PDEATHSIG, SIGKILL) only sets a flag on this process.
            if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        if let Some(bytes) = self.mem {
            let mut current = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: getrlimit writes one rlimit into the valid, exclusively borrowed struct.
            if unsafe { libc::getrlimit(libc::RLIMIT_DATA, &mut current) } != 0 {
                return Err(io::Error::last_os_error());
            }
            let limit = libc::rlimit {
                rlim_cur: bytes.min(current.rlim_max),
                rlim_max: current.rlim_max,
            };
            // SAFETY: setrlimit reads the valid struct; lowering the soft limit is always allowed.
            if unsafe { libc::setrlimit(libc::RLIMIT_DATA, &limit) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        #[cfg(target_os = "linux")]
        if let Some(set) = &self.cpus {
            // SAFETY: sched_setaffinity reads `size_of::<cpu_set_t>()` bytes from a valid set.
            let rc =
                unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// The last [`STDERR_TAIL`] bytes a worker wrote to stderr.
#[derive(Default)]
struct Tail(String);

impl Tail {
    fn push(&mut self, s: &str) {
        self.0.push_str(s);
        if self.0.len() > STDERR_TAIL {
            let mut cut = self.0.len() - STDERR_TAIL;
            while !self.0.is_char_boundary(cut) {
                cut += 1;
            }
            self.0.drain(..cut);
        }
    }
}

/// A running worker process and the threads reading its pipes.
struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    replies: Receiver<String>,
    stderr: Arc<Mutex<Tail>>,
    readers: Vec<JoinHandle<()>>,
}

impl Proc {
    fn spawn(spec: &WorkerSpec) -> Result<Proc, WorkerError> {
        let spawn_err = |source: io::Error| WorkerError::Spawn {
            program: spec.program_name(),
            source,
        };
        let limits = ChildLimits::new(spec)?;
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: the closure runs in the forked child before exec; `ChildLimits::apply` only
        // makes async-signal-safe system calls (prctl, getrlimit, setrlimit,
        // sched_setaffinity) on data prepared before the fork, and neither allocates nor
        // takes locks.
        unsafe {
            cmd.pre_exec(move || limits.apply());
        }
        let mut child = cmd.spawn().map_err(spawn_err)?;
        let stdin = child.stdin.take();
        let (Some(stdout), Some(mut stderr)) = (child.stdout.take(), child.stderr.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(spawn_err(io::Error::other("pipes were not created")));
        };
        let (tx, replies) = mpsc::channel();
        let tail = Arc::new(Mutex::new(Tail::default()));
        let mut readers = Vec::new();
        let out_reader = std::thread::Builder::new()
            .name("worker-stdout".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    // A reply may follow a partial line someone else printed.
                    if let Some(at) = line.find(REPLY_PREFIX) {
                        let reply = &line[at + REPLY_PREFIX.len()..];
                        if tx.send(reply.to_string()).is_err() {
                            break;
                        }
                    }
                }
            });
        let tail2 = Arc::clone(&tail);
        let err_reader = std::thread::Builder::new()
            .name("worker-stderr".into())
            .spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = stderr.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let text = String::from_utf8_lossy(&buf[..n]);
                    tail2.lock().unwrap_or_else(|e| e.into_inner()).push(&text);
                }
            });
        for r in [out_reader, err_reader] {
            match r {
                Ok(h) => readers.push(h),
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(spawn_err(e));
                }
            }
        }
        Ok(Proc {
            child,
            stdin,
            replies,
            stderr: tail,
            readers,
        })
    }

    /// Kills (if asked), reaps the process, drains its pipes, and says how it ended.
    fn reap(mut self, kill: bool) -> (Option<ExitStatus>, String) {
        self.stdin = None;
        if kill {
            let _ = self.child.kill();
        }
        // A dead worker has closed its stdout; give one that merely closed it a moment.
        let deadline = Instant::now() + Duration::from_secs(2);
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Ok(None) | Err(_) => {
                    let _ = self.child.kill();
                    break self.child.wait().ok();
                }
            }
        };
        // The pipes close when the worker is gone, unless a process it started still holds
        // them: wait a little for the readers (for the end of stderr), then leave them be.
        let deadline = Instant::now() + Duration::from_secs(1);
        while self.readers.iter().any(|r| !r.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        for r in self.readers.drain(..) {
            if r.is_finished() {
                let _ = r.join();
            }
        }
        let tail = std::mem::take(&mut self.stderr.lock().unwrap_or_else(|e| e.into_inner()).0);
        (status, tail)
    }

    /// Asks the worker to exit (EOF on stdin), then reaps it, killing it after a grace period.
    fn shutdown(mut self) {
        self.stdin = None;
        let deadline = Instant::now() + Duration::from_millis(500);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.reap(true);
    }
}

/// What one request came to.
enum Exchange {
    Reply(Reply),
    /// The worker died or was killed: `status` is crashed, timeout or oom.
    Died {
        status: Status,
        message: String,
    },
}

/// Why a worker ended, as a status and a one-line message.
fn classify_death(
    exit: Option<ExitStatus>,
    stderr: &str,
    timed_out: Option<Duration>,
) -> (Status, String) {
    if let Some(limit) = timed_out {
        return (
            Status::Timeout,
            format!(
                "no result within {:.1} s; the worker was killed",
                limit.as_secs_f64()
            ),
        );
    }
    let last = stderr
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(|l| l.chars().take(240).collect::<String>());
    if let Some(line) = stderr
        .lines()
        .find(|l| l.contains("memory allocation of") && l.contains("failed"))
    {
        return (
            Status::Oom,
            format!("out of memory under the worker's limit: {}", line.trim()),
        );
    }
    let how = match exit {
        None => "the worker vanished (its exit status could not be read)".to_string(),
        Some(s) => match (s.signal(), s.code()) {
            (Some(sig), _) => format!("the worker was killed by {}", signal_name(sig)),
            (None, Some(code)) => format!("the worker exited with code {code}"),
            (None, None) => format!("the worker ended: {s}"),
        },
    };
    let message = match last {
        Some(l) => format!("{how}; its stderr ended with: {l}"),
        None => how,
    };
    (Status::Crashed, message)
}

fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGSEGV => "SIGSEGV (invalid memory access)",
        libc::SIGBUS => "SIGBUS (bus error)",
        libc::SIGILL => "SIGILL (illegal instruction)",
        libc::SIGFPE => "SIGFPE (arithmetic fault)",
        libc::SIGABRT => "SIGABRT (abort)",
        libc::SIGTRAP => "SIGTRAP (trap)",
        libc::SIGKILL => "SIGKILL (from outside the tuner, e.g. the kernel's OOM killer)",
        libc::SIGTERM => "SIGTERM",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

/// A worker process that is (re)started on demand and remembers the problem to set up again
/// after a restart.
pub struct Worker {
    spec: WorkerSpec,
    proc: Option<Proc>,
    setup: Option<(String, u64)>,
    started: usize,
}

impl Worker {
    /// A worker that will be started by the first request.
    pub fn new(spec: WorkerSpec) -> Self {
        Worker {
            spec,
            proc: None,
            setup: None,
            started: 0,
        }
    }

    /// Times a worker was started again after one died or was killed.
    pub fn restarts(&self) -> usize {
        self.started.saturating_sub(1)
    }

    /// The pid of the running worker, if one is running.
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(|p| p.child.id())
    }

    /// Starts the worker if none is running: greeting, fingerprint check, set-up.
    fn start(&mut self) -> Result<(), WorkerError> {
        if self.proc.is_some() {
            return Ok(());
        }
        let proc = Proc::spawn(&self.spec)?;
        let handshake = |detail: String| WorkerError::Handshake {
            program: self.spec.program_name(),
            detail,
        };
        let greeting = match proc.replies.recv_timeout(self.spec.startup_timeout) {
            Ok(line) => line,
            Err(e) => {
                let timed_out = matches!(e, RecvTimeoutError::Timeout);
                let (exit, stderr) = proc.reap(true);
                let (_, why) = classify_death(exit, &stderr, None);
                return Err(handshake(if timed_out {
                    format!(
                        "no greeting within {:.0} s",
                        self.spec.startup_timeout.as_secs_f64()
                    )
                } else {
                    why
                }));
            }
        };
        match serde_json::from_str::<Reply>(&greeting) {
            Ok(Reply::Ready { fingerprint, .. }) => {
                if let Some(expected) = &self.spec.fingerprint {
                    if *expected != fingerprint {
                        proc.shutdown();
                        return Err(WorkerError::FingerprintMismatch {
                            expected: expected.clone(),
                            got: fingerprint,
                        });
                    }
                }
            }
            _ => {
                proc.shutdown();
                return Err(handshake(format!("unexpected greeting {greeting:?}")));
            }
        }
        self.started += 1;
        self.proc = Some(proc);
        if let Some((workload, seed)) = self.setup.clone() {
            self.send_setup(&workload, seed)?;
        }
        Ok(())
    }

    fn send_setup(&mut self, workload: &str, seed: u64) -> Result<(), WorkerError> {
        let req = Request::Setup {
            workload: workload.to_string(),
            seed,
        };
        let err = |detail: String| WorkerError::Setup {
            workload: workload.to_string(),
            detail,
        };
        match self.roundtrip(&req, SETUP_TIMEOUT)? {
            Exchange::Reply(Reply::SetupDone { .. }) => Ok(()),
            Exchange::Reply(Reply::Failed { message }) => Err(err(message)),
            Exchange::Reply(other) => Err(err(format!("unexpected reply {other:?}"))),
            Exchange::Died { message, .. } => Err(err(message)),
        }
    }

    /// Makes the problem every later request measures on (kept across restarts).
    pub fn setup(&mut self, workload: &Workload, seed: u64) -> Result<(), WorkerError> {
        self.setup = Some((workload.key(), seed));
        if self.proc.is_none() {
            return self.start();
        }
        self.send_setup(&workload.key(), seed)
    }

    /// Sends one request to the running worker and waits up to `timeout` for the reply.
    fn roundtrip(&mut self, req: &Request, timeout: Duration) -> Result<Exchange, WorkerError> {
        let proc = self
            .proc
            .as_mut()
            .ok_or_else(|| WorkerError::Protocol("no worker running".into()))?;
        let line = serde_json::to_string(req).map_err(|e| WorkerError::Protocol(e.to_string()))?;
        // Failure messages quote what the worker printed while serving this request only.
        proc.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .clear();
        let written = match proc.stdin.as_mut() {
            Some(stdin) => writeln!(stdin, "{line}").and_then(|_| stdin.flush()),
            None => Err(io::Error::from(io::ErrorKind::BrokenPipe)),
        };
        let received = match written {
            Ok(()) => proc.replies.recv_timeout(timeout),
            // It died before reading the request: collect how.
            Err(_) => Err(RecvTimeoutError::Disconnected),
        };
        let proc = self.proc.take().expect("checked above");
        match received {
            Ok(text) => match serde_json::from_str::<Reply>(&text) {
                Ok(reply) => {
                    self.proc = Some(proc);
                    Ok(Exchange::Reply(reply))
                }
                Err(e) => {
                    let _ = proc.reap(true);
                    Ok(Exchange::Died {
                        status: Status::Crashed,
                        message: format!("the worker sent an unreadable reply ({e}); killed"),
                    })
                }
            },
            Err(RecvTimeoutError::Timeout) => {
                let (exit, stderr) = proc.reap(true);
                let (status, message) = classify_death(exit, &stderr, Some(timeout));
                Ok(Exchange::Died { status, message })
            }
            Err(RecvTimeoutError::Disconnected) => {
                let (exit, stderr) = proc.reap(false);
                let (status, message) = classify_death(exit, &stderr, None);
                Ok(Exchange::Died { status, message })
            }
        }
    }

    /// Starts the worker if needed, then [`roundtrip`](Self::roundtrip)s.
    fn exchange(&mut self, req: &Request, timeout: Duration) -> Result<Exchange, WorkerError> {
        self.start()?;
        self.roundtrip(req, timeout)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(p) = self.proc.take() {
            p.shutdown();
        }
    }
}

/// The isolating [`Evaluator`] (`--isolation process`): every candidate runs in a [`Worker`]
/// under a deadline; a crash, hang or allocation failure becomes an outcome with status
/// `crashed`, `timeout` or `oom` and the next candidate gets a fresh worker.
pub struct Isolated {
    worker: Worker,
    timeout: Duration,
}

impl Isolated {
    /// An evaluator over workers started by `spec`, with a first time limit of `timeout`
    /// (the tuner lowers it once the default config has been timed).
    pub fn new(spec: WorkerSpec, timeout: Duration) -> Self {
        Isolated {
            worker: Worker::new(spec),
            timeout,
        }
    }

    /// The worker, for its pid and restart count.
    pub fn worker(&self) -> &Worker {
        &self.worker
    }
}

impl Evaluator for Isolated {
    fn isolation(&self) -> &'static str {
        "process"
    }

    fn setup(&mut self, workload: &Workload, seed: u64) -> Result<(), EvalError> {
        Ok(self.worker.setup(workload, seed)?)
    }

    fn evaluate(
        &mut self,
        kernel: &dyn Kernel,
        config: &Config,
        protocol: &Protocol,
    ) -> Result<Evaluation, EvalError> {
        if self.worker.setup.is_none() {
            return Err(EvalError::NotSetUp);
        }
        let start = Instant::now();
        let req = Request::Evaluate {
            candidate: WireCandidate::new(kernel, config),
            protocol: protocol.into(),
        };
        match self.worker.exchange(&req, self.timeout)? {
            Exchange::Reply(Reply::Evaluated {
                status,
                message,
                measurement,
                elapsed_s,
            }) => Ok(Evaluation {
                outcome: Outcome {
                    status,
                    message,
                    measurement,
                },
                elapsed: Duration::try_from_secs_f64(elapsed_s).unwrap_or(start.elapsed()),
            }),
            Exchange::Reply(Reply::Failed { message }) => {
                Err(WorkerError::Protocol(format!("evaluate refused: {message}")).into())
            }
            Exchange::Reply(other) => {
                Err(WorkerError::Protocol(format!("unexpected reply {other:?}")).into())
            }
            Exchange::Died { status, message } => Ok(Evaluation {
                outcome: Outcome::failed(status, message),
                elapsed: start.elapsed(),
            }),
        }
    }

    fn remeasure(
        &mut self,
        finalists: &[(&dyn Kernel, Config)],
        protocol: &Protocol,
        rounds: usize,
    ) -> Result<Vec<Measurement>, EvalError> {
        if self.worker.setup.is_none() {
            return Err(EvalError::NotSetUp);
        }
        let req = Request::Interleave {
            candidates: finalists
                .iter()
                .map(|(k, c)| WireCandidate::new(*k, c))
                .collect(),
            protocol: protocol.into(),
            rounds,
        };
        let failed = |status: Status, message: String| EvalError::Remeasure {
            kernel: "finalists".into(),
            config: format!("({} configs)", finalists.len()),
            status,
            message,
        };
        let limit = self.timeout.saturating_mul(finalists.len() as u32 + 1);
        match self.worker.exchange(&req, limit)? {
            Exchange::Reply(Reply::Interleaved { measurements, .. })
                if measurements.len() == finalists.len() =>
            {
                Ok(measurements)
            }
            Exchange::Reply(Reply::Failed { message }) => Err(failed(Status::RunFailed, message)),
            Exchange::Reply(other) => {
                Err(WorkerError::Protocol(format!("unexpected reply {other:?}")).into())
            }
            Exchange::Died { status, message } => Err(failed(status, message)),
        }
    }

    fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    fn timeout(&self) -> Option<Duration> {
        Some(self.timeout)
    }

    fn restarts(&self) -> usize {
        self.worker.restarts()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip_as_json_lines() {
        let req = Request::Evaluate {
            candidate: WireCandidate {
                kernel: "gemm_packed".into(),
                version: 3,
                config: Config::from_pairs([("kc", 256usize)]),
            },
            protocol: (&Protocol::quick()).into(),
        };
        let line = serde_json::to_string(&req).unwrap();
        assert!(line.starts_with(r#"{"op":"evaluate""#), "{line}");
        assert!(!line.contains('\n'));
        assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), req);
        let Request::Evaluate { protocol, .. } = req else {
            unreachable!()
        };
        assert_eq!(protocol.to_protocol().unwrap(), Protocol::quick());
        let bad = WireProtocol {
            warmup_s: -1.0,
            ..protocol
        };
        assert!(bad.to_protocol().unwrap_err().contains("warmup_s"));
    }

    #[test]
    fn serve_answers_setup_evaluate_and_bad_requests() {
        let w = "gemm:9x8x7";
        let (k, c) =
            kernels::default_for(&w.parse().unwrap(), HardwareFingerprint::current()).unwrap();
        let cand = |version| WireCandidate {
            kernel: k.name().into(),
            version,
            config: c.clone(),
        };
        let quick: WireProtocol = (&Protocol::quick()).into();
        let lines = [
            serde_json::to_string(&Request::Evaluate {
                candidate: cand(k.version()),
                protocol: quick.clone(),
            })
            .unwrap(),
            "this is not json".to_string(),
            serde_json::to_string(&Request::Setup {
                workload: w.into(),
                seed: 3,
            })
            .unwrap(),
            serde_json::to_string(&Request::Evaluate {
                candidate: cand(k.version()),
                protocol: quick.clone(),
            })
            .unwrap(),
            serde_json::to_string(&Request::Evaluate {
                candidate: cand(k.version() + 1),
                protocol: quick.clone(),
            })
            .unwrap(),
            serde_json::to_string(&Request::Interleave {
                candidates: vec![cand(k.version()), cand(k.version())],
                protocol: quick,
                rounds: 4,
            })
            .unwrap(),
        ]
        .join("\n");
        let mut out = Vec::new();
        serve(lines.as_bytes(), &mut out, &|n| kernels::kernel(n).ok()).unwrap();
        let replies: Vec<Reply> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l.strip_prefix(REPLY_PREFIX).unwrap()).unwrap())
            .collect();
        assert_eq!(replies.len(), 7);
        assert!(
            matches!(&replies[0], Reply::Ready { fingerprint, .. } if *fingerprint == HardwareFingerprint::current().id)
        );
        assert!(
            matches!(&replies[1], Reply::Failed { message } if message.contains("before setup"))
        );
        assert!(matches!(&replies[2], Reply::Failed { message } if message.contains("malformed")));
        assert!(matches!(&replies[3], Reply::SetupDone { .. }));
        assert!(
            matches!(&replies[4], Reply::Evaluated { status: Status::Ok, measurement: Some(m), .. } if m.median_s > 0.0)
        );
        assert!(
            matches!(&replies[5], Reply::Evaluated { status: Status::BuildFailed, message: Some(m), .. } if m.contains("version"))
        );
        assert!(
            matches!(&replies[6], Reply::Interleaved { measurements, .. } if measurements.len() == 2 && measurements[0].samples.len() == 4)
        );
    }

    fn exit_of(shell: &str) -> ExitStatus {
        Command::new("sh").args(["-c", shell]).status().unwrap()
    }

    #[test]
    fn deaths_are_classified_by_signal_stderr_and_deadline() {
        let (s, m) = classify_death(Some(exit_of("kill -SEGV $$")), "", None);
        assert_eq!(s, Status::Crashed);
        assert!(m.contains("SIGSEGV"), "{m}");
        let (s, m) = classify_death(Some(exit_of("kill -ABRT $$")), "boom\n\n", None);
        assert_eq!(s, Status::Crashed);
        assert!(m.contains("SIGABRT") && m.ends_with("boom"), "{m}");
        let (s, m) = classify_death(
            Some(exit_of("kill -ABRT $$")),
            "memory allocation of 67108864 bytes failed\n",
            None,
        );
        assert_eq!(s, Status::Oom);
        assert!(m.contains("67108864"), "{m}");
        let (s, m) = classify_death(Some(exit_of("exit 3")), "", None);
        assert_eq!(s, Status::Crashed);
        assert!(m.contains("code 3"), "{m}");
        let (s, m) = classify_death(None, "", Some(Duration::from_millis(1500)));
        assert_eq!(s, Status::Timeout);
        assert!(m.contains("1.5 s"), "{m}");
    }

    #[test]
    fn a_missing_program_is_a_spawn_error_and_a_silent_one_a_handshake_error() {
        let mut w = Worker::new(WorkerSpec::new("/nonexistent/autokernel", ["worker"]));
        let e = w.setup(&"gemm:2x2x2".parse().unwrap(), 0).unwrap_err();
        assert!(matches!(e, WorkerError::Spawn { .. }), "{e}");
        assert!(e.to_string().contains("/nonexistent/autokernel"), "{e}");

        let mut spec = WorkerSpec::new("sh", ["-c", "echo hello; echo oops >&2; exit 4"]);
        spec.startup_timeout = Duration::from_secs(10);
        let mut w = Worker::new(spec);
        let e = w.setup(&"gemm:2x2x2".parse().unwrap(), 0).unwrap_err();
        assert!(matches!(e, WorkerError::Handshake { .. }), "{e}");
        assert!(
            e.to_string().contains("code 4") && e.to_string().contains("oops"),
            "{e}"
        );

        let mut spec = WorkerSpec::new("sh", ["-c", "sleep 5"]);
        spec.startup_timeout = Duration::from_millis(200);
        let t = Instant::now();
        let e = Worker::new(spec)
            .setup(&"gemm:2x2x2".parse().unwrap(), 0)
            .unwrap_err();
        assert!(e.to_string().contains("no greeting"), "{e}");
        assert!(
            t.elapsed() < Duration::from_secs(4),
            "the silent worker was killed"
        );
    }

    #[test]
    fn out_of_range_cpus_are_refused() {
        let mut spec = WorkerSpec::new("true", Vec::<String>::new());
        spec.cpus = vec![1_000_000];
        let e = Worker::new(spec)
            .setup(&"gemm:2x2x2".parse().unwrap(), 0)
            .unwrap_err();
        assert!(
            matches!(e, WorkerError::BadCpu { cpu: 1_000_000, .. }),
            "{e}"
        );
    }
}
