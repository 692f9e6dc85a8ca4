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
    #[command(flatten)]
    precision: crate::PrecisionArg,
    /// Machine-readable output: one JSON object per workload.
    #[arg(long)]
    json: bool,
}

pub fn run(args: LookupArgs) -> anyhow::Result<ExitCode> {
    let workloads = super::parse_workloads(&args.workloads)?;
    super::require_db(&args.db.db)?;
    let gpu = args.device.open()?;
    args.threads.apply()?;
    let policy = args.precision.policy()?;
    args.precision.note_typed(&workloads);
    let rt = super::device::runtime(&args.db.db, gpu.as_ref())?;
    rt.set_precision(policy);
    let device = super::device::name(gpu.as_ref());
    for w in &workloads {
        if args.json {
            super::print_json(&rt.lookup_json(w, &device)?)?;
        } else {
            // What an f32 call of `w` is served as under the policy (`w` itself by default).
            let served = rt.serve_as(w);
            let choice = rt.lookup(&served)?;
            let via = if served == *w {
                String::new()
            } else {
                format!(" served as {served} ({policy}):")
            };
            println!("{w}:{via} {}", describe(&choice, rt.fingerprint()));
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
    let err = c
        .source
        .as_ref()
        .and_then(|s| s.accuracy)
        .map_or(String::new(), |a| {
            format!(", max rel err {:.1e} vs f32", a.max_rel_err)
        });
    format!(
        "{} {} {}{from}{err} [fingerprint {}]",
        c.level,
        c.kernel.name(),
        c.config,
        hw.id
    )
}
