//! Where one attention call's operands lie in memory: the workload's own `[B, H, S, D]`
//! tensors, or the rows of a transformer layer's fused QKV projection, read and written in
//! place (no copies splitting the heads out and merging them back).

use std::cell::RefCell;

use crate::cpu::pool;

use crate::cpu::gemm::view::CView;
use crate::error::Result;
use crate::kernel::Executable;
use crate::operand::{host_qkv_rows, Operand, OperandMut};
use crate::workload::Workload;

/// The memory layout of an attention call's Q, K, V and O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Q, K, V and O each `[B, H, S, D]`: the workload's operands.
    Heads,
    /// Q, K and V side by side in the rows of one `[B·S, 3·H·D]` matrix (a fused QKV
    /// projection's output: Q, then K, then V, head `h` at columns `h·D..` of each), and O
    /// in `[B·S, H·D]` rows (head `h` at columns `h·D..`), what the output projection reads.
    QkvRows,
}

/// Which of the three inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The queries.
    Q = 0,
    /// The keys.
    K = 1,
    /// The values.
    V = 2,
}

/// An attention call's shape and layout: where each head's rows are.
#[derive(Debug, Clone, Copy)]
pub struct Rows {
    /// How Q, K, V and O are laid out.
    pub layout: Layout,
    /// Batch size.
    pub b: usize,
    /// Heads per batch entry.
    pub h: usize,
    /// Sequence length (queries and keys).
    pub s: usize,
    /// Head dimension.
    pub d: usize,
}

impl Rows {
    /// Attention workload `w`'s shape in `layout`. Panics if `w` is not attention.
    pub fn of(w: &Workload, layout: Layout) -> Rows {
        let Workload::Attention { b, h, s, d, .. } = *w else {
            panic!("Rows::of takes an attention workload, got {w}");
        };
        Rows { layout, b, h, s, d }
    }

    /// Keys head `hd` (`batch·H + head`) sees: its batch's entry of `key_lens` (clamped to
    /// `0..=S`), or S without.
    pub fn keys(&self, key_lens: Option<&[i32]>, hd: usize) -> usize {
        key_lens
            .map_or(self.s, |l| usize::try_from(l[hd / self.h]).unwrap_or(0))
            .min(self.s)
    }

    /// The row stride of Q, K and V.
    pub fn ld(&self) -> usize {
        match self.layout {
            Layout::Heads => self.d,
            Layout::QkvRows => 3 * self.h * self.d,
        }
    }

    /// Where row 0 of head `hd` (`batch·H + head`) of `part` starts in that part's operand
    /// (for [`Layout::QkvRows`], the one `qkv` matrix).
    pub fn start(&self, hd: usize, part: Part) -> usize {
        let (h, s, d) = (self.h, self.s, self.d);
        match self.layout {
            Layout::Heads => hd * s * d,
            Layout::QkvRows => (hd / h) * s * 3 * h * d + (part as usize) * h * d + (hd % h) * d,
        }
    }

    /// Head `hd`'s `S` rows of `part` from `x` (that part's operand), at stride [`ld`](Self::ld):
    /// the slice from its first row to its last row's end.
    pub fn head<'x>(&self, x: &'x [f32], hd: usize, part: Part) -> &'x [f32] {
        let start = self.start(hd, part);
        &x[start..start + (self.s - 1) * self.ld() + self.d]
    }

    /// The elements one operand holds: `B·H·S·D`, or `3·B·H·S·D` for the `qkv` matrix.
    pub fn input_len(&self) -> usize {
        let n = self.b * self.h * self.s * self.d;
        match self.layout {
            Layout::Heads => n,
            Layout::QkvRows => 3 * n,
        }
    }

    /// The output as one `S × D` window per head, in head order (`batch·H + head`).
    /// Panics unless `out` holds `B·H·S·D` values.
    pub fn out_heads<'a>(&self, out: &'a mut [f32]) -> Vec<CView<'a>> {
        let (b, h, s, d) = (self.b, self.h, self.s, self.d);
        assert_eq!(out.len(), b * h * s * d, "attention output length");
        match self.layout {
            Layout::Heads => CView::new(out, b * h * s, d, d)
                .row_chunks(s)
                .into_iter()
                .map(|(_, v)| v)
                .collect(),
            Layout::QkvRows => CView::new(out, b * s, h * d, h * d)
                .row_chunks(s)
                .into_iter()
                .flat_map(|(_, batch)| batch.col_chunks(d).into_iter().map(|(_, v)| v))
                .collect(),
        }
    }
}

