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
        v["cpu_simd"] = Isa::cpu_best().name().into();
        v["isa_cap"] = Isa::cap()?.map(Isa::name).into();
        let levels: Vec<&str> = Isa::ALL
            .iter()
            .filter(|&&i| i <= Isa::cpu_best())
            .map(|i| i.name())
            .collect();
        v["simd_levels"] = levels.into();
        v["amx_refused"] = kernels::amx::state().refused.clone().into();
        super::print_json(&v)?;
    } else {
        if let Some(why) = &kernels::amx::state().refused {
            eprintln!("note: {why}");
        }
        println!("fingerprint {}", fp.id);
        println!(
            "  cpu      {} ({}, family {} model {} stepping {})",
            fp.brand, fp.vendor, fp.family, fp.model, fp.stepping
        );
        let cap = match Isa::cap()? {
            Some(_) => format!(
                ", capped by {}; the CPU runs {}",
                kernels::cpu::ISA_ENV,
                Isa::cpu_best().name()
            ),
            None => String::new(),
        };
        println!(
            "  isa      {} (kernels use {}{cap})",
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
