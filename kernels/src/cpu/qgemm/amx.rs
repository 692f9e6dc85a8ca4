//! AMX int8 micro-kernels: one `MR × NR` tile of the driver's contract
//! (`acc[r·NR + c] (+)= Σ_p a[r·lda + p] · b[(p/4·NR + c)·4 + p%4]`) with `tdpbusd`, on the
//! AMX skeleton shared with the bf16 kernels ([`crate::cpu::amx::tiled`]), written once over
//! [`TileUnit`], so the same body runs on the real tile unit ([`AsmTiles`]) and on the
//! emulated one (tests, every CPU).
//!
//! Four accumulator tiles (`tmm0..tmm3`, `rows × 16` i32 each) in one of three arrangements —
//! 2×2 (`MR = 2·rows`, `NR = 32`), 1×4 (`rows`, 64), 4×1 (`4·rows`, 16) — and the operand
//! tiles in `tmm4..tmm7`. The tile rows (≤ 16) are part of the kernel, so few-row shapes
//! compute no padded rows. Activations use full 8-bit codes (`max_code` 255: `tdpbusd` sums
//! `u8·s8` products in i32, nothing saturates).
//!
//! The B panel is already the AMX B-tile layout: a group of 4 depths is one row of `NR`
//! columns × 4 bytes, so the B tile of columns `16j..16j+16` and depths `64s..64s+64` is 16
//! rows of 64 bytes at `(64·s·NR + 64·j)` bytes, `4·NR` bytes apart. An A tile is `rows` rows
//! of 64 codes, `lda` apart. The accumulators are loaded from (or zeroed for) and stored to
//! `acc`, `4·NR` bytes per row.
//!
//! Depth: the driver pads K to a multiple of 4; the kernel steps it by 64. A remainder below
//! 64 is copied, zero-padded to 64, into staging tiles on the stack (A: `MR × 64` bytes;
//! B: 16 rows × `4·NR`) and takes one more step: the zeros add nothing, and no load reads past
//! the operands. The tile state is configured at the start of every call (for a run of row
//! tiles, [`dot`]) and released at its end (the session's `Drop`, on every path).

#[cfg(test)]
use super::ukernel::{DotKernel, DotsFn, Entry};
use crate::cpu::amx::tiled::{self, Arrangement, DpBusd};
pub(super) use crate::cpu::amx::tiled::{Square, Tall, Wide};
#[cfg(test)]
use crate::cpu::amx::Emulated;
use crate::cpu::amx::{bytes, bytes_mut, TileUnit, Tiles};

/// The kernel body on `unit`: `tiles` row tiles (`RT·rows` rows each, `lda` apart, one
/// after the other in `a`) of `kp` (a multiple of 4) depths times the B panel chunk `b`
/// (`kp/4` group rows of `NR·4` codes), into `acc` (`RT·rows × NR` i32 per tile, one after
/// the other), added to its values when `accumulate`. The tiles are configured once for all
/// of them.
#[allow(clippy::too_many_arguments)]
pub(super) fn body<U: TileUnit, L: Arrangement>(
    unit: &mut U,
    rows: usize,
    kp: usize,
    a: &[u8],
    lda: usize,
    b: &[i8],
    acc: &mut [i32],
    accumulate: bool,
    tiles: usize,
) {
    let (mr, nr) = (L::RT * rows, L::CT * 16);
    let mut t = Tiles::configure(unit, L::config(rows));
    let b = bytes(b);
    for i in 0..tiles {
        let acc = bytes_mut(&mut acc[i * mr * nr..(i + 1) * mr * nr]);
        let a = &a[i * mr * lda..];
        tiled::run::<U, L, DpBusd>(&mut t, rows, kp, a, lda, b, acc, 4 * nr, accumulate);
    }
}

