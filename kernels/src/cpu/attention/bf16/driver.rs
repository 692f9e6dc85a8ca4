//! The bf16 flash attention driver: keys and values of every head converted to bf16 and
//! packed once per call, then per task (a head, or a head × query block) the query block's
//! rows converted and packed per `MR`-row group, and each group stepped through the key
//! blocks ([`super::ukernel::Bf16Tile::step`]); outputs divided by the running sums at the
//! end. Causal masking skips fully masked key blocks; key lengths end a batch's key range
//! (keys and values past it are packed as zeros and never visited; a length 0 gives zeros).

use rayon::prelude::*;

use super::ukernel::{pack_keys, pack_queries, pack_values, Bf16Tile, StepArgs, LANES, MAX_MR};
use crate::cpu::attention::layout::{Layout, Part, Rows};
use crate::cpu::attention::AttnPar;
use crate::cpu::gemm::packed::self_scheduled;
use crate::cpu::gemm::view::CView;
use crate::cpu::pool::on_workers;
use crate::kernel::Executable;
use crate::operand::{host_attention, host_qkv_rows, Operand, OperandMut};
use crate::{DType, Workload};

/// A prepared bf16 attention.
#[derive(Debug)]
pub struct Bf16Attention {
    pub b: usize,
    pub h: usize,
    pub s: usize,
    pub d: usize,
    pub causal: bool,
    pub tile: &'static Bf16Tile,
    /// Query rows per block: a multiple of MR, at most `⌈S/MR⌉·MR`.
    pub br: usize,
    /// Keys per block: a multiple of NR, at most `⌈S/NR⌉·NR`.
    pub bc: usize,
    pub par: AttnPar,
}

/// Shared, read-only inputs of one call.
struct Ctx<'a> {
    /// Where each head's query rows are in `q`.
    rows: Rows,
    q: &'a [f32],
    kpack: &'a [u16],
    vpack: &'a [u16],
    /// Keys each head sees (its batch's length, or S).
    klens: Vec<usize>,
}

