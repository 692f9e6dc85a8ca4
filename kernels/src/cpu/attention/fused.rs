//! The fused, flash-style attention driver: query blocks of `Br` rows against key blocks of
//! `Bc` keys with an online softmax, never materialising the `S×S` score matrix.
//!
//! ```text
//! (k_layout = prepacked) pack Kᵀ of every head into NR-key panels and V into the P·V
//!                        tile's column stripes, once per call
//! per task (a head, or a head × query block):
//!   for each key block of Bc keys (causal: only up to the block's last query row)
//!     (k_layout = blockwise) pack this block's Kᵀ panels and V stripes into L1 buffers
//!     for each MR-row group (the last one by smaller tail kernels, no padding rows):
//!       scores tile from the queries in place, mask, online softmax with the scale
//!       log2(e)/√D inside the exp2's FMA, O = alpha·O + P·V   (ukernel)
//!       (the first block starts O at zero, the last one stores O / running sum straight
//!       into the output when D is a multiple of the lanes)
//! ```
//!
//! Causal masking skips fully masked key blocks and, inside a block, the key panels past a
//! row group's last query; only the panels crossing the diagonal are masked element-wise.
//! Key lengths (the optional fourth operand, [`crate::operand::host_attention`]) end every
//! query's key range of a batch at its length: the key blocks past it are never visited, and
//! a batch of length 0 gets zeros.
//!
//! What is attainable (non-causal, D = 64, AVX2 + FMA, one Zen 3 core, peak 2 FMA vectors
//! per cycle ≈ 100 GFLOP/s): per 8 scores (one row × 8 keys) the two products take
//! 64 + 64 vector FMAs and the softmax 7 more on the same two FMA pipes (the scale FMA, five
//! polynomial FMAs and the 2^n multiply of the exp2; the clamp, rounding, maxima and sums go
//! to the add pipes), so the FMA-pipe bound is 128/135 ≈ 95% of peak, counting only the
//! 4·S²·D matmul flops. Measured (version 2, best samples under load): 79-83 GFLOP/s;
//! timing the same kernel with the exp2 removed gives +4%, the rest (≈ 12%) is the per-step
//! bookkeeping (row maxima and sums, alpha, reloading and rescaling O per key block) and
//! the key and value blocks re-read from L2 for every MR-row group, where the tuned GEMM
//! keeps its B panel in L1 (its Q·Kᵀ and P·V halves alone run at 94-97 GFLOP/s).

use crate::cpu::pool;

use super::layout::{Part, Rows};
use super::ukernel::{pack_keys, AttnTile, StepArgs, Values};
use super::{AttnPar, Flash};
use crate::cpu::gemm::pack::{with_buffer, Pool};
use crate::cpu::gemm::ukernel::prefetch_lines;
use crate::cpu::gemm::view::CView;
use crate::kernel::Executable;
use crate::operand::{Operand, OperandMut};
use crate::{DType, Workload};

/// Where the score kernels read Kᵀ from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KLayout {
    /// Kᵀ of every head packed into `NR`-key panels once per call, before the main loop,
    /// and shared by all query blocks.
    Prepacked,
    /// Each task packs the key block it is about to use into a small (L1) buffer.
    Blockwise,
}

/// A prepared fused attention.
#[derive(Debug)]
pub struct FusedAttention {
    /// Batch size.
    pub(crate) b: usize,
    /// Heads per batch entry.
    pub(crate) h: usize,
    /// Sequence length (queries and keys).
    pub(crate) s: usize,
    /// Head dimension.
    pub(crate) d: usize,
    /// Whether query `i` sees only keys `j ≤ i`.
    pub(crate) causal: bool,
    /// The micro-kernel tile (the `tile` knob): `MR` query rows × `NR` keys.
    pub(crate) tile: &'static AttnTile,
    /// Query rows per block: a multiple of MR, at most `⌈S/MR⌉·MR`.
    pub(crate) br: usize,
    /// Keys per block: a multiple of NR, at most `⌈S/NR⌉·NR`.
    pub(crate) bc: usize,
    /// Where the score kernels read Kᵀ from (the `k_layout` knob).
    pub(crate) k_layout: KLayout,
    /// How the heads and query blocks are split across threads (the `par` and `threads` knobs).
    pub(crate) par: AttnPar,
}