/// The driver's entry point (`DotsFn`) for arrangement `L`, tiles of `ROWS` rows, on the
/// tile unit `U` (opened per call: the tile state is per thread): `tiles` row tiles with one
/// tile configuration for all of them (`ldtilecfg` and `tilerelease` are not free: a 32×32
/// tile of K = 768 is only 48 `tdpbusd`).
///
/// # Safety
/// `a` is readable for `tiles·MR` rows of `kp` codes `lda` apart, `b` for `kp·NR` codes,
/// `acc` readable and writable for `tiles·MR·NR` values (`MR = RT·ROWS`, `NR = 16·CT`),
/// `tiles ≥ 1`; `U` opens here (for the real unit: the process was granted AMX-INT8).
pub(super) unsafe fn dot<U: TileUnit, L: Arrangement, const ROWS: usize>(
    kp: usize,
    a: *const u8,
    lda: usize,
    b: *const i8,
    acc: *mut i32,
    accumulate: bool,
    tiles: usize,
) {
    let (mr, nr) = (L::RT * ROWS, L::CT * 16);
    // SAFETY: the extents are the caller's contract (see above).
    let (a, b, acc) = unsafe {
        (
            std::slice::from_raw_parts(a, (tiles * mr - 1) * lda + kp),
            std::slice::from_raw_parts(b, kp * nr),
            std::slice::from_raw_parts_mut(acc, tiles * mr * nr),
        )
    };
    let mut unit = U::open().expect("the AMX tile unit opens where the kernel is available");
    body::<U, L>(&mut unit, ROWS, kp, a, lda, b, acc, accumulate, tiles);
}

/// The AMX kernels on the emulated tile unit: the same bodies as the real ones in
/// [`super::ukernel::KERNELS`] (a twin of each, same name and tile), plus odd tile rows.
#[cfg(test)]
pub(super) static EMULATED: &[DotKernel] = &[
    emulated("amx_32x32", 32, 32, dot::<Emulated, Square, 16>),
    emulated("amx_16x64", 16, 64, dot::<Emulated, Wide, 16>),
    emulated("amx_64x16", 64, 16, dot::<Emulated, Tall, 16>),
    emulated("amx_8x64", 8, 64, dot::<Emulated, Wide, 8>),
    emulated("amx_6x32 (rows 3)", 6, 32, dot::<Emulated, Square, 3>),
    emulated("amx_1x64 (rows 1)", 1, 64, dot::<Emulated, Wide, 1>),
    emulated("amx_20x16 (rows 5)", 20, 16, dot::<Emulated, Tall, 5>),
];

/// An AMX kernel on the emulated unit: portable code, runs everywhere.
#[cfg(test)]
const fn emulated(name: &'static str, mr: usize, nr: usize, f: DotsFn) -> DotKernel {
    DotKernel::new(
        name,
        mr,
        nr,
        255,
        crate::cpu::Isa::Portable,
        None,
        Entry::Many(f),
    )
}

#[cfg(test)]
mod tests {
    use super::super::ukernel::{has_amx_int8, KERNELS};
    use super::*;
    use crate::rng::Rng;

    /// `acc[r·nr + c] = Σ_p a[r·lda + p] · b[(p/4·nr + c)·4 + p%4]`, in i64.
    fn reference(k: &DotKernel, kp: usize, a: &[u8], lda: usize, b: &[i8]) -> Vec<i64> {
        let mut out = vec![0i64; k.mr * k.nr];
        for r in 0..k.mr {
            for c in 0..k.nr {
                out[r * k.nr + c] = (0..kp)
                    .map(|p| a[r * lda + p] as i64 * b[(p / 4 * k.nr + c) * 4 + p % 4] as i64)
                    .sum();
            }
        }
        out
    }

