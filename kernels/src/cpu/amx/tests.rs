//! The emulated tile unit against scalar definitions of the instructions (so it cannot
//! simply agree with a wrong kernel), the session's checks and release, and — where this
//! process may use AMX — the real unit against the emulated one.

use super::*;
use crate::rng::Rng;

/// A random `rows × colsb` block of bytes.
fn random_bytes(rng: &mut Rng, rows: usize, colsb: usize) -> Vec<u8> {
    (0..rows * colsb).map(|_| rng.below(256) as u8).collect()
}

/// `C (M×N i32) + Σ_k Σ_i fa(A[m][4k+i])·fb(B[k][4n+i])` with wrap-around, from the
/// instructions' one-line definition.
fn scalar_dot(
    c: &[i32],
    a: &[u8],
    b: &[u8],
    (m, k, n): (usize, usize, usize),
    fa: fn(u8) -> i32,
) -> Vec<i32> {
    let mut out = c.to_vec();
    for r in 0..m {
        for j in 0..n {
            for g in 0..k {
                for i in 0..4 {
                    let p = fa(a[r * 4 * k + 4 * g + i]) * (b[g * 4 * n + 4 * j + i] as i8 as i32);
                    out[r * n + j] = out[r * n + j].wrapping_add(p);
                }
            }
        }
    }
    out
}

/// C (tmm0) = C + A (tmm1) · B (tmm2) on `unit` with `op`, C stored with a gap after each row
/// (which must stay untouched).
fn run_dot<U: TileUnit>(
    unit: &mut U,
    op: &str,
    (m, k, n): (usize, usize, usize),
    c: &[u8],
    a: &[u8],
    b: &[u8],
) -> Vec<u8> {
    let cfg = TileConfig::new()
        .tile(0, m, 4 * n)
        .tile(1, m, 4 * k)
        .tile(2, k, 4 * n);
    let mut t = Tiles::configure(unit, cfg);
    t.load::<0>(c, 4 * n);
    t.load::<1>(a, 4 * k);
    t.load::<2>(b, 4 * n);
    match op {
        "tdpbusd" => t.dpbusd::<0, 1, 2>(),
        "tdpbssd" => t.dpbssd::<0, 1, 2>(),
        _ => t.dpbf16ps::<0, 1, 2>(),
    }
    let ld = 4 * n + 8;
    let mut out = vec![0xAB; (m - 1) * ld + 4 * n];
    t.store::<0>(&mut out, ld);
    for r in 0..m - 1 {
        assert!(
            out[r * ld + 4 * n..(r + 1) * ld].iter().all(|&x| x == 0xAB),
            "gap written"
        );
    }
    out.chunks(ld)
        .flat_map(|row| row[..4 * n].to_vec())
        .collect()
}

fn i32s(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|x| i32::from_le_bytes(x.try_into().unwrap()))
        .collect()
}

const SHAPES: [(usize, usize, usize); 5] =
    [(1, 1, 1), (16, 16, 16), (5, 7, 3), (16, 3, 16), (2, 16, 9)];

#[test]
fn emulated_integer_dots_follow_their_definition() {
    let mut rng = Rng::new(3);
    for (m, k, n) in SHAPES {
        let (a, b) = (
            random_bytes(&mut rng, m, 4 * k),
            random_bytes(&mut rng, k, 4 * n),
        );
        let c = random_bytes(&mut rng, m, 4 * n);
        for (op, fa) in [
            ("tdpbusd", (|x| x as i32) as fn(u8) -> i32),
            ("tdpbssd", |x| x as i8 as i32),
        ] {
            let got = run_dot(&mut Emulated::default(), op, (m, k, n), &c, &a, &b);
            let want = scalar_dot(&i32s(&c), &a, &b, (m, k, n), fa);
            assert_eq!(i32s(&got), want, "{op} {m}×{k}×{n}");
        }
    }
    // Extreme codes, and the i32 sum wraps around instead of saturating.
    let c = i32::MAX.to_le_bytes().to_vec();
    let got = run_dot(
        &mut Emulated::default(),
        "tdpbusd",
        (1, 1, 1),
        &c,
        &[255, 255, 0, 0],
        &[127, 127, 0, 0],
    );
    assert_eq!(i32s(&got), [i32::MAX.wrapping_add(2 * 255 * 127)]);
    let got = run_dot(
        &mut Emulated::default(),
        "tdpbusd",
        (1, 1, 1),
        &[0; 4],
        &[255; 4],
        &[0x81; 4],
    );
    assert_eq!(i32s(&got), [4 * 255 * -127]);
}

