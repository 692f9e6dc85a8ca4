//! Micro-kernels: the register-blocked inner loops, one table per ISA, and the safe,
//! bounds-checked entry points the drivers call.
//!
//! All `unsafe` code of the GEMM families lives below this module (and in [`super::view`]).
//! Every micro-kernel is an `unsafe fn` pointer obtained from a per-ISA table; a
//! [`PackedUkernel`] or [`DirectUkernel`] can only be looked up when [`Isa::available`] says the
//! CPU runs its ISA, and its `tile` methods check every extent before calling it.

/// Defines, in an ISA module, `builds::<MR, NV>()`: the four builds of its `packed` wrapper
/// for the `MR × W·NV` tile, by where A and B are read from ([`PackedFns`]).
macro_rules! packed_builds {
    () => {
        /// The four builds of the packed `MR × W·NV` tile, by where A and B are read from.
        const fn builds<const MR: usize, const NV: usize>() -> PackedFns {
            PackedFns([
                [packed::<MR, NV, true, true>, packed::<MR, NV, true, false>],
                [
                    packed::<MR, NV, false, true>,
                    packed::<MR, NV, false, false>,
                ],
            ])
        }
    };
}

pub(crate) mod erf;
pub(crate) mod simd;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
pub(crate) mod portable;

use std::sync::OnceLock;

use super::view::CView;
use crate::cpu::Isa;
use crate::workload::Act;
use simd::Epi;

/// `(k, a, lda, b, ldb, c, ldc, tiles, accumulate, epilogue)`: see [`simd::packed_body`].
pub(crate) type PackedFn =
    unsafe fn(usize, *const f32, usize, *const f32, usize, *mut f32, usize, usize, bool, Epi);

/// A packed register tile's four builds: `[A packed, A in place][B packed, B in place]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PackedFns(pub [[PackedFn; 2]; 2]);

/// `(k, a, lda, b, ldb, c, ldc, (tiles, last), accumulate, epilogue)`: see
/// [`simd::direct_body`].
pub(crate) type DirectFn = unsafe fn(
    usize,
    *const f32,
    usize,
    *const f32,
    usize,
    *mut f32,
    usize,
    (usize, usize),
    bool,
    Epi,
);

/// An ISA's direct kernels by tile shape: `(rows, vectors)` to the kernel, if listed.
type DirectTable = fn(usize, usize) -> Option<DirectFn>;

/// `(row, bias, n, act)`: see [`simd::bias_act_body`].
type BiasActFn = unsafe fn(*mut f32, *const f32, usize, u8);

/// A bias + activation applied as a tile is stored: `bias` holds the values of the tile's
/// columns, starting at its first one.
#[derive(Debug, Clone, Copy)]
pub struct TileEpilogue<'a> {
    /// The bias values of the tile's columns, from its first column on.
    pub bias: &'a [f32],
    /// The activation applied to `x + bias` ([`Act::Identity`] for none).
    pub act: Act,
}

impl TileEpilogue<'_> {
    /// The same epilogue for the columns `from..` of this one.
    pub fn skip(&self, from: usize) -> Self {
        TileEpilogue {
            bias: &self.bias[from..],
            act: self.act,
        }
    }

    fn code(&self) -> u8 {
        match self.act {
            Act::Identity => Epi::BIAS,
            Act::Relu => Epi::RELU,
            Act::Gelu => Epi::GELU,
            Act::GeluErf => Epi::GELU_ERF,
        }
    }
}

/// The store epilogue of a tile `width` values wide: none, or `ep`'s bias and activation.
/// Panics if the bias is shorter than the tile.
pub(crate) fn epi_for(ep: Option<&TileEpilogue<'_>>, width: usize) -> Epi {
    match ep {
        Some(e) => {
            assert!(e.bias.len() >= width, "bias shorter than the tile");
            Epi {
                bias: e.bias.as_ptr(),
                act: e.code(),
            }
        }
        None => Epi::NONE,
    }
}

