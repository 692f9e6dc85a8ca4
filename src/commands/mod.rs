//! One module per subcommand.

pub mod bench;
pub mod db;
pub mod device;
pub mod hw;
pub mod infer;
pub mod lookup;
pub mod replay;
pub mod run;
pub mod tune;
pub mod worker;

use std::path::Path;

use anyhow::{bail, Context};
use kernels::Workload;

/// Parses workload strings, failing on the first bad one with its reason.
pub fn parse_workloads(items: &[String]) -> anyhow::Result<Vec<Workload>> {
    let mut out: Vec<Workload> = Vec::new();
    for s in items {
        let w: Workload = s.parse()?;
        if !out.contains(&w) {
            out.push(w);
        }
    }
    Ok(out)
}

/// Fails with a hint when a database that must already exist does not.
pub fn require_db(path: &Path) -> anyhow::Result<()> {
    match std::fs::metadata(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "database {} not found (run `autokernel tune --db {}` first)",
            path.display(),
            path.display()
        ),
        // A symlink loop, a directory this process may not search, ...: say which.
        Err(e) => bail!("database {}: {e}", path.display()),
    }
}

/// Opens the runtime on `path`, warning on stderr about the records it will not serve (the
/// first [`SKIPPED_SHOWN`], then how many more).
pub fn open_runtime(path: &Path) -> anyhow::Result<runtime::Runtime> {
    let rt = runtime::Runtime::open(path)?;
    let skipped = rt.skipped();
    for s in skipped.iter().take(SKIPPED_SHOWN) {
        eprintln!(
            "warning: {}: not serving the record for {}: {}",
            path.display(),
            s.workload,
            s.reason
        );
    }
    if skipped.len() > SKIPPED_SHOWN {
        eprintln!(
            "warning: {}: ... and {} more record(s) not served on this machine",
            path.display(),
            skipped.len() - SKIPPED_SHOWN
        );
    }
    Ok(rt)
}

/// Skipped records named one per line when a command opens a database.
const SKIPPED_SHOWN: usize = 5;

/// Checks, before any work is done, that files can be written into `dir` (created with its
/// parents if missing): a new probe file is created there and removed. `what` names the
/// flag in the error.
pub fn check_writable_dir(dir: &Path, what: &str) -> anyhow::Result<()> {
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    std::fs::create_dir_all(dir)
        .with_context(|| format!("{what}: cannot create directory {}", dir.display()))?;
    // A new file (never one that exists, nor through a symlink someone planted there).
    tuning_db::probe_dir(dir)
        .with_context(|| format!("{what}: cannot write into {}", dir.display()))
}

/// Checks, before any work is done, that `path` can take a new output file: it does not
/// exist (outputs never overwrite: a mistyped path must not replace a database) and its
/// directory takes files ([`check_writable_dir`]).
pub fn check_new_file(path: &Path, what: &str) -> anyhow::Result<()> {
    if path.exists() {
        bail!(
            "{what} {}: already exists; choose another output path or remove it first",
            path.display()
        );
    }
    check_writable_dir(path.parent().unwrap_or(Path::new(".")), what)
}

/// Checks, before any work is done, that an SVG chart may be written to `path`: a new file,
/// or a previous chart (a file that starts as SVG/XML does) — never anything else, such as
/// a database given by mistake.
pub fn check_chart_file(path: &Path, what: &str) -> anyhow::Result<()> {
    if path.is_dir() {
        bail!("{what} {}: is a directory, not an SVG file", path.display());
    }
    if path.exists() {
        let mut head = [0u8; 5];
        let n = std::io::Read::read(
            &mut std::fs::File::open(path).with_context(|| format!("{what} {}", path.display()))?,
            &mut head,
        )
        .with_context(|| format!("{what} {}", path.display()))?;
        if !(head[..n].starts_with(b"<svg") || head[..n].starts_with(b"<?xml")) {
            bail!(
                "{what} {}: exists and is not an SVG chart; refusing to overwrite it (choose another path)",
                path.display()
            );
        }
    }
    check_writable_dir(path.parent().unwrap_or(Path::new(".")), what)
}

/// Prints one JSON value on its own line.
pub fn print_json(v: &serde_json::Value) -> anyhow::Result<()> {
    println!(
        "{}",
        serde_json::to_string(v).context("serialising output")?
    );
    Ok(())
}
