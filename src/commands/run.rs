//! `autokernel run`: run a workload through the runtime, check it, time it.

use std::process::ExitCode;

use anyhow::bail;
use clap::Args;
use kernels::Problem;
use runner::{measure, verify, Protocol};
use serde_json::json;

#[derive(Args)]
pub struct RunArgs {
    /// Workload, e.g. gemm:128x768x768 (M×N×K).
    #[arg(long, value_name = "W")]
    workload: String,
    #[command(flatten)]
    db: crate::DbArg,
    #[command(flatten)]
    threads: crate::ThreadsArg,
    #[command(flatten)]
    device: super::device::DeviceArg,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let w: kernels::Workload = args.workload.parse()?;
    super::require_db(&args.db.db)?;
    if let Some(n) = args.device.cuda() {
        super::device::run(&args.db.db, &w, n, args.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    args.threads.apply()?;
    let rt = super::open_runtime(&args.db.db)?;
    let choice = rt.choose(&w)?;
    let problem = Problem::try_random(&w, 0xA0C0)?;
    let reference = problem.reference();
    let exe = RuntimeExe(&choice);
    if let Err(failure) = verify(&exe, &problem, &reference) {
        bail!(
            "{} {} gave a wrong result: {}",
            choice.kernel.name(),
            choice.config,
            failure.message.unwrap_or_default()
        );
    }
    let m = measure(&exe, &problem, &Protocol::thorough());
    let gflops = m.gflops(w.flops());
    if args.json {
        super::print_json(&json!({
            "workload": w.key(),
            "level": choice.level.as_str(),
            "kernel": choice.kernel.name(),
            "config": choice.config,
            "source_workload": choice.source.as_ref().map(|s| s.workload.key()),
            "median_s": m.median_s,
            "gflops": gflops,
            "spread": m.spread,
            "samples": m.samples.len(),
            "threads": rt.fingerprint().cores,
        }))?;
    } else {
        println!(
            "{w}: {:.3} ms median, {gflops:.1} GFLOP/s (±{:.1}% MAD, {} samples) via {} {} [{}]",
            m.median_s * 1e3,
            m.spread * 100.0,
            m.samples.len(),
            choice.kernel.name(),
            choice.config,
            choice.level
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Lets the runner's protocol time exactly what the runtime dispatches.
struct RuntimeExe<'a>(&'a runtime::Choice);

impl kernels::Executable for RuntimeExe<'_> {
    fn run(&self, inputs: &[&[f32]], output: &mut [f32]) {
        self.0.run(inputs, output)
    }
}
