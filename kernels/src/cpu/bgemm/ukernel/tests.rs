//! Tests of the micro-kernels: every kernel this process runs and every emulated AVX-512 and
//! AMX twin against the f64 sum of the same bf16 products, and the emulated `vdpbf16ps`
//! against a scalar formula and the SDM's edge cases.

use super::emulate::{dpbf16_lane, twin_of, AMX_ODD_ROWS, EMULATED};
use super::*;
use crate::cpu::bgemm::convert::{from_bf16, pack_a_rounded, round_bf16, to_bf16, Bf16B};
use crate::cpu::bgemm::layout::pack_a_pair_rows;
use crate::rng::Rng;
use crate::workload::Act;

/// Row-major `rows × kc` A (bf16 values) packed for `uk` as whole micro-panels.
fn pack_for(uk: &Bf16Kernel, a: &[f32], rows: usize, kc: usize) -> Vec<f32> {
    let steps = uk.layout.steps(kc);
    let mut out = vec![f32::NAN; rows.div_ceil(uk.mr) * uk.mr * steps];
    let (all, depth) = ((0, rows), (0, kc));
    match uk.a_pack {
        APack::PairRows => pack_a_pair_rows(a, kc, all, depth, uk.mr, halves_mut(&mut out)),
        APack::Rounded => pack_a_rounded(a, kc, all, depth, uk.mr, &mut out),
    }
    out
}

/// Why this process does not run `uk`, if it does not: `no AVX512_BF16 on this CPU`, `no AMX
/// tile state on this CPU/OS`, or the level capped off by `AUTOKERNEL_ISA`.
fn skip_reason(uk: &Bf16Kernel) -> Option<String> {
    let what = uk.missing()?;
    Some(match what {
        "AMX-BF16" => "no AMX tile state on this CPU/OS".into(),
        "AVX512_BF16" => format!("no {what} on this CPU"),
        _ if uk.isa <= Isa::cpu_best() => format!("{what} capped off by AUTOKERNEL_ISA"),
        _ => format!("no {what} on this CPU"),
    })
}

/// Runs `uk` on random operands of depth `kc` over whole and clipped windows, with and
/// without accumulation and an epilogue, and checks every element against the f64 sum of
/// the bf16 products within f32 rounding.
fn check_tiles(uk: &Bf16Kernel, rng: &mut Rng) {
    let (mr, nr) = (uk.mr, uk.nr);
    for kc in [1, 2, 3, 64, 257] {
        let tiles = 3;
        let a: Vec<f32> = (0..tiles * mr * kc)
            .map(|_| round_bf16(rng.symmetric_f32()))
            .collect();
        let b: Vec<f32> = (0..kc * nr).map(|_| rng.symmetric_f32()).collect();
        let bias: Vec<f32> = (0..nr).map(|_| rng.symmetric_f32()).collect();
        let apack = pack_for(uk, &a, tiles * mr, kc);
        let panel = Bf16B::new(&b, kc, nr, nr, uk.layout).unwrap();
        let steps = uk.layout.steps(kc);
        // Windows: every tile whole, then clipped rows and columns.
        for (rows, cols) in [(tiles * mr, nr), (tiles * mr - 1, nr - 3)] {
            for (accumulate, act) in [(false, None), (true, Some(Act::Relu))] {
                let mut c = vec![0.25f32; rows * cols];
                let mut view = CView::new(&mut c, rows, cols, cols);
                let ep = act.map(|act| TileEpilogue { bias: &bias, act });
                let block = panel.panel(0);
                uk.tiles(
                    steps,
                    &apack,
                    tiles,
                    block,
                    &mut view,
                    (0, 0),
                    accumulate,
                    ep,
                );
                for i in 0..rows {
                    for j in 0..cols {
                        let (mut z, mut mag) = (0f64, 0f64);
                        for p in 0..kc {
                            let x = a[i * kc + p] as f64 * from_bf16(panel.get(p, j)) as f64;
                            z += x;
                            mag += x.abs();
                        }
                        if accumulate {
                            z += 0.25;
                        }
                        if let Some(act) = act {
                            z = act.apply_f64(z + bias[j] as f64);
                        }
                        let tol = 1e-6 * (mag + 1.0) * (kc as f64).sqrt();
                        let got = c[i * cols + j] as f64;
                        assert!(
                            (got - z).abs() <= tol,
                            "{} kc {kc} {rows}x{cols} ({i}, {j}): {got} vs {z}",
                            uk.name
                        );
                    }
                }
            }
        }
    }
}

