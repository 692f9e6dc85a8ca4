//! Every micro-kernel this CPU runs, in both GEMM families and every parallel mode, on
//! awkward shapes and block sizes, against the f64 reference; plus the spaces and defaults.
//!
//! AVX-512 micro-kernels are exercised only on machines that have AVX-512 (the lists below
//! come from what the CPU supports).

use kernels::cpu::gemm::{self, ukernel};
use kernels::{kernel, Config, HardwareFingerprint, Kernel, Problem, Value, Workload};

/// Says which ISA level these tests ran at and which they skipped, in every run; an invalid
/// `AUTOKERNEL_ISA` fails here.
#[test]
fn isa_level_under_test() {
    kernels::cpu::announce_level("gemm_correctness").unwrap();
}

/// Shapes (M, N, K) that divide no tile or block size.
const SHAPES: &[(usize, usize, usize)] = &[
    (1, 1, 1),
    (7, 13, 5),
    (2, 513, 3),
    (16, 1, 300),
    (1, 300, 77),
    (5, 97, 64),
    (33, 40, 50),
    (63, 65, 67),
    (67, 63, 65),
    (129, 257, 131),
];

/// The par modes every kernel is run in: (par, threads). 3 tasks on 2 cores splits unevenly.
const PARS: &[(&str, usize)] = &[("none", 1), ("m", 2), ("n", 2), ("m", 3), ("n", 3)];

struct Case {
    w: Workload,
    p: Problem,
    r: kernels::Reference,
}

fn cases() -> Vec<Case> {
    SHAPES
        .iter()
        .map(|&(m, n, k)| {
            let w = Workload::gemm(m, n, k).unwrap();
            let p = Problem::random(&w, (m * 31 + n * 7 + k) as u64);
            let r = p.reference();
            Case { w, p, r }
        })
        .collect()
}

/// Builds `config` (bypassing the space, so block sizes off the grid work) and checks it.
fn check(family: &dyn Kernel, case: &Case, config: &Config) {
    let exe = family
        .build(&case.w, config)
        .unwrap_or_else(|e| panic!("{} {config}: {e}", case.w));
    // Garbage in C first: the kernel must overwrite, not accumulate.
    let mut c = vec![f32::NAN; case.w.output_len()];
    exe.run_f32(&case.p.input_slices(), &mut c).unwrap();
    if let Err(e) = case.p.check(&c, &case.r) {
        panic!("{} {} {config}: {e}", family.name(), case.w);
    }
    // A second run on the same executable reuses the thread-local buffers.
    exe.run_f32(&case.p.input_slices(), &mut c).unwrap();
    case.p
        .check(&c, &case.r)
        .unwrap_or_else(|e| panic!("second run {} {config}: {e}", case.w));
}

fn cfg(pairs: &[(&str, Value)]) -> Config {
    Config::from_pairs(pairs.iter().map(|(k, v)| (*k, v.clone())))
}

#[test]
fn packed_every_ukernel_par_and_blocking() {
    let cases = cases();
    let packed = kernel("gemm_packed").unwrap();
    let uks = ukernel::packed_available();
    assert!(!uks.is_empty());
    for uk in uks {
        // Tiny blocks (every block edge hit, several K passes), and the default-ish ones.
        let blockings = [
            (1usize, 16usize, 1usize),
            (24, 64, 2 * uk.nr + 1),
            (256, 256, 4096),
        ];
        for (i, &(mc, kc, nc)) in blockings.iter().enumerate() {
            // Every par mode on the two small blockings; the big one only serially.
            let pars = if i == 2 { &PARS[..1] } else { PARS };
            for &(par, threads) in pars {
                let layouts = gemm::A_LAYOUT_VALUES
                    .iter()
                    .flat_map(|a| gemm::B_LAYOUT_VALUES.iter().map(move |b| (a, b)));
                for (&a_layout, &b_layout) in layouts {
                    let c = cfg(&[
                        ("ukernel", uk.name.as_str().into()),
                        ("mc", mc.into()),
                        ("kc", kc.into()),
                        ("nc", nc.into()),
                        ("a_layout", a_layout.into()),
                        ("b_layout", b_layout.into()),
                        ("par", par.into()),
                        ("threads", threads.into()),
                    ]);
                    // Tiny blocks on the biggest shape are slow in debug builds and add nothing.
                    for case in cases.iter().filter(|c| i > 0 || c.w.flops() < 2e6) {
                        check(packed, case, &c);
                    }
                }
            }
        }
    }
}

