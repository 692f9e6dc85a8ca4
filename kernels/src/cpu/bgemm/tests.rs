//! The family's tests: every offered config against the references on awkward shapes, the
//! emulated AVX-512 kernels likewise through the driver, spaces and defaults per
//! fingerprint, the prepared weight against the plain run, wrong operands and configs.

use super::convert::round_bf16;
use super::*;
use crate::dtype::DType;
use crate::problem::Problem;
use crate::workload::Act;

/// `p` with its A and B rounded to bf16 values, as an f32 problem: its reference is the f64
/// product of the bf16 operands with the f32 accumulation bound — far tighter than the
/// bf16 workload's own reference (which also allows for the operand rounding), so a
/// dropped or doubled term is caught even at large K.
fn rounded_operands(p: &Problem) -> Problem {
    let mut inputs = p.inputs.clone();
    for x in inputs[..2].iter_mut().flatten() {
        *x = round_bf16(*x);
    }
    Problem {
        workload: p.workload.with_dtype(DType::F32),
        inputs,
    }
}

fn run(w: &Workload, c: &Config, p: &Problem) -> Vec<f32> {
    let exe = GemmBf16
        .prepare(w, c)
        .unwrap_or_else(|e| panic!("{w} {c}: {e}"));
    let mut out = vec![f32::NAN; w.output_len()];
    exe.run_f32(&p.input_slices(), &mut out)
        .unwrap_or_else(|e| panic!("{w} {c}: {e}"));
    out
}

#[test]
fn every_offered_config_matches_the_references_on_awkward_shapes() {
    crate::cpu::announce_level("gemm_bf16").unwrap();
    let hw = HardwareFingerprint::current();
    for text in [
        "gemm:1x1x1:bf16",
        "gemm:1x67x65:bf16",
        "gemm:5x7x9:bf16",
        "gemm:63x65x67:bf16",
        "gemm:17x3x130:bf16",
        "gemm:2x33x263:bf16",
        "gemm_bias_gelu:13x67x65:bf16",
        "gemm_bias_gelu_erf:13x67x65:bf16",
        "gemm_bias_relu:9x33x7:bf16",
        "gemm_bias:65x50x31:bf16",
    ] {
        let w: Workload = text.parse().unwrap();
        let space = GemmBf16.space(&w, hw);
        assert!(GemmBf16.config_fits(&w, hw, &GemmBf16.default_config(&w, hw)));
        let p = Problem::random(&w, 5);
        let (loose, exact) = (p.reference(), rounded_operands(&p));
        let tight = exact.reference();
        let mut n = 0;
        for c in space.iter_valid() {
            assert!(GemmBf16.config_fits(&w, hw, &c), "{w} {c}");
            let out = run(&w, &c, &p);
            p.check(&out, &loose)
                .unwrap_or_else(|e| panic!("{w} {c}: {e}"));
            exact
                .check(&out, &tight)
                .unwrap_or_else(|e| panic!("{w} {c} (bf16 operands): {e}"));
            n += 1;
        }
        assert!(n > 0, "{w}: no config");
    }
}

/// The defaults of large and skinny shapes (one config each: every config of these sizes
/// would take too long in a debug build).
#[test]
fn defaults_match_the_references_on_large_and_skinny_shapes() {
    let hw = HardwareFingerprint::current();
    for text in [
        "gemm:1x768x768:bf16",
        "gemm:3x200x1000:bf16",
        "gemm:128x96x768:bf16",
        "gemm_bias_gelu:40x300x96:bf16",
    ] {
        let w: Workload = text.parse().unwrap();
        let p = Problem::random(&w, 8);
        let exact = rounded_operands(&p);
        for c in [GemmBf16.default_config(&w, hw), serial(&w, hw)] {
            let out = run(&w, &c, &p);
            p.check(&out, &p.reference())
                .unwrap_or_else(|e| panic!("{w} {c}: {e}"));
            exact
                .check(&out, &exact.reference())
                .unwrap_or_else(|e| panic!("{w} {c} (bf16 operands): {e}"));
        }
    }
}

