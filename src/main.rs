//! `autokernel` — the command-line front end: clap definitions and dispatch only.
//! Each subcommand lives in `commands/<name>.rs`.

mod commands;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

/// Adaptive autotuning kernel framework: search kernel variants, measure them on this
/// machine, keep the winners in a SQLite tuning database, dispatch to them at run time.
#[derive(Parser)]
#[command(name = "autokernel", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print this machine's hardware fingerprint.
    Hw(commands::hw::HwArgs),
    /// Tune workloads on this machine and store every trial in the database.
    Tune(commands::tune::TuneArgs),
    /// Show which variant the runtime would use for a workload.
    Lookup(commands::lookup::LookupArgs),
    /// Run a workload through the runtime on random inputs and time it.
    Run(commands::run::RunArgs),
    /// Run a BERT encoder through the runtime: latency, throughput, levels, tuned vs defaults.
    Infer(commands::infer::InferArgs),
    /// Tuning databases for fleets: stats, export, import, merge, verify, diff.
    Db(commands::db::DbArgs),
    /// Re-measure the database's winners, compare with a baseline, save baselines, report.
    Bench(commands::bench::BenchArgs),
    /// Replay search strategies against recorded search spaces (no kernel runs); export spaces.
    Replay(commands::replay::ReplayArgs),
    /// Internal: evaluate candidates for `tune --isolation process` (JSON lines on stdin/stdout).
    #[command(hide = true)]
    Worker(commands::worker::WorkerArgs),
}

/// Options shared by the commands that read or write a tuning database.
#[derive(Args, Debug, Clone)]
pub struct DbArg {
    /// The tuning database (a SQLite file).
    #[arg(long, default_value = "tuning.db", value_name = "PATH")]
    pub db: PathBuf,
}

/// Options shared by the commands that run kernels.
#[derive(Args, Debug, Clone)]
pub struct ThreadsArg {
    /// Threads this process may use (default: all cores). Part of the hardware fingerprint.
    #[arg(long, value_name = "T", allow_negative_numbers = true, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
}

impl ThreadsArg {
    /// Sizes rayon's global pool; must run before the fingerprint is first detected. More
    /// threads than the CPUs this process may use is refused: it would name a fingerprint no
    /// machine has, and oversubscribed cores run many times slower.
    pub fn apply(&self) -> anyhow::Result<()> {
        if let Some(t) = self.threads {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            if usize::from(t) > cpus {
                anyhow::bail!(
                    "--threads {t}: this process may use {cpus} CPU(s) (its affinity and \
                     cgroup limits); use at most {cpus}"
                );
            }
            rayon::ThreadPoolBuilder::new()
                .num_threads(t as usize)
                .build_global()?;
        }
        Ok(())
    }
}

/// The runtime's precision policy, for the commands that serve calls through it.
#[derive(Args, Debug, Clone)]
pub struct PrecisionArg {
    /// Element type f32 calls are served in: `f32` (the default), `bf16`, `int8`, or `auto`
    /// (per workload, the fastest record measured on its shape within the error budget).
    #[arg(long, value_name = "P", default_value = "f32")]
    pub precision: String,
    /// Error budget: a reduced-precision record is served only if its stored max relative
    /// error against the f32 problem is at most E (`auto` defaults to 1e-2).
    #[arg(long, value_name = "E", allow_negative_numbers = true)]
    pub max_rel_err: Option<f64>,
}

impl PrecisionArg {
    /// The policy these options name.
    pub fn policy(&self) -> anyhow::Result<runtime::PrecisionPolicy> {
        let p: runtime::PrecisionPolicy = self
            .precision
            .parse()
            .map_err(|e| anyhow::anyhow!("--precision: {e}"))?;
        with_budget(p, self.max_rel_err)
    }

    /// Notes on stderr each workload of `ws` that names its element type (`…:i8`) when a
    /// policy was given: the policy chooses how f32 calls are served, and leaves those as
    /// they are.
    pub fn note_typed(&self, ws: &[kernels::Workload]) {
        if self.precision == "f32" && self.max_rel_err.is_none() {
            return;
        }
        for w in ws.iter().filter(|w| w.dtype() != kernels::DType::F32) {
            eprintln!(
                "note: {w} names its element type: --precision and --max-rel-err choose how \
                 f32 calls are served, and leave it in {}",
                w.dtype()
            );
        }
    }
}

/// `policy` with the `--max-rel-err` given, checked.
pub fn with_budget(
    policy: runtime::PrecisionPolicy,
    max_rel_err: Option<f64>,
) -> anyhow::Result<runtime::PrecisionPolicy> {
    match max_rel_err {
        Some(e) => policy
            .with_budget(e)
            .map_err(|e| anyhow::anyhow!("--max-rel-err: {e}")),
        None => Ok(policy),
    }
}

fn main() -> ExitCode {
    restore_sigpipe();
    let cli = Cli::parse();
    // An ISA cap the CPU cannot honour is refused before anything runs (the library would
    // only warn and ignore it).
    // Likewise a helper linger that is not a number of µs.
    if let Err(e) = kernels::cpu::Isa::cap().and(kernels::cpu::linger()) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let result = match cli.command {
        Command::Hw(a) => commands::hw::run(a),
        Command::Tune(a) => commands::tune::run(a),
        Command::Lookup(a) => commands::lookup::run(a),
        Command::Run(a) => commands::run::run(a),
        Command::Infer(a) => commands::infer::run(a),
        Command::Db(a) => commands::db::run(a),
        Command::Bench(a) => commands::bench::run(a),
        Command::Replay(a) => commands::replay::run(a),
        Command::Worker(a) => commands::worker::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", error_line(&e));
            ExitCode::from(2)
        }
    }
}

/// The one-line message of `e`: its chain of causes joined by ": " as `{:#}` joins them,
/// except that a cause the line already ends with is not repeated (many library errors print
/// their source in their own message, and `{:#}` would print it twice).
pub(crate) fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.is_empty() {
            line = text;
        } else if !(line == text || line.ends_with(&format!(": {text}"))) {
            line.push_str(": ");
            line.push_str(&text);
        }
    }
    line
}

/// Rust ignores SIGPIPE, which turns `autokernel db stats | head` into a panic on the closed
/// pipe; restore the default action so the process ends quietly like any other Unix tool.
fn restore_sigpipe() {
    #[cfg(unix)]
    // SAFETY: `signal` with SIG_DFL installs no handler code; it runs first in `main`, before
    // any other thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(test)]
mod tests {
    use super::error_line;

    /// A library error whose message includes its source (as `#[error("{path}: {source}")]`
    /// of thiserror writes it).
    #[derive(Debug)]
    struct Wrapped {
        path: String,
        source: std::io::Error,
    }

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{}: {}", self.path, self.source)
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.source)
        }
    }

    #[test]
    fn error_lines_name_each_cause_once() {
        let io = || std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = anyhow::Error::new(Wrapped {
            path: "s.jsonl".into(),
            source: io(),
        })
        .context("reading space s.jsonl");
        assert_eq!(
            error_line(&e),
            "reading space s.jsonl: s.jsonl: no such file"
        );
        // Causes that add something are all kept, in order.
        let e = anyhow::Error::new(io())
            .context("opening")
            .context("tuning");
        assert_eq!(error_line(&e), "tuning: opening: no such file");
        // Only a whole cause counts as repeated, not a message that merely ends alike.
        let e = anyhow::anyhow!("not found").context("value not found");
        assert_eq!(error_line(&e), "value not found: not found");
    }
}
