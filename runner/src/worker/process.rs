//! The tuner's side of a worker process: start it confined ([`WorkerSpec`]: memory limit,
//! CPU affinity, death signal), exchange one request for one reply under a deadline
//! ([`Worker`]), and when it dies or is killed, say how (`crashed`, `timeout`, `oom`).

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kernels::{Status, Workload};

use super::wire::{Reply, Request, REPLY_PREFIX};

/// How long a (re)started worker may take to greet.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the worker may take to build a problem and its reference.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(600);

/// The most of a worker's stderr kept for failure messages.
const STDERR_TAIL: usize = 16 * 1024;

/// Errors of the worker machinery itself (a candidate's crash is not one: it is an outcome).
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The worker process could not be started: its executable could not be run, its pipes
    /// were not created, or a limit of [`WorkerSpec`] could not be applied in the child.
    #[error("cannot start the worker process {program}: {cause}")]
    Spawn {
        /// The worker executable ([`WorkerSpec::program`]).
        program: String,
        /// The operating system's error.
        cause: io::Error,
    },
    /// The worker started but did not greet with [`Reply::Ready`]: it died first, sent
    /// something else, or was silent past [`WorkerSpec::startup_timeout`] (and was killed).
    #[error("the worker process {program} did not start: {detail}")]
    Handshake {
        /// The worker executable ([`WorkerSpec::program`]).
        program: String,
        /// What happened instead: how it ended (with a hint where its memory limit may be
        /// too small for it to start), the greeting it sent, or the deadline it missed.
        detail: String,
    },
    /// The worker reported another hardware fingerprint than [`WorkerSpec::fingerprint`]:
    /// its timings would be stored under the wrong machine. The worker is shut down.
    #[error(
        "the worker runs as hardware fingerprint {got} but the tuner as {expected} \
         (a different thread count or CPU affinity?)"
    )]
    FingerprintMismatch {
        /// The fingerprint id the tuner asked for.
        expected: String,
        /// The fingerprint id the worker reported.
        got: String,
    },
    /// The worker could not make the test problem of a [`Request::Setup`]: it refused,
    /// answered something else, died while making it, or was killed at [`SETUP_TIMEOUT`].
    #[error("the worker could not set up {workload}: {detail}")]
    Setup {
        /// The workload, in its text form.
        workload: String,
        /// The worker's message, or how it died.
        detail: String,
    },
    /// A CPU to pin to that a CPU affinity mask cannot hold; off Linux, where pinning is not
    /// supported, any CPU at all.
    #[error("CPU {cpu} cannot be pinned to (the affinity mask holds CPUs 0 to {max})")]
    BadCpu {
        /// The CPU asked for.
        cpu: usize,
        /// The highest CPU number a mask holds (`CPU_SETSIZE - 1`; 0 off Linux).
        max: usize,
    },
    /// The worker or the tuner's side of the exchange broke the wire protocol: an unexpected
    /// or refused reply, no worker running, or a request that could not be encoded.
    #[error("the worker broke the protocol: {0}")]
    Protocol(String),
    /// The operating system refused to pin the calling thread to the chosen CPUs
    /// (`sched_setaffinity`).
    #[error("cannot pin to the chosen CPUs: {0}")]
    Pin(io::Error),
}

