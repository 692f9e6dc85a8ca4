//! The bf16 GEMM driver: the blocked loops around the micro-kernel, the `m` / `n` thread
//! splits, and the [`Executable`] with its prepared weight.
//!
//! ```text
//! B: converted to bf16 and packed in NR-column panels once per weight (all of K, all of N),
//!    in the micro-kernel's layout (widening groups, or depth pairs for vdpbf16ps)
//! per task (rows for par=m, column panels for par=n, everything for none):
//!   for pc in 0..K step kc
//!     for ic in task's rows step mc     pack A[ic.., pc..] (L2): rounded to bf16 values
//!                                       (widening), as bf16 pairs (vdpbf16ps) or as rows
//!                                       of bf16 pairs (AMX)
//!       for each panel q                its kc×NR bf16 block stays in L1
//!         micro-kernel over the row tiles: C[ic.., q·NR..] (+)= A_block · B_block
//! ```
//!
//! For the pair layout kc is even except for the last block (whose odd depth the packings
//! pad with zeros), so every block starts at a whole pair.

use std::ops::Range;

use super::convert::{pack_a_rounded, Bf16B};
use super::layout::{pack_a_pair_rows, APack};
use super::ukernel::{halves_mut, Bf16Kernel};
use crate::cpu::gemm::epilogue::{gemm_operands, gemm_operands_prepared};
use crate::cpu::gemm::pack::{with_buffer, Pool};
use crate::cpu::gemm::ukernel::TileEpilogue;
use crate::cpu::gemm::view::CView;
use crate::cpu::pool;
use crate::cpu::weights::WeightCache;
use crate::error::{Error, Result};
use crate::kernel::{Executable, PreparedWeight, WeightFormat};
use crate::operand::{Operand, OperandMut};
use crate::workload::{Act, Workload};

/// How the work is split across tasks (the `par` knob).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Split {
    None,
    M,
    N,
}

/// A built bf16 GEMM.
pub(super) struct BGemm {
    w: Workload,
    m: usize,
    n: usize,
    k: usize,
    uk: &'static Bf16Kernel,
    /// Rows of A per packed block, a multiple of MR.
    mc: usize,
    /// Depth per block, at most K; even when below K for the pair layout.
    kc: usize,
    /// The epilogue's activation, after the bias (`gemm_bias_*`); `None` for plain GEMM.
    act: Option<Act>,
    split: Split,
    threads: usize,
    /// B converted and packed once per weight buffer.
    weights: WeightCache<Bf16B>,
}

impl BGemm {
    /// Clamps the block sizes to the shape: `mc` rounded up to whole tiles and at most the
    /// rows' tiles, `kc` within `1..=K` and, for the pair layout, rounded up to whole pairs
    /// (or K).
    pub(super) fn new(
        w: Workload,
        (m, n, k): (usize, usize, usize),
        uk: &'static Bf16Kernel,
        (mc, kc): (usize, usize),
        act: Option<Act>,
        split: Split,
        threads: usize,
    ) -> BGemm {
        let round = |x: usize| x.max(1).div_ceil(uk.mr) * uk.mr;
        BGemm {
            w,
            m,
            n,
            k,
            uk,
            mc: round(mc).min(round(m)),
            kc: uk.layout.padded(kc.max(1)).min(k.max(1)),
            act,
            split,
            threads,
            weights: WeightCache::default(),
        }
    }

    fn format(&self) -> WeightFormat {
        WeightFormat {
            family: "gemm_bf16",
            params: [self.uk.nr, self.uk.layout.code()],
        }
    }

    /// `c = ep(round(a) · bb)`: row blocks split over `threads` tasks (`par = m`), column
    /// panels split over them (`par = n`), or one task.
    fn compute(&self, a: &[f32], bb: &Bf16B, ep: Option<TileEpilogue<'_>>, c: &mut [f32]) {
        let (m, n, mr, nr) = (self.m, self.n, self.uk.mr, self.uk.nr);
        let panels = bb.panels();
        let mut view = CView::new(c, m, n, n);
        let t = self.threads;
        match self.split {
            Split::M if t > 1 && m > mr => {
                let tasks = view.row_chunks(m.div_ceil(mr).div_ceil(t) * mr);
                pool::for_each(t, tasks, |(r0, v)| self.task(a, bb, ep, r0, 0..panels, v));
            }
            Split::N if t > 1 && panels > 1 => {
                let per_task = panels.div_ceil(t);
                let mut tasks = Vec::new();
                let mut q0 = 0;
                while q0 + per_task < panels {
                    let (left, rest) = view.split_cols(per_task * nr);
                    tasks.push((q0..q0 + per_task, left));
                    (q0, view) = (q0 + per_task, rest);
                }
                tasks.push((q0..panels, view));
                pool::for_each(t, tasks, |(qs, v)| self.task(a, bb, ep, 0, qs, v));
            }
            _ => self.task(a, bb, ep, 0, 0..panels, view),
        }
    }