/// Every kernel this process runs computes its tiles; the others say why they were skipped.
#[test]
fn every_available_kernel_computes_its_tile() {
    let mut rng = Rng::new(21);
    for uk in KERNELS {
        match skip_reason(uk) {
            Some(why) => crate::testing::skipped(uk.name, uk.missing().unwrap_or("?"), &why),
            None => check_tiles(uk, &mut rng),
        }
    }
}

/// The emulated twins run the AVX-512 and AMX bodies on every CPU; the AMX body also with
/// tile rows the real kernels do not use.
#[test]
fn every_emulated_avx512_and_amx_kernel_computes_its_tile() {
    let mut rng = Rng::new(22);
    for uk in EMULATED.iter().chain(AMX_ODD_ROWS) {
        check_tiles(uk, &mut rng);
    }
}

/// Each AVX-512 and AMX kernel has a twin of the same shape and layouts (so the same body
/// instantiation: for AMX, NR fixes the arrangement and MR the tile rows), and each twin a
/// kernel.
#[test]
fn every_avx512_and_amx_kernel_has_an_emulated_twin() {
    for k in KERNELS.iter().filter(|k| k.isa == Isa::Avx512) {
        let t = twin_of(k).unwrap_or_else(|| panic!("{}: no twin", k.name));
        let shape = |k: &Bf16Kernel| (k.mr, k.nr, k.layout, k.a_pack);
        assert_eq!(shape(t), shape(k), "{}", k.name);
        assert_eq!(k.bf16 || k.amx, k.layout == Layout::Pairs, "{}", k.name);
        assert_eq!(k.bf16 || k.amx, k.a_pack == APack::PairRows, "{}", k.name);
        assert!(!k.bf16 || !k.amx, "{}: one instruction set", k.name);
        assert!(!t.amx && !t.bf16, "{}: the twin runs everywhere", t.name);
    }
    #[cfg(target_arch = "x86_64")]
    for t in EMULATED {
        let has_kernel = KERNELS
            .iter()
            .any(|k| twin_of(k).is_some_and(|x| std::ptr::eq(x, t)));
        assert!(has_kernel, "{}: no kernel", t.name);
    }
}

/// Where the OS granted this process AMX-BF16: every `amx_bf16_*` kernel (the real
/// `tdpbf16ps`) computes its tiles and agrees with its emulated twin as the `vdpbf16ps`
/// kernels must (bits that differ printed). Elsewhere it says it was skipped.
#[test]
fn real_amx_bf16_kernels_compute_their_tiles_where_granted() {
    let real: Vec<&Bf16Kernel> = KERNELS.iter().filter(|k| k.amx).collect();
    #[cfg(target_arch = "x86_64")]
    assert_eq!(real.len(), 4);
    if !has_amx_bf16() {
        let why = "no AMX tile state on this CPU/OS";
        crate::testing::skipped("amx_bf16 kernels", "amx_bf16", why);
        return;
    }
    let mut rng = Rng::new(25);
    for uk in real {
        assert!(uk.available(), "{}: {:?}", uk.name, uk.missing());
        check_tiles(uk, &mut rng);
        compare_with_twin(uk, &mut rng);
    }
}

