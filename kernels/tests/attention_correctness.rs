//! Every attention variant against the f64 reference on awkward shapes: S not a multiple of
//! any block, S = 1, D ∈ {32, 64, 80, 128} (and odd D), causal and not, every tile this CPU
//! runs, both K layouts, every parallel split; and padded batches (the key-lengths operand)
//! in both families, lengths 0, 1, primes and S, with and without causal masking.

use kernels::cpu::attention::{self, ukernel, Fused, Unfused, BC_VALUES, BR_VALUES};
use kernels::{
    default_for, Config, HardwareFingerprint, Kernel, Operand, OperandMut, Problem, Workload,
};

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

/// Runs `c` on `p` with key lengths `lens` and checks it against the masked reference; a
/// query that sees no key must be exactly zero.
fn check_masked(kernel: &dyn Kernel, w: &Workload, c: &Config, p: &Problem, lens: &[i32]) {
    let r = p.reference_with_key_lens(lens).unwrap();
    let exe = kernel
        .build(w, c)
        .unwrap_or_else(|e| panic!("{w} {c}: {e}"));
    let mut out = vec![f32::NAN; w.output_len()];
    let ins: Vec<Operand<'_>> = (p.inputs.iter().map(|x| Operand::F32(x)))
        .chain([Operand::I32(lens)])
        .collect();
    exe.run(&ins, OperandMut::F32(&mut out)).unwrap();
    p.check(&out, &r)
        .unwrap_or_else(|e| panic!("{} {w} {c} key_lens {lens:?}: {e}", kernel.name()));
}

/// Key lengths of a batch of `b` sequences of up to `s`: mixed (S, 1, a prime, 0, S − 1),
/// all padding but one, and all of length 1.
fn length_patterns(b: usize, s: usize) -> Vec<Vec<i32>> {
    let s = s as i32;
    let mixed = [s, 1, 13.min(s), 0, (s - 1).max(1)];
    let mut one_left = vec![0; b];
    one_left[b - 1] = s;
    vec![
        (0..b).map(|i| mixed[i % mixed.len()]).collect(),
        one_left,
        vec![1; b],
    ]
}

#[test]
fn padded_batches_match_the_masked_reference_in_both_families() {
    let hw = HardwareFingerprint::current();
    for text in [
        "attention:5x2x37x80",
        "attention:3x1x1x64",
        "attention:2x3x17x7:causal",
        "attention:3x2x70x64",
        "attention:5x1x41x32:causal",
    ] {
        let w: Workload = text.parse().unwrap();
        let Workload::Attention { b, s, .. } = w else {
            unreachable!()
        };
        let p = Problem::random(&w, 23);
        for lens in length_patterns(b, s) {
            for tile in ukernel::tiles_available() {
                for k_layout in ["prepacked", "blockwise"] {
                    for (br, bc, par, t) in [(16, 32, "none", 1), (64, 16, "blocks", 2)] {
                        let c = fused_config(&tile.name, br, bc, k_layout, par, t);
                        check_masked(&Fused, &w, &c, &p, &lens);
                    }
                }
            }
            let c = fused_config(
                &ukernel::tiles_available()[0].name,
                16,
                16,
                "prepacked",
                "heads",
                2,
            );
            check_masked(&Fused, &w, &c, &p, &lens);
            for (par, t) in [("none", 1usize), ("heads", 2), ("gemm", 2)] {
                let mut c = Unfused.default_config(&w, hw);
                c.set("par", par);
                c.set("threads", t);
                check_masked(&Unfused, &w, &c, &p, &lens);
            }
        }
    }
}

