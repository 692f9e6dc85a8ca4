//! `autokernel lookup`: which variant the runtime would serve.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use runtime::Runtime;
use serde_json::json;

#[derive(Args)]
pub struct LookupArgs {
    /// Workload, e.g. gemm:128x768x768 (M×N×K).
    #[arg(long, value_name = "W")]
    workload: String,
    #[command(flatten)]
    db: crate::DbArg,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

pub fn run(args: LookupArgs) -> anyhow::Result<ExitCode> {
    let w: kernels::Workload = args.workload.parse()?;
    super::require_db(&args.db.db)?;
    let rt =
        Runtime::open(&args.db.db).with_context(|| format!("opening {}", args.db.db.display()))?;
    for s in rt.skipped() {
        eprintln!(
            "warning: skipped the record for {}: {}",
            s.workload, s.reason
        );
    }
    let choice = rt.choose(&w)?;
    if args.json {
        super::print_json(&json!({
            "workload": w.key(),
            "level": choice.level.as_str(),
            "kernel": choice.kernel.name(),
            "kernel_version": choice.kernel.version(),
            "config": choice.config,
            "fingerprint": rt.fingerprint().id,
        }))?;
    } else {
        println!(
            "{w}: {} {} {} (fingerprint {})",
            choice.level,
            choice.kernel.name(),
            choice.config,
            rt.fingerprint().id
        );
    }
    Ok(ExitCode::SUCCESS)
}