/// `row[j] = act(row[j] + bias[j])` with the best SIMD ISA of this CPU: the separate-pass
/// epilogue, and the edges of fused ones. Panics if `bias` is shorter than `row`.
pub fn bias_act_row(row: &mut [f32], bias: &[f32], act: Act) {
    assert!(bias.len() >= row.len(), "bias shorter than the row");
    let f: BiasActFn = match Isa::detect() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => avx512::bias_act,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => avx2::bias_act,
        _ => portable::bias_act,
    };
    let ep = TileEpilogue { bias, act };
    // SAFETY: `Isa::detect` reported that this CPU runs the chosen function's ISA; `row` is
    // writable and `bias` readable for `row.len()` values (asserted above).
    unsafe { f(row.as_mut_ptr(), bias.as_ptr(), row.len(), ep.code()) }
}

/// Hints that every cache line of `data` will be read soon (the next B micro-panel, while
/// the current one is in use). Only a hint: a no-op where the ISA has no prefetch.
#[inline]
pub(crate) fn prefetch_lines(data: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for line in data.chunks(16) {
        // SAFETY: SSE is part of the x86_64 baseline, and a prefetch never faults (here the
        // address is inside a live slice anyway).
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr().cast(),
            )
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// A packed micro-kernel: `MR × NR` tile over packed A and B micro-panels.
#[derive(Debug)]
pub struct PackedUkernel {
    /// Knob value, e.g. `avx2_6x16`.
    pub name: String,
    /// The ISA its code is compiled for ([`Isa::available`] says whether this CPU runs it).
    pub isa: Isa,
    /// Rows of the register tile.
    pub mr: usize,
    /// Columns of the register tile (a multiple of the ISA's lane count).
    pub nr: usize,
    /// Its builds by A and B source.
    fns: PackedFns,
    /// The ISA's lanes, direct kernels and their most rows: the edge tiles.
    edge: (usize, DirectTable, usize),
}

/// Where a packed micro-kernel reads its A tiles from.
#[derive(Debug, Clone, Copy)]
pub enum ATiles<'a> {
    /// Packed micro-panels (`k·MR` values per tile), one after the other.
    Packed(&'a [f32]),
    /// Row-major A in place: the slice starts at the first tile's first element, rows
    /// `lda` apart.
    Rows(&'a [f32], usize),
}

/// Where a packed micro-kernel reads its B micro-panel from.
#[derive(Debug, Clone, Copy)]
pub enum BPanel<'a> {
    /// A packed micro-panel: `k` groups of `NR` values.
    Packed(&'a [f32]),
    /// Row-major B in place: the slice starts at the panel's first element, rows `ldb`
    /// apart.
    Rows(&'a [f32], usize),
}

impl BPanel<'_> {
    /// Whether the first `cols` values of `k` rows are inside the slice (rows `nr` apart
    /// in a packed panel).
    fn holds(&self, nr: usize, cols: usize, k: usize) -> bool {
        match *self {
            BPanel::Packed(b) => cols <= nr && k >= 1 && (k - 1) * nr + cols <= b.len(),
            BPanel::Rows(b, ldb) => cols <= ldb && k >= 1 && (k - 1) * ldb + cols <= b.len(),
        }
    }

    /// The pointer and row stride (`nr` for a packed panel).
    fn parts(&self, nr: usize) -> (*const f32, usize) {
        match *self {
            BPanel::Packed(b) => (b.as_ptr(), nr),
            BPanel::Rows(b, ldb) => (b.as_ptr(), ldb),
        }
    }
}

impl<'a> ATiles<'a> {
    /// The tiles from tile `t` on (tiles of `mr` rows × `k` values).
    pub(crate) fn skip(self, t: usize, mr: usize, k: usize) -> ATiles<'a> {
        match self {
            ATiles::Packed(p) => ATiles::Packed(&p[t * mr * k..]),
            ATiles::Rows(r, lda) => ATiles::Rows(&r[t * mr * lda..], lda),
        }
    }

    /// Whether `tiles` tiles of `mr` rows × `k` values are inside the slice.
    fn holds(&self, tiles: usize, mr: usize, k: usize) -> bool {
        match *self {
            ATiles::Packed(a) => a.len() >= tiles * mr * k,
            ATiles::Rows(a, lda) => k <= lda && (tiles * mr - 1) * lda + k <= a.len(),
        }
    }
}

/// A direct micro-kernel family: tiles of up to `r × v` registers over unpacked A and B.
#[derive(Debug)]
pub struct DirectUkernel {
    /// Knob value, e.g. `avx2_4x3` (4 rows × 3 vectors).
    pub name: String,
    /// The ISA its code is compiled for ([`Isa::available`] says whether this CPU runs it).
    pub isa: Isa,
    /// Rows of the main tile.
    pub r: usize,
    /// Vectors (of [`DirectUkernel::lanes`] columns) of the main tile.
    pub v: usize,
    /// Lanes per vector.
    pub lanes: usize,
    table: fn(usize, usize) -> Option<DirectFn>,
}

struct Tables {
    packed: Vec<PackedUkernel>,
    direct: Vec<DirectUkernel>,
}

fn tables() -> &'static Tables {
    static T: OnceLock<Tables> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = Tables {
            packed: Vec::new(),
            direct: Vec::new(),
        };
        let mut add = |isa: Isa,
                       lanes: usize,
                       packed: &[(usize, usize, PackedFns)],
                       direct: &[(usize, usize)],
                       max: (usize, usize),
                       table: fn(usize, usize) -> Option<DirectFn>| {
            for &(mr, nr, fns) in packed {
                // Every edge tile has a direct kernel (`PackedUkernel::edge`).
                assert!(nr.is_multiple_of(lanes) && nr / lanes <= max.1);
                t.packed.push(PackedUkernel {
                    name: format!("{}_{mr}x{nr}", isa.name()),
                    isa,
                    mr,
                    nr,
                    fns,
                    edge: (lanes, table, max.0),
                });
            }
            for &(r, v) in direct {
                debug_assert!(r <= max.0 && v <= max.1);
                t.direct.push(DirectUkernel {
                    name: format!("{}_{r}x{v}", isa.name()),
                    isa,
                    r,
                    v,
                    lanes,
                    table,
                });
            }
        };
        #[cfg(target_arch = "x86_64")]
        {
            add(
                Isa::Avx512,
                16,
                avx512::PACKED,
                avx512::DIRECT,
                avx512::DIRECT_MAX,
                avx512::direct_fn,
            );
            add(
                Isa::Avx2,
                8,
                avx2::PACKED,
                avx2::DIRECT,
                avx2::DIRECT_MAX,
                avx2::direct_fn,
            );
        }
        add(
            Isa::Portable,
            8,
            portable::PACKED,
            portable::DIRECT,
            portable::DIRECT_MAX,
            portable::direct_fn,
        );
        t
    })
}

