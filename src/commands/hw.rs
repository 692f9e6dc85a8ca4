//! `autokernel hw`: this machine's fingerprint.

use std::process::ExitCode;

use clap::Args;
use kernels::{cpu::Isa, HardwareFingerprint};

#[derive(Args)]
pub struct HwArgs {
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    threads: crate::ThreadsArg,
}

pub fn run(args: HwArgs) -> anyhow::Result<ExitCode> {
    args.threads.apply()?;
    let fp = HardwareFingerprint::current();
    if args.json {
        let mut v = serde_json::to_value(fp)?;
        v["simd"] = Isa::detect().name().into();
        super::print_json(&v)?;
    } else {
        println!("fingerprint {}", fp.id);
        println!(
            "  cpu      {} ({}, family {} model {} stepping {})",
            fp.brand, fp.vendor, fp.family, fp.model, fp.stepping
        );
        println!(
            "  isa      {} (kernels use {})",
            fp.isa.join(" "),
            Isa::detect().name()
        );
        println!("  threads  {}", fp.cores);
        println!(
            "  caches   L1d {} KiB, L2 {} KiB, L3 {} MiB",
            fp.l1d_bytes >> 10,
            fp.l2_bytes >> 10,
            fp.l3_bytes >> 20
        );
    }
    Ok(ExitCode::SUCCESS)
}
