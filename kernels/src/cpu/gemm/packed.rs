//! The BLIS-style packed GEMM driver: the five loops around the micro-kernel, cache blocking
//! by `nc` / `kc` / `mc`, and the `m` / `n` thread splits.
//!
//! ```text
//! for jc in 0..N step nc            (B block kc×nc shared by all threads, lives in L3)
//!   for pc in 0..K step kc          pack B[pc.., jc..] once, in parallel
//!     per thread (rows for par=m, column panels for par=n):
//!       for ic in 0..M step mc      pack A[ic.., pc..] into this thread's buffer (L2)
//!         for jr in 0..nc step NR   B micro-panel stays in L1
//!           for ir in 0..mc step MR micro-kernel: C[ir.., jr..] (+)= A_panel · B_panel
//! ```

use super::pack::{pack_a, pack_b, with_buffer, AlignedBuf, Pool};
use super::ukernel::{prefetch_lines, ATiles, BPanel, PackedUkernel, TileEpilogue};
use super::view::CView;
use super::Par;
use crate::cpu::pool;
use crate::kernel::Executable;
use crate::operand::{host_f32, Operand, OperandMut};
use crate::{DType, Workload};

/// Where the B operand comes from.
#[derive(Clone, Copy)]
pub enum BSource<'a> {
    /// Row-major `K×N`, packed block by block during the call.
    RowMajor(&'a [f32]),
    /// Packed once, ahead of the call, into this GEMM's panel layout ([`PackedGemm::pack_b`]).
    Packed(&'a PackedB),
}

/// A `K×N` B matrix packed once into the micro-panel layout of one (`NR`, `kc`) blocking:
/// what an inference runtime does with a constant weight, so that calls skip packing.
///
/// Layout: depth blocks of `kc` rows one after the other; inside the block starting at
/// depth `pc` (with `kcb` rows), the `⌈N/NR⌉` panels of `kcb × NR` values (zero-padded past
/// column N) in column order. The panels of any NR-aligned column range are contiguous.
pub struct PackedB {
    k: usize,
    n: usize,
    nr: usize,
    kc: usize,
    panels: usize,
    data: AlignedBuf,
}

impl std::fmt::Debug for PackedB {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedB")
            .field("k", &self.k)
            .field("n", &self.n)
            .field("nr", &self.nr)
            .field("kc", &self.kc)
            .finish()
    }
}

impl PackedB {
    /// Packs row-major `b` (`k×n`) for micro-kernels `nr` columns wide and depth blocks of
    /// `kc` (clamped to `1..=k`); [`crate::Error::OutOfMemory`] when the memory left cannot
    /// hold it. Panics if `b.len() != k·n` or a dimension is 0.
    pub fn pack(b: &[f32], k: usize, n: usize, nr: usize, kc: usize) -> crate::Result<PackedB> {
        assert!(k >= 1 && n >= 1 && nr >= 1, "empty B");
        assert_eq!(b.len(), k * n, "B must be K×N = {k}×{n}");
        let kc = kc.clamp(1, k);
        let panels = n.div_ceil(nr);
        let mut data = AlignedBuf::default();
        let all = data.try_slice(k * panels * nr, "a packed f32 weight")?;
        for pc in (0..k).step_by(kc) {
            let kcb = kc.min(k - pc);
            let block = &mut all[pc * panels * nr..][..kcb * panels * nr];
            pack_b(b, n, (pc, kcb), (0, n), nr, 0, block);
        }
        Ok(PackedB {
            k,
            n,
            nr,
            kc,
            panels,
            data,
        })
    }

    /// `(k, n)` of the packed matrix.
    pub fn dims(&self) -> (usize, usize) {
        (self.k, self.n)
    }

    /// The panels of depth block `pc..` covering columns `jc..jc+ncb` (`jc` a multiple of NR).
    fn block(&self, pc: usize, jc: usize, ncb: usize) -> &[f32] {
        debug_assert!(pc.is_multiple_of(self.kc) && jc.is_multiple_of(self.nr));
        let kcb = self.kc.min(self.k - pc);
        let all = self.data.as_slice(self.k * self.panels * self.nr);
        let base = pc * self.panels * self.nr;
        let q0 = jc / self.nr;
        let np = ncb.div_ceil(self.nr);
        &all[base + q0 * self.nr * kcb..base + (q0 + np) * self.nr * kcb]
    }
}