#[test]
fn a_mask_is_not_ignored_and_bad_lengths_are_errors() {
    let w: Workload = "attention:2x1x20x16".parse().unwrap();
    let p = Problem::random(&w, 4);
    let full = p.reference();
    // The masked reference differs from the full one wherever keys are dropped: a kernel
    // that ignores the lengths fails `check_masked`.
    let masked = p.reference_with_key_lens(&[20, 7]).unwrap();
    assert_eq!(full.values[..320], masked.values[..320]);
    let unmasked: Vec<f32> = full.values.iter().map(|&x| x as f32).collect();
    let e = p.check(&unmasked, &masked).unwrap_err();
    assert!(e.index >= 320, "{e}");
    let hw = HardwareFingerprint::current();
    for kernel in [&Fused as &dyn Kernel, &Unfused] {
        let exe = kernel.build(&w, &kernel.default_config(&w, hw)).unwrap();
        let mut out = p.output();
        let ins = |lens: &'static [i32]| -> Vec<Operand<'_>> {
            (p.inputs.iter().map(|x| Operand::F32(x)))
                .chain([Operand::I32(lens)])
                .collect()
        };
        for (lens, needle) in [
            (&[20, 21][..], "key length 21 of batch 1 is outside 0..=20"),
            (&[3][..], "operand 'key_lens'"),
        ] {
            let e = exe.run(&ins(lens), OperandMut::F32(&mut out)).unwrap_err();
            assert!(e.to_string().contains(needle), "{}: {e}", kernel.name());
        }
    }
    assert!(p.reference_with_key_lens(&[1, 21]).is_err());
    let g = Problem::random(&"gemm:2x2x2".parse().unwrap(), 1);
    assert!(g.reference_with_key_lens(&[1]).is_err());
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

/// A NaN query makes its output row NaN in every family (its scores are NaN: none may come
/// out of the softmax as a weight, which would turn the row into a finite mean of V), and
/// leaves the other rows as they were.
#[test]
fn a_nan_query_gives_a_nan_row_and_only_that() {
    let hw = HardwareFingerprint::current();
    let w: Workload = "attention:1x2x9x16".parse().unwrap();
    let mut p = Problem::random(&w, 6);
    let r = p.reference();
    let d = 16;
    p.inputs[0][3 * d + 5] = f32::NAN; // head 0, query row 3
    for family in attention::FAMILIES.iter().filter(|f| f.supports(&w)) {
        let exe = family.build(&w, &family.default_config(&w, hw)).unwrap();
        let mut out = p.output();
        exe.run_f32(&p.input_slices(), &mut out).unwrap();
        for (row, (got, want)) in out.chunks(d).zip(r.values.chunks(d)).enumerate() {
            if row == 3 {
                assert!(got.iter().all(|x| x.is_nan()), "{}: {got:?}", family.name());
            } else {
                let err = got.iter().zip(want).map(|(g, w)| (*g as f64 - w).abs());
                assert!(
                    err.fold(0.0, f64::max) < 1e-4,
                    "{} row {row}",
                    family.name()
                );
            }
        }
    }
}

/// Scores far beyond any a model produces (|q·k| near 2^33, where an f32 ulp is 2^10) still
/// give the reference's nearly one-hot weights in every family.
#[test]
fn huge_scores_stay_within_the_softmax() {
    let hw = HardwareFingerprint::current();
    let w: Workload = "attention:1x2x9x16".parse().unwrap();
    let mut p = Problem::random(&w, 7);
    for x in p.inputs[0].iter_mut() {
        *x *= 1e10;
    }
    let r = p.reference();
    for family in attention::FAMILIES.iter().filter(|f| f.supports(&w)) {
        let exe = family.build(&w, &family.default_config(&w, hw)).unwrap();
        let mut out = p.output();
        exe.run_f32(&p.input_slices(), &mut out).unwrap();
        let err = out
            .iter()
            .zip(&r.values)
            .map(|(g, w)| (*g as f64 - w).abs());
        assert!(err.fold(0.0, f64::max) < 1e-4, "{}: {out:?}", family.name());
    }
}

/// `exe` over a fused QKV projection's rows (`run_qkv_rows`) against the same variant on the
/// heads split out of them (`run`), output merged back: equal to the bit, with and without
/// key lengths. `exe` must read the rows in place (not return `None`).
fn rows_match_heads(exe: &dyn kernels::Executable, w: &Workload, lens: Option<&[i32]>, tag: &str) {
    let n = w.output_len();
    let qkv: Vec<f32> = (0..3 * n)
        .map(|i| (i as f32 * 0.7311).sin() * 2.0)
        .collect();
    let mut want = vec![f32::NAN; n];
    attention::layout::run_via_heads(exe, w, (&qkv, lens), &mut want).unwrap();
    // Twice: buffers reused across calls must not leak state.
    for _ in 0..2 {
        let mut got = vec![f32::NAN; n];
        exe.run_qkv_rows(&qkv, lens, &mut got)
            .unwrap_or_else(|| panic!("{tag} {w}: does not read QKV rows"))
            .unwrap_or_else(|e| panic!("{tag} {w}: {e}"));
        let diff = got
            .iter()
            .zip(&want)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        assert!(diff.is_none(), "{tag} {w} {lens:?}: value {diff:?} differs");
    }
}

/// Attention straight from QKV rows (what a BERT layer calls, no head split or merge) is the
/// same computation as on `[B, H, S, D]` operands, for every fused tile, K layout and split,
/// odd D (scratch outputs) and D a multiple of the lanes, masks and causal; the unfused
/// family reads heads only (`None`: the runtime splits for it); bad operands are errors.
#[test]
fn fused_reads_qkv_rows_in_place_exactly() {
    for text in [
        "attention:2x3x37x64",
        "attention:1x2x17x7:causal",
        "attention:3x1x1x32",
        "attention:2x2x70x80:causal",
    ] {
        let w: Workload = text.parse().unwrap();
        let Workload::Attention { b, s, .. } = w else {
            unreachable!()
        };
        let lens = &length_patterns(b, s)[0];
        for tile in ukernel::tiles_available() {
            for k_layout in ["prepacked", "blockwise"] {
                for (br, bc, par, t) in [
                    (16, 32, "none", 1),
                    (64, 16, "blocks", 2),
                    (32, 64, "heads", 2),
                ] {
                    let c = fused_config(&tile.name, br, bc, k_layout, par, t);
                    if !Fused.config_fits(&w, HardwareFingerprint::current(), &c) && par == "heads"
                    {
                        continue; // fewer heads than threads
                    }
                    let exe = Fused.build(&w, &c).unwrap();
                    let tag = format!("{c}");
                    rows_match_heads(exe.as_ref(), &w, None, &tag);
                    rows_match_heads(exe.as_ref(), &w, Some(lens), &tag);
                }
            }
        }
    }
    let w: Workload = "attention:2x2x9x16".parse().unwrap();
    let hw = HardwareFingerprint::current();
    let unfused = Unfused.build(&w, &Unfused.default_config(&w, hw)).unwrap();
    assert!(unfused
        .run_qkv_rows(&[0.0; 3 * 576], None, &mut [0.0; 576])
        .is_none());
    let fused = Fused.build(&w, &Fused.default_config(&w, hw)).unwrap();
    let n = w.output_len();
    let (qkv, mut out) = (vec![0.5; 3 * n], vec![0.0; n]);
    for (qkv, lens, out_len, bad) in [
        (&qkv[1..], None, n, "qkv"),
        (&qkv[..], None, n + 1, "out"),
        (&qkv[..], Some(&[1][..]), n, "key_lens"),
        (&qkv[..], Some(&[1, 10][..]), n, "key_lens"),
    ] {
        let mut o = vec![0.0; out_len];
        let err = fused.run_qkv_rows(qkv, lens, &mut o).unwrap().unwrap_err();
        assert!(err.to_string().contains(bad), "{bad}: {err}");
    }
    assert!(fused
        .run_qkv_rows(&qkv, Some(&[0, 9]), &mut out)
        .unwrap()
        .is_ok());
}