/// The copy [`Layout::QkvRows`] saves a variant that reads it in place: `qkv` (`[B·S,
/// 3·H·D]`) split into `heads_out` = Q, K, V one after the other, each `[B, H, S, D]`
/// (`rows`' layout is not used). In parallel over the call's threads ([`pool::threads`]).
pub fn split_heads(rows: &Rows, qkv: &[f32], heads_out: &mut [f32]) {
    let (b, h, s, d) = (rows.b, rows.h, rows.s, rows.d);
    let by_rows = Rows {
        layout: Layout::QkvRows,
        ..*rows
    };
    assert!(qkv.len() == by_rows.input_len() && heads_out.len() == qkv.len());
    let parts = [Part::Q, Part::K, Part::V];
    pool::each_chunk(heads_out, s * d, |i, dst| {
        let (part, hd) = (parts[i / (b * h)], i % (b * h));
        let src = by_rows.head(qkv, hd, part);
        for (r, row) in dst.chunks_exact_mut(d).enumerate() {
            row.copy_from_slice(&src[r * by_rows.ld()..][..d]);
        }
    });
}

/// The inverse copy for the output: `ctx` (`[B, H, S, D]`) into `out` rows (`[B·S, H·D]`,
/// head `h` at columns `h·D..`). In parallel over the call's threads ([`pool::threads`]).
pub fn merge_heads(rows: &Rows, ctx: &[f32], out: &mut [f32]) {
    let (h, s, d) = (rows.h, rows.s, rows.d);
    assert!(ctx.len() == rows.b * h * s * d && out.len() == ctx.len());
    pool::each_chunk(out, h * d, |row, dst| {
        let (b, i) = (row / s, row % s);
        for (hh, piece) in dst.chunks_exact_mut(d).enumerate() {
            piece.copy_from_slice(&ctx[((b * h + hh) * s + i) * d..][..d]);
        }
    });
}

