//! The Rust side of `scripts/bench-python.py`: latency of one `Runtime::gemm` call on a
//! small GEMM (default `gemm:8x64x64`), preallocated buffers, as JSON on stdout.
//!
//! `cargo run --release --example gemm_call_latency -- [DB] [M N K] [ITERS]`

use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = match args.first().filter(|a| a.as_str() != "-") {
        Some(db) => runtime::Runtime::open_or_defaults(db),
        None => runtime::Runtime::defaults_only(),
    };
    let dim = |i: usize, d: usize| args.get(i).map_or(Ok(d), |s| s.parse());
    let (m, n, k) = (dim(1, 8)?, dim(2, 64)?, dim(3, 64)?);
    let iters = dim(4, 200_000)?;
    let a = vec![0.5f32; m * k];
    let b = vec![0.25f32; k * n];
    let mut c = vec![0.0f32; m * n];
    for _ in 0..iters / 10 {
        rt.gemm(m, n, k, &a, &b, &mut c)?;
    }
    let mut samples = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        rt.gemm(m, n, k, &a, &b, &mut c)?;
        samples.push(t.elapsed().as_secs_f64());
    }
    samples.sort_by(f64::total_cmp);
    let q = |p: f64| samples[((samples.len() - 1) as f64 * p) as usize] * 1e6;
    println!(
        "{{\"workload\":\"gemm:{m}x{n}x{k}\",\"iters\":{iters},\"p50_us\":{},\"p90_us\":{},\"level\":\"{}\"}}",
        q(0.5),
        q(0.9),
        rt.lookup(&kernels::Workload::gemm(m, n, k)?)?.level
    );
    Ok(())
}
