//! The bf16 micro-kernels: `MR × NR` tiles of `A · B` over bf16 operands with f32
//! accumulation, two generic bodies (`body`) over a small trait per ISA, the AMX tile
//! kernels (`amx`), and the safe, bounds-checked entry points the driver calls. All
//! `unsafe` code of the bf16 family lives in this module (the AMX instructions themselves in
//! [`crate::cpu::amx`]).
//!
//! - `avx2_*` (AVX2 + FMA): one 256-bit load of 16 bf16 values per group of 16 columns,
//!   widened to two f32 vectors in registers (`vpslld 16` for the columns in the low halves,
//!   `vpand` for those in the high halves: [`super::convert::slot_in`]), then f32 FMAs; A is
//!   packed as f32 rounded to bf16 values.
//! - `avx512_*` (AVX-512F, with or without AVX512_BF16): the same scheme in zmm registers,
//!   one 512-bit load per 32 columns ([`Layout::Widen32`]).
//! - `avx512bf16_*` (AVX512_BF16): `vdpbf16ps`, B packed in depth pairs
//!   ([`Layout::Pairs`]), A packed as rows of bf16 pairs ([`APack::PairRows`]) and broadcast
//!   as 32-bit words: one instruction per 16 columns and 2 depths, no widening.
//! - `amx_bf16_*` (AMX-BF16, tile state granted by the OS): `tdpbf16ps` on four 16×16 f32
//!   accumulator tiles (2×2, 1×4, 4×1), B in the same depth pairs, A in rows of pair words
//!   ([`APack::PairRows`]), 32 depths per tile step.
//! - `portable_*`: the widening body over 8-lane arrays, for CPUs without AVX2.
//!
//! The AVX-512 and AMX tiles have emulated twins (`emulate.rs`, tests only): the same bodies,
//! with the same tile shapes, over a plain-Rust 16-lane vocabulary and a `vdpbf16ps` that
//! follows the instruction's documented semantics, or over the emulated tile unit
//! ([`crate::cpu::amx::Emulated`]), so their arithmetic and indexing are tested on every
//! CPU. The real AVX-512 and AMX tiles run (and are tested) only where the CPU has the
//! feature: the AVX-512 ones ran on an AMD Zen 4 (AVX512_BF16); the AMX ones never ran on a
//! real tile unit.

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
mod amx;
pub(crate) mod body;
#[cfg(test)]
pub(crate) mod emulate;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

use super::layout::{APack, Layout};
#[cfg(target_arch = "x86_64")]
use crate::cpu::amx::tiled::{Square, Tall, Wide};
#[cfg(target_arch = "x86_64")]
use crate::cpu::amx::AsmTiles;
use crate::cpu::gemm::ukernel::simd::Epi;
use crate::cpu::gemm::ukernel::{epi_for, store_clipped, TileEpilogue};
use crate::cpu::gemm::view::CView;
use crate::cpu::Isa;
use body::widen_body;

/// `(steps, a, b, c, ldc, tiles, accumulate, epilogue)`: see [`body::widen_body`] and
/// [`body::pair_body`]; `a` holds the packed A block's 32-bit words (f32 values for the
/// widening kernels, bf16 pairs for the pair kernels).
type TileFn = unsafe fn(usize, *const f32, *const u16, *mut f32, usize, usize, bool, Epi);

/// Largest `MR·NR` of any kernel (edge tiles are computed in a stack buffer).
const MAX_TILE: usize = 1024;

/// Widest panel of any kernel.
const MAX_NR: usize = 128;

/// One bf16 micro-kernel: its name (the `ukernel` knob's value), tile shape, ISA, whether it
/// needs AVX512_BF16 or the AMX tile unit, and the layout of its operands.
#[derive(Debug)]
pub struct Bf16Kernel {
    /// The `ukernel` knob's value, e.g. `avx512bf16_12x32`.
    pub name: &'static str,
    /// Rows of the tile.
    pub mr: usize,
    /// Columns of the tile (a multiple of the layout's group: the panel width of B).
    pub nr: usize,
    /// The ISA level it is compiled for (checked at run time).
    pub isa: Isa,
    /// Whether it also needs AVX512_BF16 (checked at run time with the ISA).
    pub bf16: bool,
    /// Whether it also needs AMX-BF16 with the tile state granted by the OS (checked at run
    /// time with the ISA; offered where the fingerprint has `amx_bf16`).
    pub amx: bool,
    /// How B's panels are laid out for it.
    pub layout: Layout,
    /// How its packed A block is laid out.
    pub a_pack: APack,
    f: TileFn,
}