/// Where this CPU runs the `vdpbf16ps` kernels: each agrees with its emulated twin within
/// the bound of a depth-301 sum's roundings, and how many of its outputs differ in any bit
/// is printed (the SDM's text is what the emulation follows; the count is 0 on a Zen 4).
#[test]
fn real_vdpbf16ps_kernels_against_their_twins() {
    let mut rng = Rng::new(23);
    for uk in KERNELS.iter().filter(|k| k.bf16) {
        if let Some(why) = skip_reason(uk) {
            crate::testing::skipped(uk.name, uk.missing().unwrap_or("?"), &why);
            continue;
        }
        compare_with_twin(uk, &mut rng);
    }
}

/// One `uk` tile (depth 301) against its emulated twin's on the same operands: every output
/// within `301·ε·Σ|a·b|` of the twin's (a wrong pair order or layout is off by O(Σ|a·b|));
/// prints how many differ in any bit.
fn compare_with_twin(uk: &Bf16Kernel, rng: &mut Rng) {
    let twin = twin_of(uk).expect("every AVX-512 and AMX kernel has a twin");
    let kc = 301;
    let a: Vec<f32> = (0..uk.mr * kc)
        .map(|_| round_bf16(rng.symmetric_f32()))
        .collect();
    let b: Vec<f32> = (0..kc * uk.nr).map(|_| rng.symmetric_f32()).collect();
    let (apack, panel) = (
        pack_for(uk, &a, uk.mr, kc),
        Bf16B::new(&b, kc, uk.nr, uk.nr, uk.layout).unwrap(),
    );
    let run = |k: &Bf16Kernel| {
        let mut c = vec![0f32; uk.mr * uk.nr];
        let mut view = CView::new(&mut c, uk.mr, uk.nr, uk.nr);
        let steps = k.layout.steps(kc);
        let block = panel.panel(0);
        k.tiles(steps, &apack, 1, block, &mut view, (0, 0), false, None);
        c
    };
    let (real, emu) = (run(uk), run(twin));
    for (at, (x, y)) in real.iter().zip(&emu).enumerate() {
        let (i, j) = (at / uk.nr, at % uk.nr);
        let magnitude: f64 = (0..kc)
            .map(|p| f64::from(a[i * kc + p] * round_bf16(b[p * uk.nr + j])).abs())
            .sum();
        let bound = kc as f64 * f64::from(f32::EPSILON) * magnitude;
        let diff = f64::from(x - y).abs();
        assert!(
            diff <= bound,
            "{}: C[{i}][{j}] = {x}, emulated {y}",
            uk.name
        );
    }
    let differ = real
        .iter()
        .zip(&emu)
        .filter(|(x, y)| x.to_bits() != y.to_bits());
    println!(
        "{}: {} of {} outputs differ from the emulation in some bit",
        uk.name,
        differ.count(),
        real.len()
    );
}

/// Words of two bf16 values: `hi` in the high half.
fn pair(hi: f32, lo: f32) -> u32 {
    u32::from(to_bf16(hi)) << 16 | u32::from(to_bf16(lo))
}