#[test]
fn direct_every_ukernel_par_and_blocking() {
    let cases = cases();
    let direct = kernel("gemm_direct").unwrap();
    let uks = ukernel::direct_available();
    assert!(!uks.is_empty());
    for uk in uks {
        for kc in [0usize, 1, 2, 7, 64] {
            for &(par, threads) in PARS {
                let c = cfg(&[
                    ("ukernel", uk.name.as_str().into()),
                    ("kc", kc.into()),
                    ("par", par.into()),
                    ("threads", threads.into()),
                ]);
                for case in cases.iter().filter(|c| direct.supports(&c.w)) {
                    check(direct, case, &c);
                }
            }
        }
    }
}

#[test]
fn direct_supports_only_small_m() {
    let direct = kernel("gemm_direct").unwrap();
    assert!(direct.supports(&Workload::gemm(32, 5, 5).unwrap()));
    assert!(!direct.supports(&Workload::gemm(33, 5, 5).unwrap()));
    assert!(direct
        .build(&Workload::gemm(33, 5, 5).unwrap(), &Config::default())
        .is_err());
}

#[test]
fn families_and_versions() {
    let names: Vec<_> = gemm::FAMILIES.iter().map(|k| k.name()).collect();
    assert_eq!(names, ["gemm_packed", "gemm_direct"]);
    let versions: Vec<_> = gemm::FAMILIES.iter().map(|k| k.version()).collect();
    assert_eq!(versions, [3, 1]);
}

/// A `gemm_packed` v2 record (no `b_layout`: B packed on every call) reads as the v3 config
/// that runs the same way, and fits the space; v1 records (no `a_layout`) stay stale.
#[test]
fn packed_v2_configs_upgrade_to_rowmajor_b() {
    let packed = kernel("gemm_packed").unwrap();
    let w = Workload::gemm(128, 768, 768).unwrap();
    let hw = HardwareFingerprint::current();
    let current = packed.default_config(&w, hw);
    let mut v2 = current.clone();
    v2.0.remove("b_layout");
    let up = packed.upgrade(2, &v2).expect("v2 upgrades");
    assert_eq!(up.str("b_layout"), Some("rowmajor"));
    assert!(packed.config_fits(&w, hw, &up));
    assert_eq!(
        kernels::registry::upgrade_record("gemm_packed", 2, v2.clone()),
        (3, up)
    );
    assert_eq!(packed.upgrade(3, &current), Some(current.clone()));
    let mut v1 = v2.clone();
    v1.0.remove("a_layout");
    assert_eq!(packed.upgrade(1, &v1), None);
    assert_eq!(
        kernels::registry::upgrade_record("gemm_packed", 1, v1.clone()),
        (1, v1),
        "a stale record is left as it is"
    );
    assert_eq!(packed.upgrade(2, &current), None, "v2 never had b_layout");
}

/// Shapes for the default / space checks (no reference needed, so they can be big).
fn many_shapes() -> Vec<Workload> {
    let dims = [
        1usize, 2, 5, 16, 17, 32, 33, 64, 100, 128, 768, 1024, 3072, 5000,
    ];
    let mut out = Vec::new();
    for &m in &dims {
        for &n in &dims {
            for &k in &[1usize, 3, 64, 257, 768, 3072] {
                out.push(Workload::gemm(m, n, k).unwrap());
            }
        }
    }
    out
}

#[test]
fn defaults_are_in_their_space_and_prepare() {
    let hw = HardwareFingerprint::current();
    for w in many_shapes() {
        for family in gemm::FAMILIES.iter().filter(|f| f.supports(&w)) {
            let c = family.default_config(&w, hw);
            let space = family.space(&w, hw);
            space
                .check(&c)
                .unwrap_or_else(|e| panic!("{} default {c} for {w}: {e}", family.name()));
        }
        let (family, c) = kernels::default_for(&w, hw).unwrap();
        assert!(family.supports(&w));
        family
            .prepare(&w, &c)
            .unwrap_or_else(|e| panic!("default_for({w}).unwrap() = {} {c}: {e}", family.name()));
    }
}