/// The packed micro-kernels offered as knob values where `best` is the best ISA level
/// ([`Isa::of`] the fingerprint), best first ([`Isa::offered_under`]).
pub fn packed_offered(best: Isa) -> Vec<&'static PackedUkernel> {
    tables()
        .packed
        .iter()
        .filter(|u| u.isa.offered_under(best))
        .collect()
}

/// The direct micro-kernels offered where `best` is the best ISA level, best first.
pub fn direct_offered(best: Isa) -> Vec<&'static DirectUkernel> {
    tables()
        .direct
        .iter()
        .filter(|u| u.isa.offered_under(best))
        .collect()
}

/// Every packed micro-kernel this CPU can run (offered or not, e.g. portable ones).
pub fn packed_available() -> Vec<&'static PackedUkernel> {
    tables()
        .packed
        .iter()
        .filter(|u| u.isa.available())
        .collect()
}

/// Every direct micro-kernel this CPU can run (offered or not).
pub fn direct_available() -> Vec<&'static DirectUkernel> {
    tables()
        .direct
        .iter()
        .filter(|u| u.isa.available())
        .collect()
}

/// The packed micro-kernel called `name`, if this CPU can run it (offered or not).
pub fn packed(name: &str) -> Option<&'static PackedUkernel> {
    tables()
        .packed
        .iter()
        .find(|u| u.name == name && u.isa.available())
}

/// The direct micro-kernel called `name`, if this CPU can run it (offered or not).
pub fn direct(name: &str) -> Option<&'static DirectUkernel> {
    tables()
        .direct
        .iter()
        .find(|u| u.name == name && u.isa.available())
}

impl PackedUkernel {
    /// The build for `a` and `b`, A's pointer and row stride (unused for packed panels),
    /// and B's.
    fn source(
        &self,
        a: ATiles<'_>,
        b: BPanel<'_>,
    ) -> (PackedFn, (*const f32, usize), (*const f32, usize)) {
        let (ai, ap) = match a {
            ATiles::Packed(a) => (0, (a.as_ptr(), 0)),
            ATiles::Rows(a, lda) => (1, (a.as_ptr(), lda)),
        };
        let bi = usize::from(matches!(b, BPanel::Rows(..)));
        (self.fns.0[ai][bi], ap, b.parts(self.nr))
    }