    /// One task: rows `row0..row0 + out.rows()` of C, column panels `panels` (whose columns
    /// `out` holds, from the first panel's first column on).
    fn task(
        &self,
        a: &[f32],
        bb: &Bf16B,
        ep: Option<TileEpilogue<'_>>,
        row0: usize,
        panels: Range<usize>,
        mut out: CView<'_>,
    ) {
        let (k, mr, nr) = (self.k, self.uk.mr, self.uk.nr);
        let (rows, col0) = (out.rows(), panels.start * nr);
        with_buffer(Pool::A, |buf| {
            for pc in (0..k).step_by(self.kc) {
                let kcb = self.kc.min(k - pc);
                let last = pc + kcb == k;
                for ic in (0..rows).step_by(self.mc) {
                    let mcb = self.mc.min(rows - ic);
                    let tiles = mcb.div_ceil(mr);
                    let steps = self.uk.layout.steps(kcb);
                    let apack = buf.slice(tiles * mr * steps);
                    self.pack_a(a, (row0 + ic, mcb), (pc, kcb), apack);
                    let depth = pc..pc + self.uk.layout.padded(kcb);
                    for q in panels.clone() {
                        let block = &bb.panel(q)[depth.start * nr..depth.end * nr];
                        let ep = ep.filter(|_| last).map(|e| e.skip(q * nr));
                        let at = (ic, q * nr - col0);
                        self.uk
                            .tiles(steps, apack, tiles, block, &mut out, at, pc > 0, ep);
                    }
                }
            }
        })
    }

    /// Packs rows `rows` × depths `depth` of A for the micro-kernel's layout into `out`.
    fn pack_a(&self, a: &[f32], rows: (usize, usize), depth: (usize, usize), out: &mut [f32]) {
        let (k, mr) = (self.k, self.uk.mr);
        match self.uk.a_pack {
            APack::PairRows => pack_a_pair_rows(a, k, rows, depth, mr, halves_mut(out)),
            APack::Rounded => pack_a_rounded(a, k, rows, depth, mr, out),
        }
    }

    /// B converted and packed for the micro-kernel.
    fn pack_b(&self, b: &[f32]) -> Result<Bf16B> {
        Bf16B::new(b, self.k, self.n, self.uk.nr, self.uk.layout)
    }

    fn wrong_b(&self, reason: String) -> Error {
        Error::Operand {
            workload: self.w.key(),
            operand: "b".into(),
            reason,
        }
    }
}

impl Executable for BGemm {
    fn run(&self, inputs: &[Operand<'_>], out: OperandMut<'_>) -> Result<()> {
        let (a, b, ep, c) = gemm_operands(&self.w, self.act, inputs, out)?;
        let bb = self.weights.get(b, || self.pack_b(b))?;
        self.compute(a, &bb, ep, c);
        Ok(())
    }

    fn weight_format(&self) -> Option<WeightFormat> {
        Some(self.format())
    }

    fn prepare_weight(&self, b: &[f32]) -> Result<PreparedWeight> {
        let want = self.k * self.n;
        if b.len() != want {
            return Err(self.wrong_b(format!("{} elements, expected {want}", b.len())));
        }
        let bb = self.pack_b(b)?;
        Ok(PreparedWeight::new(self.format(), bb.bytes(), bb))
    }

    fn run_prepared(
        &self,
        inputs: &[&[f32]],
        weight: &PreparedWeight,
        output: &mut [f32],
    ) -> Result<()> {
        let bb: &Bf16B = weight.get(self.format(), &self.w)?;
        if (bb.k, bb.n, bb.layout) != (self.k, self.n, self.uk.layout) {
            return Err(self.wrong_b(format!("prepared for K×N {}×{}", bb.k, bb.n)));
        }
        let (a, ep, c) = gemm_operands_prepared(&self.w, self.act, inputs, output)?;
        self.compute(a, bb, ep, c);
        Ok(())
    }
}