/// The default of `w` with the work split over every core along the other dimension (or
/// serial on one core), so both splits run whatever this machine's default picks.
fn serial(w: &Workload, hw: &HardwareFingerprint) -> Config {
    let mut c = GemmBf16.default_config(w, hw);
    let (par, threads) = match (hw.cores, c.str("par")) {
        (1, _) => ("none", 1),
        (_, Some("n")) => ("m", hw.cores),
        _ => ("n", hw.cores),
    };
    c.set("par", par);
    c.set("threads", threads);
    c
}

#[test]
fn a_prepared_weight_gives_the_same_bits_and_wrong_ones_are_refused() {
    let hw = HardwareFingerprint::current();
    for text in ["gemm:7x67x65:bf16", "gemm_bias_gelu:13x40x33:bf16"] {
        let w: Workload = text.parse().unwrap();
        let c = GemmBf16.default_config(&w, hw);
        let exe = GemmBf16.prepare(&w, &c).unwrap();
        let p = Problem::random(&w, 9);
        let ins = p.input_slices();
        let mut want = vec![0f32; w.output_len()];
        exe.run_f32(&ins, &mut want).unwrap();
        let weight = exe.prepare_weight(ins[1]).unwrap();
        assert_eq!(Some(weight.format()), exe.weight_format());
        let (_, n, k) = w.gemm_dims().unwrap();
        let bytes = weight.bytes();
        assert!(
            bytes >= 2 * k * n && bytes < 4 * k * n,
            "bf16: {bytes} bytes"
        );
        let rest: Vec<&[f32]> = ins
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 1)
            .map(|(_, x)| *x)
            .collect();
        let mut got = vec![f32::NAN; w.output_len()];
        exe.run_prepared(&rest, &weight, &mut got).unwrap();
        assert!(
            got.iter()
                .zip(&want)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "{w}"
        );
        // Wrong operands are errors naming them, never a panic.
        if rest.len() > 1 {
            let e = exe.run_prepared(&rest[..1], &weight, &mut got);
            assert!(e.unwrap_err().to_string().contains("without B"));
        }
        let mut bad = rest.clone();
        bad[0] = &rest[0][1..];
        let e = exe.run_prepared(&bad, &weight, &mut got).unwrap_err();
        assert!(e.to_string().contains("operand 'a'"), "{e}");
        let e = exe.run_prepared(&rest, &weight, &mut got[1..]).unwrap_err();
        assert!(e.to_string().contains("operand 'c'"), "{e}");
        assert!(exe.prepare_weight(&ins[1][1..]).is_err());
        let e = exe.run_f32(&ins[..1], &mut want).unwrap_err();
        assert!(e.to_string().contains("expected"), "{e}");
        // A weight of another shape, or of another panel width, is refused.
        let other: Workload = "gemm:7x66x65:bf16".parse().unwrap();
        let other_exe = GemmBf16
            .prepare(&other, &GemmBf16.default_config(&other, hw))
            .unwrap();
        let ow = other_exe.prepare_weight(&vec![0.5; 66 * 65]).unwrap();
        assert!(exe.run_prepared(&rest, &ow, &mut got).is_err());
        let mut wide = c.clone();
        let nr = exe.weight_format().unwrap().params[0];
        let Some(wider) = offered(hw).into_iter().find(|k| k.nr != nr) else {
            continue;
        };
        wide.set("ukernel", wider.name);
        let wide_exe = GemmBf16.prepare(&w, &wide).unwrap();
        assert_ne!(wide_exe.weight_format(), exe.weight_format());
        let e = wide_exe.run_prepared(&rest, &weight, &mut got).unwrap_err();
        assert!(e.to_string().contains("cannot serve"), "{e}");
    }
}

