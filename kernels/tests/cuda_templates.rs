#![cfg(feature = "cuda")]
//! Every CUDA template compiles with the real NVRTC, for sm_80 and sm_90, over a sample of each
//! space: the default config plus seeded random valid configs. NVRTC needs no GPU; the arch
//! is a real one (`sm_XY`), so NVRTC also runs ptxas and inline-PTX mistakes fail here too.
//!
//! Without libnvrtc on the loader's path the tests print why and pass — unless
//! `AUTOKERNEL_REQUIRE_NVRTC` is set (CI sets it, after installing the `nvidia-cuda-nvrtc-cu12`
//! wheel; see `.ci/run`), in which case a missing NVRTC is a failure.

use std::collections::BTreeSet;

use kernels::cuda::{
    compile_source, nvrtc_version, Arch, Attention, AttentionShape, CompileError, GemmBf16,
    GemmF32, GemmShape, Template,
};
use kernels::{Config, Rng};

/// Random configs per (family, shape, arch), besides the default.
const RANDOM_CONFIGS: usize = 10;

fn nvrtc_present() -> bool {
    match nvrtc_version() {
        Ok((major, minor)) => {
            println!("NVRTC {major}.{minor}");
            true
        }
        Err(e) => {
            let required =
                std::env::var("AUTOKERNEL_REQUIRE_NVRTC").is_ok_and(|v| !v.is_empty() && v != "0");
            assert!(!required, "AUTOKERNEL_REQUIRE_NVRTC is set, but {e}");
            println!("skipping: {e}");
            false
        }
    }
}

/// The default config and up to `RANDOM_CONFIGS` distinct random valid ones, seeded.
fn sample<T: Template>(t: &T, shape: &T::Shape, arch: Arch, seed: u64) -> Vec<Config> {
    let space = t.space(shape, arch);
    let default = t.default_config(shape, arch);
    assert_eq!(
        space.check(&default),
        Ok(()),
        "{} default {default}",
        t.name()
    );
    let mut seen = BTreeSet::from([default.clone()]);
    let mut out = vec![default];
    let mut rng = Rng::new(seed);
    for _ in 0..RANDOM_CONFIGS * 4 {
        if out.len() > RANDOM_CONFIGS {
            break;
        }
        let c = space.sample(&mut rng).expect("the space has valid configs");
        if seen.insert(c.clone()) {
            out.push(c);
        }
    }
    out
}

/// Compiles the sample for each shape and CI arch; returns one line per failure, and checks
/// that the PTX holds the kernel entry and, where named, the instructions it must use.
fn compile_family<T: Template>(t: &T, shapes: &[T::Shape], must_contain: &[&str]) -> Vec<String> {
    let mut failures = Vec::new();
    let mut compiled = 0;
    for (i, shape) in shapes.iter().enumerate() {
        for arch in Arch::CI {
            assert!(t.supports(shape, arch), "{} {shape:?} {arch}", t.name());
            let configs = sample(t, shape, arch, 0xC0DE + i as u64);
            for (config, result) in configs.iter().zip(t.compile_many(shape, &configs, arch)) {
                compiled += 1;
                match result {
                    Ok(ptx) => {
                        let text = ptx.to_src();
                        let entry = format!(".entry {}(", t.entry());
                        for needle in
                            std::iter::once(entry.as_str()).chain(must_contain.iter().copied())
                        {
                            if !text.contains(needle) {
                                failures.push(format!(
                                    "{} {arch} {config}: PTX lacks '{needle}'",
                                    t.name()
                                ));
                            }
                        }
                    }
                    Err(e) => failures.push(format!("{} {arch} {config}: {e}", t.name())),
                }
            }
        }
    }
    println!("{}: {compiled} compilations", t.name());
    failures
}