#[test]
fn defaults_compute_correctly() {
    let hw = HardwareFingerprint::current();
    for case in cases() {
        let (family, c) = kernels::default_for(&case.w, hw).unwrap();
        let exe = family.prepare(&case.w, &c).unwrap();
        let mut out = vec![f32::NAN; case.w.output_len()];
        exe.run_f32(&case.p.input_slices(), &mut out).unwrap();
        case.p
            .check(&out, &case.r)
            .unwrap_or_else(|e| panic!("default {} {c} for {}: {e}", family.name(), case.w));
    }
}

/// Named machines, not this CPU (the counts depend on the ISA level and the threads): the
/// Zen 3 reference and the same with AVX-512.
fn named_machines() -> [HardwareFingerprint; 2] {
    let zen3 = HardwareFingerprint::reference_zen3();
    let mut isa = zen3.isa.clone();
    isa.extend(["avx512f".to_string(), "avx512bw".to_string()]);
    let avx512 = HardwareFingerprint::new(
        "x86_64",
        "AuthenticAMD",
        (26, 2, 1),
        "AMD EPYC (AVX-512)",
        isa,
        2,
        (48 << 10, 1 << 20, 32 << 20),
    );
    [zen3, avx512]
}

#[test]
fn few_row_defaults_split_columns_from_half_a_million_multiply_adds() {
    // Streaming B: from 2^19 multiply-adds two cores beat one (the rule's measurements are in
    // gemm/mod.rs); a one-core machine never splits.
    let direct = kernel("gemm_direct").unwrap();
    for hw in &named_machines() {
        let par = |m, n, k| {
            let c = direct.default_config(&Workload::gemm(m, n, k).unwrap(), hw);
            (
                c.get("par").unwrap().to_string(),
                c.get("threads").unwrap().to_string(),
            )
        };
        let split = ("n".to_string(), hw.cores.to_string());
        let serial = ("none".to_string(), "1".to_string());
        assert_eq!(par(1, 768, 768), split, "{}", hw.id);
        assert_eq!(par(2, 512, 512), split);
        assert_eq!(par(1, 512, 512), serial);
        let one = hw.with_cores(1);
        let c = direct.default_config(&Workload::gemm(1, 3072, 768).unwrap(), &one);
        assert_eq!(c.get("threads").unwrap().to_string(), "1");
    }
}

#[test]
fn spaces_are_small_nonempty_and_named() {
    let packed = kernel("gemm_packed").unwrap();
    let direct = kernel("gemm_direct").unwrap();
    for hw in &named_machines() {
        for (m, n, k) in [
            (1, 1, 1),
            (8, 3072, 768),
            (128, 768, 3072),
            (2048, 2048, 2048),
        ] {
            let w = Workload::gemm(m, n, k).unwrap();
            let s = packed.space(&w, hw);
            let names: Vec<_> = s.knobs().iter().map(|k| k.name.as_str()).collect();
            assert_eq!(
                names,
                ["ukernel", "mc", "kc", "nc", "a_layout", "b_layout", "par", "threads"]
            );
            let count = s.count_valid();
            // Small enough for the tuner to enumerate and the cost model to rank every one.
            assert!((1..=20_000).contains(&count), "{w}: {count} packed configs");
            assert!(s.rule_names().contains(&"serial_iff_one_thread"));
            if m <= gemm::DIRECT_MAX_M {
                let s = direct.space(&w, hw);
                let names: Vec<_> = s.knobs().iter().map(|k| k.name.as_str()).collect();
                assert_eq!(names, ["ukernel", "kc", "par", "threads"]);
                assert!(s.count_valid() >= 1);
            }
        }
        // Redundant block sizes are cut: for a 1×1×1 problem only the smallest values remain.
        let tiny = packed.space(&Workload::gemm(1, 1, 1).unwrap(), hw);
        for c in tiny.iter_valid() {
            assert_eq!(c.int("mc"), Some(gemm::MC_VALUES[0] as i64));
            assert_eq!(c.int("kc"), Some(gemm::KC_VALUES[0] as i64));
            assert_eq!(c.int("nc"), Some(gemm::NC_VALUES[0] as i64));
        }
    }
}

#[test]
fn space_offers_only_runnable_ukernels() {
    let hw = HardwareFingerprint::current();
    let w = Workload::gemm(64, 64, 64).unwrap();
    for family in gemm::FAMILIES {
        let space = family.space(&w, hw);
        let uk = &space.knobs()[0];
        assert_eq!(uk.name, "ukernel");
        for v in &uk.values {
            let Value::Str(name) = v else {
                panic!("ukernel values are names")
            };
            let runnable = ukernel::packed(name).is_some() || ukernel::direct(name).is_some();
            assert!(runnable, "{name} offered but not runnable");
        }
    }
}

