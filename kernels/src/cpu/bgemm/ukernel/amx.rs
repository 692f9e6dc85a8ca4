//! AMX-BF16 micro-kernels (`amx_bf16_*`): the family's tile contract ([`super::TileFn`]) with
//! `tdpbf16ps`, on the AMX skeleton shared with the int8 kernels ([`tiled`]: four f32
//! accumulator tiles in 2×2, 1×4 or 4×1, K stepped by 64 bytes = 32 bf16 per A row, the
//! remainder staged zero-padded on the stack), written once over [`TileUnit`]: the same body
//! runs on the real tile unit ([`crate::cpu::amx::AsmTiles`]) and on the emulated one (tests,
//! every CPU).
//!
//! Operands, as bytes:
//! - B: the panel block in the pair layout ([`crate::cpu::bgemm::layout::Layout::Pairs`],
//!   shared with the `vdpbf16ps` kernels): `steps` rows of `NR` words, word `c` holding
//!   column `c`'s two depths — a depth-pair row of 16 columns is one 64-byte B-tile row, the
//!   rows `4·NR` bytes apart.
//! - A: the micro-panel packed as rows of pair words
//!   ([`crate::cpu::bgemm::layout::pack_a_pair_rows`]): `MR` rows of `steps` words, so an A
//!   tile (16 pairs = 32 depths per row) is read with a stride of `4·steps` bytes.
//! - C: the accumulator tiles are zeroed, or loaded from C with `accumulate`, and stored to C
//!   directly (rows `4·ldc` bytes apart); then the epilogue, if any, runs row by row over the
//!   stored tile ([`bias_act_row`]).
//!
//! The tile unit is configured once per call (for all its row tiles) and released at its end.

use crate::cpu::amx::tiled::{self, Arrangement, DpBf16ps};
use crate::cpu::amx::{bytes, bytes_mut, TileUnit, Tiles};
use crate::cpu::gemm::ukernel::bias_act_row;
use crate::cpu::gemm::ukernel::simd::Epi;
use crate::workload::Act;

/// The `MR × NR` tile (`MR = RT·ROWS`, `NR = 16·CT`) with arrangement `L` on the tile unit
/// `U`, opened here (tile state is per thread).
///
/// # Safety
/// As [`super::TileFn`]: `a` is readable for `tiles·MR·steps` words (bf16 pairs, each
/// micro-panel in rows: [`crate::cpu::bgemm::layout::pack_a_pair_rows`]), `b` for
/// `steps·2·NR` values; `c + r·ldc + j` is readable and writable for `r < tiles·MR`,
/// `j < NR`; unless `ep.act` is none, `ep.bias` is readable for `NR` values; `U` opens here
/// (for the real unit: the process was granted AMX-BF16).
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile<U: TileUnit, L: Arrangement, const ROWS: usize>(
    steps: usize,
    a: *const f32,
    b: *const u16,
    c: *mut f32,
    ldc: usize,
    tiles: usize,
    accumulate: bool,
    ep: Epi,
) {
    let (mr, nr) = (L::RT * ROWS, L::CT * 16);
    let act = act_of(ep.act);
    // SAFETY: the extents are the caller's contract (see above).
    let (a, b, bias) = unsafe {
        (
            std::slice::from_raw_parts(a, tiles * mr * steps),
            std::slice::from_raw_parts(b, steps * 2 * nr),
            act.map(|_| std::slice::from_raw_parts(ep.bias, nr)),
        )
    };
    let mut unit = U::open().expect("the AMX tile unit opens where the kernel is available");
    let mut t = Tiles::configure(&mut unit, L::config(ROWS));
    let kb = 4 * steps; // bytes of depth per A row
    for (i, a) in a.chunks_exact(mr * steps).enumerate() {
        let len = (mr - 1) * ldc + nr;
        // SAFETY: rows `i·MR..(i+1)·MR` of C, `NR` values each, are the caller's contract.
        let c = unsafe { std::slice::from_raw_parts_mut(c.add(i * mr * ldc), len) };
        let (ab, bb) = (bytes(a), bytes(b));
        tiled::run::<U, L, DpBf16ps>(
            &mut t,
            ROWS,
            kb,
            ab,
            kb,
            bb,
            bytes_mut(c),
            4 * ldc,
            accumulate,
        );
        if let (Some(act), Some(bias)) = (act, bias) {
            for r in 0..mr {
                bias_act_row(&mut c[r * ldc..r * ldc + nr], bias, act);
            }
        }
    }
}

/// The activation of an epilogue code (bias only is [`Act::Identity`]); `None` for no
/// epilogue.
fn act_of(code: u8) -> Option<Act> {
    match code {
        Epi::BIAS => Some(Act::Identity),
        Epi::RELU => Some(Act::Relu),
        Epi::GELU => Some(Act::Gelu),
        Epi::GELU_ERF => Some(Act::GeluErf),
        _ => None,
    }
}