/// Every bf16 micro-kernel of this build, best first within an ISA.
pub static KERNELS: &[Bf16Kernel] = &[
    #[cfg(target_arch = "x86_64")]
    dp("avx512bf16_12x32", 12, 32, x86::avx512bf16::<12, 2>),
    #[cfg(target_arch = "x86_64")]
    dp("avx512bf16_4x64", 4, 64, x86::avx512bf16::<4, 4>),
    #[cfg(target_arch = "x86_64")]
    dp("avx512bf16_2x64", 2, 64, x86::avx512bf16::<2, 4>),
    #[cfg(target_arch = "x86_64")]
    dp("avx512bf16_1x128", 1, 128, x86::avx512bf16::<1, 8>),
    #[cfg(target_arch = "x86_64")]
    dp("avx512bf16_1x64", 1, 64, x86::avx512bf16::<1, 4>),
    // AMX: after the vdpbf16ps kernels; never a default (unmeasured), tuning may pick them.
    #[cfg(target_arch = "x86_64")]
    amx("amx_bf16_32x32", 32, 32, amx::tile::<AsmTiles, Square, 16>),
    #[cfg(target_arch = "x86_64")]
    amx("amx_bf16_16x64", 16, 64, amx::tile::<AsmTiles, Wide, 16>),
    #[cfg(target_arch = "x86_64")]
    amx("amx_bf16_64x16", 64, 16, amx::tile::<AsmTiles, Tall, 16>),
    #[cfg(target_arch = "x86_64")]
    amx("amx_bf16_8x64", 8, 64, amx::tile::<AsmTiles, Wide, 8>),
    #[cfg(target_arch = "x86_64")]
    wide("avx512_12x32", 12, 32, x86::avx512::<12, 2>),
    #[cfg(target_arch = "x86_64")]
    wide("avx512_4x64", 4, 64, x86::avx512::<4, 4>),
    #[cfg(target_arch = "x86_64")]
    wide("avx512_2x64", 2, 64, x86::avx512::<2, 4>),
    #[cfg(target_arch = "x86_64")]
    wide("avx512_1x128", 1, 128, x86::avx512::<1, 8>),
    #[cfg(target_arch = "x86_64")]
    wide("avx512_1x64", 1, 64, x86::avx512::<1, 4>),
    #[cfg(target_arch = "x86_64")]
    Bf16Kernel::widen16("avx2_6x16", 6, 16, Isa::Avx2, x86::avx2::<6, 2>),
    #[cfg(target_arch = "x86_64")]
    Bf16Kernel::widen16("avx2_4x16", 4, 16, Isa::Avx2, x86::avx2::<4, 2>),
    // Few rows (decoding, GEMV): B is the whole cost, so wider panels and no padded rows.
    #[cfg(target_arch = "x86_64")]
    Bf16Kernel::widen16("avx2_2x32", 2, 32, Isa::Avx2, x86::avx2::<2, 4>),
    #[cfg(target_arch = "x86_64")]
    Bf16Kernel::widen16("avx2_1x64", 1, 64, Isa::Avx2, x86::avx2::<1, 8>),
    #[cfg(target_arch = "x86_64")]
    Bf16Kernel::widen16("avx2_1x32", 1, 32, Isa::Avx2, x86::avx2::<1, 4>),
    Bf16Kernel::widen16("portable_4x16", 4, 16, Isa::Portable, portable::<4, 2>),
    Bf16Kernel::widen16("portable_1x32", 1, 32, Isa::Portable, portable::<1, 4>),
];

/// An AVX512_BF16 `vdpbf16ps` kernel (pair layout).
#[cfg(target_arch = "x86_64")]
const fn dp(name: &'static str, mr: usize, nr: usize, f: TileFn) -> Bf16Kernel {
    Bf16Kernel::new(name, mr, nr, Isa::Avx512, true, Layout::Pairs, f)
}

/// An AVX-512F widening kernel (groups of 32 columns).
#[cfg(target_arch = "x86_64")]
const fn wide(name: &'static str, mr: usize, nr: usize, f: TileFn) -> Bf16Kernel {
    Bf16Kernel::new(name, mr, nr, Isa::Avx512, false, Layout::Widen32, f)
}

/// An AMX-BF16 `tdpbf16ps` kernel (AMX CPUs all have AVX-512, whose ISA cap turns AMX off
/// too): B in the pair layout, A in pair rows.
#[cfg(target_arch = "x86_64")]
const fn amx(name: &'static str, mr: usize, nr: usize, f: TileFn) -> Bf16Kernel {
    Bf16Kernel::tiled(name, mr, nr, Isa::Avx512, true, f)
}

impl Bf16Kernel {
    const fn new(
        name: &'static str,
        mr: usize,
        nr: usize,
        isa: Isa,
        bf16: bool,
        layout: Layout,
        f: TileFn,
    ) -> Bf16Kernel {
        assert!(mr * nr <= MAX_TILE && nr <= MAX_NR && nr.is_multiple_of(layout.group()));
        Bf16Kernel {
            name,
            mr,
            nr,
            isa,
            bf16,
            amx: false,
            layout,
            a_pack: APack::of(layout),
            f,
        }
    }

