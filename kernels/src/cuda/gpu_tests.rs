//! Tests that run the templates on a real GPU: compile, launch, verify (cuBLAS / f64
//! reference), time. Without a CUDA device — or without NVRTC — each prints
//! `skipping: ...` and passes; they never fail for lack of a GPU.

use std::time::Duration;

use crate::measurement::Status;
use crate::rng::Rng;
use crate::space::Config;

use super::*;

/// A short protocol: the point here is correctness, not a tight median.
fn timing() -> GpuTiming {
    GpuTiming {
        warmup: Duration::from_millis(1),
        min_samples: 3,
        max_samples: 5,
        max_time: Duration::from_millis(50),
        target_ci: 0.5,
        flush_l2: true,
    }
}

/// Device 0 with NVRTC, or `None` after saying why the test is skipped.
fn gpu_or_skip() -> Option<Gpu> {
    let gpu = match Gpu::open(0) {
        Ok(gpu) => gpu,
        Err(e) => {
            println!("skipping: no CUDA device ({e})");
            return None;
        }
    };
    if let Err(e) = nvrtc_version() {
        let required =
            std::env::var("AUTOKERNEL_REQUIRE_NVRTC").is_ok_and(|v| !v.is_empty() && v != "0");
        assert!(!required, "AUTOKERNEL_REQUIRE_NVRTC is set, but {e}");
        println!("skipping: a CUDA device but no NVRTC ({e})");
        return None;
    }
    println!("{}", gpu.fingerprint().summary());
    Some(gpu)
}

/// The default and `n` seeded random configs of a space.
fn configs<T: Template>(t: &T, shape: &T::Shape, arch: Arch, n: usize) -> Vec<Config> {
    let space = t.space(shape, arch);
    let mut rng = Rng::new(17);
    let mut out = vec![t.default_config(shape, arch)];
    out.extend((0..n).filter_map(|_| space.sample(&mut rng)));
    out
}

fn assert_ok(what: &str, config: &Config, outcome: &GpuOutcome) {
    assert_eq!(
        outcome.status,
        Status::Ok,
        "{what} {config}: {}",
        outcome.message.as_deref().unwrap_or("")
    );
    let m = outcome.measurement.as_ref().expect("a timed outcome");
    assert!(m.median_s > 0.0 && m.samples.len() >= 3);
    println!("{what} {config}: {:.1} µs", m.median_s * 1e6);
}

const GEMM_SHAPES: [(usize, usize, usize); 6] = [
    (1, 1, 1),
    (33, 65, 67),
    (1, 768, 3072),
    (128, 256, 512),
    (255, 257, 1031),
    (512, 512, 512),
];

fn gemm_family_verifies(dtype: GemmDtype) {
    let Some(gpu) = gpu_or_skip() else { return };
    for (m, n, k) in GEMM_SHAPES {
        let shape = GemmShape::new(m, n, k).unwrap();
        let mut problem = GemmProblem::new(&gpu, shape, dtype, 1).unwrap();
        let configs = match dtype {
            GemmDtype::F32 => configs(&GemmF32, &shape, gpu.arch(), 4),
            GemmDtype::Bf16 => configs(&GemmBf16, &shape, gpu.arch(), 4),
        };
        for c in configs {
            let outcome = problem.evaluate(&gpu, &c, &timing());
            assert_ok(&format!("gemm {dtype:?} {m}x{n}x{k}"), &c, &outcome);
        }
    }
}

#[test]
fn gemm_f32_configs_verify_against_cublas() {
    gemm_family_verifies(GemmDtype::F32);
}

#[test]
fn gemm_bf16_configs_verify_against_cublas() {
    let Some(gpu) = gpu_or_skip() else { return };
    if !gpu.arch().has_bf16_mma() {
        println!("skipping: {} has no bf16 tensor-core mma", gpu.arch());
        return;
    }
    gemm_family_verifies(GemmDtype::Bf16);
}

#[test]
fn attention_configs_verify_against_the_f64_reference() {
    let Some(gpu) = gpu_or_skip() else { return };
    let shapes = [
        (1, 1, 1, 1, 1, false),
        (2, 3, 17, 33, 64, true),
        (1, 4, 100, 60, 80, true),
        (1, 2, 130, 130, 128, true),
        (1, 1, 64, 200, 256, false),
    ];
    for family in [Attention::F32, Attention::BF16] {
        for (b, h, sq, sk, d, causal) in shapes {
            let shape = AttentionShape::new(b, h, sq, sk, d, causal).unwrap();
            if !family.supports(&shape, gpu.arch()) {
                continue;
            }
            let mut problem = AttentionProblem::new(&gpu, shape, family, 2).unwrap();
            for c in configs(&family, &shape, gpu.arch(), 3) {
                let outcome = problem.evaluate(&gpu, &c, &timing());
                assert_ok(&format!("{} {shape:?}", family.name()), &c, &outcome);
            }
        }
    }
}

/// Failures are data: a config outside the space is `build_failed` (with the reason), and a
/// corrupted output is caught by the verification.
#[test]
fn failures_become_outcomes() {
    let Some(gpu) = gpu_or_skip() else { return };
    let shape = GemmShape::new(64, 64, 64).unwrap();
    let mut problem = GemmProblem::new(&gpu, shape, GemmDtype::F32, 3).unwrap();
    let mut bad = GemmF32.default_config(&shape, gpu.arch());
    bad.set("wm", 128usize);
    let outcome = problem.evaluate(&gpu, &bad, &timing());
    assert_eq!(outcome.status, Status::BuildFailed);
    assert!(outcome.message.unwrap().contains("tiles_nest"));

    let good = GemmF32.default_config(&shape, gpu.arch());
    let loaded = gpu.load(&GemmF32, &shape, &good).unwrap();
    problem.launch(&gpu, &loaded).unwrap();
    gpu.synchronize().unwrap();
    let mut c = problem.output(&gpu).unwrap();
    assert_eq!(problem.compare(&c), Ok(()));
    c[100] += 1.0;
    let m = problem.compare(&c).unwrap_err();
    assert_eq!((m.index, m.row, m.col, m.bad), (100, 1, 36, 1));
}

#[test]
fn fingerprint_and_timing_on_the_device() {
    let Some(gpu) = gpu_or_skip() else { return };
    let fp = gpu.fingerprint();
    assert!(fp.id_is_consistent());
    assert!(fp.sm_count > 0 && fp.memory_bytes > 0 && gpu.l2_bytes() > 0);
    assert_eq!(fp.compute_capability, gpu.arch());
    gpu.flush_l2().unwrap();
    let m = gpu.time(&timing(), || gpu.flush_l2()).unwrap();
    assert!(m.median_s > 0.0);
}