#[test]
fn bad_configs_are_errors_not_panics() {
    let w = Workload::gemm(8, 8, 8).unwrap();
    let packed = kernel("gemm_packed").unwrap();
    let bad = cfg(&[
        ("ukernel", "avx9_1x1".into()),
        ("mc", 24usize.into()),
        ("kc", 64usize.into()),
        ("nc", 512usize.into()),
        ("par", "none".into()),
        ("threads", 1usize.into()),
    ]);
    assert!(packed.build(&w, &bad).is_err());
    assert!(packed.prepare(&w, &bad).is_err());
    assert!(packed.build(&w, &Config::default()).is_err());
}

#[test]
fn wrong_operands_are_errors_naming_them_in_every_family() {
    use kernels::{DType, DeviceBuffer, Operand, OperandMut};
    let hw = HardwareFingerprint::current();
    for text in [
        "gemm:4x4x4",
        "gemm:300x5x7",
        "gemm_bias_gelu:4x4x4",
        "gemm_bias:300x5x7",
        "attention:1x2x8x4",
        "attention:1x1x600x4:causal",
    ] {
        let w: Workload = text.parse().unwrap();
        for family in kernels::kernels_for(&w, hw) {
            let exe = family.prepare(&w, &family.default_config(&w, hw)).unwrap();
            let p = Problem::random(&w, 1);
            let inputs = p.input_slices();
            let mut out = p.output();
            let name = w.input_names()[0];
            let short = &inputs[0][1..];
            let mut bad: Vec<&[f32]> = inputs.clone();
            bad[0] = short;
            let e = exe.run_f32(&bad, &mut out).unwrap_err().to_string();
            assert!(
                e.contains(&format!("operand '{name}' of {text}")),
                "{}: {e}",
                family.name()
            );
            let e = exe.run_f32(&inputs[1..], &mut out).unwrap_err().to_string();
            assert!(e.contains("operand 'inputs'"), "{e}");
            let e = exe.run_f32(&inputs, &mut out[1..]).unwrap_err().to_string();
            assert!(e.contains(&format!("operand '{}'", w.output_name())), "{e}");
            let bits = vec![0u16; inputs[0].len()];
            let mut typed: Vec<Operand> = inputs.iter().map(|x| Operand::F32(x)).collect();
            typed[0] = Operand::Bf16(&bits);
            let e = exe
                .run(&typed, OperandMut::F32(&mut out))
                .unwrap_err()
                .to_string();
            assert!(e.contains("bf16"), "{e}");
            let dev = DeviceBuffer {
                ordinal: 0,
                ptr: 0x1000,
                len: out.len(),
                dtype: DType::F32,
            };
            typed[0] = Operand::F32(inputs[0]);
            let e = exe
                .run(&typed, OperandMut::Cuda(dev))
                .unwrap_err()
                .to_string();
            assert!(e.contains("cuda:0"), "{e}");
            // And the right operands still work after the refusals.
            exe.run_f32(&inputs, &mut out).unwrap();
            p.check(&out, &p.reference()).unwrap();
        }
    }
}

#[test]
fn fma_peak_is_positive() {
    // Positive and finite, nothing about its size: a debug build of the portable loop on a
    // loaded 2-core VM measured 0.098 GFLOP/s, under the 0.1 once asserted here.
    let g = kernels::cpu::peak::fma_peak_gflops(1, 0.01);
    assert!(g.is_finite() && g > 0.0, "{g}");
}

#[test]
fn dot_peaks_run_where_the_cpu_has_them() {
    use kernels::cpu::peak::{peak_gflops, Unit};
    for (unit, feature) in [
        (Unit::Bf16Dot, "avx512bf16"),
        (Unit::I8Dot, "avx512vnni"),
        (Unit::AmxBf16, "amx_bf16"),
        (Unit::AmxInt8, "amx_int8"),
    ] {
        match peak_gflops(unit, 1, 0.01) {
            Some(g) => assert!(g.is_finite() && g > 0.0, "{}: {g}", unit.name()),
            None => kernels::testing::skipped(
                &format!("{} peak", unit.name()),
                feature,
                &format!("no {feature} here (the CPU, the OS or AUTOKERNEL_ISA)"),
            ),
        }
    }
}