/// bf16 bits of `x` (exact for the values used here).
fn bf16(x: f32) -> [u8; 2] {
    assert_eq!(x.to_bits() & 0xffff, 0, "{x} is not a bf16 value");
    ((x.to_bits() >> 16) as u16).to_le_bytes()
}

fn bf16_tile(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|&x| bf16(x)).collect()
}

#[test]
fn emulated_bf16_dot_follows_its_definition() {
    let mut rng = Rng::new(4);
    // Small integers and halves: every product and sum is exact, so any order agrees.
    let mut val = || (rng.below(33) as f32 - 16.0) / 2.0;
    for (m, k, n) in SHAPES {
        let a: Vec<f32> = (0..m * 2 * k).map(|_| val()).collect();
        let b: Vec<f32> = (0..k * 2 * n).map(|_| val()).collect();
        let c: Vec<f32> = (0..m * n).map(|_| val()).collect();
        let got = run_dot(
            &mut Emulated::default(),
            "tdpbf16ps",
            (m, k, n),
            bytes(&c),
            &bf16_tile(&a),
            &bf16_tile(&b),
        );
        for r in 0..m {
            for j in 0..n {
                let want = c[r * n + j]
                    + (0..2 * k)
                        .map(|p| a[r * 2 * k + p] * b[p / 2 * 2 * n + 2 * j + p % 2])
                        .sum::<f32>();
                let x = f32::from_le_bytes(got[4 * (r * n + j)..][..4].try_into().unwrap());
                assert_eq!(x, want, "{m}×{k}×{n} ({r}, {j})");
            }
        }
    }
    // Input denormals read as zero: 1e-40 (a bf16 denormal) · 2^100 adds nothing.
    let tiny = f32::from_bits(0x0001_0000);
    let got = run_dot(
        &mut Emulated::default(),
        "tdpbf16ps",
        (1, 1, 1),
        bytes(&[0f32]),
        &bf16_tile(&[tiny, 0.0]),
        &bf16_tile(&[2f32.powi(100), 0.0]),
    );
    assert_eq!(got, 0f32.to_le_bytes());
    // Output denormals are flushed: 2^-70 · 2^-70 = 2^-140 becomes 0.
    let small = 2f32.powi(-70);
    let got = run_dot(
        &mut Emulated::default(),
        "tdpbf16ps",
        (1, 1, 1),
        bytes(&[0f32]),
        &bf16_tile(&[small, 0.0]),
        &bf16_tile(&[small, 0.0]),
    );
    assert_eq!(got, 0f32.to_le_bytes());
    // The SDM's order: the even and odd products summed from zero, then added to C. With
    // C = 2^24 and products 1 and 1, that is 2^24 + 2; adding each product into C in turn
    // would round 2^24 + 1 back to 2^24 twice.
    let got = run_dot(
        &mut Emulated::default(),
        "tdpbf16ps",
        (1, 1, 1),
        bytes(&[2f32.powi(24)]),
        &bf16_tile(&[1.0, 1.0]),
        &bf16_tile(&[1.0, 1.0]),
    );
    assert_eq!(got, (2f32.powi(24) + 2.0).to_le_bytes());
}

