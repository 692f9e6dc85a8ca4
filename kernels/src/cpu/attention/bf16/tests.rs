//! Tests of the bf16 attention family. The emulated twins run the real step body on every
//! CPU; the AVX512_BF16 tiles run only where the CPU has the feature (and say so when
//! skipped).

use super::ukernel::{Bf16Tile, EMULATED, TILES};
use super::{AttentionBf16, Bf16Attention};
use crate::cpu::attention::AttnPar;
use crate::cpu::bgemm::convert::round_bf16;
use crate::kernel::{Executable, Kernel};
use crate::operand::{Operand, OperandMut};
use crate::problem::{attention_reference, Problem, Reference};
use crate::{DType, HardwareFingerprint, Workload};

/// Awkward shapes `(b, h, s, d, causal)`: S = 1, primes, 63/65/67; D = 64, 80 and odd.
const SHAPES: &[(usize, usize, usize, usize, bool)] = &[
    (1, 1, 1, 64, false),
    (1, 2, 1, 80, true),
    (1, 1, 7, 17, false),
    (2, 1, 13, 80, true),
    (1, 2, 63, 64, false),
    (1, 1, 65, 80, true),
    (2, 1, 67, 64, false),
    (1, 1, 67, 33, true),
];

/// `(br, bc, par)` combinations, block sizes below, at and above the tiles' and S's.
fn blockings() -> Vec<(usize, usize, AttnPar)> {
    vec![
        (16, 16, AttnPar::None),
        (64, 256, AttnPar::Heads(2)),
        (32, 64, AttnPar::Blocks(2)),
    ]
}

fn bf16_workload((b, h, s, d, causal): (usize, usize, usize, usize, bool)) -> Workload {
    Workload::Attention {
        b,
        h,
        s,
        d,
        causal,
        dtype: DType::Bf16,
    }
}

fn run(exe: &dyn Executable, p: &Problem, lens: Option<&[i32]>) -> Vec<f32> {
    let mut inputs: Vec<Operand<'_>> = p
        .inputs
        .iter()
        .map(|x| Operand::F32(x.as_slice()))
        .collect();
    if let Some(l) = lens {
        inputs.push(Operand::I32(l));
    }
    let mut o = vec![f32::NAN; p.inputs[0].len()];
    exe.run(&inputs, OperandMut::F32(&mut o)).unwrap();
    o
}

/// The tight reference: f64 attention of Q, K, V rounded to bf16 values, its bound widened
/// only by the bf16 rounding of the weights (`2⁻⁸` of each): what is left of the error once
/// the operands' rounding is taken out. A dropped or doubled key is far outside it.
fn rounded_reference(p: &Problem, lens: Option<&[i32]>) -> Reference {
    let Workload::Attention {
        h, s, d, causal, ..
    } = p.workload
    else {
        unreachable!()
    };
    let r: Vec<Vec<f32>> = p
        .inputs
        .iter()
        .map(|x| x.iter().map(|&v| round_bf16(v)).collect())
        .collect();
    let lens = lens.map(|l| (l, h));
    let unit = 2f64.powi(-8);
    attention_reference(&r[0], &r[1], &r[2], (s, d), causal, lens, (0.0, unit))
}

/// Both checks: the bf16 bound against the f32 problem, and the tight one.
fn check_both(tag: &str, p: &Problem, o: &[f32], lens: Option<&[i32]>) {
    let loose = match lens {
        Some(l) => p.reference_with_key_lens(l).unwrap(),
        None => p.reference(),
    };
    if let Err(e) = p.check(o, &loose) {
        panic!("{tag}: against the f32 problem: {e}");
    }
    if let Err(e) = p.check(o, &rounded_reference(p, lens)) {
        panic!("{tag}: against the rounded operands: {e}");
    }
}

/// Every tile on every shape and blocking, through the driver.
fn all_shapes(tiles: &'static [Bf16Tile]) {
    for tile in tiles {
        for &shape in SHAPES {
            let w = bf16_workload(shape);
            let p = Problem::random(&w, 7 + shape.2 as u64);
            for (br, bc, par) in blockings() {
                let exe = Bf16Attention::new(shape, tile, (br, bc), par);
                let o = run(&exe, &p, None);
                check_both(&format!("{} {w} br={br} bc={bc}", tile.name), &p, &o, None);
            }
        }
    }
}

#[test]
fn emulated_twins_match_the_reference_on_awkward_shapes() {
    for t in TILES {
        let twin = EMULATED
            .iter()
            .find(|e| e.name.strip_prefix("emu_") == Some(t.name));
        assert!(
            twin.is_some_and(|e| (e.mr, e.nr) == (t.mr, t.nr)),
            "{}",
            t.name
        );
    }
    all_shapes(EMULATED);
}

#[test]
fn avx512bf16_tiles_match_the_reference_where_the_cpu_has_them() {
    let runnable: Vec<&'static Bf16Tile> = TILES.iter().filter(|t| t.available()).collect();
    if runnable.is_empty() {
        crate::testing::skipped(
            "bf16 attention tiles",
            "avx512bf16",
            "no AVX512_BF16 on this CPU",
        );
        return;
    }
    for tile in runnable {
        all_shapes(std::slice::from_ref(tile));
    }
}

