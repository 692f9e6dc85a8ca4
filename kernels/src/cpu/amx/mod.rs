//! The AMX tile unit (Sapphire Rapids and later): eight 1 KiB tile registers `tmm0..tmm7`
//! shaped by a 64-byte palette-1 configuration, and the instructions the reduced-precision
//! kernels use — `ldtilecfg`, `tilezero`, `tileloadd`, `tilestored`, `tdpbusd` / `tdpbssd`
//! (`u8·s8` / `s8·s8` groups of 4 bytes into i32), `tdpbf16ps` (bf16 pairs into f32),
//! `tilerelease`.
//!
//! A kernel is written once against [`TileUnit`] and runs on either implementation:
//!
//! - [`AsmTiles`] (x86-64): the real instructions in inline `asm!` (stable Rust has no AMX
//!   intrinsics). Only constructible where [`crate::amx`] found AMX usable: CPUID's palette 1
//!   and TMUL limits take [`TileConfig`]'s tiles, the OS enabled the tile state in XCR0 and
//!   granted it to this process (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, read
//!   back with `ARCH_GET_XCOMP_PERM`).
//! - [`Emulated`]: the instructions' documented semantics (Intel SDM) in plain Rust on 8 ×
//!   1 KiB of memory, including the faults (`#GP` from `ldtilecfg`, `#UD` from a tile
//!   operation on shapes that do not fit), which it raises as panics. It runs on every CPU, so
//!   a kernel's layout, strides and driver are tested where there is no AMX.
//!
//! Kernels never call a [`TileUnit`] directly: [`Tiles`] is the safe session over one. It
//! checks the configuration before loading it, every memory extent a load or store touches,
//! and every dot product's tile shapes (so the real unit never faults), and it releases the
//! tile state when dropped — on every path, unwinding included.
//!
//! The GEMM micro-kernels (int8 `tdpbusd`, bf16 `tdpbf16ps`) share one skeleton over a
//! session, `tiled` (crate-internal): tile arrangements, K steps, remainder staging.

#[cfg(target_arch = "x86_64")]
mod asm;
mod config;
mod emulated;
#[cfg(test)]
mod tests;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) mod tiled;

#[cfg(target_arch = "x86_64")]
pub use asm::{granted, AsmTiles};
pub use config::{TileConfig, TileFault, BYTES_PER_ROW, MAX_ROWS, TILES, TILE_BYTES};
pub use emulated::Emulated;

/// The operations of a tile unit. The tile register is a const parameter (`T`, `C`, `A`,
/// `B` in `0..8`), as in the instruction encoding.
///
/// # Safety
/// Every method except [`TileUnit::open`] is unsafe, with this contract, which [`Tiles`]
/// upholds: a configuration passed to `configure` is valid ([`TileConfig::check`]); every
/// other operation but `release` runs between a `configure` and the next `release` on the
/// same thread; the tiles it names are configured and their shapes fit the operation
/// ([`TileConfig::check_dot`]); a load reads, a store writes, `rows` rows of `colsb` bytes
/// `stride` bytes apart from the pointer (rows and colsb of that tile), all of it valid memory.
pub trait TileUnit: Sized {
    /// The unit of this thread, where this process may use it.
    fn open() -> Option<Self>;
    /// Whether it runs `tdpbusd` / `tdpbssd` (AMX-INT8).
    fn int8(&self) -> bool;
    /// Whether it runs `tdpbf16ps` (AMX-BF16).
    fn bf16(&self) -> bool;
    /// `ldtilecfg`: the configuration, every tile zeroed.
    ///
    /// # Safety
    /// The trait's contract (see [`TileUnit`]).
    unsafe fn configure(&mut self, cfg: &TileConfig);
    /// `tilerelease`: back to the initial (unconfigured, zero) state.
    ///
    /// # Safety
    /// The trait's contract (see [`TileUnit`]).
    unsafe fn release(&mut self);
    /// `tilezero tmmT`.
    ///
    /// # Safety
    /// The trait's contract (see [`TileUnit`]).
    unsafe fn zero<const T: u8>(&mut self);
    /// `tileloadd tmmT, [src + stride]`.
    ///
    /// # Safety
    /// The trait's contract (see [`TileUnit`]).
    unsafe fn load<const T: u8>(&mut self, src: *const u8, stride: usize);
    /// `tilestored [dst + stride], tmmT`.
    ///
    /// # Safety
    /// The trait's contract (see [`TileUnit`]).
    unsafe fn store<const T: u8>(&mut self, dst: *mut u8, stride: usize);
    /// `tdpbusd tmmC, tmmA, tmmB`: `u8` rows of A times `s8` columns of B into i32.
    ///
    /// # Safety
    /// The trait's contract (see [`TileUnit`]).
    unsafe fn dpbusd<const C: u8, const A: u8, const B: u8>(&mut self);
    /// `tdpbssd tmmC, tmmA, tmmB`: `s8` times `s8` into i32.
    ///
    /// # Safety
    /// The trait's contract (see [`TileUnit`]).
    unsafe fn dpbssd<const C: u8, const A: u8, const B: u8>(&mut self);
    /// `tdpbf16ps tmmC, tmmA, tmmB`: bf16 pairs into f32.
    ///
    /// # Safety
    /// The trait's contract (see [`TileUnit`]).
    unsafe fn dpbf16ps<const C: u8, const A: u8, const B: u8>(&mut self);
}

