//! The skeleton the AMX GEMM micro-kernels share (int8 `tdpbusd`, bf16 `tdpbf16ps`): four
//! accumulator tiles in one of three arrangements, the K loop in steps of 64 bytes per A row,
//! the remainder staged on the stack, and the accumulators loaded from (or zeroed for) and
//! stored to memory — written once over [`TileUnit`] and over the dot-product instruction.
//!
//! Both instructions read the same shapes: an A tile is `rows` rows of 64 bytes (64 `u8`
//! codes, or 16 pairs of bf16 values), a B tile 16 rows of 64 bytes (16 columns × a group of
//! 4 bytes: 4 int8 depths, or one bf16 depth pair), an accumulator tile `rows` rows of 16
//! 32-bit values (i32 or f32). So everything here counts bytes: a row of A holds `kb` bytes of
//! depth (a multiple of 4), B holds `kb/4` rows of `4·NR` bytes (the panel layouts of both
//! families: [`crate::cpu::bgemm::layout`] for bf16), and the kernel steps `kb` by 64.
//!
//! Arrangements: 2×2 ([`Square`], `MR = 2·rows`, `NR = 32`), 1×4 ([`Wide`], `rows`, 64),
//! 4×1 ([`Tall`], `4·rows`, 16); accumulators in `tmm0..tmm3`, operands in `tmm4..tmm7`.
//! A remainder below 64 bytes is copied, zero-padded to 64, into staging tiles on the stack
//! (A: `MR × 64` bytes; B: 16 rows × `4·NR`) and takes one more step: the zero products add
//! nothing (for bf16 they may turn a `−0` sum into `+0`), and no load reads past the operands.

use super::{TileConfig, TileUnit, Tiles};

/// The dot-product instruction a kernel steps with.
pub(crate) trait Dot {
    /// `tmmC += tmmA · tmmB` with this instruction.
    fn dot<U: TileUnit, const C: u8, const A: u8, const B: u8>(t: &mut Tiles<'_, U>);
}

/// `tdpbusd`: `u8` rows of A times `s8` columns of B into i32.
pub(crate) struct DpBusd;

impl Dot for DpBusd {
    #[inline(always)]
    fn dot<U: TileUnit, const C: u8, const A: u8, const B: u8>(t: &mut Tiles<'_, U>) {
        t.dpbusd::<C, A, B>();
    }
}

/// `tdpbf16ps`: bf16 pairs of A times bf16 pairs of B into f32.
pub(crate) struct DpBf16ps;

impl Dot for DpBf16ps {
    #[inline(always)]
    fn dot<U: TileUnit, const C: u8, const A: u8, const B: u8>(t: &mut Tiles<'_, U>) {
        t.dpbf16ps::<C, A, B>();
    }
}

/// How the four accumulator tiles cover the `MR × NR` tile, and the K step over them.
pub(crate) trait Arrangement {
    /// Accumulator tiles down (row tiles).
    const RT: usize;
    /// Accumulator tiles across (16-column tiles).
    const CT: usize;

    /// The tile configuration for accumulator tiles of `rows` rows.
    fn config(rows: usize) -> TileConfig;

    /// One K step of 64 bytes: `a` at the step's first byte (`rows·RT` rows `lda` apart), `b`
    /// at its first group row (16 rows `ldb` bytes apart, `CT` column tiles 64 bytes apart).
    fn step<U: TileUnit, D: Dot>(
        t: &mut Tiles<'_, U>,
        a: &[u8],
        lda: usize,
        rows: usize,
        b: &[u8],
        ldb: usize,
    );
}

/// Accumulator tiles `tmm0..tmm3`, `rows × 64` bytes; the given operand tiles A (`rows × 64`)
/// and B (`16 × 64`).
fn config(rows: usize, a: &[u8], b: &[u8]) -> TileConfig {
    let mut c = TileConfig::new();
    for t in 0..4 {
        c = c.tile(t, rows, 64);
    }
    for &t in a {
        c = c.tile(t, rows, 64);
    }
    for &t in b {
        c = c.tile(t, 16, 64);
    }
    c
}

/// 2×2: A in `tmm4, tmm5`, B in `tmm6, tmm7`; each operand tile feeds two dot products.
pub(crate) struct Square;

impl Arrangement for Square {
    const RT: usize = 2;
    const CT: usize = 2;

    fn config(rows: usize) -> TileConfig {
        config(rows, &[4, 5], &[6, 7])
    }

    fn step<U: TileUnit, D: Dot>(
        t: &mut Tiles<'_, U>,
        a: &[u8],
        lda: usize,
        rows: usize,
        b: &[u8],
        ldb: usize,
    ) {
        t.load::<4>(a, lda);
        t.load::<5>(&a[rows * lda..], lda);
        t.load::<6>(b, ldb);
        t.load::<7>(&b[64..], ldb);
        D::dot::<U, 0, 4, 6>(t);
        D::dot::<U, 1, 4, 7>(t);
        D::dot::<U, 2, 5, 6>(t);
        D::dot::<U, 3, 5, 7>(t);
    }
}

/// 1×4: A in `tmm4`; B in `tmm5..tmm7`, the fourth B tile reusing `tmm5`.
pub(crate) struct Wide;

impl Arrangement for Wide {
    const RT: usize = 1;
    const CT: usize = 4;