/// Padded batches (one of length 0, one of 1, one full), causal and not.
fn padded(tiles: &'static [Bf16Tile]) {
    for tile in tiles {
        for (s, d, causal) in [(67, 64, false), (65, 80, true), (13, 17, true)] {
            let shape = (3, 2, s, d, causal);
            let w = bf16_workload(shape);
            let p = Problem::random(&w, 11);
            let lens = [s as i32 - 3, 0, 1];
            for (br, bc, par) in blockings() {
                let exe = Bf16Attention::new(shape, tile, (br, bc), par);
                let o = run(&exe, &p, Some(&lens));
                let tag = format!("{} {w} lens {lens:?} br={br} bc={bc}", tile.name);
                check_both(&tag, &p, &o, Some(&lens));
                let batch = 2 * s * d;
                assert!(o[batch..2 * batch].iter().all(|&x| x == 0.0), "{tag}");
            }
        }
    }
}

#[test]
fn emulated_twins_mask_padding() {
    padded(EMULATED);
}

#[test]
fn avx512bf16_tiles_mask_padding_where_the_cpu_has_them() {
    let runnable: Vec<&'static Bf16Tile> = TILES.iter().filter(|t| t.available()).collect();
    if runnable.is_empty() {
        crate::testing::skipped(
            "bf16 attention tiles",
            "avx512bf16",
            "no AVX512_BF16 on this CPU",
        );
        return;
    }
    for tile in runnable {
        padded(std::slice::from_ref(tile));
    }
}

/// QKV rows read in place (`run_qkv_rows`) give the heads-layout result to the bit, padded
/// or not, for every shape and blocking.
fn qkv_rows(tiles: &'static [Bf16Tile]) {
    use crate::cpu::attention::layout::run_via_heads;
    for tile in tiles {
        for &shape in SHAPES {
            let (b, h, s, d, _) = shape;
            let w = bf16_workload(shape);
            let n = b * h * s * d;
            let qkv: Vec<f32> = (0..3 * n).map(|i| (i as f32 * 0.913).sin()).collect();
            let lens: Vec<i32> = (0..b).map(|i| [s as i32 - 1, 0][i % 2]).collect();
            for (br, bc, par) in blockings() {
                let exe = Bf16Attention::new(shape, tile, (br, bc), par);
                for lens in [None, Some(&lens[..])] {
                    let mut want = vec![f32::NAN; n];
                    run_via_heads(&exe, &w, (&qkv, lens), &mut want).unwrap();
                    let mut got = vec![f32::NAN; n];
                    exe.run_qkv_rows(&qkv, lens, &mut got).unwrap().unwrap();
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "{} {shape:?} br={br} bc={bc} {lens:?}", tile.name);
                }
            }
        }
    }
}

#[test]
fn emulated_twins_read_qkv_rows_in_place() {
    qkv_rows(EMULATED);
}

#[test]
fn avx512bf16_tiles_read_qkv_rows_in_place_where_the_cpu_has_them() {
    let runnable: Vec<&'static Bf16Tile> = TILES.iter().filter(|t| t.available()).collect();
    if runnable.is_empty() {
        crate::testing::skipped(
            "bf16 attention tiles",
            "avx512bf16",
            "no AVX512_BF16 on this CPU",
        );
        return;
    }
    for tile in runnable {
        qkv_rows(std::slice::from_ref(tile));
    }
}

/// The bf16 result really is bf16: against the f32 problem it is off by more than f32
/// rounding would be, and within the bf16 bound.
#[test]
fn results_carry_bf16_rounding() {
    let shape = (1, 2, 65, 64, false);
    let p = Problem::random(&bf16_workload(shape), 5);
    let exe = Bf16Attention::new(shape, &EMULATED[0], (64, 64), AttnPar::None);
    let o = run(&exe, &p, None);
    let f32_problem = Problem {
        workload: p.workload.with_dtype(DType::F32),
        inputs: p.inputs.clone(),
    };
    assert!(f32_problem.check(&o, &f32_problem.reference()).is_err());
    assert!(p.check(&o, &p.reference()).is_ok());
}

/// An x86-64 fingerprint with AVX-512F and AVX512BW, and AVX512_BF16 if `bf16`.
fn avx512_machine(bf16: bool) -> HardwareFingerprint {
    let mut isa = vec!["avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl"];
    if bf16 {
        isa.push("avx512bf16");
    }
    HardwareFingerprint::new(
        "x86_64",
        "GenuineIntel",
        (6, 143, 8),
        "AVX512_BF16 test machine",
        isa.into_iter().map(String::from).collect(),
        2,
        (48 << 10, 2 << 20, 60 << 20),
    )
}

/// The `tile` knob's values of `space` (none for an unsatisfiable space).
fn tiles_of(space: &crate::space::Space) -> Vec<crate::space::Value> {
    let tile = space.knobs().iter().find(|k| k.name == "tile");
    tile.map_or(Vec::new(), |k| k.values.clone())
}

