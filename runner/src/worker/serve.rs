//! The worker's side: a server loop that reads [`Request`]s and answers them by running the
//! same [`Bench`] the in-process evaluator runs, so a candidate is built, verified and timed
//! by one copy of that code wherever it runs.

use std::io::{self, BufRead, Write};
use std::os::fd::FromRawFd;
use std::time::Instant;

use kernels::{HardwareFingerprint, Kernel, Status, Workload};

use super::wire::{Reply, Request, WireCandidate, REPLY_PREFIX};
use crate::evaluator::{Bench, Contender, EvalError};
use crate::protocol::Protocol;
use crate::Outcome;

/// Resolves a kernel family by name in the worker (normally [`kernels::kernel()`]).
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
    let mut bench: Option<Bench> = None;
    for line in input.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<Request>(&line) {
            Err(e) => failed(format!("malformed request: {e}")),
            Ok(req) => answer(req, &mut bench, resolve),
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

fn failed(message: String) -> Reply {
    Reply::Failed { message }
}

/// One request's reply; the problem set up lives in `bench` between requests.
fn answer(req: Request, bench: &mut Option<Bench>, resolve: Resolver<'_>) -> Reply {
    let start = Instant::now();
    match req {
        Request::Setup { workload, seed } => setup(workload, seed, bench, start),
        Request::Evaluate {
            candidate,
            protocol,
        } => match (bench.as_mut(), protocol.to_protocol()) {
            (None, _) => failed("evaluate before setup".into()),
            (_, Err(e)) => failed(e),
            (Some(b), Ok(p)) => evaluate(b, &candidate, &p, resolve, start),
        },
        Request::Interleave {
            candidates,
            protocol,
            rounds,
        } => match (bench.as_ref(), protocol.to_protocol()) {
            (None, _) => failed("interleave before setup".into()),
            (_, Err(e)) => failed(e),
            (Some(b), Ok(p)) => interleave(b, &candidates, &p, rounds, resolve, start),
        },
    }
}

fn setup(workload: Workload, seed: u64, bench: &mut Option<Bench>, start: Instant) -> Reply {
    *bench = Some(Bench::setup(&workload, seed));
    Reply::SetupDone {
        workload,
        elapsed_s: start.elapsed().as_secs_f64(),
    }
}

fn evaluate(
    bench: &mut Bench,
    candidate: &WireCandidate,
    protocol: &Protocol,
    resolve: Resolver<'_>,
    start: Instant,
) -> Reply {
    let outcome = match resolve_candidate(candidate, resolve) {
        Ok(kernel) => bench.evaluate(kernel, &candidate.config, protocol).outcome,
        Err(message) => Outcome::failed(Status::BuildFailed, message),
    };
    Reply::Evaluated {
        status: outcome.status,
        message: outcome.message,
        measurement: outcome.measurement,
        accuracy: outcome.accuracy,
        elapsed_s: seconds_since(start),
    }
}

fn interleave(
    bench: &Bench,
    candidates: &[WireCandidate],
    protocol: &Protocol,
    rounds: usize,
    resolve: Resolver<'_>,
    start: Instant,
) -> Reply {
    let mut finalists: Vec<Contender<'_>> = Vec::with_capacity(candidates.len());
    for c in candidates {
        match resolve_candidate(c, resolve) {
            Ok(kernel) => finalists.push(Contender {
                kernel,
                config: c.config.clone(),
                dtype: c.dtype.unwrap_or(bench.workload().dtype()),
            }),
            Err(m) => return failed(format!("{} {}: {m}", c.kernel, c.config)),
        }
    }
    match bench.remeasure(&finalists, protocol, rounds) {
        Ok(measurements) => Reply::Interleaved {
            measurements,
            elapsed_s: seconds_since(start),
        },
        Err(EvalError::Remeasure {
            kernel,
            config,
            status,
            message,
        }) => failed(format!("{kernel} {config}: {status}: {message}")),
        Err(other) => failed(other.to_string()),
    }
}

fn seconds_since(start: Instant) -> f64 {
    start.elapsed().as_secs_f64()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::WireProtocol;

    /// The replies `serve` gives to `requests` (JSON lines as they are, then decoded).
    fn served(requests: &[String]) -> Vec<Reply> {
        let mut out = Vec::new();
        serve(requests.join("\n").as_bytes(), &mut out, &|n| {
            kernels::kernel(n).ok()
        })
        .unwrap();
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l.strip_prefix(REPLY_PREFIX).unwrap()).unwrap())
            .collect()
    }

    #[test]
    fn serve_answers_setup_evaluate_and_bad_requests() {
        let w: Workload = "gemm:9x8x7".parse().unwrap();
        let (k, c) = kernels::default_for(&w, HardwareFingerprint::current()).unwrap();
        let cand = |version| WireCandidate {
            version,
            ..WireCandidate::new(k, &c)
        };
        let quick: WireProtocol = (&Protocol::quick()).into();
        let evaluate = |version| Request::Evaluate {
            candidate: cand(version),
            protocol: quick.clone(),
        };
        let json = |r: &Request| serde_json::to_string(r).unwrap();
        let replies = served(&[
            json(&evaluate(k.version())),
            "this is not json".to_string(),
            json(&Request::Setup {
                workload: w,
                seed: 3,
            }),
            json(&evaluate(k.version())),
            json(&evaluate(k.version() + 1)),
            json(&Request::Interleave {
                candidates: vec![cand(k.version()), cand(k.version())],
                protocol: quick.clone(),
                rounds: 4,
            }),
        ]);
        assert_eq!(replies.len(), 7);
        assert!(
            matches!(&replies[0], Reply::Ready { fingerprint, .. } if *fingerprint == HardwareFingerprint::current().id)
        );
        assert!(
            matches!(&replies[1], Reply::Failed { message } if message.contains("before setup"))
        );
        assert!(matches!(&replies[2], Reply::Failed { message } if message.contains("malformed")));
        assert!(matches!(&replies[3], Reply::SetupDone { workload, .. } if *workload == w));
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
}