/// A prepared packed GEMM: shape, micro-kernel and effective block sizes.
pub struct PackedGemm {
    /// Rows of A and C.
    pub(crate) m: usize,
    /// Columns of B and C.
    pub(crate) n: usize,
    /// Depth: columns of A, rows of B.
    pub(crate) k: usize,
    /// The micro-kernel (the `ukernel` knob).
    pub(crate) uk: &'static PackedUkernel,
    /// Rows of A per packed block, a multiple of MR, at most ⌈M/MR⌉·MR.
    pub(crate) mc: usize,
    /// Depth per packed block, at most K.
    pub(crate) kc: usize,
    /// Columns of B per packed block, a multiple of NR, at most ⌈N/NR⌉·NR.
    pub(crate) nc: usize,
    /// How C is split across threads (the `par` and `threads` knobs).
    pub(crate) par: Par,
    /// Pack A's whole row tiles into micro-panels (`a_layout = packed`), or read them in
    /// place (`inplace`); a partial last row tile is read in place either way.
    pub(crate) pack_a: bool,
    /// Read a row-major B's column panels in place (`b_layout = inplace`) instead of
    /// packing every block during the call. A B packed ahead ([`BSource::Packed`]) is read
    /// as packed either way.
    pub(crate) b_inplace: bool,
}

/// The B micro-panels of one (depth, column) block, as [`PackedGemm::rows_task`] reads them.
#[derive(Clone, Copy)]
enum BBlock<'a> {
    /// Packed panels of `kcb·NR` values, one after the other.
    Packed(&'a [f32]),
    /// Row-major B in place from the block's first element (rows `ldb` apart): `panels`
    /// panels, the last of which may be narrower than NR.
    Rows {
        b: &'a [f32],
        ldb: usize,
        panels: usize,
    },
}

impl<'a> BBlock<'a> {
    /// Panel `q` (`nr` columns, `kcb` deep), if the block has one.
    fn panel(self, q: usize, nr: usize, kcb: usize) -> Option<BPanel<'a>> {
        match self {
            BBlock::Packed(p) => p.get(q * nr * kcb..(q + 1) * nr * kcb).map(BPanel::Packed),
            BBlock::Rows { b, ldb, panels } => {
                (q < panels).then(|| BPanel::Rows(&b[q * nr..], ldb))
            }
        }
    }

    /// The block's panels from panel `q` on.
    fn skip(self, q: usize, nr: usize, kcb: usize) -> BBlock<'a> {
        match self {
            BBlock::Packed(p) => BBlock::Packed(&p[(q * nr * kcb).min(p.len())..]),
            BBlock::Rows { b, ldb, panels } => BBlock::Rows {
                b: &b[(q * nr).min(b.len())..],
                ldb,
                panels: panels.saturating_sub(q),
            },
        }
    }
}