thread_local! {
    /// The head-major Q, K, V and context of this thread's last [`run_via_heads`]: grown,
    /// never shrunk, so a serving loop allocates (and faults in) once.
    static HEADS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// QKV rows ([`Executable::run_qkv_rows`]'s operands for attention workload `w`) through a
/// variant that reads `[B, H, S, D]` operands only (where `run_qkv_rows` says `None`): the
/// heads split out into a buffer this thread keeps, [`Executable::run`], and the output
/// merged back into `out` rows. Operands that do not fit `w` are an error, as from
/// `run_qkv_rows`.
pub fn run_via_heads(
    exe: &dyn Executable,
    w: &Workload,
    (qkv, key_lens): (&[f32], Option<&[i32]>),
    out: &mut [f32],
) -> Result<()> {
    host_qkv_rows(w, qkv, key_lens, out)?;
    let rows = Rows::of(w, Layout::QkvRows);
    let n = out.len();
    // Taken, not borrowed: a nested call on this thread (rayon work stealing) gets its own.
    let mut buf = HEADS.with(|b| std::mem::take(&mut *b.borrow_mut()));
    if buf.len() < 4 * n {
        buf.resize(4 * n, 0.0);
    }
    let (heads, rest) = buf.split_at_mut(3 * n);
    let ctx = &mut rest[..n];
    split_heads(&rows, qkv, heads);
    let mut inputs: Vec<Operand<'_>> = heads.chunks_exact(n).map(Operand::F32).collect();
    inputs.extend(key_lens.map(Operand::I32));
    let done = exe.run(&inputs, OperandMut::F32(ctx));
    if done.is_ok() {
        merge_heads(&rows, ctx, out);
    }
    HEADS.with(|b| {
        let mut b = b.borrow_mut();
        if b.len() < buf.len() {
            *b = buf;
        }
    });
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layout_finds_the_same_head_rows() {
        let (b, h, s, d) = (2, 3, 5, 4);
        // Value = its (part, batch, head, row, col) index, placed in each layout.
        let id = |p: usize, bb: usize, hh: usize, i: usize, j: usize| {
            ((((p * b + bb) * h + hh) * s + i) * d + j) as f32
        };
        let heads: Vec<Vec<f32>> = (0..3)
            .map(|p| {
                let mut x = vec![0.0; b * h * s * d];
                for (n, v) in x.iter_mut().enumerate() {
                    let (bh, i, j) = (n / (s * d), n / d % s, n % d);
                    *v = id(p, bh / h, bh % h, i, j);
                }
                x
            })
            .collect();
        let mut qkv = vec![0.0; 3 * b * h * s * d];
        for (n, v) in qkv.iter_mut().enumerate() {
            let (row, col) = (n / (3 * h * d), n % (3 * h * d));
            let (p, hh, j) = (col / (h * d), col / d % h, col % d);
            *v = id(p, row / s, hh, row % s, j);
        }
        let by_heads = Rows {
            layout: Layout::Heads,
            b,
            h,
            s,
            d,
        };
        let by_rows = Rows {
            layout: Layout::QkvRows,
            ..by_heads
        };
        assert_eq!(by_rows.input_len(), qkv.len());
        for hd in 0..b * h {
            for (p, part) in [Part::Q, Part::K, Part::V].into_iter().enumerate() {
                let a = by_heads.head(&heads[p], hd, part);
                let r = by_rows.head(&qkv, hd, part);
                for i in 0..s {
                    let want: Vec<f32> = (0..d).map(|j| id(p, hd / h, hd % h, i, j)).collect();
                    assert_eq!(a[i * by_heads.ld()..][..d], want[..]);
                    assert_eq!(r[i * by_rows.ld()..][..d], want[..]);
                }
            }
        }
        let mut split = vec![0.0; qkv.len()];
        split_heads(&by_rows, &qkv, &mut split);
        assert_eq!(split, heads.concat());
        let mut merged = vec![0.0; b * h * s * d];
        merge_heads(&by_rows, &heads[1], &mut merged);
        for hd in 0..b * h {
            let rows_of_k = by_rows.head(&qkv, hd, Part::K);
            let out = Rows {
                layout: Layout::QkvRows,
                ..by_rows
            };
            for i in 0..s {
                // Output rows are H·D wide: the K part's columns shifted by -H·D.
                let at = (hd / h * s + i) * h * d + hd % h * d;
                assert_eq!(merged[at..at + d], rows_of_k[i * out.ld()..][..d]);
            }
        }
        // Output windows: head hd's row i lands at [b, h, i, :] or at row b·S + i, cols h·D..
        for rows in [by_heads, by_rows] {
            let mut out = vec![0.0; b * h * s * d];
            for (hd, mut v) in rows.out_heads(&mut out).into_iter().enumerate() {
                assert_eq!((v.rows(), v.cols()), (s, d));
                // Adjacent rows only where heads are whole tensors (H > 1 here).
                assert_eq!(v.contiguous_mut().is_some(), rows.layout == Layout::Heads);
                for i in 0..s {
                    v.row_mut(i).fill((hd * s + i) as f32);
                }
            }
            for (n, &x) in out.iter().enumerate() {
                let (hd, i) = match rows.layout {
                    Layout::Heads => (n / (s * d), n / d % s),
                    Layout::QkvRows => {
                        let (row, col) = (n / (h * d), n % (h * d));
                        ((row / s) * h + col / d, row % s)
                    }
                };
                assert_eq!(x, (hd * s + i) as f32, "{:?} element {n}", rows.layout);
            }
        }
    }

    #[test]
    fn split_then_merge_round_trips_each_part_in_parallel() {
        // Past one task's work: the parallel path.
        let rows = Rows {
            layout: Layout::QkvRows,
            b: 2,
            h: 4,
            s: 67,
            d: 65,
        };
        let n = rows.b * rows.h * rows.s * rows.d;
        assert!(n > 2 * pool::TASK_VALUES);
        let qkv: Vec<f32> = (0..3 * n).map(|i| i as f32).collect();
        let mut all = vec![0.0; 3 * n];
        split_heads(&rows, &qkv, &mut all);
        let hid = rows.h * rows.d;
        for (part, t) in all.chunks_exact(n).enumerate() {
            let mut back = vec![0.0; n];
            merge_heads(&rows, t, &mut back);
            for (r, row) in back.chunks_exact(hid).enumerate() {
                assert_eq!(
                    row,
                    &qkv[r * 3 * hid + part * hid..][..hid],
                    "part {part} row {r}"
                );
            }
        }
    }
}