    /// An AMX tile kernel (pair layout, A in pair rows) needing the tile unit if `amx` (the
    /// emulated twins do not).
    const fn tiled(
        name: &'static str,
        mr: usize,
        nr: usize,
        isa: Isa,
        amx: bool,
        f: TileFn,
    ) -> Bf16Kernel {
        let k = Bf16Kernel::new(name, mr, nr, isa, false, Layout::Pairs, f);
        Bf16Kernel { amx, ..k }
    }

    /// An 8-lane widening kernel (groups of 16 columns).
    const fn widen16(name: &'static str, mr: usize, nr: usize, isa: Isa, f: TileFn) -> Self {
        Bf16Kernel::new(name, mr, nr, isa, false, Layout::Widen16, f)
    }

    /// Whether this process runs it.
    pub fn available(&self) -> bool {
        self.missing().is_none()
    }

    /// What this process lacks to run it (`"AVX-512F"`, `"AVX512_BF16"`, `"AMX-BF16"`, ...),
    /// if anything: the ISA level (detected, capped by `AUTOKERNEL_ISA`), then AVX512_BF16,
    /// then AMX-BF16 with the tile state granted by the OS.
    pub fn missing(&self) -> Option<&'static str> {
        match self.isa {
            isa if !isa.available() => Some(match isa {
                Isa::Avx512 => "AVX-512F",
                Isa::Avx2 => "AVX2",
                Isa::Portable => "nothing",
            }),
            _ if self.bf16 && !has_avx512bf16() => Some("AVX512_BF16"),
            _ if self.amx && !has_amx_bf16() => Some("AMX-BF16"),
            _ => None,
        }
    }

    /// Whether `hw`'s fingerprint offers it: its ISA under the fingerprint's level (see
    /// [`Isa::offered_under`]), for a `vdpbf16ps` kernel the `avx512bf16` and `avx512bw`
    /// flags, for an AMX kernel `amx_bf16` (reported only where the OS granted the tile
    /// state).
    pub fn offered_on(&self, hw: &crate::hardware::HardwareFingerprint) -> bool {
        let bf16 = hw.has("avx512bf16") && hw.has("avx512bw");
        self.isa.offered_under(Isa::of(hw))
            && (!self.bf16 || bf16)
            && (!self.amx || hw.has("amx_bf16"))
    }

    /// The kernel called `name`, if this process runs it.
    pub fn by_name(name: &str) -> Option<&'static Bf16Kernel> {
        KERNELS
            .iter()
            .find(|k| k.name == name)
            .filter(|k| k.available())
    }

    /// Bytes of packed A per row and depth: 4 (f32) for widening kernels, 2 for pairs.
    pub fn a_bytes_per_depth(&self) -> usize {
        4 / self.layout.depth_per_step()
    }

    /// `C[i.., j..] (+)= A_tiles · B_panel` for `tiles` row tiles stacked from `(i, j)`,
    /// clipped to `c`'s window: tile `t` reads the packed A micro-panel `a[t·MR·steps..]`
    /// (`steps` groups of MR words: [`Layout::steps`] of the block's depth) against the panel
    /// block `b` (`steps` steps of `depth_per_step·NR` bf16 values in the kernel's layout).
    /// With `accumulate` the products are added to C, else C is overwritten; then with `ep`,
    /// `act(x + bias)` is stored (bias from column `j` on). Whole tiles are stored from
    /// registers; a tile that sticks out of the window is computed in a stack buffer and only
    /// its valid part written. Panics if A, the panel or the bias is too short, `(i, j)` is
    /// outside `c`, or this process does not run the kernel.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn tiles(
        &self,
        steps: usize,
        a: &[f32],
        tiles: usize,
        b: &[u16],
        c: &mut CView<'_>,
        (i, j): (usize, usize),
        accumulate: bool,
        ep: Option<TileEpilogue<'_>>,
    ) {
        let (mr, nr) = (self.mr, self.nr);
        assert!(self.available(), "{} does not run here", self.name);
        assert!(
            a.len() >= tiles * mr * steps && b.len() >= self.b_len(steps),
            "micro-panels too short"
        );
        assert!(i < c.rows() && j < c.cols(), "tile outside the window");
        let cols = nr.min(c.cols() - j);
        let whole = (c.rows() - i) / mr;
        let full = if cols == nr { tiles.min(whole) } else { 0 };
        if full > 0 {
            let epi = epi_for(ep.as_ref(), nr);
            let (ld, p) = (c.ld(), c.block_ptr(i, j, full * mr, nr));
            // SAFETY: `available()` checked the ISA (and AVX512_BF16); the `full` A tiles and
            // the B panel block are inside their slices (asserted above); `block_ptr` checked
            // that the whole `full·MR × NR` block lies in `c`'s window; `epi_for` checked that
            // the bias, if any, holds NR values.
            unsafe { (self.f)(steps, a.as_ptr(), b.as_ptr(), p, ld, full, accumulate, epi) }
        }
        for t in full..tiles {
            let row = i + t * mr;
            if row >= c.rows() {
                break;
            }
            self.edge(steps, &a[t * mr * steps..], b, c, (row, j), accumulate, ep);
        }
    }

    /// bf16 values of B that `steps` kernel steps read.
    fn b_len(&self, steps: usize) -> usize {
        steps * self.layout.depth_per_step() * self.nr
    }

    /// One tile that sticks out of `c`'s window at `(i, j)`: computed in a stack buffer, then
    /// its valid part added or copied, and the epilogue applied row by row.
    #[allow(clippy::too_many_arguments)]
    fn edge(
        &self,
        steps: usize,
        a: &[f32],
        b: &[u16],
        c: &mut CView<'_>,
        (i, j): (usize, usize),
        accumulate: bool,
        ep: Option<TileEpilogue<'_>>,
    ) {
        let (mr, nr) = (self.mr, self.nr);
        let rows = mr.min(c.rows() - i);
        let cols = nr.min(c.cols() - j);
        let mut buf = [0.0f32; MAX_TILE];
        assert!(a.len() >= mr * steps && b.len() >= self.b_len(steps) && mr * nr <= MAX_TILE);
        // SAFETY: `available()` was checked by the caller; the A tile and the panel block are
        // inside their slices (asserted above); the destination is `buf`, an MR×NR block with
        // stride NR (`mr·nr ≤ MAX_TILE`, asserted).
        unsafe {
            let out = buf.as_mut_ptr();
            (self.f)(steps, a.as_ptr(), b.as_ptr(), out, nr, 1, false, Epi::NONE)
        }
        store_clipped(&buf, nr, (rows, cols), c, (i, j), accumulate, ep);
    }
}