impl PackedGemm {
    /// Clamps and rounds the knob values so every one of them is usable for this shape.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        (m, n, k): (usize, usize, usize),
        uk: &'static PackedUkernel,
        mc: usize,
        kc: usize,
        nc: usize,
        par: Par,
        (pack_a, b_inplace): (bool, bool),
    ) -> Self {
        let round = |x: usize, to: usize| x.max(1).div_ceil(to) * to;
        PackedGemm {
            m,
            n,
            k,
            uk,
            mc: round(mc, uk.mr).min(round(m, uk.mr)),
            kc: kc.clamp(1, k),
            nc: round(nc, uk.nr).min(round(n, uk.nr)),
            par,
            pack_a,
            b_inplace,
        }
    }

    /// Packs `b` (`K×N`, row-major) once into this GEMM's panel layout, for
    /// [`BSource::Packed`] ([`crate::Error::OutOfMemory`] when it does not fit). Panics if
    /// `b` is not `K×N`.
    pub fn pack_b(&self, b: &[f32]) -> crate::Result<PackedB> {
        PackedB::pack(b, self.k, self.n, self.uk.nr, self.kc)
    }

    /// `C = A·B` into `c` (M×N, overwritten); with `ep`, `C = act(A·B + bias)` applied as
    /// the last depth block's tiles are stored. Panics on wrong buffer sizes, or a
    /// pre-packed B that was not packed by [`PackedGemm::pack_b`] of an equal blocking.
    pub fn run_with(&self, a: &[f32], b: BSource<'_>, c: &mut [f32], ep: Option<TileEpilogue<'_>>) {
        let (m, n, k) = (self.m, self.n, self.k);
        assert_eq!(a.len(), m * k, "A must be M×K = {m}×{k}");
        match b {
            BSource::RowMajor(b) => assert_eq!(b.len(), k * n, "B must be K×N = {k}×{n}"),
            BSource::Packed(p) => assert!(
                (p.k, p.n, p.nr, p.kc) == (k, n, self.uk.nr, self.kc),
                "B was packed for another blocking: {p:?}"
            ),
        }
        assert_eq!(c.len(), m * n, "C must be M×N = {m}×{n}");
        if let Some(ep) = &ep {
            assert_eq!(ep.bias.len(), n, "bias must have N = {n} values");
        }
        self.gemm(a, b, CView::new(c, m, n, n), ep);
    }

    /// `C = A·B` into the window `c` (the whole output), with the epilogue `ep` (bias of
    /// all N columns) applied on the last depth block.
    fn gemm(&self, a: &[f32], b: BSource<'_>, mut c: CView<'_>, ep: Option<TileEpilogue<'_>>) {
        let (m, n, k) = (self.m, self.n, self.k);
        let nr = self.uk.nr;
        let threads = self.par.threads();
        // A pre-packed B was packed long before the call: its panels come from L3 (or
        // memory), so each one is prefetched while the tiles of the previous one run. (A B
        // block packed during the call gains nothing from it: measured 2-3% slower.)
        let prefetch = matches!(b, BSource::Packed(_));
        if let (BSource::Packed(p), Par::M(t)) = (b, self.par) {
            if t > 1 {
                return self.packed_row_blocks(a, p, c, ep, t);
            }
        }
        with_buffer(Pool::B, |bbuf| {
            for jc in (0..n).step_by(self.nc) {
                let ncb = self.nc.min(n - jc);
                let panels = ncb.div_ceil(nr);
                for pc in (0..k).step_by(self.kc) {
                    let kcb = self.kc.min(k - pc);
                    let panel_len = nr * kcb;
                    let ep = if pc + kcb == k {
                        ep.map(|e| e.skip(jc))
                    } else {
                        None
                    };
                    let block = c.sub(0, jc, m, ncb);
                    let depth = (pc, kcb);
                    if let (BSource::RowMajor(b), Par::N(t)) = (b, self.par) {
                        if t > 1 && panels > 1 && !self.b_inplace {
                            let bpack = bbuf.slice(panels * panel_len);
                            self.cols_packing(a, b, bpack, block, (jc, ncb), depth, ep, t);
                            continue;
                        }
                    }
                    let bblock = match b {
                        BSource::Packed(p) => BBlock::Packed(p.block(pc, jc, ncb)),
                        BSource::RowMajor(b) if self.b_inplace => BBlock::Rows {
                            b: &b[pc * n + jc..],
                            ldb: n,
                            panels,
                        },
                        BSource::RowMajor(b) => {
                            let bpack = bbuf.slice(panels * nr * kcb);
                            if threads > 1 && panels > 1 {
                                let per = panels.div_ceil(threads);
                                let parts = bpack.chunks_mut(per * panel_len).enumerate();
                                pool::for_each(threads, parts.collect(), |(t, part)| {
                                    pack_b(b, n, (pc, kcb), (jc, ncb), nr, t * per, part)
                                });
                            } else {
                                pack_b(b, n, (pc, kcb), (jc, ncb), nr, 0, bpack);
                            }
                            BBlock::Packed(bpack)
                        }
                    };
                    match self.par {
                        Par::None => self.rows_task(a, bblock, block, 0, depth, ep, prefetch),
                        Par::M(t) => {
                            // Row blocks pulled by `t` tasks as they get free, so a core that
                            // is slowed down (shared machines) does fewer of them.
                            pool::for_each(t, self.row_blocks(block, t), |(row0, view)| {
                                self.rows_task(a, bblock, view, row0, depth, ep, prefetch)
                            });
                        }
                        Par::N(t) => {
                            let per = panels.div_ceil(t);
                            let parts = column_parts(block, per, nr);
                            pool::for_each(t, parts, |(q, view)| {
                                let bp = bblock.skip(q, nr, kcb);
                                let ep = ep.map(|e| e.skip(q * nr));
                                self.rows_task(a, bp, view, 0, depth, ep, prefetch)
                            });
                        }
                    }
                }
            }
        });
    }

    /// `Par::N` over a row-major B: the columns of `c` (the block at columns `jc..jc+ncb`)
    /// split in `t` parts, each task packing the B panels of its own part into its slice
    /// of `bpack` and running its rows on them. One fork-join per block instead of two (a
    /// parallel pack, then a parallel compute), and each core computes on the panels it
    /// packed, from its own L2, instead of half of them from the other core's.
    #[allow(clippy::too_many_arguments)]
    fn cols_packing(
        &self,
        a: &[f32],
        b: &[f32],
        bpack: &mut [f32],
        block: CView<'_>,
        (jc, ncb): (usize, usize),
        (pc, kcb): (usize, usize),
        ep: Option<TileEpilogue<'_>>,
        t: usize,
    ) {
        let nr = self.uk.nr;
        let panel_len = nr * kcb;
        let per = ncb.div_ceil(nr).div_ceil(t);
        // One B chunk per part: both count ⌈panels ÷ per⌉.
        let parts: Vec<_> = column_parts(block, per, nr)
            .into_iter()
            .zip(bpack.chunks_mut(per * panel_len))
            .collect();
        pool::for_each(t, parts, |((q, view), chunk)| {
            pack_b(b, self.n, (pc, kcb), (jc, ncb), nr, q, chunk);
            let ep = ep.map(|e| e.skip(q * nr));
            self.rows_task(a, BBlock::Packed(chunk), view, 0, (pc, kcb), ep, false);
        });
    }

    /// `c`'s row blocks (mc rows, fewer if that leaves one of `t` threads idle), each with
    /// its first row.
    fn row_blocks<'c>(&self, c: CView<'c>, t: usize) -> Vec<(usize, CView<'c>)> {
        let rows = self.m.div_ceil(t).div_ceil(self.uk.mr) * self.uk.mr;
        c.row_chunks(self.mc.min(rows))
    }

    /// `par = m` over a B packed ahead: nothing is shared that a task writes, so each task
    /// takes a row block through every (column, depth) block of B on its own — one fork-join
    /// per call instead of one per block (each a wake-up and a wait for the slowest thread).
    fn packed_row_blocks(
        &self,
        a: &[f32],
        p: &PackedB,
        c: CView<'_>,
        ep: Option<TileEpilogue<'_>>,
        t: usize,
    ) {
        let (n, k) = (self.n, self.k);
        pool::for_each(t, self.row_blocks(c, t), |(row0, mut view)| {
            let rows = view.rows();
            for jc in (0..n).step_by(self.nc) {
                let ncb = self.nc.min(n - jc);
                for pc in (0..k).step_by(self.kc) {
                    let kcb = self.kc.min(k - pc);
                    let ep = ep.filter(|_| pc + kcb == k).map(|e| e.skip(jc));
                    let block = view.sub(0, jc, rows, ncb);
                    let bblock = BBlock::Packed(p.block(pc, jc, ncb));
                    self.rows_task(a, bblock, block, row0, (pc, kcb), ep, true);
                }
            }
        });
    }

    /// All `mc` blocks of rows `row0..row0+c.rows()` against the B panels `bblock` (which
    /// cover `c`'s columns), packing A into this thread's buffer; `ep`'s bias starts
    /// at `c`'s first column. With `prefetch`, the next B panel is fetched into the cache a
    /// slice per row tile while the whole row tiles of the current one run.
    #[allow(clippy::too_many_arguments)]
    fn rows_task(
        &self,
        a: &[f32],
        bblock: BBlock<'_>,
        mut c: CView<'_>,
        row0: usize,
        (pc, kcb): (usize, usize),
        ep: Option<TileEpilogue<'_>>,
        prefetch: bool,
    ) {
        let (mr, nr) = (self.uk.mr, self.uk.nr);
        let accumulate = pc > 0;
        with_buffer(Pool::A, |abuf| {
            for ic in (0..c.rows()).step_by(self.mc) {
                let mcb = self.mc.min(c.rows() - ic);
                let full = mcb / mr;
                let i0 = row0 + ic;
                // The whole row tiles, packed or in place (edge tiles read A in place).
                let a_full = if self.pack_a {
                    let apack = abuf.slice(full * mr * kcb);
                    if full > 0 {
                        pack_a(a, self.k, (i0, full * mr), (pc, kcb), mr, apack);
                    }
                    ATiles::Packed(apack)
                } else {
                    ATiles::Rows(&a[i0 * self.k + pc..], self.k)
                };
                // Whole row tiles go through one call per B panel; a partial last row
                // tile or column panel through the clipping `edge`.
                for jr in 0.. {
                    let j = jr * nr;
                    let Some(bp) = bblock.panel(jr, nr, kcb).filter(|_| j < c.cols()) else {
                        break;
                    };
                    let ep = ep.map(|e| e.skip(j));
                    if full > 0 && j + nr <= c.cols() {
                        let next = match bblock {
                            BBlock::Packed(p) => p.get((jr + 1) * nr * kcb..(jr + 2) * nr * kcb),
                            BBlock::Rows { .. } => None,
                        };
                        match next.filter(|_| prefetch) {
                            Some(next) => self.tiles_prefetching(
                                kcb,
                                a_full,
                                full,
                                bp,
                                next,
                                &mut c,
                                (ic, j),
                                accumulate,
                                ep,
                            ),
                            None => self.uk.tiles(
                                kcb,
                                a_full,
                                full,
                                bp,
                                &mut c,
                                (ic, j),
                                accumulate,
                                ep,
                            ),
                        }
                    }
                    // Edge tiles (a partial column panel's row tiles, a partial row tile):
                    // exactly their rows and columns, A read in place.
                    let cols = nr.min(c.cols() - j);
                    let whole_rows = if cols < nr { full } else { 0 };
                    let edge_rows = mcb - full * mr;
                    let tiles = (0..whole_rows).map(|ir| (ir * mr, mr));
                    let last = (edge_rows > 0).then_some((full * mr, edge_rows));
                    for (r0, rows) in tiles.chain(last) {
                        let i = ic + r0;
                        let a_rows = &a[(row0 + i) * self.k + pc..];
                        self.uk.edge(
                            kcb,
                            a_rows,
                            self.k,
                            (rows, cols),
                            bp,
                            &mut c,
                            (i, j),
                            accumulate,
                            ep,
                        );
                    }
                }
            }
        });
    }

    /// The `full` whole row tiles of one B panel, one micro-kernel call per row tile, each
    /// preceded by the prefetch of its share of the `next` panel (whole cache lines). Kept
    /// out of line so the row-major B path around it compiles as before.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn tiles_prefetching(
        &self,
        kcb: usize,
        a_full: ATiles<'_>,
        full: usize,
        bp: BPanel<'_>,
        next: &[f32],
        c: &mut CView<'_>,
        (ic, j): (usize, usize),
        accumulate: bool,
        ep: Option<TileEpilogue<'_>>,
    ) {
        let mr = self.uk.mr;
        let share = next.len().div_ceil(16).div_ceil(full.max(1)) * 16;
        let parts = next.chunks(share.max(16)).chain(std::iter::repeat(&[][..]));
        for (ir, part) in parts.take(full).enumerate() {
            prefetch_lines(part);
            let at = a_full.skip(ir, mr, kcb);
            self.uk
                .tiles(kcb, at, 1, bp, c, (ic + ir * mr, j), accumulate, ep);
        }
    }
}

/// `block` split by columns, left to right, into parts of `per` panels of `nr` columns (the
/// last may be narrower): each part's first panel index and its view.
fn column_parts(block: CView<'_>, per: usize, nr: usize) -> Vec<(usize, CView<'_>)> {
    let mut parts = block.col_chunks(per * nr);
    for (first, _) in &mut parts {
        *first /= nr;
    }
    parts
}

impl Executable for PackedGemm {
    fn run(&self, inputs: &[Operand<'_>], out: OperandMut<'_>) -> crate::Result<()> {
        let (m, n, k) = (self.m, self.n, self.k);
        let w = Workload::Gemm {
            m,
            n,
            k,
            dtype: DType::F32,
        };
        let ([a, b], out) = host_f32(&w, inputs, out)?;
        self.run_with(a, BSource::RowMajor(b), out, None);
        Ok(())
    }
}