fn assert_none(failures: Vec<String>) {
    assert!(
        failures.is_empty(),
        "{} template compilations failed:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn gemm_f32_compiles_for_sm80_and_sm90() {
    if !nvrtc_present() {
        return;
    }
    // K large enough that every split_k value is in the space; the source does not depend on
    // the shape otherwise (edges are predicated at run time).
    let shapes = [GemmShape::new(1000, 1000, 4096).unwrap()];
    assert_none(compile_family(&GemmF32, &shapes, &["fma.rn.f32"]));
}

#[test]
fn gemm_bf16_compiles_for_sm80_and_sm90() {
    if !nvrtc_present() {
        return;
    }
    let shapes = [GemmShape::new(1000, 1000, 4096).unwrap()];
    assert_none(compile_family(
        &GemmBf16,
        &shapes,
        &[
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
            "ldmatrix.sync.aligned",
        ],
    ));
}

#[test]
fn attention_compiles_for_sm80_and_sm90() {
    if !nvrtc_present() {
        return;
    }
    // The head dimension and the element type are what change the source (causality is a
    // run-time flag): f32 with D = 128 and D = 80 (not a multiple of 32: predicated lanes),
    // bf16 with D = 64.
    let shape = |d, causal| AttentionShape::new(2, 4, 500, 500, d, causal).unwrap();
    let mut failures = compile_family(
        &Attention::F32,
        &[shape(128, true), shape(80, false)],
        &["ex2.approx"],
    );
    failures.extend(compile_family(
        &Attention::BF16,
        &[shape(64, true)],
        &["ex2.approx"],
    ));
    assert_none(failures);
}

/// The pipelined GEMMs really use cp.async on sm_80+, and a one-stage config does not need to.
#[test]
fn pipelined_configs_use_cp_async() {
    if !nvrtc_present() {
        return;
    }
    let shape = GemmShape::new(256, 256, 256).unwrap();
    let mut c = GemmF32.default_config(&shape, Arch::SM80);
    assert!(c.int("stages").unwrap() >= 2);
    let ptx = GemmF32.compile(&shape, &c, Arch::SM80).unwrap().to_src();
    assert!(
        ptx.contains("cp.async.cg.shared.global"),
        "16-byte async copies"
    );
    assert!(ptx.contains("cp.async.wait_group"));
    c.set("vec", 1usize);
    let ptx = GemmF32.compile(&shape, &c, Arch::SM80).unwrap().to_src();
    assert!(
        ptx.contains("cp.async.ca.shared.global"),
        "4-byte async copies"
    );
}

/// A template that does not compile fails with NVRTC's log, naming the problem — for a C++
/// error (front end) and for an inline-PTX error (ptxas, run because the arch is real).
#[test]
fn compile_errors_keep_the_nvrtc_log() {
    if !nvrtc_present() {
        return;
    }
    let shape = GemmShape::new(64, 64, 64).unwrap();
    let config = GemmBf16.default_config(&shape, Arch::SM80);
    let good = GemmBf16.source(&shape, &config).unwrap();

    let planted = good.replace(
        "const int tid = threadIdx.x;",
        "const int tid = threadIdx.x +;",
    );
    assert_ne!(planted, good);
    match compile_source("planted_syntax", &planted, Arch::SM80) {
        Err(CompileError::Nvrtc { log, options, .. }) => {
            assert!(log.contains("error"), "{log}");
            assert!(
                log.contains("planted_syntax.cu"),
                "the log names the source: {log}"
            );
            assert!(
                options.iter().any(|o| o == "--gpu-architecture=sm_80"),
                "{options:?}"
            );
        }
        other => panic!("expected an NVRTC error, got {other:?}"),
    }

    let planted = good.replace("m16n8k16.row.col", "m16n8k15.row.col");
    assert_ne!(planted, good);
    match compile_source("planted_ptx", &planted, Arch::SM90) {
        Err(e @ CompileError::Nvrtc { .. }) => {
            let text = e.to_string();
            assert!(text.contains("ptxas"), "{text}");
            assert!(text.contains("sm_90"), "{text}");
        }
        other => panic!("expected a ptxas error, got {other:?}"),
    }
}