/// The worker's memory limit (`RLIMIT_DATA`) a tuning job sets when its caller names none:
/// the CLI's `--mem-limit-mb` default and `autokernel.tune`'s.
pub const DEFAULT_MEM_LIMIT_MB: u64 = 4096;

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
        #[cfg(not(target_os = "linux"))]
        if let Some(&cpu) = spec.cpus.first() {
            return Err(WorkerError::BadCpu { cpu, max: 0 });
        }
        Ok(ChildLimits {
            mem: spec.mem_limit_bytes.map(|b| b as libc::rlim_t),
            #[cfg(target_os = "linux")]
            cpus: crate::pin::cpu_set(&spec.cpus)?,
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
            crate::pin::set_affinity(set)?;
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
            cause: source,
        };
        let mut child = command(spec)?.spawn().map_err(spawn_err)?;
        let stdin = child.stdin.take();
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            kill_and_wait(&mut child);
            return Err(spawn_err(io::Error::other("pipes were not created")));
        };
        let (tx, replies) = mpsc::channel();
        let tail = Arc::new(Mutex::new(Tail::default()));
        let readers = match start_readers(stdout, stderr, tx, Arc::clone(&tail)) {
            Ok(readers) => readers,
            Err(e) => {
                kill_and_wait(&mut child);
                return Err(spawn_err(e));
            }
        };
        Ok(Proc {
            child,
            stdin,
            replies,
            stderr: tail,
            readers,
        })
    }

    /// Writes one request line, after forgetting the stderr of earlier requests (failure
    /// messages quote what the worker printed while serving this request only).
    fn send(&mut self, line: &str) -> io::Result<()> {
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .clear();
        match self.stdin.as_mut() {
            Some(stdin) => writeln!(stdin, "{line}").and_then(|_| stdin.flush()),
            None => Err(io::Error::from(io::ErrorKind::BrokenPipe)),
        }
    }

    /// Reaps a worker that sent no reply: killed past its `timeout`, or dead (its stdout
    /// closed), and says how it ended.
    fn died(self, why: RecvTimeoutError, timeout: Duration) -> Exchange {
        let timed_out = matches!(why, RecvTimeoutError::Timeout);
        let (exit, stderr) = self.reap(timed_out);
        let (status, message) = classify_death(exit, &stderr, timed_out.then_some(timeout));
        Exchange::Died { status, message }
    }

    /// Kills (if asked), reaps the process, drains its pipes, and says how it ended.
    fn reap(mut self, kill: bool) -> (Option<ExitStatus>, String) {
        self.stdin = None;
        if kill {
            let _ = self.child.kill();
        }
        let status = self.wait_exit();
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

    /// The exit status: a dead worker has closed its stdout; give one that merely closed it
    /// a moment, then kill it.
    fn wait_exit(&mut self) -> Option<ExitStatus> {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            match self.child.try_wait() {
                Ok(Some(s)) => return Some(s),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Ok(None) | Err(_) => {
                    let _ = self.child.kill();
                    return self.child.wait().ok();
                }
            }
        }
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

/// The command that starts the worker, its pipes and its limits ([`ChildLimits`]).
fn command(spec: &WorkerSpec) -> Result<Command, WorkerError> {
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
    Ok(cmd)
}

fn kill_and_wait(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Starts the threads reading the worker's pipes: reply lines (the text after
/// [`REPLY_PREFIX`]) into `replies`, stderr into `tail`.
fn start_readers(
    stdout: ChildStdout,
    mut stderr: ChildStderr,
    replies: Sender<String>,
    tail: Arc<Mutex<Tail>>,
) -> io::Result<Vec<JoinHandle<()>>> {
    let out_reader = std::thread::Builder::new()
        .name("worker-stdout".into())
        .spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // A reply may follow a partial line someone else printed.
                if let Some(at) = line.find(REPLY_PREFIX) {
                    let reply = &line[at + REPLY_PREFIX.len()..];
                    if replies.send(reply.to_string()).is_err() {
                        break;
                    }
                }
            }
        })?;
    let err_reader = std::thread::Builder::new()
        .name("worker-stderr".into())
        .spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let text = String::from_utf8_lossy(&buf[..n]);
                tail.lock().unwrap_or_else(|e| e.into_inner()).push(&text);
            }
        })?;
    Ok(vec![out_reader, err_reader])
}

/// What one request came to.
pub(super) enum Exchange {
    Reply(Reply),
    /// The worker died or was killed: `status` is crashed, timeout or oom.
    Died {
        status: Status,
        message: String,
    },
}

/// Whether a worker's stderr says it ran out of memory or address space before it could
/// start (threads that could not be spawned, a failed allocation or mapping).
fn short_of_memory(stderr: &str) -> bool {
    [
        "Cannot allocate memory",
        "Resource temporarily unavailable",
        "memory allocation of",
        "failed to spawn thread",
    ]
    .iter()
    .any(|s| stderr.contains(s))
}

