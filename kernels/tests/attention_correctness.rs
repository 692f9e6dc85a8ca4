//! Every attention variant against the f64 reference on awkward shapes: S not a multiple of
//! any block, S = 1, D ∈ {32, 64, 80, 128} (and odd D), causal and not, every tile this CPU
//! runs, both K layouts, every parallel split.

use kernels::cpu::attention::{self, ukernel, Fused, Unfused, BC_VALUES, BR_VALUES};
use kernels::{default_for, Config, HardwareFingerprint, Kernel, Problem, Workload};

/// Says which ISA level these tests ran at and which they skipped, in every run; an invalid
/// `AUTOKERNEL_ISA` fails here.
#[test]
fn isa_level_under_test() {
    kernels::cpu::announce_level("attention_correctness").unwrap();
}

fn check(kernel: &dyn Kernel, w: &Workload, c: &Config, p: &Problem, r: &kernels::Reference) {
    let exe = kernel
        .build(w, c)
        .unwrap_or_else(|e| panic!("{w} {c}: {e}"));
    // Twice for the smaller shapes: buffers reused across calls must not leak state.
    let runs = if w.flops() < 1e6 { 2 } else { 1 };
    for _ in 0..runs {
        let mut out = vec![f32::NAN; w.output_len()];
        exe.run_f32(&p.input_slices(), &mut out).unwrap();
        p.check(&out, r)
            .unwrap_or_else(|e| panic!("{} {w} {c}: {e}", kernel.name()));
    }
}

fn fused_config(tile: &str, br: usize, bc: usize, k_layout: &str, par: &str, t: usize) -> Config {
    let mut c = Config::default();
    c.set("tile", tile);
    c.set("br", br);
    c.set("bc", bc);
    c.set("k_layout", k_layout);
    c.set("par", par);
    c.set("threads", t);
    c
}

#[test]
fn fused_is_correct_on_awkward_shapes_for_every_tile_and_layout() {
    let shapes = [
        "attention:1x1x1x64",
        "attention:1x1x1x1",
        "attention:2x1x5x32",
        "attention:1x2x37x80",
        "attention:1x1x70x128",
        "attention:1x3x33x64",
        "attention:1x1x19x7",
        "attention:1x1x100x64",
    ];
    for text in shapes {
        for causal in [false, true] {
            let w: Workload = if causal {
                format!("{text}:causal").parse().unwrap()
            } else {
                text.parse().unwrap()
            };
            let p = Problem::random(&w, 17);
            let r = p.reference();
            for tile in ukernel::tiles_available() {
                for k_layout in ["prepacked", "blockwise"] {
                    // Blocks smaller than S and not dividing it, of both aspect ratios.
                    for (br, bc) in [(16, 32), (64, 16)] {
                        let c = fused_config(&tile.name, br, bc, k_layout, "none", 1);
                        check(&Fused, &w, &c, &p, &r);
                    }
                }
            }
            // One block covering all of S.
            let tile = &ukernel::tiles_offered(kernels::cpu::Isa::detect())[0].name;
            check(
                &Fused,
                &w,
                &fused_config(tile, 256, 512, "prepacked", "none", 1),
                &p,
                &r,
            );
        }
    }
}

#[test]
fn fused_parallel_splits_match_the_reference() {
    for text in ["attention:2x3x45x64", "attention:1x1x130x80:causal"] {
        let w: Workload = text.parse().unwrap();
        let p = Problem::random(&w, 5);
        let r = p.reference();
        let tile = &ukernel::tiles_offered(kernels::cpu::Isa::detect())[0].name;
        for par in ["heads", "blocks"] {
            for k_layout in ["prepacked", "blockwise"] {
                let c = fused_config(tile, 16, 32, k_layout, par, 2);
                check(&Fused, &w, &c, &p, &r);
            }
        }
    }
}

#[test]
fn unfused_is_correct_for_every_split() {
    for text in [
        "attention:1x1x1x64",
        "attention:2x2x37x80:causal",
        "attention:1x3x20x32",
        "attention:1x1x50x128:causal",
    ] {
        let w: Workload = text.parse().unwrap();
        let p = Problem::random(&w, 2);
        let r = p.reference();
        for uk in kernels::cpu::gemm::ukernel::packed_available() {
            for (par, t) in [("none", 1usize), ("heads", 2), ("gemm", 2)] {
                let mut c = Config::default();
                c.set("ukernel", uk.name.as_str());
                c.set("par", par);
                c.set("threads", t);
                check(&Unfused, &w, &c, &p, &r);
            }
        }
    }
}

#[test]
fn defaults_are_valid_and_correct_everywhere() {
    let hw = HardwareFingerprint::current();
    for text in [
        "attention:1x1x1x1",
        "attention:1x12x16x64:causal",
        "attention:1x1x300x80",
        "attention:3x1x9x128:causal",
    ] {
        let w: Workload = text.parse().unwrap();
        let p = Problem::random(&w, 4);
        let r = p.reference();
        let (k, c) = default_for(&w, hw).unwrap();
        assert_eq!(k.name(), "attention_fused");
        let exe = k.prepare(&w, &c).unwrap_or_else(|e| panic!("{w} {c}: {e}"));
        let mut out = p.output();
        exe.run_f32(&p.input_slices(), &mut out).unwrap();
        p.check(&out, &r).unwrap();
        for family in attention::FAMILIES.iter().filter(|f| f.supports(&w)) {
            let c = family.default_config(&w, hw);
            family.space(&w, hw).check(&c).unwrap();
            check(*family, &w, &c, &p, &r);
            // Other thread counts than this machine's: still valid configs.
            let other = hw.with_cores(4);
            let c4 = family.default_config(&w, &other);
            assert!(family.space(&w, &other).check(&c4).is_ok(), "{c4}");
        }
    }
}

#[test]
fn spaces_cap_the_blocks_and_bad_configs_are_errors() {
    let hw = HardwareFingerprint::current();
    let w: Workload = "attention:1x2x20x64".parse().unwrap();
    let space = Fused.space(&w, hw);
    for c in space.iter_valid() {
        assert!(
            c.int("br").unwrap() <= 32 && c.int("bc").unwrap() <= 32,
            "{c}"
        );
    }
    assert!(space.count_valid() > 0);
    assert_eq!(BR_VALUES[0], 16);
    assert!(BC_VALUES.contains(&64));
    let good = Fused.default_config(&w, hw);
    for (knob, value) in [
        ("tile", "avx9_1x1"),
        ("k_layout", "diagonal"),
        ("par", "sideways"),
    ] {
        let mut c = good.clone();
        c.set(knob, value);
        assert!(Fused.prepare(&w, &c).is_err(), "{c}");
        assert!(Fused.build(&w, &c).is_err(), "{c}");
    }
    let mut c = good.clone();
    c.set("br", 0usize);
    assert!(Fused.build(&w, &c).is_err());
    let gemm: Workload = "gemm:4x4x4".parse().unwrap();
    assert!(Fused.build(&gemm, &good).is_err());
    assert!(!Unfused.supports(&"attention:1x1x5000x64".parse().unwrap()));
    assert!(Unfused
        .build(
            &"attention:1x1x5000x64".parse().unwrap(),
            &Config::default()
        )
        .is_err());
}
