//! Quick GEMM speed harness: median GFLOP/s of one config, or a sweep over a space.
//!
//! ```text
//! cargo run --release -p kernels --example gemm_speed -- 1024x1024x1024
//!     default family + config for the shape
//! cargo run --release -p kernels --example gemm_speed -- 128x768x768 gemm_packed '{"ukernel":"avx2_6x16","mc":144,"kc":256,"nc":1024,"par":"none","threads":1}'
//!     one config (checked against the space); knobs left out take the default config's values
//! cargo run --release -p kernels --example gemm_speed -- 128x768x768 gemm_packed '{"par":"none"}' --sweep
//!     every valid config that agrees with the partial config, fastest last
//! cargo run --release -p kernels --example gemm_speed -- 128x768x768:i8 gemm_i8 '{"threads":1,"par":"none"}' --vs '{"ukernel":"avx2_4x16"}'
//!     A/B: the second config (its knobs over the first) against the first, in alternating
//!     samples; prints the median ratio (the only comparison a shared VM's drift leaves alone)
//! cargo run --release -p kernels --example gemm_speed -- peak [threads]
//!     the arithmetic peaks: f32 FMA, and vdpbf16ps / vpdpbusd where the CPU has them
//! ```
//! Shapes are M×N×K (`gemm:`), or give a whole workload key. `--qkv-rows` times attention
//! on BERT's layout (one `[B·S, 3·H·D]` matrix in), as the runtime's encoder calls it. Every measured config is first checked against the f64 reference.

use std::time::Instant;

use kernels::cpu::peak::{peak_gflops, Unit};
use kernels::{default_for, kernel, Config, Executable, HardwareFingerprint, Problem, Workload};

/// GFLOP/s of `samples` samples of at least `min_secs` each, slowest first. With
/// `qkv_rows`, attention runs on BERT's layout: one `[B·S, 3·H·D]` matrix of Q, K and V rows
/// in, `[B·S, H·D]` out (what the runtime's encoder calls), instead of `[B, H, S, D]` operands.
fn rates(
    exe: &dyn Executable,
    p: &Problem,
    qkv_rows: bool,
    samples: usize,
    min_secs: f64,
) -> Vec<f64> {
    let inputs = p.input_slices();
    let mut c = p.output();
    let qkv: Vec<f32> = if qkv_rows {
        (0..3 * c.len())
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect()
    } else {
        Vec::new()
    };
    let mut call = || match qkv_rows {
        true => exe
            .run_qkv_rows(&qkv, None, &mut c)
            .expect("--qkv-rows: an attention workload")
            .unwrap(),
        false => exe.run_f32(&inputs, &mut c).unwrap(),
    };
    call();
    // Calibrate repetitions per sample.
    let t = Instant::now();
    call();
    let one = t.elapsed().as_secs_f64().max(1e-7);
    let reps = ((min_secs / one).ceil() as usize).max(1);
    let mut rates: Vec<f64> = (0..samples)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..reps {
                call();
            }
            p.workload.flops() * reps as f64 / t.elapsed().as_secs_f64() / 1e9
        })
        .collect();
    rates.sort_by(|a, b| a.total_cmp(b));
    rates
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let hw = HardwareFingerprint::current();
    if args.first().map(String::as_str) == Some("peak") {
        let threads = args.get(1).and_then(|t| t.parse().ok()).unwrap_or(1);
        for unit in Unit::ALL {
            let runs: Option<Vec<f64>> = (0..3).map(|_| peak_gflops(unit, threads, 0.5)).collect();
            match runs {
                Some(runs) => println!(
                    "{} peak, {threads} thread(s): {runs:.1?} G(FL)OP/s",
                    unit.name()
                ),
                None => println!(
                    "{} peak: skipped, not available (the CPU or AUTOKERNEL_ISA)",
                    unit.name()
                ),
            }
        }
        return;
    }
    let shape = args
        .first()
        .expect("usage: gemm_speed MxNxK [family [config-json [--sweep]]] | peak [threads]");
    // A whole workload key (`gemm_bias_gelu_erf:128x3072x768:i8`) or a GEMM shape.
    let w: Workload = shape
        .parse()
        .or_else(|_| format!("gemm:{shape}").parse())
        .expect("a workload key or a shape MxNxK");
    let p = Problem::random(&w, 1);
    let reference = p.reference();
    let sweep = args.iter().any(|a| a == "--sweep");
    let qkv = args.iter().any(|a| a == "--qkv-rows");
    let (family, config) = match args.get(1) {
        None => {
            let (k, c) = default_for(&w, hw).unwrap();
            (k, c)
        }
        Some(name) => {
            let k = kernel(name).expect("family name");
            let mut c = k.default_config(&w, hw);
            if let Some(j) = args.get(2).filter(|j| !j.starts_with("--")) {
                // A partial config: its knobs replace the default's; sweeps filter on them.
                let given = Config::from_json(j).expect("config JSON");
                if sweep {
                    c = given;
                } else {
                    for (name, value) in given.0 {
                        c.set(&name, value);
                    }
                }
            }
            (k, c)
        }
    };
    // A partial config merged over the default may break a rule (e.g. `{"threads":1}` with
    // the default's parallel split): say which, instead of a panic.
    let prepare = |c: &Config| {
        family.prepare(&w, c).unwrap_or_else(|e| {
            eprintln!("gemm_speed: {e}");
            std::process::exit(2)
        })
    };
    let check = |exe: &dyn Executable| {
        let mut c = p.output();
        exe.run_f32(&p.input_slices(), &mut c).unwrap();
        p.check(&c, &reference)
            .expect("result matches the reference");
    };
    if let Some(other) = args.iter().position(|a| a == "--vs").map(|i| &args[i + 1]) {
        // A/B: the partial config `other` over this one, alternating short samples; the
        // median of the paired ratios cancels the drift of a shared machine's speed.
        let mut config_b = config.clone();
        for (name, value) in Config::from_json(other).expect("config JSON").0 {
            config_b.set(&name, value);
        }
        let (a, b) = (prepare(&config), prepare(&config_b));
        check(a.as_ref());
        check(b.as_ref());
        let pairs: Vec<(f64, f64)> = (0..41)
            .map(|_| {
                let ra = median(&rates(a.as_ref(), &p, qkv, 1, 0.02));
                (ra, median(&rates(b.as_ref(), &p, qkv, 1, 0.02)))
            })
            .collect();
        let ratio: Vec<f64> = pairs.iter().map(|(a, b)| b / a).collect();
        let (ra, rb): (Vec<f64>, Vec<f64>) = pairs.into_iter().unzip();
        println!(
            "{w} {}\n  A {config}: {:.1} GFLOP/s\n  B {config_b}: {:.1} GFLOP/s\n  B/A {:.3} (median of 41 alternating pairs)",
            family.name(),
            median(&ra),
            median(&rb),
            median(&ratio)
        );
        return;
    }
    if !sweep {
        let exe = prepare(&config);
        check(exe.as_ref());
        let runs: Vec<f64> = (0..3)
            .map(|_| median(&rates(exe.as_ref(), &p, qkv, 9, 0.05)))
            .collect();
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
            (median(&rates(exe.as_ref(), &p, qkv, 5, 0.01)), c)
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
