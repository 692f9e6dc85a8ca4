//! The bf16 flash attention driver: keys and values of every head converted to bf16 and
//! packed once per call, then per task (a head, or a head × query block) the query block's
//! rows converted and packed per `MR`-row group, and each group stepped through the key
//! blocks ([`super::ukernel::Bf16Tile::step`]); outputs divided by the running sums at the
//! end. Causal masking skips fully masked key blocks; key lengths end a batch's key range
//! (keys and values past it are packed as zeros and never visited; a length 0 gives zeros).

use rayon::prelude::*;

use super::ukernel::{pack_keys, pack_queries, pack_values, Bf16Tile, StepArgs, LANES, MAX_MR};
use crate::cpu::attention::AttnPar;
use crate::cpu::gemm::packed::self_scheduled;
use crate::cpu::pool::on_workers;
use crate::kernel::Executable;
use crate::operand::{host_attention, Operand, OperandMut};
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

    /// One query block `[i0, i0 + rows)` of head `hd`; `out` holds its `rows × D` outputs.
    fn query_block(&self, cx: &Ctx<'_>, hd: usize, i0: usize, out: &mut [f32]) {
        let (s, d, mr, nr) = (self.s, self.d, self.tile.mr, self.tile.nr);
        let dm = self.dims();
        let rows = out.len() / d;
        let klen = cx.klens[hd];
        if klen == 0 {
            out.fill(0.0);
            return;
        }
        let groups = rows.div_ceil(mr);
        let head_q = &cx.q[hd * s * d..(hd + 1) * s * d];
        let mut qa = vec![0u32; groups * dm.dsteps * mr];
        for (g, qg) in qa.chunks_exact_mut(dm.dsteps * mr).enumerate() {
            let r0 = i0 + g * mr;
            pack_queries(&head_q[r0 * d..], d, mr.min(rows - g * mr), mr, qg);
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
        for (r, orow) in out.chunks_exact_mut(d).enumerate() {
            let inv = if l[r] > 0.0 { 1.0 / l[r] } else { 0.0 };
            for (x, y) in orow.iter_mut().zip(&o[r * dm.dp..]) {
                *x = y * inv;
            }
        }
    }

    fn compute(&self, cx: &Ctx<'_>, out: &mut [f32]) {
        let (s, d, br) = (self.s, self.d, self.br);
        let head = |hd: usize, oh: &mut [f32]| {
            for (qb, ob) in oh.chunks_mut(br * d).enumerate() {
                self.query_block(cx, hd, qb * br, ob);
            }
        };
        match self.par {
            AttnPar::None => {
                for (hd, oh) in out.chunks_exact_mut(s * d).enumerate() {
                    head(hd, oh);
                }
            }
            AttnPar::Heads(t) => {
                let items: Vec<_> = out.chunks_exact_mut(s * d).enumerate().collect();
                self_scheduled(t, items, |(hd, oh)| head(hd, oh));
            }
            AttnPar::Blocks(t) => {
                let mut items: Vec<(usize, usize, &mut [f32])> = Vec::new();
                for (hd, oh) in out.chunks_exact_mut(s * d).enumerate() {
                    for (qb, ob) in oh.chunks_mut(br * d).enumerate() {
                        items.push((hd, qb * br, ob));
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

    /// Keys and values of every head converted and packed (zeros past each head's length).
    fn pack(&self, k: &[f32], v: &[f32], klens: &[usize]) -> (Vec<u16>, Vec<u16>) {
        let (s, d, nr) = (self.s, self.d, self.tile.nr);
        let dm = self.dims();
        let heads = self.b * self.h;
        let mut kpack = vec![0u16; heads * dm.kstride];
        let mut vpack = vec![0u16; heads * dm.vstride];
        let pack = |(hd, (kp, vp)): (usize, (&mut [u16], &mut [u16]))| {
            let src = hd * s * d..(hd + 1) * s * d;
            pack_keys(&k[src.clone()], d, nr, klens[hd], kp);
            pack_values(&v[src], d, dm.dp, klens[hd], vp);
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

impl Executable for Bf16Attention {
    fn run(&self, inputs: &[Operand<'_>], out: OperandMut<'_>) -> crate::Result<()> {
        let w = Workload::Attention {
            b: self.b,
            h: self.h,
            s: self.s,
            d: self.d,
            causal: self.causal,
            dtype: DType::Bf16,
        };
        let ([q, k, v], lens, out) = host_attention(&w, inputs, out)?;
        let klens: Vec<usize> = (0..self.b * self.h)
            .map(|hd| lens.map_or(self.s, |l| usize::try_from(l[hd / self.h]).unwrap_or(0)))
            .map(|x| x.min(self.s))
            .collect();
        on_workers(self.par.threads(), || {
            let (kpack, vpack) = self.pack(k, v, &klens);
            let cx = Ctx {
                q,
                kpack: &kpack,
                vpack: &vpack,
                klens,
            };
            self.compute(&cx, out);
        });
        Ok(())
    }
}
