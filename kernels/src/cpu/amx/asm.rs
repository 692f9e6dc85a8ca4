//! The real tile unit: the AMX instructions in inline `asm!` (Intel syntax; LLVM's assembler
//! encodes them: `ldtilecfg m512`, `tilezero tmm`, `tileloadd tmm, [base + stride*1]` — SIB
//! addressing, the index register is the row stride —, `tilestored [base + stride*1], tmm`,
//! `tdpbusd/tdpbssd/tdpbf16ps tmm1, tmm2, tmm3` = C (ModRM.reg), A (ModRM.rm), B (VEX.vvvv),
//! `tilerelease`). The tile registers are named in the template (a `const` operand), never
//! allocated by the compiler, which knows nothing of them; every block keeps the default
//! memory clobber, so no memory access moves across a tile operation.
//!
//! All the `unsafe` of the AMX path that touches hardware is here. An [`AsmTiles`] exists only
//! where the fingerprint reports AMX ([`crate::amx`]: the tile state granted, CPUID's palette 1
//! and TMUL limits at least what [`TileConfig`] describes); one thread configures at most one
//! at a time (checked), so a session never releases another's tiles.

use std::arch::asm;
use std::cell::Cell;
use std::marker::PhantomData;

use super::config::TileConfig;
use super::TileUnit;
use crate::isa::Isa;

thread_local! {
    /// Whether this thread's tiles are configured by an [`AsmTiles`].
    static CONFIGURED: Cell<bool> = const { Cell::new(false) };
}

/// Whether this process may use the AMX feature `flag` (`amx_tile`, `amx_int8`, `amx_bf16`):
/// the fingerprint reports it ([`crate::amx::state`]: the CPU has it, its tile palette and
/// TMUL limits take [`TileConfig`]'s tiles, the OS enabled and granted the tile state) and the
/// `AUTOKERNEL_ISA` cap allows AVX-512.
pub fn granted(flag: &str) -> bool {
    Isa::Avx512.available() && crate::amx::state().flags.contains(&flag)
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