#[test]
fn bad_configs_are_errors_and_defaults_fit_every_shape() {
    let hw = HardwareFingerprint::current();
    let w: Workload = "gemm:8x8x8:bf16".parse().unwrap();
    let base = GemmBf16.default_config(&w, hw);
    for (knob, value) in [
        ("kc", crate::space::Value::Int(0)),
        ("mc", crate::space::Value::Int(0)),
        ("ukernel", "avx9_1x1".into()),
        ("par", "k".into()),
        ("kc", "x".into()),
    ] {
        let mut c = base.clone();
        c.0.insert(knob.into(), value);
        assert!(GemmBf16.build(&w, &c).is_err(), "{c}");
        assert!(GemmBf16.prepare(&w, &c).is_err(), "{c}");
    }
    assert!(GemmBf16.build(&w.with_dtype(DType::F32), &base).is_err());
    for (m, n, k) in [(1, 1, 1), (1, 4096, 4096), (7, 3, 5000), (3000, 9000, 130)] {
        for w in [
            Workload::gemm(m, n, k).unwrap(),
            Workload::gemm_bias_act(m, n, k, Act::Gelu).unwrap(),
        ] {
            let w = w.with_dtype(DType::Bf16);
            for cores in [1, 2, 3, 16] {
                let hw = hw.with_cores(cores);
                let c = GemmBf16.default_config(&w, &hw);
                assert!(GemmBf16.config_fits(&w, &hw, &c), "{w} {cores}: {c}");
            }
        }
    }
}

/// An x86-64 fingerprint with AVX-512F and AVX512BW, and AVX512_BF16 if `bf16`.
fn avx512_machine(bf16: bool) -> HardwareFingerprint {
    machine_with(if bf16 { &["avx512bf16"] } else { &[] })
}

/// An AVX512_BF16 fingerprint whose OS granted the AMX tile state (a Sapphire Rapids).
fn amx_machine() -> HardwareFingerprint {
    machine_with(&["avx512bf16", "amx_tile", "amx_bf16", "amx_int8"])
}

/// An x86-64 fingerprint with AVX-512F, AVX512BW and the flags `extra`.
fn machine_with(extra: &[&str]) -> HardwareFingerprint {
    let mut isa = vec![
        "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
    ];
    isa.extend_from_slice(extra);
    HardwareFingerprint::new(
        "x86_64",
        "AuthenticAMD",
        (26, 2, 0),
        "AVX-512 test machine",
        isa.into_iter().map(String::from).collect(),
        2,
        (48 << 10, 1 << 20, 32 << 20),
    )
}

/// Spaces and defaults are built from the fingerprint, so they can be checked on every CPU:
/// `vdpbf16ps` kernels only with AVX512_BF16, where the default picks one (also where AMX is
/// granted: the AMX kernels are offered there, never a default); AVX-512F widening on other
/// AVX-512 machines; AVX2 below.
#[test]
fn spaces_and_defaults_follow_the_fingerprint() {
    let shapes = [
        "gemm:1x768x768:bf16",
        "gemm:1x33x65:bf16",
        "gemm:2x3072x768:bf16",
        "gemm:8x3072x768:bf16",
        "gemm:128x768x768:bf16",
        "gemm_bias_gelu:1024x1024x1024:bf16",
    ];
    for (hw, prefix) in [
        (amx_machine(), "avx512bf16_"),
        (avx512_machine(true), "avx512bf16_"),
        (avx512_machine(false), "avx512_"),
        (HardwareFingerprint::reference_zen3(), "avx2_"),
    ] {
        let names: Vec<&str> = offered(&hw).iter().map(|k| k.name).collect();
        let dp = names.iter().any(|n| n.starts_with("avx512bf16_"));
        assert_eq!(dp, hw.has("avx512bf16"), "{names:?}");
        assert_eq!(names.iter().any(|n| n.starts_with("avx2_")), hw.has("avx2"));
        let amx = names.iter().filter(|n| n.starts_with("amx_bf16_")).count();
        let granted = cfg!(target_arch = "x86_64") && hw.has("amx_bf16");
        assert_eq!(amx, if granted { 4 } else { 0 }, "{names:?}");
        for text in shapes {
            let w: Workload = text.parse().unwrap();
            let c = GemmBf16.default_config(&w, &hw);
            assert!(GemmBf16.config_fits(&w, &hw, &c), "{w}: {c}");
            let uk = c.str("ukernel").unwrap();
            assert!(uk.starts_with(prefix), "{w} on {prefix}: {c}");
            if prefix.starts_with("avx512") && text.contains(":1x") {
                assert!(uk.ends_with("_1x128") || uk.ends_with("_1x64"), "{w}: {c}");
            }
        }
    }
}

/// The emulated twins of the AVX-512 and AMX kernels through the whole driver (packing,
/// depth blocks with an odd last one, both splits, epilogues) on awkward shapes, against both
/// references: the same bodies and tile shapes as the real kernels, on every CPU.
#[test]
fn emulated_avx512_and_amx_kernels_match_the_references_on_awkward_shapes() {
    through_the_driver(super::ukernel::emulate::EMULATED.iter());
}