    fn config(rows: usize) -> TileConfig {
        config(rows, &[4], &[5, 6, 7])
    }

    fn step<U: TileUnit, D: Dot>(
        t: &mut Tiles<'_, U>,
        a: &[u8],
        lda: usize,
        _rows: usize,
        b: &[u8],
        ldb: usize,
    ) {
        t.load::<4>(a, lda);
        t.load::<5>(b, ldb);
        t.load::<6>(&b[64..], ldb);
        t.load::<7>(&b[128..], ldb);
        D::dot::<U, 0, 4, 5>(t);
        D::dot::<U, 1, 4, 6>(t);
        D::dot::<U, 2, 4, 7>(t);
        t.load::<5>(&b[192..], ldb);
        D::dot::<U, 3, 4, 5>(t);
    }
}

/// 4×1: B in `tmm4`; A in `tmm5..tmm7`, the fourth A tile reusing `tmm5`.
pub(crate) struct Tall;

impl Arrangement for Tall {
    const RT: usize = 4;
    const CT: usize = 1;

    fn config(rows: usize) -> TileConfig {
        config(rows, &[5, 6, 7], &[4])
    }

    fn step<U: TileUnit, D: Dot>(
        t: &mut Tiles<'_, U>,
        a: &[u8],
        lda: usize,
        rows: usize,
        b: &[u8],
        ldb: usize,
    ) {
        t.load::<4>(b, ldb);
        t.load::<5>(a, lda);
        t.load::<6>(&a[rows * lda..], lda);
        t.load::<7>(&a[2 * rows * lda..], lda);
        D::dot::<U, 0, 5, 4>(t);
        D::dot::<U, 1, 6, 4>(t);
        D::dot::<U, 2, 7, 4>(t);
        t.load::<5>(&a[3 * rows * lda..], lda);
        D::dot::<U, 3, 5, 4>(t);
    }
}

/// Runs `$body` once per accumulator tile, with `$t` the tile register (a constant).
macro_rules! each_acc {
    ($t:ident => $body:block) => {{
        {
            const $t: u8 = 0;
            $body
        }
        {
            const $t: u8 = 1;
            $body
        }
        {
            const $t: u8 = 2;
            $body
        }
        {
            const $t: u8 = 3;
            $body
        }
    }};
}

/// Byte offset in the accumulator memory (rows `ld` bytes apart) of accumulator tile `t`
/// (row tile `t / CT`, column tile `t % CT`).
fn acc_offset<L: Arrangement>(t: u8, rows: usize, ld: usize) -> usize {
    let (i, j) = (t as usize / L::CT, t as usize % L::CT);
    i * rows * ld + j * 64
}

/// One `MR × NR` tile (`MR = RT·rows`, `NR = 16·CT`) on the configured session `t`
/// (`L::config(rows)`): `kb` bytes of depth (a multiple of 4) of `a` (`MR` rows `lda` bytes
/// apart) times `b` (`kb/4` group rows of `4·NR` bytes), with instruction `D`, into the
/// 32-bit accumulators in `acc` (`MR` rows of `NR` values, `ld` bytes apart), added to their
/// values when `accumulate`. Panics (before touching the tile unit) if an extent is short.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run<U: TileUnit, L: Arrangement, D: Dot>(
    t: &mut Tiles<'_, U>,
    rows: usize,
    kb: usize,
    a: &[u8],
    lda: usize,
    b: &[u8],
    acc: &mut [u8],
    ld: usize,
    accumulate: bool,
) {
    let (mr, nr) = (L::RT * rows, L::CT * 16);
    let ldb = 4 * nr; // bytes per B group row
    assert!(kb.is_multiple_of(4) && lda >= kb, "depth in 4-byte groups");
    assert!(
        a.len() >= (mr - 1) * lda + kb && b.len() >= kb * nr,
        "operands too short"
    );
    assert!(
        acc.len() >= (mr - 1) * ld + 4 * nr,
        "accumulators too short"
    );
    each_acc!(T => {
        let at = acc_offset::<L>(T, rows, ld);
        if accumulate {
            t.load::<T>(&acc[at..], ld);
        } else {
            t.zero::<T>();
        }
    });
    let full = kb / 64 * 64;
    for k0 in (0..full).step_by(64) {
        L::step::<U, D>(t, &a[k0..], lda, rows, &b[k0 * nr..], ldb);
    }
    if full < kb {
        let rem = kb - full;
        let mut sa = [0u8; 64 * 64];
        for (r, row) in sa.chunks_exact_mut(64).take(mr).enumerate() {
            row[..rem].copy_from_slice(&a[r * lda + full..r * lda + kb]);
        }
        let mut sb = [0u8; 16 * 256];
        sb[..rem * nr].copy_from_slice(&b[full * nr..kb * nr]);
        L::step::<U, D>(t, &sa, 64, rows, &sb, ldb);
    }
    each_acc!(T => {
        let at = acc_offset::<L>(T, rows, ld);
        t.store::<T>(&mut acc[at..], ld);
    });
}
