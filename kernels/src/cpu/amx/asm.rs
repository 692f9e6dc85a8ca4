//! The real tile unit: the AMX instructions in inline `asm!` (Intel syntax; LLVM's assembler
//! encodes them: `ldtilecfg m512`, `tilezero tmm`, `tileloadd tmm, [base + stride*1]` — SIB
//! addressing, the index register is the row stride —, `tilestored [base + stride*1], tmm`,
//! `tdpbusd/tdpbssd/tdpbf16ps tmm1, tmm2, tmm3` = C (ModRM.reg), A (ModRM.rm), B (VEX.vvvv),
//! `tilerelease`). The tile registers are named in the template (a `const` operand), never
//! allocated by the compiler, which knows nothing of them; every block keeps the default
//! memory clobber, so no memory access moves across a tile operation.
//!
//! All the `unsafe` of the AMX path that touches hardware is here. An [`AsmTiles`] exists only
//! where the OS granted this process the tile data state and CPUID's palette 1 is at least
//! the one [`TileConfig`] describes; one thread configures at most one at a time (checked),
//! so a session never releases another's tiles.

use std::arch::asm;
use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::OnceLock;

use super::config::{TileConfig, BYTES_PER_ROW, MAX_ROWS, TILES, TILE_BYTES};
use super::TileUnit;
use crate::isa::Isa;

thread_local! {
    /// Whether this thread's tiles are configured by an [`AsmTiles`].
    static CONFIGURED: Cell<bool> = const { Cell::new(false) };
}

/// Whether this process may use the AMX feature `flag` (`amx_tile`, `amx_int8`, `amx_bf16`):
/// the fingerprint reports it (the CPU has it, Linux granted the tile data state, and the
/// `AUTOKERNEL_ISA` cap allows AVX-512) and palette 1 fits [`TileConfig`].
pub fn granted(flag: &str) -> bool {
    Isa::Avx512.available()
        && crate::amx::state().flags.contains(&flag)
        && palette1().is_ok_and(|p| p.fits())
        && tmul().is_ok_and(|t| t.fits())
}

/// Palette 1 as CPUID leaf 0x1D reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Palette1 {
    pub total_tile_bytes: u32,
    pub bytes_per_tile: u32,
    pub bytes_per_row: u32,
    pub max_names: u32,
    pub max_rows: u32,
}

impl Palette1 {
    /// Whether [`TileConfig`]'s limits are within this palette's.
    pub fn fits(&self) -> bool {
        self.bytes_per_row as usize >= BYTES_PER_ROW
            && self.max_rows as usize >= MAX_ROWS
            && self.max_names as usize >= TILES
            && self.bytes_per_tile as usize >= TILE_BYTES
    }
}

/// CPUID leaf 0x1D, sub-leaf 1 (palette 1), read once; an error where the leaf or the
/// palette does not exist.
pub fn palette1() -> Result<Palette1, String> {
    static P: OnceLock<Result<Palette1, String>> = OnceLock::new();
    P.get_or_init(|| {
        let max_leaf = cpuid(0, 0).eax;
        if max_leaf < 0x1D {
            return Err(format!("CPUID has no tile leaf (max leaf {max_leaf:#x})"));
        }
        let palettes = cpuid(0x1D, 0).eax;
        if palettes < 1 {
            return Err("CPUID reports no tile palette 1".into());
        }
        let p = cpuid(0x1D, 1);
        Ok(Palette1 {
            total_tile_bytes: p.eax & 0xffff,
            bytes_per_tile: p.eax >> 16,
            bytes_per_row: p.ebx & 0xffff,
            max_names: p.ebx >> 16,
            max_rows: p.ecx & 0xffff,
        })
    })
    .clone()
}

/// The matrix unit's limits as CPUID leaf 0x1E reports them: the most rows of B a
/// `tdp*` reads (`tmul_maxk`) and the most bytes of a B row (`tmul_maxn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tmul {
    pub max_k: u32,
    pub max_n_bytes: u32,
}

impl Tmul {
    /// Whether the kernels' largest tiles (16 rows of B, 64-byte rows) are within the unit's
    /// limits.
    pub fn fits(&self) -> bool {
        self.max_k as usize >= MAX_ROWS && self.max_n_bytes as usize >= BYTES_PER_ROW
    }

    /// From leaf 0x1E's EBX: `tmul_maxk` in bits 0–7, `tmul_maxn` in bits 8–23.
    pub fn from_ebx(ebx: u32) -> Tmul {
        Tmul {
            max_k: ebx & 0xff,
            max_n_bytes: (ebx >> 8) & 0xffff,
        }
    }
}

