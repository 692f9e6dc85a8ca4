//! Quick GEMM speed harness: median GFLOP/s of one config, or a sweep over a space.
//!
//! ```text
//! cargo run --release -p kernels --example gemm_speed -- 1024x1024x1024
//!     default family + config for the shape
//! cargo run --release -p kernels --example gemm_speed -- 128x768x768 gemm_packed '{"ukernel":"avx2_6x16","mc":144,"kc":256,"nc":1024,"par":"none","threads":1}'
//!     one config (checked against the space)
//! cargo run --release -p kernels --example gemm_speed -- 128x768x768 gemm_packed '{"par":"none"}' --sweep
//!     every valid config that agrees with the partial config, fastest last
//! cargo run --release -p kernels --example gemm_speed -- peak [threads]
//!     the FMA peak
//! ```
//! Shapes are M×N×K. Every measured config is first checked against the f64 reference.

use std::time::Instant;

use kernels::cpu::peak::fma_peak_gflops;
use kernels::{default_for, kernel, Config, Executable, HardwareFingerprint, Problem, Workload};

/// Median GFLOP/s over `samples` samples of at least `min_secs` each.
fn measure(exe: &dyn Executable, p: &Problem, samples: usize, min_secs: f64) -> f64 {
    let inputs = p.input_slices();
    let mut c = p.output();
    exe.run_f32(&inputs, &mut c).unwrap();
    // Calibrate repetitions per sample.
    let t = Instant::now();
    exe.run_f32(&inputs, &mut c).unwrap();
    let one = t.elapsed().as_secs_f64().max(1e-7);
    let reps = ((min_secs / one).ceil() as usize).max(1);
    let mut rates: Vec<f64> = (0..samples)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..reps {
                exe.run_f32(&inputs, &mut c).unwrap();
            }
            p.workload.flops() * reps as f64 / t.elapsed().as_secs_f64() / 1e9
        })
        .collect();
    rates.sort_by(|a, b| a.total_cmp(b));
    rates[rates.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let hw = HardwareFingerprint::current();
    if args.first().map(String::as_str) == Some("peak") {
        let threads = args.get(1).and_then(|t| t.parse().ok()).unwrap_or(1);
        let runs: Vec<f64> = (0..3).map(|_| fma_peak_gflops(threads, 0.5)).collect();
        println!("FMA peak, {threads} thread(s): {runs:.1?} GFLOP/s");
        return;
    }
    let shape = args
        .first()
        .expect("usage: gemm_speed MxNxK [family [config-json [--sweep]]] | peak [threads]");
    let w: Workload = format!("gemm:{shape}").parse().expect("shape MxNxK");
    let p = Problem::random(&w, 1);
    let reference = p.reference();
    let sweep = args.iter().any(|a| a == "--sweep");
    let (family, config) = match args.get(1) {
        None => {
            let (k, c) = default_for(&w, hw).unwrap();
            (k, c)
        }
        Some(name) => {
            let k = kernel(name).expect("family name");
            let c = match args.get(2) {
                Some(j) if !j.starts_with("--") => Config::from_json(j).expect("config JSON"),
                _ => k.default_config(&w, hw),
            };
            (k, c)
        }
    };
    let check = |exe: &dyn Executable| {
        let mut c = p.output();
        exe.run_f32(&p.input_slices(), &mut c).unwrap();
        p.check(&c, &reference)
            .expect("result matches the reference");
    };
    if !sweep {
        let exe = family.prepare(&w, &config).expect("valid config");
        check(exe.as_ref());
        let runs: Vec<f64> = (0..3).map(|_| measure(exe.as_ref(), &p, 9, 0.05)).collect();
        println!(
            "{w} {} {config}: {:.1} GFLOP/s (runs {runs:.1?})",
            family.name(),
            median(&runs)
        );
        return;
    }
    let space = family.space(&w, hw);
    let mut results: Vec<(f64, Config)> = space
        .iter_valid()
        .filter(|c| config.0.iter().all(|(k, v)| c.get(k) == Some(v)))
        .map(|c| {
            let exe = family.prepare(&w, &c).expect("valid config");
            check(exe.as_ref());
            (measure(exe.as_ref(), &p, 5, 0.01), c)
        })
        .collect();
    results.sort_by(|a, b| a.0.total_cmp(&b.0));
    for (g, c) in results.iter().rev().take(12).rev() {
        println!("{g:7.1} GFLOP/s  {c}");
    }
    println!(
        "{} configs swept for {w} ({})",
        results.len(),
        family.name()
    );
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}
