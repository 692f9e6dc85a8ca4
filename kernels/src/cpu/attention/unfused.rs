//! The unfused attention driver, per head: `S = Q·Kᵀ` with a GEMM, a row softmax of the
//! whole `S×S` score matrix (over the keys each query sees: causal, and the batch's key
//! length when given), then `O = P·V` with a second GEMM.
//!
//! The two GEMMs are any [`Executable`]s for `gemm:SxSxD` and `gemm:SxDxS` — the registered
//! family builds them from the packed GEMM family, and [`UnfusedAttention::with_gemms`]
//! takes tuned ones (what the benchmark compares the fused kernel with).

use super::ukernel::softmax_row;
use crate::cpu::gemm::pack::{with_buffer, Pool};
use crate::cpu::pool;
use crate::kernel::Executable;
use crate::operand::{host_attention, Operand, OperandMut};
use crate::{DType, Workload};

/// Largest `S` the unfused variant supports: the score matrix of one head (`S²` f32, 64 MiB
/// at 4096) lives in memory once per concurrent head.
pub const UNFUSED_MAX_S: usize = 4096;

/// A prepared unfused attention.
pub struct UnfusedAttention {
    b: usize,
    h: usize,
    s: usize,
    d: usize,
    causal: bool,
    /// `gemm:SxSxD`: scores = Q·Kᵀ.
    qk: Box<dyn Executable>,
    /// `gemm:SxDxS`: O = P·V.
    pv: Box<dyn Executable>,
    /// Heads processed concurrently (1: one after the other, the GEMMs may be parallel).
    head_tasks: usize,
}

impl std::fmt::Debug for UnfusedAttention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnfusedAttention")
            .field("shape", &(self.b, self.h, self.s, self.d, self.causal))
            .field("head_tasks", &self.head_tasks)
            .finish()
    }
}

impl UnfusedAttention {
    /// Attention over `[b, h, s, d]` from two prepared GEMMs: `qk` for `gemm:SxSxD` and `pv`
    /// for `gemm:SxDxS` (their buffer sizes are checked when they run). `head_tasks` heads
    /// run concurrently (use serial GEMMs then).
    pub fn with_gemms(
        (b, h, s, d, causal): (usize, usize, usize, usize, bool),
        qk: Box<dyn Executable>,
        pv: Box<dyn Executable>,
        head_tasks: usize,
    ) -> Self {
        UnfusedAttention {
            b,
            h,
            s,
            d,
            causal,
            qk,
            pv,
            head_tasks: head_tasks.max(1),
        }
    }

    /// One head whose queries see the first `keys` keys (fewer when causal).
    fn head(&self, q: &[f32], k: &[f32], v: &[f32], keys: usize, o: &mut [f32]) {
        let (s, d) = (self.s, self.d);
        let scale = std::f32::consts::LOG2_E / (d as f32).sqrt();
        with_buffer(Pool::Keys, |ktbuf| {
            with_buffer(Pool::Work, |sbuf| {
                let kt = ktbuf.slice(d * s);
                for (j, row) in k.chunks_exact(d).enumerate() {
                    for (c, x) in row.iter().enumerate() {
                        kt[c * s + j] = *x;
                    }
                }
                let scores = sbuf.slice(s * s);
                let sizes = "the scores and head buffers are sized at build";
                self.qk.run_f32(&[q, kt], scores).expect(sizes);
                for (i, row) in scores.chunks_exact_mut(s).enumerate() {
                    match keys.min(if self.causal { i + 1 } else { s }) {
                        // A query that sees no key: a zero row of P gives a zero output.
                        0 => row.fill(0.0),
                        seen => softmax_row(row, seen, scale),
                    }
                }
                self.pv.run_f32(&[scores, v], o).expect(sizes);
            })
        });
    }
}

impl Executable for UnfusedAttention {
    fn run(&self, inputs: &[Operand<'_>], out: OperandMut<'_>) -> crate::Result<()> {
        let hs = self.s * self.d;
        let w = Workload::Attention {
            b: self.b,
            h: self.h,
            s: self.s,
            d: self.d,
            causal: self.causal,
            dtype: DType::F32,
        };
        let ([q, k, v], lens, out) = host_attention(&w, inputs, out)?;
        let items: Vec<_> = out.chunks_exact_mut(hs).enumerate().collect();
        pool::for_each(self.head_tasks, items, |(hd, o)| {
            let r = hd * hs..(hd + 1) * hs;
            let keys = lens.map_or(self.s, |l| usize::try_from(l[hd / self.h]).unwrap_or(0));
            self.head(&q[r.clone()], &k[r.clone()], &v[r], keys, o);
        });
        Ok(())
    }
}