/// Shared, read-only inputs of one call.
#[derive(Clone, Copy)]
struct Ctx<'a> {
    /// Where each head's rows are in `q`, `k` and `v` (one and the same `qkv` matrix for
    /// [`Layout::QkvRows`]).
    rows: Rows,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    /// Prepacked Kᵀ panels of all heads (`heads × ⌈S/NR⌉·NR·dp`).
    kpre: Option<&'a [f32]>,
    /// Values packed into the tile's stripes (`S·dp` per head), with `kpre`.
    vpre: Option<&'a [f32]>,
    /// The head whose packed keys and values `kpre` and `vpre` start with.
    first_head: usize,
    dp: usize,
    /// Keys seen per batch (every `S` without).
    lens: Option<&'a [i32]>,
}

/// The per-task working buffers of [`FusedAttention::steps`].
struct Scratch<'w> {
    /// Running maxima and sums, a value per query row.
    m: &'w mut [f32],
    l: &'w mut [f32],
    /// One row group's scores.
    sbuf: &'w mut [f32],
    /// This key block's packed keys and values (`k_layout = blockwise`; else empty).
    kblock: &'w mut [f32],
    vblock: &'w mut [f32],
}

impl FusedAttention {
    /// Clamps and rounds the block sizes so they are usable for this shape.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        (b, h, s, d, causal): (usize, usize, usize, usize, bool),
        tile: &'static AttnTile,
        br: usize,
        bc: usize,
        k_layout: KLayout,
        par: AttnPar,
    ) -> Self {
        let round = |x: usize, to: usize| x.max(1).div_ceil(to) * to;
        FusedAttention {
            b,
            h,
            s,
            d,
            causal,
            tile,
            br: round(br, tile.mr).min(round(s, tile.mr)),
            bc: round(bc, tile.nr).min(round(s, tile.nr)),
            k_layout,
            par,
        }
    }

    fn heads(&self) -> usize {
        self.b * self.h
    }

    /// One query block `[i0, i0 + rows)` of head `hd`; `out` is its `rows × D` window.
    /// Outputs are written in place where D is a multiple of the lanes and the window's rows
    /// are adjacent; otherwise through a scratch block copied out at the end.
    fn query_block(&self, cx: &Ctx<'_>, hd: usize, i0: usize, mut out: CView<'_>) {
        let (d, dp, mr) = (self.d, cx.dp, self.tile.mr);
        let rows = out.rows();
        if cx.rows.keys(cx.lens, hd) == 0 {
            (0..rows).for_each(|r| out.row_mut(r).fill(0.0));
            return;
        }
        let in_place = d == dp && out.contiguous_mut().is_some();
        let blockwise = self.k_layout == KLayout::Blockwise;
        let bcp_max = self.bc.div_ceil(self.tile.nr) * self.tile.nr;
        with_buffer(Pool::Work, |work| {
            let kblock_len = if blockwise { bcp_max * dp } else { 0 };
            let vblock_len = if blockwise { self.bc * dp } else { 0 };
            let o_len = if in_place { 0 } else { rows * dp };
            let total = o_len + 2 * rows + mr * bcp_max + kblock_len + vblock_len;
            let buf = work.slice(total);
            let (oscr, rest) = buf.split_at_mut(o_len);
            let (m, rest) = rest.split_at_mut(rows);
            let (l, rest) = rest.split_at_mut(rows);
            let (sbuf, rest) = rest.split_at_mut(mr * bcp_max);
            let (kblock, vblock) = rest.split_at_mut(kblock_len);
            m.fill(f32::NEG_INFINITY);
            l.fill(0.0);
            let scratch = Scratch {
                m,
                l,
                sbuf,
                kblock,
                vblock,
            };
            match out.contiguous_mut() {
                Some(o) if in_place => self.steps(cx, hd, (i0, rows), (o, d), scratch),
                _ => {
                    self.steps(cx, hd, (i0, rows), (&mut *oscr, dp), scratch);
                    for r in 0..rows {
                        // Rows a row stride apart, missing every cache: fetched 4 ahead.
                        if r + 4 < rows {
                            prefetch_lines(out.row_mut(r + 4));
                        }
                        out.row_mut(r).copy_from_slice(&oscr[r * dp..][..d]);
                    }
                }
            }
        });
    }

    /// The key blocks of query block `[i0, i0 + rows)` of head `hd` (which sees at least one
    /// key), its outputs finished into `o` (rows `ldo` apart).
    fn steps(
        &self,
        cx: &Ctx<'_>,
        hd: usize,
        (i0, rows): (usize, usize),
        (o, ldo): (&mut [f32], usize),
        sc: Scratch<'_>,
    ) {
        let (s, d, dp) = (self.s, self.d, cx.dp);
        let mr = self.tile.mr;
        let ld = cx.rows.ld();
        let qh = cx.rows.head(cx.q, hd, Part::Q);
        let scale = std::f32::consts::LOG2_E / (d as f32).sqrt();
        let klen = cx.rows.keys(cx.lens, hd);
        let kend = if self.causal { s.min(i0 + rows) } else { s }.min(klen);
        let mut lim = [0usize; 16];
        debug_assert!(mr <= lim.len());
        for j0 in (0..kend).step_by(self.bc) {
            let kvb = self.bc.min(kend - j0);
            let (kp, vals) = self.key_block(cx, hd, (j0, kvb), (&mut *sc.kblock, &mut *sc.vblock));
            for g0 in (0..rows).step_by(mr) {
                let r0 = i0 + g0;
                let valid = mr.min(rows - g0);
                let kv = super::key_limits(&mut lim[..valid], valid, self.causal, r0, (j0, kvb));
                if kv == 0 {
                    continue;
                }
                // The group's last key block: no later one holds a key it sees.
                let group_kend = if self.causal { s.min(r0 + valid) } else { s }.min(klen);
                // The next group's queries, read in place (from L3 when a batch's heads
                // outgrow L2), are fetched while this group's first step runs: measured on
                // the Zen 4 with the keys' and values' packing fetching ahead likewise,
                // `attention:8x12x128x64` 1.05× (1 and 2 threads, alternating binaries,
                // medians of 15–18 samples), `1x12x128x64` unchanged.
                // Its output rows likewise, which the last step stores into.
                if j0 == 0 {
                    for r in (r0 + mr)..(r0 + 2 * mr).min(i0 + rows) {
                        prefetch_lines(&qh[r * ld..r * ld + d]);
                    }
                    for r in g0..g0 + valid {
                        prefetch_lines(&o[r * ldo..][..d]);
                    }
                }
                self.tile.step(
                    valid,
                    StepArgs {
                        q: &qh[r0 * ld..],
                        ldq: ld,
                        d,
                        scale,
                        kp,
                        v: vals,
                        dp,
                        kv,
                        lim: &lim[..valid],
                        s: sc.sbuf,
                        o: &mut o[g0 * ldo..],
                        ldo,
                        m: &mut sc.m[g0..g0 + valid],
                        l: &mut sc.l[g0..g0 + valid],
                        first: j0 == 0,
                        last: j0 + self.bc >= group_kend,
                    },
                );
            }
        }
    }

    /// Keys `[j0, j0 + kvb)` of head `hd` as the tile takes them: Kᵀ panels and value
    /// stripes, from the prepacked ones or packed here into `kblock` and `vblock`.
    fn key_block<'a>(
        &self,
        cx: &Ctx<'a>,
        hd: usize,
        (j0, kvb): (usize, usize),
        (kblock, vblock): (&'a mut [f32], &'a mut [f32]),
    ) -> (&'a [f32], Values<'a>) {
        let (s, d, dp, nr) = (self.s, self.d, cx.dp, self.tile.nr);
        let ld = cx.rows.ld();
        let ph = hd - cx.first_head;
        let kp: &[f32] = match cx.kpre {
            Some(kpre) => {
                let per_head = s.div_ceil(nr) * nr * dp;
                &kpre[ph * per_head + j0 * dp..ph * per_head + (j0 + kvb).div_ceil(nr) * nr * dp]
            }
            None => {
                let kh = cx.rows.head(cx.k, hd, Part::K);
                pack_keys((kh, ld), d, dp, nr, (j0, kvb), kblock);
                kblock
            }
        };
        let vals = match cx.vpre {
            Some(vpre) => Values(&vpre[ph * s * dp..(ph + 1) * s * dp], s, j0),
            None => {
                let vh = cx.rows.head(cx.v, hd, Part::V);
                self.tile
                    .pack_values((&vh[j0 * ld..], ld), d, dp, kvb, vblock);
                Values(&vblock[..kvb * dp], kvb, 0)
            }
        };
        (kp, vals)
    }

    /// All query blocks of head `hd` (`out`: its `S × D` window). With `k_layout =
    /// prepacked` and nothing packed yet, packs this head's keys and values first, into this
    /// thread's buffers: the head's query blocks then find them in L2, where packing every
    /// head up front would have evicted them.
    fn head(&self, cx: &Ctx<'_>, hd: usize, out: CView<'_>) {
        let blocks = |cx: &Ctx<'_>, out: CView<'_>| {
            for (i0, ob) in out.row_chunks(self.br) {
                self.query_block(cx, hd, i0, ob);
            }
        };
        if self.k_layout == KLayout::Blockwise || cx.kpre.is_some() {
            return blocks(cx, out);
        }
        let (s, dp, nr) = (self.s, cx.dp, self.tile.nr);
        with_buffer(Pool::Keys, |kbuf| {
            with_buffer(Pool::Values, |vbuf| {
                let kp = kbuf.slice(s.div_ceil(nr) * nr * dp);
                let vp = vbuf.slice(s * dp);
                self.pack_head(cx, hd, kp, vp);
                let local = Ctx {
                    kpre: Some(kp),
                    vpre: Some(vp),
                    first_head: hd,
                    ..*cx
                };
                blocks(&local, out);
            })
        });
    }

    /// Packs all keys (`kp`) and values (`vp`) of head `hd`.
    fn pack_head(&self, cx: &Ctx<'_>, hd: usize, kp: &mut [f32], vp: &mut [f32]) {
        let (s, d, dp, ld) = (self.s, self.d, cx.dp, cx.rows.ld());
        // The first row group's queries arrive while the keys and values are packed.
        let qh = cx.rows.head(cx.q, hd, Part::Q);
        for r in 0..self.tile.mr.min(s) {
            prefetch_lines(&qh[r * ld..][..d]);
        }
        pack_keys(
            (cx.rows.head(cx.k, hd, Part::K), ld),
            d,
            dp,
            self.tile.nr,
            (0, s),
            kp,
        );
        let vh = cx.rows.head(cx.v, hd, Part::V);
        self.tile.pack_values((vh, ld), d, dp, s, vp);
    }

    fn compute(&self, cx: &Ctx<'_>, out: &mut [f32]) {
        self.par.run(
            cx.rows.out_heads(out),
            (self.br, self.causal),
            |hd, oh| self.head(cx, hd, oh),
            |hd, i0, ob| self.query_block(cx, hd, i0, ob),
        );
    }
}