/// Spaces follow the fingerprint: tiles only with `avx512bf16`; the default fits its space
/// there; `supports` follows this CPU, and a family that cannot run says why.
#[test]
fn spaces_follow_the_fingerprint_and_support_this_cpu() {
    let w = bf16_workload((2, 12, 128, 64, false));
    let with = avx512_machine(true);
    let names = tiles_of(&AttentionBf16.space(&w, &with));
    assert_eq!(names.len(), TILES.len(), "{names:?}");
    for hw in [with.with_cores(1), with.clone()] {
        let c = AttentionBf16.default_config(&w, &hw);
        assert!(AttentionBf16.config_fits(&w, &hw, &c), "{c}");
        assert!(AttentionBf16.space(&w, &hw).check(&c).is_ok(), "{c}");
        // `config_fits` agrees with the space on every config of the knobs' product.
        for small in [w, bf16_workload((1, 1, 40, 64, true))] {
            let space = AttentionBf16.space(&small, &hw);
            let mut valid = 0;
            for i in 0..space.cardinality() {
                let c = space.config_at(i);
                let fits = AttentionBf16.config_fits(&small, &hw, &c);
                assert_eq!(fits, space.check(&c).is_ok(), "{small} {c}");
                valid += usize::from(fits);
            }
            assert!(valid > 0, "{small}");
        }
    }
    for hw in [avx512_machine(false), HardwareFingerprint::reference_zen3()] {
        assert!(tiles_of(&AttentionBf16.space(&w, &hw)).is_empty());
        let c = AttentionBf16.default_config(&w, &with);
        assert!(!AttentionBf16.config_fits(&w, &hw, &c));
    }
    let runs = TILES.iter().any(|t| t.available());
    assert_eq!(AttentionBf16.supports(&w), runs);
    assert!(!AttentionBf16.supports(&w.with_dtype(DType::F32)));
    assert_eq!(AttentionBf16.missing_here(&w).is_some(), !runs);
    let c = AttentionBf16.default_config(&w, &with);
    match AttentionBf16.build(&w, &c) {
        Ok(_) => assert!(runs),
        Err(e) => assert!(!runs && e.to_string().contains("AVX512_BF16"), "{e}"),
    }
}

/// The packers against their layouts written out element by element: odd D, D past one
/// 32-column stripe, D past several 64-value conversion pieces (300), odd key lengths,
/// length 0, groups of 8 keys across panels (BERT's D = 64); rows adjacent (`ld = D`) and
/// rows of a wider matrix (a fused QKV row). Queries are packed as the bf16 GEMM's A rows
/// (`pack_a_pair_rows`, tested with it).
#[test]
fn packers_follow_their_layouts() {
    use super::ukernel::{pack_keys, pack_values};
    use crate::cpu::bgemm::convert::to_bf16;
    for (s, d, nr, klen) in [
        (7usize, 17usize, 32usize, 5usize),
        (13, 80, 64, 13),
        (5, 300, 32, 4),
        (3, 33, 32, 0),
        // Whole groups of 8 keys (the transposing path) across panels, and a tail.
        (70, 64, 32, 67),
        (40, 37, 64, 40),
    ] {
        for ld in [d, 3 * d + 1] {
            let x: Vec<f32> = (0..(s - 1) * ld + d)
                .map(|i| (i as f32 * 0.37).sin() * 3.0)
                .collect();
            packed_as_written_out(&x, (s, d, ld), nr, klen);
        }
    }

    fn packed_as_written_out(x: &[f32], (s, d, ld): (usize, usize, usize), nr: usize, klen: usize) {
        let (dsteps, dp, spairs) = (d.div_ceil(2), d.div_ceil(16) * 16, s.div_ceil(2));
        let at = |j: usize, c: usize| {
            if j < klen && c < d {
                to_bf16(x[j * ld + c])
            } else {
                0
            }
        };
        let case = format!("S {s} D {d} ld {ld} length {klen}");

        let half = |w: u32, c: usize| (w >> (16 * (c % 2))) as u16;
        let mut kp = vec![0u32; s.div_ceil(nr) * dsteps * nr];
        pack_keys((x, ld), d, nr, klen, &mut kp);
        for j in 0..s.div_ceil(nr) * nr {
            for c in 0..2 * dsteps {
                let got = half(kp[j / nr * dsteps * nr + c / 2 * nr + j % nr], c);
                assert_eq!(got, at(j, c), "key ({j}, {c}) of {case}");
            }
        }

        let mut vp = vec![0u32; dp * spairs];
        pack_values((x, ld), (d, dp), spairs, klen, &mut vp);
        for j in 0..2 * spairs {
            for c in 0..dp {
                let (c0, width) = (c / 32 * 32, 32.min(dp - c / 32 * 32));
                let got = half(vp[c0 * spairs + j / 2 * width + c - c0], j);
                assert_eq!(got, at(j, c), "value ({j}, {c}) of {case}");
            }
        }
    }
}
