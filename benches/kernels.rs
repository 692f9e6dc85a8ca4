//! Every kernel family in the registry at its default config, on a few shapes each: the fast
//! local benchmark to run after touching a kernel (about a minute on 2 cores).
//!
//! ```text
//! cargo bench --bench kernels                       # all families, all shapes
//! cargo bench --bench kernels -- gemm_direct        # one family (criterion filter)
//! ```
//!
//! One criterion group per family (`kernels::registry()`), one benchmark per shape the family
//! supports from [`SHAPES`], throughput in FLOP (criterion prints FLOP/s as elem/s). Each
//! shape's output is verified against the f64 reference before it is timed. A family that
//! supports none of the shapes is reported, so a new family cannot be skipped silently: add
//! shapes for it here.

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use kernels::{registry, HardwareFingerprint, Problem, Workload};

/// Candidate shapes; each family is benchmarked on those it supports.
const SHAPES: [&str; 7] = [
    "gemm:1x768x768",
    "gemm:8x3072x768",
    "gemm:32x768x768",
    "gemm:64x64x64",
    "gemm:128x768x768",
    "gemm:256x256x256",
    "gemm:512x512x512",
];

/// At most this many shapes per family, to keep the run short.
const PER_FAMILY: usize = 4;

fn main() {
    let hw = HardwareFingerprint::current();
    let shapes: Vec<Workload> = SHAPES
        .iter()
        .map(|s| s.parse().expect("static shape"))
        .collect();
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    for kernel in registry() {
        let supported: Vec<&Workload> = shapes
            .iter()
            .filter(|w| kernel.supports(w))
            .take(PER_FAMILY)
            .collect();
        if supported.is_empty() {
            eprintln!(
                "warning: no shape in benches/kernels.rs for kernel family {}",
                kernel.name()
            );
            continue;
        }
        let mut g = c.benchmark_group(kernel.name());
        for w in supported {
            let config = kernel.default_config(w, hw);
            let exe = kernel
                .prepare(w, &config)
                .unwrap_or_else(|e| panic!("{} default for {w}: {e}", kernel.name()));
            let p = Problem::random(w, 5);
            let inputs = p.input_slices();
            let mut out = p.output();
            exe.run_f32(&inputs, &mut out).unwrap();
            p.check(&out, &p.reference())
                .unwrap_or_else(|e| panic!("{} default on {w}: {e}", kernel.name()));
            g.throughput(Throughput::Elements(w.flops() as u64));
            g.bench_function(BenchmarkId::new("default", w.key()), |b| {
                b.iter(|| exe.run_f32(&inputs, &mut out).unwrap())
            });
        }
        g.finish();
    }
    c.final_summary();
}