/// `bytes` in MiB for messages (bytes below 1 MiB).
fn mib(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{bytes} bytes")
    }
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
    /// The workload and seed of the last [`setup`](Self::setup), sent again to a restarted
    /// worker.
    setup: Option<(Workload, u64)>,
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

    /// The CPUs its processes are pinned to (empty: not pinned).
    pub fn cpus(&self) -> &[usize] {
        &self.spec.cpus
    }

    /// Times a worker was started again after one died or was killed.
    pub fn restarts(&self) -> usize {
        self.started.saturating_sub(1)
    }

    /// The pid of the running worker, if one is running.
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(|p| p.child.id())
    }

    /// Whether [`setup`](Self::setup) was called (the problem every request measures on).
    pub(super) fn is_set_up(&self) -> bool {
        self.setup.is_some()
    }

    /// Makes the problem every later request measures on (kept across restarts).
    pub fn setup(&mut self, workload: &Workload, seed: u64) -> Result<(), WorkerError> {
        self.setup = Some((*workload, seed));
        if self.proc.is_none() {
            // Starting sends the set-up.
            return self.start();
        }
        self.send_setup(workload, seed)
    }

    /// Starts the worker if none is running: greeting, fingerprint check, set-up.
    fn start(&mut self) -> Result<(), WorkerError> {
        if self.proc.is_some() {
            return Ok(());
        }
        let proc = self.greet(Proc::spawn(&self.spec)?)?;
        self.started += 1;
        self.proc = Some(proc);
        if let Some((workload, seed)) = self.setup {
            self.send_setup(&workload, seed)?;
        }
        Ok(())
    }

    /// Waits for a new worker's greeting and checks its fingerprint; a worker that fails
    /// either is reaped.
    fn greet(&self, proc: Proc) -> Result<Proc, WorkerError> {
        let handshake = |detail: String| WorkerError::Handshake {
            program: self.spec.program_name(),
            detail,
        };
        let greeting = match proc.replies.recv_timeout(self.spec.startup_timeout) {
            Ok(line) => line,
            Err(e) => {
                let timed_out = matches!(e, RecvTimeoutError::Timeout);
                let (exit, stderr) = proc.reap(true);
                let (status, why) = classify_death(exit, &stderr, None);
                if timed_out {
                    return Err(handshake(format!(
                        "no greeting within {:.0} s",
                        self.spec.startup_timeout.as_secs_f64()
                    )));
                }
                let hint = match self.spec.mem_limit_bytes {
                    Some(b) if status == Status::Oom || short_of_memory(&stderr) => format!(
                        " (its memory limit, {}, may be too small for the worker to start)",
                        mib(b)
                    ),
                    _ => String::new(),
                };
                return Err(handshake(format!("{why}{hint}")));
            }
        };
        let Ok(Reply::Ready { fingerprint, .. }) = serde_json::from_str::<Reply>(&greeting) else {
            proc.shutdown();
            return Err(handshake(format!("unexpected greeting {greeting:?}")));
        };
        match &self.spec.fingerprint {
            Some(expected) if *expected != fingerprint => {
                proc.shutdown();
                Err(WorkerError::FingerprintMismatch {
                    expected: expected.clone(),
                    got: fingerprint,
                })
            }
            _ => Ok(proc),
        }
    }

    fn send_setup(&mut self, workload: &Workload, seed: u64) -> Result<(), WorkerError> {
        let req = Request::Setup {
            workload: *workload,
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

    /// Sends one request to the running worker and waits up to `timeout` for the reply; a
    /// worker that dies, hangs or answers gibberish is reaped and the exchange says how.
    fn roundtrip(&mut self, req: &Request, timeout: Duration) -> Result<Exchange, WorkerError> {
        let proc = self
            .proc
            .as_mut()
            .ok_or_else(|| WorkerError::Protocol("no worker running".into()))?;
        let line = serde_json::to_string(req).map_err(|e| WorkerError::Protocol(e.to_string()))?;
        let received = match proc.send(&line) {
            Ok(()) => proc.replies.recv_timeout(timeout),
            // It died before reading the request: collect how.
            Err(_) => Err(RecvTimeoutError::Disconnected),
        };
        let proc = self.proc.take().expect("checked above");
        let text = match received {
            Ok(text) => text,
            Err(why) => return Ok(proc.died(why, timeout)),
        };
        match serde_json::from_str::<Reply>(&text) {
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
        }
    }

    /// Starts the worker if needed, then [`roundtrip`](Self::roundtrip)s.
    pub(super) fn exchange(
        &mut self,
        req: &Request,
        timeout: Duration,
    ) -> Result<Exchange, WorkerError> {
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

#[cfg(test)]
mod tests {
    use super::*;

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

        // Under a memory limit, a worker that dies of memory before greeting is told with
        // the limit; one that dies of something else is not.
        for (script, hint) in [
            ("echo 'Cannot allocate memory' >&2; exit 5", true),
            ("exit 5", false),
        ] {
            let mut spec = WorkerSpec::new("sh", ["-c", script]);
            spec.mem_limit_bytes = Some(64 << 20);
            let e = Worker::new(spec)
                .setup(&"gemm:2x2x2".parse().unwrap(), 0)
                .unwrap_err()
                .to_string();
            assert!(e.contains("code 5"), "{e}");
            assert_eq!(e.contains("memory limit, 64 MiB"), hint, "{e}");
        }

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