    /// `C[i..i+rows, j..j+cols] (+)= A[..rows, ..k] · B_panel[.., ..cols]` for an edge tile
    /// (`rows ≤ MR`, `cols ≤ NR`): the ISA's direct kernels of at most its rows and
    /// `⌈cols/lanes⌉` vectors, the last vector read and written through its first lanes
    /// only, so that nothing is computed past the tile's rows, no copy is made and nothing
    /// past its columns is read: A in place (`rows` rows `lda` apart from the start of `a`),
    /// the B micro-panel packed or in place (the last panel of a row-major B, narrower than
    /// NR). With `ep`, `act(x + bias)` is stored.
    ///
    /// Panics if the tile is empty or larger than MR × NR, A, the panel or the bias are
    /// too short, or the block is not inside `c`.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub fn edge(
        &self,
        k: usize,
        a: &[f32],
        lda: usize,
        (rows, cols): (usize, usize),
        b: BPanel<'_>,
        c: &mut CView<'_>,
        (i, j): (usize, usize),
        accumulate: bool,
        ep: Option<TileEpilogue<'_>>,
    ) {
        let (lanes, table, most) = self.edge;
        assert!(
            (1..=self.mr).contains(&rows) && (1..=self.nr).contains(&cols),
            "edge tile {rows}×{cols} of a {}×{} micro-kernel",
            self.mr,
            self.nr
        );
        assert!(k >= 1 && k <= lda, "depth beyond the row stride");
        assert!(
            (rows - 1) * lda + k <= a.len() && b.holds(self.nr, cols, k),
            "edge tile reads outside A or the panel"
        );
        let v = cols.div_ceil(lanes);
        let last = cols - (v - 1) * lanes;
        let epi = epi_for(ep.as_ref(), cols);
        let (bp, ldb) = b.parts(self.nr);
        for r0 in (0..rows).step_by(most) {
            let r = most.min(rows - r0);
            let f = table(r, v).expect("a direct kernel for every edge tile (checked in `tables`)");
            let (ldc, p) = (c.ld(), c.block_ptr(i + r0, j, r, cols));
            // SAFETY: `self` was handed out only after checking that the CPU runs
            // `self.isa`, and `table` is that ISA's direct table; A (rows × k, stride
            // lda ≥ k) is inside its slice and the panel holds `cols` values of each of its
            // k rows (asserted above), which is what a tile of v vectors whose last one is
            // clipped to `last = cols - (v-1)·lanes` lanes reads; `block_ptr` checked that the
            // r × cols block lies in `c`'s window; the bias, if any, holds `cols` values
            // (`epi_for` asserted it).
            unsafe {
                f(
                    k,
                    a.as_ptr().add(r0 * lda),
                    lda,
                    bp,
                    ldb,
                    p,
                    ldc,
                    (1, last),
                    accumulate,
                    epi,
                )
            }
        }
    }

    /// `tiles` whole `MR × NR` tiles stacked vertically from `(i, j)`: tile `t` is
    /// `C[i + t·MR.., j..] (+)= A_tile[t] · B_panel`, all in one call (the B micro-panel
    /// stays in L1 while the A tiles stream by). With `ep`, `act(x + bias)` is stored
    /// instead.
    ///
    /// Panics if the A tiles, the panel or the bias are too short or the `tiles·MR × NR`
    /// block is not inside `c`'s window (edge tiles go through [`PackedUkernel::edge`]).
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub fn tiles(
        &self,
        k: usize,
        a: ATiles<'_>,
        tiles: usize,
        b: BPanel<'_>,
        c: &mut CView<'_>,
        (i, j): (usize, usize),
        accumulate: bool,
        ep: Option<TileEpilogue<'_>>,
    ) {
        let (mr, nr) = (self.mr, self.nr);
        if tiles == 0 {
            return;
        }
        assert!(
            a.holds(tiles, mr, k) && b.holds(nr, nr, k),
            "micro-panels too short"
        );
        let epi = epi_for(ep.as_ref(), nr);
        let (f, (ap, lda), (bp, ldb)) = self.source(a, b);
        let (ld, p) = (c.ld(), c.block_ptr(i, j, tiles * mr, nr));
        // SAFETY: `self` was handed out by `packed()`/`packed_offered()` only after checking
        // that the CPU runs `self.isa`; the `tiles` A tiles and the B panel are inside their
        // slices (asserted above); `block_ptr` checked that the whole `tiles·MR × NR` block
        // lies in `c`'s window; the bias, if any, holds at least NR values (asserted above).
        unsafe { f(k, ap, lda, bp, ldb, p, ld, tiles, accumulate, epi) }
    }
}

