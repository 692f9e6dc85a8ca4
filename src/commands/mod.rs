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
    if !path.exists() {
        bail!(
            "database {} not found (run `autokernel tune --db {}` first)",
            path.display(),
            path.display()
        );
    }
    Ok(())
}

/// Opens the runtime on `path`, warning on stderr about each record it will not serve.
pub fn open_runtime(path: &Path) -> anyhow::Result<runtime::Runtime> {
    let rt = runtime::Runtime::open(path)?;
    for s in rt.skipped() {
        eprintln!(
            "warning: {}: not serving the record for {}: {}",
            path.display(),
            s.workload,
            s.reason
        );
    }
    Ok(rt)
}

/// Prints one JSON value on its own line.
pub fn print_json(v: &serde_json::Value) -> anyhow::Result<()> {
    println!(
        "{}",
        serde_json::to_string(v).context("serialising output")?
    );
    Ok(())
}