/// CPUID leaf 0x1E, sub-leaf 0 (the TMUL unit), read once; an error where the leaf does not
/// exist.
pub fn tmul() -> Result<Tmul, String> {
    static T: OnceLock<Result<Tmul, String>> = OnceLock::new();
    T.get_or_init(|| {
        let max_leaf = cpuid(0, 0).eax;
        if max_leaf < 0x1E {
            return Err(format!("CPUID has no TMUL leaf (max leaf {max_leaf:#x})"));
        }
        Ok(Tmul::from_ebx(cpuid(0x1E, 0).ebx))
    })
    .clone()
}

/// CPUID `leaf`, `sub`-leaf (the caller knows the leaf exists).
fn cpuid(leaf: u32, sub: u32) -> std::arch::x86_64::CpuidResult {
    // SAFETY: CPUID exists on every x86-64 CPU; a leaf past the highest one returns data of
    // the highest, never faults.
    #[allow(unused_unsafe)]
    unsafe {
        std::arch::x86_64::__cpuid_count(leaf, sub)
    }
}

/// The CPU's tile unit (per thread: the tile state is a thread's register state).
#[derive(Debug)]
pub struct AsmTiles {
    int8: bool,
    bf16: bool,
    /// Tile state belongs to a thread: not `Send`.
    _thread: PhantomData<*const ()>,
}

impl TileUnit for AsmTiles {
    fn open() -> Option<AsmTiles> {
        granted("amx_tile").then(|| AsmTiles {
            int8: granted("amx_int8"),
            bf16: granted("amx_bf16"),
            _thread: PhantomData,
        })
    }

    fn int8(&self) -> bool {
        self.int8
    }

    fn bf16(&self) -> bool {
        self.bf16
    }

    unsafe fn configure(&mut self, cfg: &TileConfig) {
        assert!(
            !CONFIGURED.replace(true),
            "ldtilecfg: this thread's tiles are already configured by another session"
        );
        // SAFETY: AMX-TILE is there and the OS granted its state (an `AsmTiles` exists);
        // `cfg` is 64 valid bytes (the caller checked them: no #GP); ldtilecfg reads them.
        unsafe {
            asm!("ldtilecfg [{cfg}]", cfg = in(reg) cfg.as_bytes().as_ptr(),
                 options(nostack, preserves_flags));
        }
    }

    unsafe fn release(&mut self) {
        // SAFETY: AMX-TILE is there (an `AsmTiles` exists); tilerelease touches no memory.
        unsafe { asm!("tilerelease", options(nostack, preserves_flags)) };
        CONFIGURED.set(false);
    }

    unsafe fn zero<const T: u8>(&mut self) {
        // SAFETY: configured, tile T valid (the caller's contract).
        unsafe { asm!("tilezero tmm{t}", t = const T, options(nostack, preserves_flags)) };
    }

    unsafe fn load<const T: u8>(&mut self, src: *const u8, stride: usize) {
        // SAFETY: configured, tile T valid, its rows × colsb bytes `stride` apart readable
        // from `src` (the caller's contract).
        unsafe {
            asm!("tileloadd tmm{t}, [{src} + {stride}*1]", t = const T,
                 src = in(reg) src, stride = in(reg) stride, options(nostack, preserves_flags));
        }
    }

    unsafe fn store<const T: u8>(&mut self, dst: *mut u8, stride: usize) {
        // SAFETY: configured, tile T valid, its rows × colsb bytes `stride` apart writable
        // from `dst` (the caller's contract).
        unsafe {
            asm!("tilestored [{dst} + {stride}*1], tmm{t}", t = const T,
                 dst = in(reg) dst, stride = in(reg) stride, options(nostack, preserves_flags));
        }
    }

    unsafe fn dpbusd<const C: u8, const A: u8, const B: u8>(&mut self) {
        // SAFETY: AMX-INT8 (the session checked `int8()`); three distinct configured tiles of
        // fitting shapes (the caller's contract): no #UD.
        unsafe {
            asm!("tdpbusd tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A, b = const B,
                 options(nostack, preserves_flags));
        }
    }

    unsafe fn dpbssd<const C: u8, const A: u8, const B: u8>(&mut self) {
        // SAFETY: as for `dpbusd`.
        unsafe {
            asm!("tdpbssd tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A, b = const B,
                 options(nostack, preserves_flags));
        }
    }

    unsafe fn dpbf16ps<const C: u8, const A: u8, const B: u8>(&mut self) {
        // SAFETY: AMX-BF16 (the session checked `bf16()`); shapes as for `dpbusd`.
        unsafe {
            asm!("tdpbf16ps tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A, b = const B,
                 options(nostack, preserves_flags));
        }
    }
}