    /// Runs `k` on random (or extreme: 255 × ±127) codes for depths around the K step of 64
    /// and checks it against the exact reference, fresh and accumulating.
    fn check_kernel(k: &DotKernel, rng: &mut Rng) {
        for kp in [4, 60, 64, 68, 128, 132, 196, 772] {
            for (lda, extreme) in [(kp, false), (kp + 12, false), (kp + 4, true)] {
                let a: Vec<u8> = (0..(k.mr - 1) * lda + kp)
                    .map(|_| if extreme { 255 } else { rng.below(256) as u8 })
                    .collect();
                let b: Vec<i8> = (0..kp * k.nr)
                    .map(|i| match (extreme, i / 4 % 2) {
                        (true, 0) => 127,
                        (true, _) => -127,
                        (false, _) => (rng.below(255) as i32 - 127) as i8,
                    })
                    .collect();
                let want = reference(k, kp, &a, lda, &b);
                let mut acc = vec![7i32; k.mr * k.nr];
                k.tile(kp, &a, lda, &b, &mut acc, false);
                let got: Vec<i64> = acc.iter().map(|&x| x as i64).collect();
                assert!(
                    got == want,
                    "{} kp {kp} lda {lda} extreme {extreme}",
                    k.name
                );
                k.tile(kp, &a, lda, &b, &mut acc, true);
                let twice = acc.iter().zip(&want).all(|(&x, &w)| x as i64 == 2 * w);
                assert!(twice, "{} kp {kp}: accumulating", k.name);
            }
        }
    }

    #[test]
    fn emulated_amx_kernels_equal_the_exact_integer_product() {
        let mut rng = Rng::new(21);
        for k in EMULATED {
            check_kernel(k, &mut rng);
        }
    }

    /// A run of row tiles in one call (one tile configuration) equals a call per tile, fresh
    /// and accumulating, on the emulated unit.
    #[test]
    fn a_run_of_tiles_equals_a_call_per_tile() {
        let mut rng = Rng::new(23);
        for k in EMULATED {
            assert!(k.batches(), "{}", k.name);
            let (kp, lda, tiles) = (132, 140, 3);
            let a: Vec<u8> = (0..(tiles * k.mr - 1) * lda + kp)
                .map(|_| rng.below(256) as u8)
                .collect();
            let b: Vec<i8> = (0..kp * k.nr)
                .map(|_| (rng.below(255) as i32 - 127) as i8)
                .collect();
            let tile_len = k.mr * k.nr;
            for accumulate in [false, true] {
                let start: Vec<i32> = (0..tiles * tile_len).map(|i| i as i32 - 50).collect();
                let mut run = start.clone();
                k.tiles(kp, &a, lda, &b, &mut run, accumulate, tiles);
                let mut each = start.clone();
                for (t, acc) in each.chunks_exact_mut(tile_len).enumerate() {
                    k.tile(kp, &a[t * k.mr * lda..], lda, &b, acc, accumulate);
                }
                assert!(run == each, "{} accumulate {accumulate}", k.name);
            }
        }
    }

    #[test]
    fn every_real_amx_kernel_has_an_emulated_twin() {
        let real: Vec<&DotKernel> = KERNELS
            .iter()
            .filter(|k| k.needs == Some("amx_int8"))
            .collect();
        #[cfg(target_arch = "x86_64")]
        assert!(!real.is_empty());
        for k in real {
            let twin = EMULATED.iter().find(|e| e.name == k.name);
            let twin = twin.unwrap_or_else(|| panic!("{} has no emulated twin", k.name));
            assert_eq!((twin.mr, twin.nr, twin.max_code), (k.mr, k.nr, 255));
        }
    }

    #[test]
    fn real_amx_kernels_equal_the_exact_integer_product_where_granted() {
        if !has_amx_int8() {
            let why = "no AMX tile state on this CPU/OS";
            crate::testing::skipped("amx int8 kernels", "amx_int8", why);
            return;
        }
        let mut rng = Rng::new(22);
        for k in KERNELS.iter().filter(|k| k.needs == Some("amx_int8")) {
            assert!(k.available());
            check_kernel(k, &mut rng);
        }
    }
}