/// `buf`'s values as 32-bit words (the packed A block of a pair kernel is written as words
/// into the family's f32 buffer).
pub(crate) fn words_mut(buf: &mut [f32]) -> &mut [u32] {
    // SAFETY: `f32` and `u32` have the same size and alignment and every bit pattern is a
    // valid value of both; the borrow of `buf` is moved into the result.
    unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u32>(), buf.len()) }
}

/// `buf`'s values as twice as many 16-bit halves (bf16 values written into the family's f32
/// buffer).
pub(crate) fn halves_mut(buf: &mut [f32]) -> &mut [u16] {
    // SAFETY: an `f32` is two `u16`s' worth of bytes, `u16`'s alignment divides `f32`'s, and
    // every bit pattern is a valid value of both; the borrow of `buf` is moved into the result.
    unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u16>(), 2 * buf.len()) }
}

/// Whether this CPU runs AVX512_BF16 code (with AVX-512F and AVX512BW), detected once.
pub(crate) fn has_avx512bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    return x86::has_avx512bf16();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether this process may run AMX-BF16 (the CPU has it, Linux granted the tile data state,
/// the ISA cap allows AVX-512): [`crate::cpu::amx::granted`].
pub fn has_amx_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    return crate::cpu::amx::granted("amx_tile") && crate::cpu::amx::granted("amx_bf16");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

impl body::WidenBf16 for crate::cpu::gemm::ukernel::portable::Portable {
    #[inline(always)]
    unsafe fn widen_group(p: *const u16) -> ([f32; 8], [f32; 8]) {
        // SAFETY: `p` is readable for 16 values (caller contract); `read_unaligned` needs no
        // alignment beyond `u16`'s.
        let g = unsafe { p.cast::<[u16; 16]>().read_unaligned() };
        (
            std::array::from_fn(|j| f32::from_bits(u32::from(g[2 * j]) << 16)),
            std::array::from_fn(|j| f32::from_bits(u32::from(g[2 * j + 1]) << 16)),
        )
    }
}

/// The portable tile.
///
/// # Safety
/// As [`body::widen_body`] with `NV·8` columns.
#[allow(clippy::too_many_arguments)]
unsafe fn portable<const MR: usize, const NV: usize>(
    steps: usize,
    a: *const f32,
    b: *const u16,
    c: *mut f32,
    ldc: usize,
    tiles: usize,
    accumulate: bool,
    ep: Epi,
) {
    use crate::cpu::gemm::ukernel::portable::Portable;
    // SAFETY: forwarded caller contract; portable code runs everywhere.
    unsafe { widen_body::<Portable, MR, NV>(steps, a, b, c, ldc, tiles, accumulate, ep) }
}

#[cfg(test)]
mod tests;