/// The SDM's order, rounding and denormal rules on values where each matters.
#[test]
fn emulated_vdpbf16ps_follows_the_sdm_on_edge_cases() {
    let two = |e: i32| 2f32.powi(e);
    let one = pair(1.0, 1.0);
    // High pair first: 1 + 2²⁴ rounds (tie, even) to 2²⁴, then + 1 again to 2²⁴; low pair
    // first would give 2 + 2²⁴ exactly.
    assert_eq!(
        dpbf16_lane(1.0, pair(two(12), 1.0), pair(two(12), 1.0)),
        two(24)
    );
    // One rounding per step: 1 + 2⁻²⁴ twice stays 1 (a single rounding: 1 + 2⁻²³).
    let step = pair(two(-12), two(-12));
    assert_eq!(dpbf16_lane(1.0, step, step), 1.0);
    // Fused: 2⁶⁴·2⁶⁴ = 2¹²⁸ overflows as an f32 product, but −MAX + 2¹²⁸ = 2¹⁰⁴ does not.
    let big = pair(two(64), 0.0);
    assert_eq!(dpbf16_lane(-f32::MAX, big, big), two(104));
    // DAZ on a bf16 operand: the smallest bf16 subnormal (0x0001) times 2¹⁰⁰ counts as 0.
    let tiny = 0x0001_0000u32;
    assert_eq!(dpbf16_lane(0.0, tiny, pair(two(100), 0.0)).to_bits(), 0);
    // DAZ on the accumulator: 2⁻¹²⁷ (subnormal) + 2⁻¹²⁶ gives 2⁻¹²⁶, not 1.5·2⁻¹²⁶.
    let acc = f32::from_bits(0x0040_0000);
    assert_eq!(
        dpbf16_lane(acc, pair(two(-126), 0.0), pair(1.0, 0.0)),
        two(-126)
    );
    // FTZ on the result: 2⁻¹²⁶ − 2⁻¹²⁷ is subnormal, so +0 (and −0 for the mirror image).
    let (p, q) = (pair(-two(-63), 0.0), pair(two(-64), 0.0));
    assert_eq!(dpbf16_lane(two(-126), p, q).to_bits(), 0);
    let neg = pair(two(-63), -0.0); // the low product −0 keeps the sign of the flushed −0
    assert_eq!(dpbf16_lane(-two(-126), neg, q).to_bits(), 0x8000_0000);
    // Overflow to ∞, and NaN from ∞·0 and from a NaN operand.
    let most = pair(from_bf16(0x7F7F), 0.0); // the largest finite bf16
    assert_eq!(dpbf16_lane(f32::MAX, one, most), f32::INFINITY);
    assert!(dpbf16_lane(0.0, pair(f32::INFINITY, 0.0), pair(0.0, 0.0)).is_nan());
    assert!(dpbf16_lane(0.0, pair(1.0, f32::NAN), one).is_nan());
    assert!(dpbf16_lane(f32::NAN, one, one).is_nan());
}

/// On values whose sums f64 holds exactly, each step is the exact sum rounded once to f32:
/// the emulation must agree bit for bit, lane by lane through the 16-lane `dot` too. The
/// bf16 values are `±(1 + m/128)·2^e` with `|e| ≤ 4`, the accumulators at least 2⁻⁴: every
/// value, product and rounded partial sum then has its lowest bit at or above 2⁻²⁷ and its
/// highest below 2¹², 39 bits that an f64 holds exactly.
#[test]
fn emulated_vdpbf16ps_matches_the_scalar_formula() {
    use super::body::DotBf16;
    use super::emulate::EmuDp;
    let mut rng = Rng::new(24);
    let mut bf = || {
        let (e, m, sign) = (rng.below(9) as i32 - 4, rng.below(128), rng.below(2));
        let x = (1.0 + m as f32 / 128.0) * 2f32.powi(e);
        let h = to_bf16(if sign == 1 { -x } else { x });
        assert_eq!(from_bf16(h).abs(), x, "exact");
        h
    };
    for _ in 0..2000 {
        let a: [u32; 16] = std::array::from_fn(|_| u32::from(bf()) << 16 | u32::from(bf()));
        let b: [u32; 16] = std::array::from_fn(|_| u32::from(bf()) << 16 | u32::from(bf()));
        let acc: [f32; 16] = std::array::from_fn(|i| from_bf16(bf()) * (1.0 + i as f32 / 3.0));
        // SAFETY: the emulation needs no CPU feature.
        let got = unsafe { EmuDp::dot(acc, a, b) };
        for i in 0..16 {
            let v = |w: u32, s: u32| from_bf16((w >> s) as u16) as f64;
            let t = (acc[i] as f64 + v(a[i], 16) * v(b[i], 16)) as f32;
            let want = (t as f64 + v(a[i], 0) * v(b[i], 0)) as f32;
            assert_eq!(got[i].to_bits(), want.to_bits(), "lane {i}: {got:?}");
        }
    }
}
