//! The bf16 flash attention driver: keys and values of every head converted to bf16 and
//! packed once per call, then per task (a head, or a head × query block) the query block's
//! rows converted and packed per `MR`-row group, and each group stepped through the key
//! blocks ([`super::ukernel::Bf16Tile::step`]); outputs divided by the running sums at the
//! end. Causal masking skips fully masked key blocks; key lengths end a batch's key range
//! (keys and values past it are packed as zeros and never visited; a length 0 gives zeros).

use crate::cpu::pool;

use super::ukernel::{pack_keys, pack_values, Bf16Tile, StepArgs, LANES, MAX_MR};
use crate::cpu::attention::layout::{Part, Rows};
use crate::cpu::attention::{key_limits, AttnPar, Flash};
use crate::cpu::bgemm::layout::pack_a_pair_rows;
use crate::cpu::bgemm::ukernel::{halves_mut, words_mut};
use crate::cpu::gemm::pack::{with_buffer, Pool};
use crate::cpu::gemm::ukernel::prefetch_lines;
use crate::cpu::gemm::view::CView;
use crate::kernel::Executable;
use crate::operand::{Operand, OperandMut};
use crate::{DType, Workload};

/// A prepared bf16 attention.
#[derive(Debug)]
pub struct Bf16Attention {
    /// Batch size.
    pub b: usize,
    /// Heads per batch entry.
    pub h: usize,
    /// Sequence length (queries and keys).
    pub s: usize,
    /// Head dimension.
    pub d: usize,
    /// Whether query `i` sees only keys `j ≤ i`.
    pub causal: bool,
    /// The micro-kernel tile (the `tile` knob): `MR` query rows, score panels of `NR` keys.
    pub tile: &'static Bf16Tile,
    /// Query rows per block: a multiple of MR, at most `⌈S/MR⌉·MR`.
    pub br: usize,
    /// Keys per block: a multiple of NR, at most `⌈S/NR⌉·NR`.
    pub bc: usize,
    /// How the heads and query blocks are split across threads (the `par` and `threads` knobs).
    pub par: AttnPar,
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
    /// Packed keys and values of the heads from `first_head` on (all of them for `par =
    /// blocks`; else the head a task is on), `None` before any is packed.
    kpack: Option<&'a [u32]>,
    vpack: Option<&'a [u32]>,
    first_head: usize,
    /// Keys seen per batch (every `S` without).
    lens: Option<&'a [i32]>,
}

/// Per-call sizes derived from the shape and the tile.
#[derive(Clone, Copy)]
struct Dims {
    dsteps: usize,
    dp: usize,
    spairs: usize,
    /// Packed key (value) words per head.
    kstride: usize,
    vstride: usize,
}

impl Bf16Attention {
    /// Clamps and rounds the block sizes so they are usable for this shape.
    pub fn new(
        (b, h, s, d, causal): (usize, usize, usize, usize, bool),
        tile: &'static Bf16Tile,
        (br, bc): (usize, usize),
        par: AttnPar,
    ) -> Self {
        let round = |x: usize, to: usize| x.max(1).div_ceil(to) * to;
        Bf16Attention {
            b,
            h,
            s,
            d,
            causal,
            tile,
            br: round(br, tile.mr).min(round(s, tile.mr)),
            bc: round(bc, tile.nr).min(round(s, tile.nr)),
            par,
        }
    }

    fn dims(&self) -> Dims {
        let (s, d, nr) = (self.s, self.d, self.tile.nr);
        let (dsteps, dp, spairs) = (d.div_ceil(2), d.div_ceil(LANES) * LANES, s.div_ceil(2));
        Dims {
            dsteps,
            dp,
            spairs,
            kstride: s.div_ceil(nr) * dsteps * nr,
            vstride: dp * spairs,
        }
    }