/// Per-call sizes derived from the shape and the tile.
#[derive(Clone, Copy)]
struct Dims {
    dsteps: usize,
    dp: usize,
    spairs: usize,
    /// Packed keys (values) per head.
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
            kstride: s.div_ceil(nr) * dsteps * 2 * nr,
            vstride: dp * 2 * spairs,
        }
    }

    fn rows(&self, layout: Layout) -> Rows {
        Rows {
            layout,
            b: self.b,
            h: self.h,
            s: self.s,
            d: self.d,
        }
    }

    /// One query block `[i0, i0 + rows)` of head `hd`; `out` is its `rows × D` window.
    fn query_block(&self, cx: &Ctx<'_>, hd: usize, i0: usize, mut out: CView<'_>) {
        let (s, d, mr, nr) = (self.s, self.d, self.tile.mr, self.tile.nr);
        let dm = self.dims();
        let rows = out.rows();
        let klen = cx.klens[hd];
        if klen == 0 {
            (0..rows).for_each(|r| out.row_mut(r).fill(0.0));
            return;
        }
        let groups = rows.div_ceil(mr);
        let (head_q, ld) = (cx.rows.head(cx.q, hd, Part::Q), cx.rows.ld());
        let mut qa = vec![0u32; groups * dm.dsteps * mr];
        for (g, qg) in qa.chunks_exact_mut(dm.dsteps * mr).enumerate() {
            let r0 = i0 + g * mr;
            pack_queries((&head_q[r0 * ld..], ld), d, mr.min(rows - g * mr), mr, qg);
        }
        let kp = &cx.kpack[hd * dm.kstride..(hd + 1) * dm.kstride];
        let vp = &cx.vpack[hd * dm.vstride..(hd + 1) * dm.vstride];
        let mut o = vec![0f32; groups * mr * dm.dp];
        let mut m = vec![f32::NEG_INFINITY; groups * mr];
        let mut l = vec![0f32; groups * mr];
        let mut sbuf = vec![0f32; mr * self.bc];
        let mut pa = vec![0u32; self.bc.div_ceil(2) * mr];
        let scale = std::f32::consts::LOG2_E / (d as f32).sqrt();
        let kend = if self.causal { s.min(i0 + rows) } else { s }.min(klen);
        let mut lim = [0usize; MAX_MR];
        for j0 in (0..kend).step_by(self.bc) {
            let kvb = self.bc.min(kend - j0);
            for g in 0..groups {
                let (r0, valid) = (i0 + g * mr, mr.min(rows - g * mr));
                for (r, x) in lim[..mr].iter_mut().enumerate() {
                    *x = match r < valid {
                        false => 0,
                        true if self.causal => kvb.min((r0 + r + 1).saturating_sub(j0)),
                        true => kvb,
                    };
                }
                let kv = lim[..mr].iter().copied().max().unwrap_or(0);
                if kv == 0 {
                    continue;
                }
                let rows_of = |x: usize| g * mr * x..(g + 1) * mr * x;
                self.tile.step(StepArgs {
                    qa: &qa[rows_of(dm.dsteps)],
                    dsteps: dm.dsteps,
                    kp: &kp[j0 / nr * dm.dsteps * 2 * nr..],
                    vp,
                    spairs: dm.spairs,
                    j0,
                    dp: dm.dp,
                    kv,
                    lim: &lim[..mr],
                    scale,
                    s: &mut sbuf,
                    pa: &mut pa,
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
    }

    fn compute(&self, cx: &Ctx<'_>, out: &mut [f32]) {
        let heads = cx.rows.out_heads(out);
        let head = |hd: usize, oh: CView<'_>| {
            for (i0, ob) in oh.row_chunks(self.br) {
                self.query_block(cx, hd, i0, ob);
            }
        };
        match self.par {
            AttnPar::None => {
                for (hd, oh) in heads.into_iter().enumerate() {
                    head(hd, oh);
                }
            }
            AttnPar::Heads(t) => {
                let items: Vec<_> = heads.into_iter().enumerate().collect();
                self_scheduled(t, items, |(hd, oh)| head(hd, oh));
            }
            AttnPar::Blocks(t) => {
                let mut items: Vec<(usize, usize, CView<'_>)> = Vec::new();
                for (hd, oh) in heads.into_iter().enumerate() {
                    for (i0, ob) in oh.row_chunks(self.br) {
                        items.push((hd, i0, ob));
                    }
                }
                if self.causal {
                    // Later query blocks see more keys: start them first.
                    items.sort_by_key(|&(hd, i0, _)| (std::cmp::Reverse(i0), hd));
                }
                self_scheduled(t, items, |(hd, i0, ob)| self.query_block(cx, hd, i0, ob));
            }
        }
    }

    /// Keys and values of every head (laid out as `rows` says) converted and packed (zeros
    /// past each head's length).
    fn pack(&self, rows: Rows, [k, v]: [&[f32]; 2], klens: &[usize]) -> (Vec<u16>, Vec<u16>) {
        let (d, nr, ld) = (self.d, self.tile.nr, rows.ld());
        let dm = self.dims();
        let heads = self.b * self.h;
        let mut kpack = vec![0u16; heads * dm.kstride];
        let mut vpack = vec![0u16; heads * dm.vstride];
        let pack = |(hd, (kp, vp)): (usize, (&mut [u16], &mut [u16]))| {
            pack_keys((rows.head(k, hd, Part::K), ld), d, nr, klens[hd], kp);
            let vh = rows.head(v, hd, Part::V);
            pack_values((vh, ld), (d, dm.dp), dm.spairs, klens[hd], vp);
        };
        if self.par.threads() > 1 {
            kpack
                .par_chunks_mut(dm.kstride)
                .zip(vpack.par_chunks_mut(dm.vstride))
                .enumerate()
                .for_each(pack);
        } else {
            kpack
                .chunks_mut(dm.kstride)
                .zip(vpack.chunks_mut(dm.vstride))
                .enumerate()
                .for_each(pack);
        }
        (kpack, vpack)
    }
}

impl Bf16Attention {
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

    /// The checked call: `q`, `k`, `v` and `out` laid out as `rows` says.
    fn attend(&self, rows: Rows, [q, k, v]: [&[f32]; 3], lens: Option<&[i32]>, out: &mut [f32]) {
        let klens: Vec<usize> = (0..self.b * self.h)
            .map(|hd| lens.map_or(self.s, |l| usize::try_from(l[hd / self.h]).unwrap_or(0)))
            .map(|x| x.min(self.s))
            .collect();
        on_workers(self.par.threads(), || {
            let (kpack, vpack) = self.pack(rows, [k, v], &klens);
            let cx = Ctx {
                rows,
                q,
                kpack: &kpack,
                vpack: &vpack,
                klens,
            };
            self.compute(&cx, out);
        });
    }
}

impl Executable for Bf16Attention {
    fn run(&self, inputs: &[Operand<'_>], out: OperandMut<'_>) -> crate::Result<()> {
        let (qkv, lens, out) = host_attention(&self.workload(), inputs, out)?;
        self.attend(self.rows(Layout::Heads), qkv, lens, out);
        Ok(())
    }

    fn run_qkv_rows(
        &self,
        qkv: &[f32],
        key_lens: Option<&[i32]>,
        out: &mut [f32],
    ) -> Option<crate::Result<()>> {
        let rows = self.rows(Layout::QkvRows);
        Some(
            host_qkv_rows(&self.workload(), qkv, key_lens, out)
                .map(|()| self.attend(rows, [qkv; 3], key_lens, out)),
        )
    }
}
