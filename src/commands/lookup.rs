//! `autokernel lookup`: which variant the runtime would serve, and which level answered
//! (`exact`, `same_arch`, `nearest_shape` or `default`).

use std::process::ExitCode;

use clap::Args;
use runtime::Choice;

#[derive(Args)]
pub struct LookupArgs {
    /// Workload, e.g. gemm:128x768x768 (M×N×K); repeat for several.
    #[arg(long = "workload", value_name = "W", required = true)]
    workloads: Vec<String>,
    #[command(flatten)]
    db: crate::DbArg,
    #[command(flatten)]
    threads: crate::ThreadsArg,
    #[command(flatten)]
    device: super::device::DeviceArg,
    /// Machine-readable output: one JSON object per workload.
    #[arg(long)]
    json: bool,
}

pub fn run(args: LookupArgs) -> anyhow::Result<ExitCode> {
    let workloads = super::parse_workloads(&args.workloads)?;
    super::require_db(&args.db.db)?;
    let gpu = args.device.open()?;
    args.threads.apply()?;
    let rt = super::device::runtime(&args.db.db, gpu.as_ref())?;
    let device = super::device::name(gpu.as_ref());
    for w in &workloads {
        let choice = rt.lookup(w)?;
        if args.json {
            super::print_json(&choice.to_json(w, &rt, &device))?;
        } else {
            println!("{w}: {}", describe(&choice, rt.fingerprint()));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One-line human description of a choice.
pub fn describe(c: &Choice, hw: &kernels::HardwareFingerprint) -> String {
    let from = match (&c.source, c.level) {
        (Some(s), runtime::Level::NearestShape) => format!(
            " (config of {} on {}, log2 distance {:.3})",
            s.workload, s.fingerprint_id, s.distance
        ),
        (Some(s), runtime::Level::SameArch) => {
            format!(
                " (record of {} of the same micro-architecture)",
                s.fingerprint_id
            )
        }
        _ => String::new(),
    };
    format!(
        "{} {} {}{from} [fingerprint {}]",
        c.level,
        c.kernel.name(),
        c.config,
        hw.id
    )
}