/// The AMX body with tile rows the real kernels do not use, through the driver likewise.
#[test]
fn emulated_amx_kernels_with_odd_tile_rows_match_the_references() {
    through_the_driver(super::ukernel::emulate::AMX_ODD_ROWS.iter());
}

/// The real `amx_bf16_*` kernels through the driver likewise, where the OS granted this
/// process AMX-BF16; elsewhere it says it was skipped.
#[test]
fn real_amx_kernels_match_the_references_where_granted() {
    if !super::ukernel::has_amx_bf16() {
        let why = "no AMX tile state on this CPU/OS";
        crate::testing::skipped("amx_bf16 through the driver", "amx_bf16", why);
        return;
    }
    through_the_driver(KERNELS.iter().filter(|k| k.amx));
}

/// Runs every kernel of `kernels` through the driver on awkward shapes (M = 1, primes,
/// 63/65/67, odd K, K not a multiple of 32) with three block and split configurations, and
/// checks the outputs against the bf16 workload's reference and the f64 product of the bf16
/// operands.
fn through_the_driver(kernels: impl Iterator<Item = &'static Bf16Kernel> + Clone) {
    for text in [
        "gemm:1x1x1:bf16",
        "gemm:1x67x65:bf16",
        "gemm:2x33x263:bf16",
        "gemm:5x7x9:bf16",
        "gemm:63x65x67:bf16",
        "gemm:17x131x129:bf16",
        "gemm:65x67x63:bf16",
        "gemm_bias_gelu_erf:13x67x65:bf16",
        "gemm_bias_relu:9x33x7:bf16",
    ] {
        let w: Workload = text.parse().unwrap();
        let p = Problem::random(&w, 6);
        let (loose, exact) = (p.reference(), rounded_operands(&p));
        let tight = exact.reference();
        let act = match w {
            Workload::GemmBiasAct { act, .. } => Some(act),
            _ => None,
        };
        for uk in kernels.clone() {
            for (mc, kc, split) in [
                (24, 64, Split::None),
                (96, 4096, Split::M),
                (48, 3, Split::N),
            ] {
                let exe = BGemm::new(w, dims(&w), uk, (mc, kc), act, split, 2);
                let mut out = vec![f32::NAN; w.output_len()];
                exe.run_f32(&p.input_slices(), &mut out).unwrap();
                let at = format!("{w} {} mc {mc} kc {kc} {split:?}", uk.name);
                p.check(&out, &loose)
                    .unwrap_or_else(|e| panic!("{at}: {e}"));
                exact
                    .check(&out, &tight)
                    .unwrap_or_else(|e| panic!("{at} (bf16 operands): {e}"));
            }
        }
    }
}

/// A weight prepared for the pair layout is refused by a widening kernel of the same panel
/// width, and the other way round.
#[test]
fn pair_and_widening_weights_are_not_interchangeable() {
    use super::ukernel::emulate::EMULATED;
    let w: Workload = "gemm:3x70x9:bf16".parse().unwrap();
    let by = |name: &str| EMULATED.iter().find(|k| k.name == name).unwrap();
    let (dp, wide) = (by("emu_avx512bf16_4x64"), by("emu_avx512_4x64"));
    let make = |uk| BGemm::new(w, dims(&w), uk, (24, 64), None, Split::None, 1);
    let (x, y) = (make(dp), make(wide));
    assert_ne!(x.weight_format(), y.weight_format());
    let p = Problem::random(&w, 2);
    let ins = p.input_slices();
    let mut out = vec![0f32; w.output_len()];
    let (wx, wy) = (
        x.prepare_weight(ins[1]).unwrap(),
        y.prepare_weight(ins[1]).unwrap(),
    );
    assert!(x.run_prepared(&ins[..1], &wy, &mut out).is_err());
    assert!(y.run_prepared(&ins[..1], &wx, &mut out).is_err());
    x.run_prepared(&ins[..1], &wx, &mut out).unwrap();
    let exact = rounded_operands(&p);
    exact.check(&out, &exact.reference()).unwrap();
}