    /// One query block `[i0, i0 + rows)` of head `hd`; `out` is its `rows × D` window.
    fn query_block(&self, cx: &Ctx<'_>, hd: usize, i0: usize, mut out: CView<'_>) {
        let (s, d, mr, nr) = (self.s, self.d, self.tile.mr, self.tile.nr);
        let dm = self.dims();
        let rows = out.rows();
        let klen = cx.rows.keys(cx.lens, hd);
        let (Some(kpack), Some(vpack), true) = (cx.kpack, cx.vpack, klen > 0) else {
            (0..rows).for_each(|r| out.row_mut(r).fill(0.0));
            return;
        };
        let ph = hd - cx.first_head;
        let kp = &kpack[ph * dm.kstride..(ph + 1) * dm.kstride];
        let vp = &vpack[ph * dm.vstride..(ph + 1) * dm.vstride];
        let groups = rows.div_ceil(mr);
        let (head_q, ld) = (cx.rows.head(cx.q, hd, Part::Q), cx.rows.ld());
        with_buffer(Pool::Work, |work| {
            let (qa_len, o_len) = (groups * dm.dsteps * mr, groups * mr * dm.dp);
            let pa_len = self.bc.div_ceil(2) * mr;
            let buf = work.slice(qa_len + o_len + 2 * groups * mr + mr * self.bc + pa_len);
            let (qa, rest) = buf.split_at_mut(qa_len);
            let (o, rest) = rest.split_at_mut(o_len);
            let (m, rest) = rest.split_at_mut(groups * mr);
            let (l, rest) = rest.split_at_mut(groups * mr);
            let (sbuf, pa) = rest.split_at_mut(mr * self.bc);
            pack_a_pair_rows(head_q, ld, (i0, rows), (0, d), mr, halves_mut(qa));
            let (qa, pa) = (words_mut(qa), words_mut(pa));
            o.fill(0.0);
            m.fill(f32::NEG_INFINITY);
            l.fill(0.0);
            let scale = std::f32::consts::LOG2_E / (d as f32).sqrt();
            let kend = if self.causal { s.min(i0 + rows) } else { s }.min(klen);
            let mut lim = [0usize; MAX_MR];
            for j0 in (0..kend).step_by(self.bc) {
                let kvb = self.bc.min(kend - j0);
                for g in 0..groups {
                    let (r0, valid) = (i0 + g * mr, mr.min(rows - g * mr));
                    // The group's output rows, written at the end, fetched while it computes
                    // (stores that missed every cache filled the store queue: 5% of
                    // `8x12x128x64:bf16`), a group at a time (all at once, the prefetches
                    // waited for each other).
                    if j0 == 0 {
                        for r in g * mr..g * mr + valid {
                            prefetch_lines(out.row_mut(r));
                        }
                    }
                    let kv = key_limits(&mut lim[..mr], valid, self.causal, r0, (j0, kvb));
                    if kv == 0 {
                        continue;
                    }
                    let rows_of = |x: usize| g * mr * x..(g + 1) * mr * x;
                    self.tile.step(StepArgs {
                        qa: &qa[rows_of(dm.dsteps)],
                        dsteps: dm.dsteps,
                        kp: &kp[j0 / nr * dm.dsteps * nr..],
                        vp,
                        spairs: dm.spairs,
                        j0,
                        dp: dm.dp,
                        kv,
                        lim: &lim[..mr],
                        scale,
                        s: &mut *sbuf,
                        pa: &mut *pa,
                        o: &mut o[rows_of(dm.dp)],
                        m: &mut m[rows_of(1)],
                        l: &mut l[rows_of(1)],
                        first: j0 == 0,
                    });
                }
            }
            for r in 0..rows {
                let inv = if l[r] > 0.0 { 1.0 / l[r] } else { 0.0 };
                for (x, y) in out.row_mut(r).iter_mut().zip(&o[r * dm.dp..]) {
                    *x = y * inv;
                }
            }
        });
    }

    /// All query blocks of head `hd` (`out`: its `S × D` window), its keys and values packed
    /// first into this thread's buffers if nothing is packed yet: the head's query blocks
    /// then find them in L2.
    fn head(&self, cx: &Ctx<'_>, hd: usize, out: CView<'_>) {
        let blocks = |cx: &Ctx<'_>, out: CView<'_>| {
            for (i0, ob) in out.row_chunks(self.br) {
                self.query_block(cx, hd, i0, ob);
            }
        };
        if cx.kpack.is_some() {
            return blocks(cx, out);
        }
        let dm = self.dims();
        with_buffer(Pool::Keys, |kbuf| {
            with_buffer(Pool::Values, |vbuf| {
                let kp = words_mut(kbuf.slice(dm.kstride));
                let vp = words_mut(vbuf.slice(dm.vstride));
                self.pack_head(cx, hd, kp, vp);
                let local = Ctx {
                    kpack: Some(kp),
                    vpack: Some(vp),
                    first_head: hd,
                    ..*cx
                };
                blocks(&local, out);
            })
        });
    }

    /// Head `hd`'s keys (`kp`) and values (`vp`) converted and packed, zeros past its length.
    fn pack_head(&self, cx: &Ctx<'_>, hd: usize, kp: &mut [u32], vp: &mut [u32]) {
        let (d, ld, dm) = (self.d, cx.rows.ld(), self.dims());
        let klen = cx.rows.keys(cx.lens, hd);
        kp.fill(0);
        vp.fill(0);
        pack_keys(
            (cx.rows.head(cx.k, hd, Part::K), ld),
            d,
            self.tile.nr,
            klen,
            kp,
        );
        let vh = cx.rows.head(cx.v, hd, Part::V);
        pack_values((vh, ld), (d, dm.dp), dm.spairs, klen, vp);
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

impl Flash for Bf16Attention {
    fn workload(&self) -> Workload {
        Workload::Attention {
            b: self.b,
            h: self.h,
            s: self.s,
            d: self.d,
            causal: self.causal,
            dtype: DType::Bf16,
        }
    }

    /// The checked call, from this thread: `q`, `k`, `v` and `out` laid out as `rows` says.
    /// With `par = blocks` every head's keys and values are packed up front (tasks split
    /// heads); otherwise each head's task packs its own ([`Self::head`]).
    fn attend(&self, rows: Rows, [q, k, v]: [&[f32]; 3], lens: Option<&[i32]>, out: &mut [f32]) {
        let cx = Ctx {
            rows,
            q,
            k,
            v,
            kpack: None,
            vpack: None,
            first_head: 0,
            lens,
        };
        if !matches!(self.par, AttnPar::Blocks(_)) {
            return self.compute(&cx, out);
        }
        let dm = self.dims();
        let heads = self.b * self.h;
        with_buffer(Pool::Keys, |kbuf| {
            with_buffer(Pool::Values, |vbuf| {
                let (kn, vn) = (heads * dm.kstride, heads * dm.vstride);
                let kpack = words_mut(kbuf.slice(kn));
                let vpack = words_mut(vbuf.slice(vn));
                let pack = |(hd, (kp, vp)): (usize, (&mut [u32], &mut [u32]))| {
                    self.pack_head(&cx, hd, kp, vp)
                };
                let heads = kpack
                    .chunks_mut(dm.kstride)
                    .zip(vpack.chunks_mut(dm.vstride));
                pool::for_each(self.par.threads(), heads.enumerate().collect(), pack);
                let cx = Ctx {
                    kpack: Some(kpack),
                    vpack: Some(vpack),
                    ..cx
                };
                self.compute(&cx, out);
            })
        });
    }
}

impl Executable for Bf16Attention {
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
