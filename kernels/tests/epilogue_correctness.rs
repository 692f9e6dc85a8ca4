//! `gemm_bias` / `gemm_bias_relu` / `gemm_bias_gelu` / `gemm_bias_gelu_erf` against the f64
//! reference: every micro-kernel, both fusions, both weight layouts, every thread split,
//! awkward shapes; and the vectorised GELUs (tanh and erf forms) against their f64
//! definitions over a wide range of inputs.

use kernels::cpu::gemm::epilogue::{EpilogueDirect, EpilogueGemm, EpiloguePacked};
use kernels::cpu::gemm::ukernel::{self, bias_act_row};
use kernels::{Act, Config, HardwareFingerprint, Kernel, Problem, Workload};

/// Says which ISA level these tests ran at and which they skipped, in every run; an invalid
/// `AUTOKERNEL_ISA` fails here.
#[test]
fn isa_level_under_test() {
    kernels::cpu::announce_level("epilogue_correctness").unwrap();
}

fn check_config(kernel: &dyn Kernel, w: &Workload, c: &Config, p: &Problem) {
    let r = p.reference();
    let exe = kernel
        .build(w, c)
        .unwrap_or_else(|e| panic!("{} {w} {c}: {e}", kernel.name()));
    // Twice: the pre-packed weight is reused by the second call.
    for _ in 0..2 {
        let mut out = vec![f32::NAN; w.output_len()];
        exe.run_f32(&p.input_slices(), &mut out).unwrap();
        p.check(&out, &r)
            .unwrap_or_else(|e| panic!("{} {w} {c}: {e}", kernel.name()));
    }
}

#[test]
fn packed_epilogues_for_every_ukernel_fusion_layout_and_split() {
    let hw = HardwareFingerprint::current();
    for text in [
        "gemm_bias_gelu:1x1x1",
        "gemm_bias:1x1x1",
        "gemm_bias_relu:13x17x300",
        "gemm_bias:29x41x70",
        "gemm_bias_gelu:50x37x19",
        "gemm_bias_gelu:7x100x64",
        // One or many row tiles, partial tiles, one or many column panels (a partial last
        // one), several depth and column blocks: the pre-packed B path prefetches the next
        // panel a slice per row tile.
        "gemm_bias_gelu:7x67x5",
        "gemm_bias_gelu:13x65x63",
        "gemm_bias_gelu:63x17x67",
        "gemm_bias_gelu:65x131x1",
        "gemm_bias_gelu:67x33x129",
        "gemm_bias_gelu:2x47x67",
        "gemm_bias_gelu:37x16x3",
        "gemm_bias_gelu_erf:1x1x1",
        "gemm_bias_gelu_erf:13x65x63",
        "gemm_bias_gelu_erf:37x16x3",
    ] {
        let w: Workload = text.parse().unwrap();
        let p = Problem::random(&w, 3);
        for uk in ukernel::packed_available() {
            for (fusion, layout, a_layout) in [
                ("fused", "prepacked", "packed"),
                ("fused", "prepacked", "inplace"),
                ("fused", "rowmajor", "inplace"),
                ("separate", "prepacked", "packed"),
                ("separate", "rowmajor", "packed"),
                ("fused", "inplace", "packed"),
                ("separate", "inplace", "inplace"),
            ] {
                for (par, t, nc) in [
                    ("none", 1usize, 512usize),
                    ("m", 2, 512),
                    ("m", 2, 32),
                    ("n", 2, 32),
                ] {
                    let mut c = EpiloguePacked.default_config(&w, hw);
                    c.set("ukernel", uk.name.as_str());
                    // Small blocks, so several depth blocks and column blocks are used.
                    c.set("kc", 64usize);
                    c.set("mc", 24usize);
                    c.set("nc", nc);
                    c.set("fusion", fusion);
                    c.set("b_layout", layout);
                    c.set("a_layout", a_layout);
                    c.set("par", par);
                    c.set("threads", t);
                    check_config(&EpiloguePacked, &w, &c, &p);
                }
            }
        }
    }
}

#[test]
fn direct_epilogues_for_every_ukernel_and_fusion() {
    let hw = HardwareFingerprint::current();
    for text in [
        "gemm_bias_gelu:1x70x33",
        "gemm_bias:2x70x33",
        "gemm_bias_relu:5x9x100",
        "gemm_bias_gelu:3x16x8",
        "gemm_bias_gelu_erf:1x70x33",
        "gemm_bias_gelu_erf:3x16x8",
    ] {
        let w: Workload = text.parse().unwrap();
        let p = Problem::random(&w, 8);
        for uk in ukernel::direct_available() {
            for fusion in ["fused", "separate"] {
                for kc in [0usize, 8] {
                    let mut c = EpilogueDirect.default_config(&w, hw);
                    c.set("ukernel", uk.name.as_str());
                    c.set("fusion", fusion);
                    c.set("kc", kc);
                    check_config(&EpilogueDirect, &w, &c, &p);
                }
            }
        }
    }
}

#[test]
fn an_explicitly_packed_weight_serves_many_calls() {
    let w: Workload = "gemm_bias_relu:20x30x40".parse().unwrap();
    let hw = HardwareFingerprint::current();
    let exe = EpilogueGemm::from_config(&w, &EpiloguePacked.default_config(&w, hw)).unwrap();
    let p = Problem::random(&w, 1);
    let weight = exe.pack_weight(&p.inputs[1]).unwrap();
    for seed in 0..3 {
        // New activations and bias, the same weight.
        let mut q = Problem::random(&w, 100 + seed);
        q.inputs[1] = p.inputs[1].clone();
        let mut out = q.output();
        exe.run_prepacked(&q.inputs[0], &weight, &q.inputs[2], &mut out);
        q.check(&out, &q.reference()).unwrap();
    }
}

#[test]
fn vectorised_gelu_stays_within_its_error_bound() {
    // x from -60 to 60 (saturated on both sides) plus values near 0, in one row so every
    // vector lane and the scalar tail are used.
    let xs: Vec<f32> = (-12_000..=12_000)
        .map(|i| i as f32 * 0.005)
        .chain([
            1e-30, -1e-30, 0.0, -0.0, 1e-3, -1e-3, 88.0, -88.0, 1e6, -1e6,
        ])
        .collect();
    let zero = vec![0.0f32; xs.len()];
    let eps = f32::EPSILON as f64;
    for act in [Act::Gelu, Act::GeluErf] {
        let mut row = xs.clone();
        bias_act_row(&mut row, &zero, act);
        for (x, y) in xs.iter().zip(&row) {
            let want = act.apply_f64(*x as f64);
            // The bound the reference tolerances assume: 16 ε·|x| (plus the smallest normal).
            let bound = 16.0 * eps * (*x as f64).abs() + f32::MIN_POSITIVE as f64;
            assert!(
                y.is_finite() && (*y as f64 - want).abs() <= bound,
                "{act}({x}) = {y}, want {want} ± {bound:e}"
            );
        }
    }
    let mut relu = vec![-2.0f32, -0.0, 0.5, 3.0];
    bias_act_row(&mut relu, &[1.0, 1.0, 1.0, 1.0], Act::Relu);
    assert_eq!(relu, vec![0.0, 1.0, 1.5, 4.0]);
    // Bias only: nine values, so the scalar tail after one AVX2 vector is used too.
    let mut plain: Vec<f32> = (0..9).map(|i| i as f32 - 4.0).collect();
    bias_act_row(&mut plain, &[0.5; 9], Act::Identity);
    let want: Vec<f32> = (0..9).map(|i| i as f32 - 3.5).collect();
    assert_eq!(plain, want);
}
