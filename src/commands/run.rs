//! `autokernel run`: run a workload through the runtime's choice on its device, check it,
//! time it.

use std::process::ExitCode;

use anyhow::bail;
use clap::Args;
use kernels::Status;
use runner::Protocol;
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
    #[command(flatten)]
    precision: crate::PrecisionArg,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let w: kernels::Workload = args.workload.parse()?;
    super::require_db(&args.db.db)?;
    let gpu = args.device.open()?;
    args.threads.apply()?;
    let policy = args.precision.policy()?;
    args.precision.note_typed(&[w]);
    let rt = super::device::runtime(&args.db.db, gpu.as_ref())?;
    rt.set_precision(policy);
    // The workload as the runtime serves an f32 call of it under the policy.
    let asked = w;
    let w = rt.serve_as(&w);
    let choice = rt.choose(&w)?;
    // The chosen config verified against the reference, then timed by the thorough protocol,
    // by the device's evaluator (on a GPU: CUDA events with an L2 flush).
    let mut ev = super::device::evaluator(gpu.as_ref());
    ev.setup(&w, 0xA0C0)?;
    let outcome = ev
        .evaluate(choice.kernel, &choice.config, &Protocol::thorough())?
        .outcome;
    let accuracy = outcome.accuracy;
    let m = match (outcome.status, outcome.measurement) {
        (Status::Ok, Some(m)) => m,
        (status, _) => bail!(
            "{} {} on {w}: {status}: {}",
            choice.kernel.name(),
            choice.config,
            outcome.message.unwrap_or_default()
        ),
    };
    let gflops = m.gflops(w.flops());
    if args.json {
        super::print_json(&json!({
            "workload": asked.key(),
            "served_as": w.key(),
            "precision": rt.precision().to_string(),
            "dtype": w.dtype(),
            "device": super::device::name(gpu.as_ref()),
            "level": choice.level.as_str(),
            "kernel": choice.kernel.name(),
            "config": choice.config,
            "source_workload": choice.source.as_ref().map(|s| s.workload.key()),
            "median_s": m.median_s,
            "gflops": gflops,
            "spread": m.spread,
            "samples": m.samples.len(),
            "threads": rt.fingerprint().cores,
            "fingerprint": rt.fingerprint().id,
            "max_rel_err_vs_f32": accuracy.map(|a| a.max_rel_err),
            "fro_rel_err_vs_f32": accuracy.map(|a| a.fro_rel_err),
        }))?;
    } else {
        println!(
            "{w}: {:.3} ms median, {gflops:.1} GFLOP/s (±{:.1}% MAD, {} samples) via {} {} [{}] on {}",
            m.median_s * 1e3,
            m.spread * 100.0,
            m.samples.len(),
            choice.kernel.name(),
            choice.config,
            choice.level,
            super::device::describe(gpu.as_ref(), rt.fingerprint())
        );
        if let (Some(a), true) = (accuracy, w.dtype() != kernels::DType::F32) {
            println!(
                "  error vs the f32 problem: max {:.2e} (relative to max |C|), Frobenius {:.2e}",
                a.max_rel_err, a.fro_rel_err
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