/// Stores the `rows × cols` top-left block of `buf` (row stride `ld`) at `c[i.., j..]`,
/// adding to what is there with `accumulate`, then applying `ep`: how a tile computed into
/// a buffer reaches a window it sticks out of.
pub(crate) fn store_clipped(
    buf: &[f32],
    ld: usize,
    (rows, cols): (usize, usize),
    c: &mut CView<'_>,
    (i, j): (usize, usize),
    accumulate: bool,
    ep: Option<TileEpilogue<'_>>,
) {
    for r in 0..rows {
        let src = &buf[r * ld..r * ld + cols];
        let dst = &mut c.row_mut(i + r)[j..j + cols];
        if accumulate {
            dst.iter_mut().zip(src).for_each(|(d, s)| *d += s);
        } else {
            dst.copy_from_slice(src);
        }
        if let Some(ep) = &ep {
            bias_act_row(dst, ep.bias, ep.act);
        }
    }
}

impl DirectUkernel {
    /// Tiles of `r` rows × `v` vectors side by side over `cols` columns:
    /// `C[ci..ci+r, cj..cj+cols] (+)= A[..r, ..k] · B[..k, ..cols]` where `a` starts at the
    /// first A element (row stride `lda`) and `b` at the first B element (row stride `ldb`);
    /// any tile of `r ≤ self.r` rows by `v ≤ self.v` vectors works (smaller tiles serve the
    /// edges). `cols` is a whole number of tiles, or falls in the last vector of its last
    /// tile, which is then read and written through its first lanes only. With `ep`,
    /// `act(x + bias)` is stored instead.
    ///
    /// Panics if `cols` ends in another vector of its last tile, any of the three blocks is
    /// outside its slice or window, or the bias is shorter than `cols`.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub fn tile(
        &self,
        (r, v): (usize, usize),
        cols: usize,
        k: usize,
        a: &[f32],
        lda: usize,
        b: &[f32],
        ldb: usize,
        c: &mut CView<'_>,
        (ci, cj): (usize, usize),
        accumulate: bool,
        ep: Option<TileEpilogue<'_>>,
    ) {
        assert!(
            r <= self.r && v <= self.v,
            "tile larger than the micro-kernel"
        );
        let f = (self.table)(r, v).expect("direct tile shape within the table");
        assert!(k >= 1 && r >= 1 && v >= 1 && cols >= 1, "empty direct tile");
        let tw = v * self.lanes;
        let tiles = cols.div_ceil(tw);
        let last = cols - (tiles * v - 1) * self.lanes;
        assert!(
            (1..=self.lanes).contains(&last),
            "{cols} columns end before the last vector of a {tw}-column tile"
        );
        assert!(
            (r - 1) * lda + k <= a.len() && (k - 1) * ldb + cols <= b.len(),
            "direct tile reads outside A or B"
        );
        let epi = epi_for(ep.as_ref(), cols);
        let (ldc, p) = (c.ld(), c.block_ptr(ci, cj, r, cols));
        // SAFETY: `self` was handed out only after checking that the CPU runs `self.isa`; the
        // A block (r rows of k values, stride lda) and the B block (k rows of `cols` values,
        // stride ldb: what `tiles` tiles of v vectors read with the last vector clipped to
        // `last` lanes) end inside their slices (asserted above); `block_ptr` checked that
        // the r × cols C block lies in the window; `(r, v)` is within the table, so `f`
        // exists; the bias, if any, holds `cols` values (`epi_for` asserted it).
        unsafe {
            f(
                k,
                a.as_ptr(),
                lda,
                b.as_ptr(),
                ldb,
                p,
                ldc,
                (tiles, last),
                accumulate,
                epi,
            )
        }
    }
}
