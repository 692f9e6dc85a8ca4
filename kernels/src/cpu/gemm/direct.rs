//! The direct (unpacked) GEMM for small M: register tiles of `R` rows × `V` vectors read A
//! rows (broadcasting `a[i, p]`) and rows of B in place, so nothing is copied for GEMV-like
//! shapes where packing would cost as much as the arithmetic.
//!
//! ```text
//! for pc in 0..K step kc                (kc = 0: whole K; else the B slab kc × V·lanes stays in L1)
//!   for jt in 0..N step V·lanes         column tiles; the last one uses fewer vectors, and a
//!                                       final partial vector goes through a zero-padded copy
//!     for it in 0..M step R             row tiles; the last one uses fewer rows
//!       C[it.., jt..] (+)= A[it.., pc..] · B[pc.., jt..]
//! ```

use crate::cpu::pool;

use super::ukernel::{DirectUkernel, TileEpilogue};
use super::view::CView;
use super::Par;
use crate::kernel::Executable;
use crate::operand::{host_f32, Operand, OperandMut};
use crate::{DType, Workload};

/// Bytes of the B slab (`kc` rows × a chunk of columns) that the row tiles of one depth pass
/// share: half of a 32 KiB L1d, the size of every x86-64 core's L1d this targets.
const SLAB_BYTES: usize = 16 * 1024;

/// A prepared direct GEMM.
pub struct DirectGemm {
    /// Rows of A and C.
    pub(crate) m: usize,
    /// Columns of B and C.
    pub(crate) n: usize,
    /// Depth: columns of A, rows of B.
    pub(crate) k: usize,
    /// The micro-kernel family (the `ukernel` knob).
    pub(crate) uk: &'static DirectUkernel,
    /// Depth per pass over the B slab, `1..=K`.
    pub(crate) kc: usize,
    /// How C is split across threads (the `par` and `threads` knobs).
    pub(crate) par: Par,
}

impl DirectGemm {
    /// `kc = 0` means the whole of K.
    pub fn new(
        (m, n, k): (usize, usize, usize),
        uk: &'static DirectUkernel,
        kc: usize,
        par: Par,
    ) -> Self {
        let kc = if kc == 0 { k } else { kc.min(k) };
        DirectGemm {
            m,
            n,
            k,
            uk,
            kc,
            par,
        }
    }

    /// `C = A·B` into `c` (M×N, overwritten); with `ep` (bias of all N columns),
    /// `C = act(A·B + bias)` applied as the last depth pass stores its tiles. Panics on
    /// wrong buffer sizes.
    pub fn run_with(&self, a: &[f32], b: &[f32], c: &mut [f32], ep: Option<TileEpilogue<'_>>) {
        let (m, n, k) = (self.m, self.n, self.k);
        assert_eq!(a.len(), m * k, "A must be M×K = {m}×{k}");
        assert_eq!(b.len(), k * n, "B must be K×N = {k}×{n}");
        assert_eq!(c.len(), m * n, "C must be M×N = {m}×{n}");
        if let Some(ep) = &ep {
            assert_eq!(ep.bias.len(), n, "bias must have N = {n} values");
        }
        self.gemm(a, b, CView::new(c, m, n, n), ep);
    }

    /// Rows `i0..i0+c.rows()` × columns `j0..j0+c.cols()` of C; `ep`'s bias covers all N.
    fn block(
        &self,
        a: &[f32],
        b: &[f32],
        mut c: CView<'_>,
        (i0, j0): (usize, usize),
        ep: Option<TileEpilogue<'_>>,
    ) {
        let (n, k) = (self.n, self.k);
        let uk = self.uk;
        let lanes = uk.lanes;
        let tw = uk.v * lanes;
        let (rows, cols) = (c.rows(), c.cols());
        for pc in (0..k).step_by(self.kc) {
            let kcb = self.kc.min(k - pc);
            let accumulate = pc > 0;
            let ep = if pc + kcb == k { ep } else { None };
            // Column chunks whose B slab (kcb rows) stays in L1 while every row tile reads
            // it; a single row tile has no reuse and sweeps the whole width in one call.
            let chunk = if rows <= uk.r {
                cols.max(1)
            } else {
                (SLAB_BYTES / (kcb * std::mem::size_of::<f32>()) / tw).max(1) * tw
            };
            for jt in (0..cols).step_by(chunk) {
                let width = chunk.min(cols - jt);
                // Whole tiles, then the rest in one tile of the vectors it needs (the last
                // one clipped to the columns there are).
                let whole = width / tw * tw;
                let rest = width - whole;
                for it in (0..rows).step_by(uk.r) {
                    let r = uk.r.min(rows - it);
                    let a_tile = &a[(i0 + it) * k + pc..];
                    let parts = [(whole, uk.v, jt), (rest, rest.div_ceil(lanes), jt + whole)];
                    for (w, v, j) in parts.into_iter().filter(|p| p.0 > 0) {
                        uk.tile(
                            (r, v),
                            w,
                            kcb,
                            a_tile,
                            k,
                            &b[pc * n + j0 + j..],
                            n,
                            &mut c,
                            (it, j),
                            accumulate,
                            ep.map(|e| e.skip(j0 + j)),
                        );
                    }
                }
            }
        }
    }

    fn gemm(&self, a: &[f32], b: &[f32], c: CView<'_>, ep: Option<TileEpilogue<'_>>) {
        match self.par {
            Par::None => self.block(a, b, c, (0, 0), ep),
            Par::M(t) => {
                let tasks = c.row_chunks(self.m.div_ceil(t));
                pool::for_each(t, tasks, |(i0, view)| self.block(a, b, view, (i0, 0), ep));
            }
            Par::N(t) => {
                let lanes = self.uk.lanes;
                let tasks = c.col_chunks(self.n.div_ceil(t).div_ceil(lanes) * lanes);
                pool::for_each(t, tasks, |(j0, view)| self.block(a, b, view, (0, j0), ep));
            }
        }
    }
}

impl Executable for DirectGemm {
    fn run(&self, inputs: &[Operand<'_>], out: OperandMut<'_>) -> crate::Result<()> {
        let (m, n, k) = (self.m, self.n, self.k);
        let w = Workload::Gemm {
            m,
            n,
            k,
            dtype: DType::F32,
        };
        let ([a, b], out) = host_f32(&w, inputs, out)?;
        self.run_with(a, b, out, None);
        Ok(())
    }
}
