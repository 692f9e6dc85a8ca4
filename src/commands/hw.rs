//! `autokernel hw`: this machine's fingerprint, and with `--peak` its measured arithmetic
//! peaks.

use std::process::ExitCode;

use clap::Args;
use kernels::cpu::peak::{peak_gflops, Unit};
use kernels::{cpu::Isa, HardwareFingerprint};
use serde_json::json;

#[derive(Args)]
pub struct HwArgs {
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    threads: crate::ThreadsArg,
    /// Also measure the arithmetic peaks on the fingerprint's threads (~3 s): f32 FMA, and
    /// where the CPU has them bf16 `vdpbf16ps`, int8 `vpdpbusd` and AMX `tdpbf16ps` /
    /// `tdpbusd` — what GEMM efficiency is quoted against, and what reduced precision can
    /// gain here.
    #[arg(long)]
    peak: bool,
}

/// Seconds per peak run; the best of [`PEAK_RUNS`] counts (a shared VM takes cores away).
const PEAK_SECONDS: f64 = 0.3;
const PEAK_RUNS: usize = 3;

/// The peaks of `threads` threads, in [`Unit::ALL`]'s order: the best run, or `None` where
/// the CPU (or the ISA cap) lacks the instruction.
fn peaks(threads: usize) -> Vec<(Unit, Option<f64>)> {
    Unit::ALL
        .iter()
        .map(|&u| {
            let best = (0..PEAK_RUNS)
                .filter_map(|_| peak_gflops(u, threads, PEAK_SECONDS))
                .reduce(f64::max);
            (u, best)
        })
        .collect()
}

/// The JSON field of a unit's peak.
fn peak_field(u: Unit) -> &'static str {
    match u {
        Unit::F32Fma => "f32_gflops",
        Unit::Bf16Dot => "bf16_gflops",
        Unit::I8Dot => "int8_gops",
        Unit::AmxBf16 => "amx_bf16_gflops",
        Unit::AmxInt8 => "amx_int8_gops",
    }
}

pub fn run(args: HwArgs) -> anyhow::Result<ExitCode> {
    args.threads.apply()?;
    let fp = HardwareFingerprint::current();
    let peaks = args.peak.then(|| peaks(fp.cores));
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
        if let Some(peaks) = &peaks {
            let mut p = json!({ "threads": fp.cores, "seconds": PEAK_SECONDS, "runs": PEAK_RUNS });
            for &(u, g) in peaks {
                p[peak_field(u)] = g.into();
            }
            v["peak"] = p;
        }
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
        if let Some(peaks) = &peaks {
            let f32 = peaks[0].1.unwrap_or(0.0);
            let line: Vec<String> = peaks
                .iter()
                .map(|&(u, g)| match g {
                    Some(g) if u == Unit::F32Fma => format!("{} {g:.0}", u.name()),
                    Some(g) => format!("{} {g:.0} ({:.1}× f32)", u.name(), g / f32),
                    None => format!("{}: not here", u.name()),
                })
                .collect();
            println!(
                "  peak     {} G(FL)OP/s on {} thread(s), best of {PEAK_RUNS} × {PEAK_SECONDS} s",
                line.join(", "),
                fp.cores
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