/// A configured tile unit: the safe face of a [`TileUnit`]. Every operation is checked
/// against the configuration first (a violation panics with the fault the hardware would
/// raise, before anything runs); dropping it runs `tilerelease`.
pub struct Tiles<'u, U: TileUnit> {
    unit: &'u mut U,
    cfg: TileConfig,
}

impl<'u, U: TileUnit> Tiles<'u, U> {
    /// Loads `cfg` into `unit` (all tiles zero). Panics if `cfg` is invalid.
    pub fn configure(unit: &'u mut U, cfg: TileConfig) -> Tiles<'u, U> {
        fault(cfg.check());
        // SAFETY: `cfg` is valid (checked above); the session releases it when dropped.
        unsafe { unit.configure(&cfg) };
        Tiles { unit, cfg }
    }

    /// The configuration loaded.
    pub fn config(&self) -> &TileConfig {
        &self.cfg
    }

    /// `tilezero tmmT`.
    pub fn zero<const T: u8>(&mut self) {
        fault(self.cfg.check_tile("tilezero", T));
        // SAFETY: configured (this session), tile T valid (checked).
        unsafe { self.unit.zero::<T>() }
    }

    /// `tileloadd tmmT`: the tile's rows from `src`, `stride` bytes apart.
    pub fn load<const T: u8>(&mut self, src: &[u8], stride: usize) {
        fault(self.cfg.check_memory("tileloadd", T, src.len(), stride));
        // SAFETY: configured, tile T valid, and its rows·stride extent inside `src` (checked).
        unsafe { self.unit.load::<T>(src.as_ptr(), stride) }
    }

    /// `tilestored`: the tile's rows into `dst`, `stride` bytes apart.
    pub fn store<const T: u8>(&mut self, dst: &mut [u8], stride: usize) {
        fault(self.cfg.check_memory("tilestored", T, dst.len(), stride));
        // SAFETY: configured, tile T valid, and its rows·stride extent inside `dst` (checked).
        unsafe { self.unit.store::<T>(dst.as_mut_ptr(), stride) }
    }

    /// `tdpbusd tmmC, tmmA, tmmB`.
    pub fn dpbusd<const C: u8, const A: u8, const B: u8>(&mut self) {
        assert!(self.unit.int8(), "tdpbusd: this tile unit has no AMX-INT8");
        fault(self.cfg.check_dot("tdpbusd", C, A, B));
        // SAFETY: configured; the three tiles valid, distinct and of fitting shapes (checked).
        unsafe { self.unit.dpbusd::<C, A, B>() }
    }

    /// `tdpbssd tmmC, tmmA, tmmB`.
    pub fn dpbssd<const C: u8, const A: u8, const B: u8>(&mut self) {
        assert!(self.unit.int8(), "tdpbssd: this tile unit has no AMX-INT8");
        fault(self.cfg.check_dot("tdpbssd", C, A, B));
        // SAFETY: as for `dpbusd`.
        unsafe { self.unit.dpbssd::<C, A, B>() }
    }

    /// `tdpbf16ps tmmC, tmmA, tmmB`.
    pub fn dpbf16ps<const C: u8, const A: u8, const B: u8>(&mut self) {
        assert!(
            self.unit.bf16(),
            "tdpbf16ps: this tile unit has no AMX-BF16"
        );
        fault(self.cfg.check_dot("tdpbf16ps", C, A, B));
        // SAFETY: as for `dpbusd`.
        unsafe { self.unit.dpbf16ps::<C, A, B>() }
    }
}

impl<U: TileUnit> Drop for Tiles<'_, U> {
    fn drop(&mut self) {
        // SAFETY: `configure` ran (a session exists only after it); release ends it.
        unsafe { self.unit.release() }
    }
}

/// Panics with the fault the hardware would raise.
#[track_caller]
fn fault(r: Result<(), TileFault>) {
    if let Err(e) = r {
        panic!("{e}");
    }
}

/// The bytes of a slice of plain integers or floats (tiles move bytes).
pub(crate) fn bytes<T: Plain>(v: &[T]) -> &[u8] {
    // SAFETY: `Plain` types have no padding and no invalid bit patterns; u8 has alignment 1;
    // the byte length is the slice's size in memory.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
}

/// The bytes of a mutable slice of plain integers or floats.
pub(crate) fn bytes_mut<T: Plain>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as for `bytes`; every byte pattern written is a valid `T`.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), std::mem::size_of_val(v)) }
}

/// Element types whose every bit pattern is a value and that have no padding.
///
/// # Safety
/// Only for such types (integers, floats).
pub(crate) unsafe trait Plain: Copy {}
// SAFETY: primitive integers and floats: no padding, every bit pattern a value.
unsafe impl Plain for u8 {}
// SAFETY: as above.
unsafe impl Plain for i8 {}
// SAFETY: as above.
unsafe impl Plain for u16 {}
// SAFETY: as above.
unsafe impl Plain for i32 {}
// SAFETY: as above.
unsafe impl Plain for f32 {}