#[test]
fn faults_and_bounds_panic_before_anything_runs_and_sessions_release() {
    let panics = |f: &mut dyn FnMut()| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
            .unwrap_err()
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default()
    };
    let mut unit = Emulated::default();
    let cfg = TileConfig::new()
        .tile(0, 4, 64)
        .tile(1, 4, 64)
        .tile(2, 16, 64);
    let msg = panics(&mut || {
        let mut t = Tiles::configure(&mut unit, cfg);
        t.load::<1>(&[0u8; 3 * 64 + 63], 64);
    });
    assert!(msg.contains("AMX bounds in tileloadd"), "{msg}");
    assert!(!unit.configured(), "released while unwinding");
    let msg = panics(&mut || {
        let mut t = Tiles::configure(&mut unit, cfg);
        t.dpbusd::<0, 2, 1>();
    });
    assert!(msg.contains("#UD in tdpbusd"), "{msg}");
    let msg = panics(&mut || {
        Tiles::configure(&mut unit, TileConfig::new().tile(0, 17, 64));
    });
    assert!(msg.contains("#GP in ldtilecfg"), "{msg}");
    // The unit itself faults on an unconfigured tile, as the hardware would.
    // SAFETY: the emulated unit touches no memory of ours in `tilezero`; it faults here.
    let msg = panics(&mut || unsafe { unit.zero::<0>() });
    assert!(msg.contains("not configured"), "{msg}");
    {
        let mut t = Tiles::configure(&mut unit, cfg);
        t.zero::<0>();
    }
    assert!(!unit.configured());
}

/// Where this process may use AMX: the real unit computes what the emulated one does, and a
/// panic inside a session leaves the thread's tiles released.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_real_unit_agrees_with_the_emulated_one_where_granted() {
    let fp_says =
        crate::amx::state().flags.contains(&"amx_tile") && crate::isa::Isa::Avx512.available();
    if fp_says {
        // Reported: palette 1 and the TMUL limits fit (they are part of the grant).
        let p = crate::amx::palette1().expect("CPUID tile palette 1");
        assert!(
            p.fits(),
            "palette 1 {p:?} is smaller than TileConfig assumes"
        );
        let t = crate::amx::tmul().expect("CPUID TMUL leaf");
        assert!(t.fits(), "TMUL {t:?} is smaller than the kernels' tiles");
    }
    let Some(mut real) = AsmTiles::open() else {
        crate::testing::skipped(
            "amx tile unit",
            "amx_tile",
            "no AMX tile state on this CPU/OS",
        );
        return;
    };
    let mut rng = Rng::new(5);
    for (m, k, n) in SHAPES {
        let (a, b) = (
            random_bytes(&mut rng, m, 4 * k),
            random_bytes(&mut rng, k, 4 * n),
        );
        let c = random_bytes(&mut rng, m, 4 * n);
        let mut ops = vec![];
        if real.int8() {
            ops.extend(["tdpbusd", "tdpbssd"]);
        }
        for op in ops {
            let want = run_dot(&mut Emulated::default(), op, (m, k, n), &c, &a, &b);
            assert_eq!(
                run_dot(&mut real, op, (m, k, n), &c, &a, &b),
                want,
                "{op} {m}×{k}×{n}"
            );
        }
        if real.bf16() {
            let mut val = || bf16((rng.below(33) as f32 - 16.0) / 2.0);
            let a: Vec<u8> = (0..m * 2 * k).flat_map(|_| val()).collect();
            let b: Vec<u8> = (0..k * 2 * n).flat_map(|_| val()).collect();
            let c = bytes(&vec![1.5f32; m * n]).to_vec();
            let want = run_dot(&mut Emulated::default(), "tdpbf16ps", (m, k, n), &c, &a, &b);
            assert_eq!(
                run_dot(&mut real, "tdpbf16ps", (m, k, n), &c, &a, &b),
                want,
                "bf16 {m}×{k}×{n}"
            );
        }
    }
    let cfg = TileConfig::new().tile(0, 2, 8);
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut t = Tiles::configure(&mut real, cfg);
        t.load::<0>(&[0u8; 4], 8);
    }));
    assert!(unwound.is_err());
    // Released while unwinding: a new session configures.
    let mut t = Tiles::configure(&mut real, cfg);
    t.zero::<0>();
}