impl Flash for FusedAttention {
    fn workload(&self) -> Workload {
        Workload::Attention {
            b: self.b,
            h: self.h,
            s: self.s,
            d: self.d,
            causal: self.causal,
            dtype: DType::F32,
        }
    }

    /// The checked call, from this thread: `q`, `k`, `v` and `out` laid out as `rows` says.
    fn attend(&self, rows: Rows, [q, k, v]: [&[f32]; 3], lens: Option<&[i32]>, out: &mut [f32]) {
        let (s, d) = (self.s, self.d);
        let lanes = self.tile.lanes;
        let dp = d.div_ceil(lanes) * lanes;
        let nr = self.tile.nr;
        let cx = Ctx {
            rows,
            q,
            k,
            v,
            kpre: None,
            vpre: None,
            first_head: 0,
            dp,
            lens,
        };
        // Keys and values packed up front only when tasks split heads (`par = blocks`);
        // otherwise each head packs its own when its task starts (see `head`).
        if self.k_layout == KLayout::Blockwise || !matches!(self.par, AttnPar::Blocks(_)) {
            return self.compute(&cx, out);
        }
        with_buffer(Pool::Keys, |kbuf| {
            with_buffer(Pool::Values, |vbuf| {
                let per_head = s.div_ceil(nr) * nr * dp;
                let kpre = kbuf.slice(self.heads() * per_head);
                let vpre = vbuf.slice(self.heads() * s * dp);
                let pack = |(hd, (kp, vp)): (usize, (&mut [f32], &mut [f32]))| {
                    self.pack_head(&cx, hd, kp, vp)
                };
                let heads = kpre.chunks_mut(per_head).zip(vpre.chunks_mut(s * dp));
                pool::for_each(self.par.threads(), heads.enumerate().collect(), pack);
                let cx = Ctx {
                    kpre: Some(kpre),
                    vpre: Some(vpre),
                    ..cx
                };
                self.compute(&cx, out);
            })
        });
    }
}

impl Executable for FusedAttention {
    fn run(&self, inputs: &[Operand<'_>], out: OperandMut<'_>) -> crate::Result<()> {
        self.run_heads(inputs, out)
    }

    fn run_qkv_rows(
        &self,
        qkv: &[f32],
        key_lens: Option<&[i32]>,
        out: &mut [f32],
    ) -> Option<crate::Result<()>> {
        Some(self.run_rows(qkv, key_lens, out))
    }
}
