//! AMX (Advanced Matrix Extensions, Sapphire Rapids and later): whether this process may use
//! the tile registers. Four things must say yes, checked once per process in this order:
//! the CPU has the features (CPUID leaf 7: AMX-TILE, AMX-BF16, AMX-INT8); its tile palette 1
//! (leaf 0x1D) and TMUL limits (leaf 0x1E) take the kernels' 16-row, 64-byte tiles; the OS
//! enabled the tile state in XCR0 (a hypervisor that hides AMX from its guest's kernel leaves
//! it clear); and Linux grants it to this process (`arch_prctl(ARCH_REQ_XCOMP_PERM,
//! XFEATURE_XTILEDATA)`, read back with `ARCH_GET_XCOMP_PERM`; older kernels and some
//! hypervisors refuse). The fingerprint reports the `amx_*` flags only when all do, so a
//! record that needs AMX is never served where its tiles cannot run.

use std::sync::OnceLock;

use crate::cpu::amx::{BYTES_PER_ROW, MAX_ROWS, TILES, TILE_BYTES};

/// The AMX flags, in the order a fingerprint reports them.
pub const AMX_FLAGS: [&str; 3] = ["amx_tile", "amx_bf16", "amx_int8"];

/// What this process found: the flags it may use, or why it may use none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmxState {
    /// The `amx_*` flags granted (empty when the CPU has no AMX or the OS refused).
    pub flags: Vec<&'static str>,
    /// Why the CPU's AMX cannot be used (`None` when granted or when there is none).
    pub refused: Option<String>,
}

/// The state of this process, probed (and the tile data permission asked for) once.
pub fn state() -> &'static AmxState {
    static STATE: OnceLock<AmxState> = OnceLock::new();
    STATE.get_or_init(probe)
}

#[cfg(target_arch = "x86_64")]
fn probe() -> AmxState {
    let cpu = cpu_flags();
    if cpu.is_empty() {
        return AmxState {
            flags: cpu,
            refused: None,
        };
    }
    if let Err(why) = tiles_fit().and_then(|()| os_enabled_tiles()) {
        return AmxState {
            flags: Vec::new(),
            refused: Some(format!(
                "the CPU has {} but {why}; AMX variants are left out",
                cpu.join(", ")
            )),
        };
    }
    match request_tile_data() {
        Ok(()) => AmxState {
            flags: cpu,
            refused: None,
        },
        Err(why) => AmxState {
            flags: Vec::new(),
            refused: Some(format!(
                "the CPU has {} but the OS refused the tile data state ({why}); AMX variants \
                 are left out",
                cpu.join(", ")
            )),
        },
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn probe() -> AmxState {
    AmxState {
        flags: Vec::new(),
        refused: None,
    }
}

/// The AMX flags of CPUID leaf 7 (EDX bits 24, 22, 25).
#[cfg(target_arch = "x86_64")]
fn cpu_flags() -> Vec<&'static str> {
    // Leaf 0 gives the highest leaf: leaf 7 is only read where it exists.
    if cpuid(0, 0).eax < 7 {
        return Vec::new();
    }
    let edx = cpuid(7, 0).edx;
    let bit = |b: u32| edx & (1 << b) != 0;
    if !bit(24) {
        return Vec::new();
    }
    let mut flags = vec!["amx_tile"];
    if bit(22) {
        flags.push("amx_bf16");
    }
    if bit(25) {
        flags.push("amx_int8");
    }
    flags
}

/// Palette 1 as CPUID leaf 0x1D reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Palette1 {
    /// Bytes of tile storage in all (EAX bits 0–15; 8192 on Sapphire Rapids).
    pub total_tile_bytes: u32,
    /// Bytes of one tile register (EAX bits 16–31; 1024 on Sapphire Rapids).
    pub bytes_per_tile: u32,
    /// Bytes of one tile row (EBX bits 0–15; 64 on Sapphire Rapids).
    pub bytes_per_row: u32,
    /// Number of tile registers, `tmm0` to `tmm{max_names - 1}` (EBX bits 16–31; 8 on Sapphire
    /// Rapids).
    pub max_names: u32,
    /// Most rows of a tile (ECX bits 0–15; 16 on Sapphire Rapids).
    pub max_rows: u32,
}

impl Palette1 {
    /// Whether the kernels' tile configuration ([`crate::cpu::amx::TileConfig`]: 8 tiles of
    /// 16 rows of 64 bytes) is within this palette's limits.
    pub fn fits(&self) -> bool {
        self.bytes_per_row as usize >= BYTES_PER_ROW
            && self.max_rows as usize >= MAX_ROWS
            && self.max_names as usize >= TILES
            && self.bytes_per_tile as usize >= TILE_BYTES
    }
}

/// The matrix unit's limits as CPUID leaf 0x1E reports them: the most rows of B a `tdp*`
/// reads (`tmul_maxk`) and the most bytes of a B row (`tmul_maxn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tmul {
    /// `tmul_maxk`: the most rows of B (depth steps) one `tdp*` instruction reads.
    pub max_k: u32,
    /// `tmul_maxn`: the most bytes of one B row a `tdp*` instruction reads.
    pub max_n_bytes: u32,
}

impl Tmul {
    /// Whether the kernels' largest tiles (16 rows of B, 64-byte rows) are within the
    /// unit's limits.
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

/// CPUID leaf 0x1D, sub-leaf 1 (palette 1); an error where the leaf or the palette does not
/// exist.
#[cfg(target_arch = "x86_64")]
pub fn palette1() -> Result<Palette1, String> {
    let max_leaf = cpuid(0, 0).eax;
    if max_leaf < 0x1D {
        return Err(format!("CPUID has no tile leaf (max leaf {max_leaf:#x})"));
    }
    if cpuid(0x1D, 0).eax < 1 {
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
}

/// CPUID leaf 0x1E, sub-leaf 0 (the TMUL unit); an error where the leaf does not exist.
#[cfg(target_arch = "x86_64")]
pub fn tmul() -> Result<Tmul, String> {
    let max_leaf = cpuid(0, 0).eax;
    if max_leaf < 0x1E {
        return Err(format!("CPUID has no TMUL leaf (max leaf {max_leaf:#x})"));
    }
    Ok(Tmul::from_ebx(cpuid(0x1E, 0).ebx))
}

/// Whether palette 1 and the TMUL limits take the kernels' tiles (an AMX CPU whose leaves
/// say less is left out rather than faulted on).
#[cfg(target_arch = "x86_64")]
fn tiles_fit() -> Result<(), String> {
    let p = palette1()?;
    if !p.fits() {
        return Err(format!(
            "its tile palette 1 ({p:?}) is smaller than the kernels' tiles"
        ));
    }
    let t = tmul()?;
    if !t.fits() {
        return Err(format!(
            "its TMUL limits ({t:?}) are smaller than the kernels' tiles"
        ));
    }
    Ok(())
}

/// CPUID `leaf`, `sub`-leaf (a leaf past the highest one returns the highest one's data).
#[cfg(target_arch = "x86_64")]
fn cpuid(leaf: u32, sub: u32) -> std::arch::x86_64::CpuidResult {
    // SAFETY: CPUID exists on every x86-64 CPU and never faults.
    #[allow(unused_unsafe)]
    unsafe {
        std::arch::x86_64::__cpuid_count(leaf, sub)
    }
}

/// The xsave feature number of the tile data (XTILEDATA; XTILECFG is 17).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const XFEATURE_XTILEDATA: u32 = 18;

/// Whether the OS enabled the tile state in XCR0 (XTILECFG and XTILEDATA, bits 17 and 18):
/// without them every tile instruction faults, whatever CPUID says. A hypervisor that hides
/// AMX from its guests' kernels leaves them clear.
#[cfg(target_arch = "x86_64")]
fn os_enabled_tiles() -> Result<(), String> {
    let osxsave = cpuid(1, 0).ecx & (1 << 27) != 0;
    if !osxsave {
        return Err("the OS has not enabled XSAVE (CPUID.1:ECX.OSXSAVE)".into());
    }
    // SAFETY: OSXSAVE is set (checked above), so XGETBV is enabled.
    let xcr0 = unsafe { xcr0() };
    tile_bits_set(xcr0)
}

/// XCR0, the xsave features the OS enabled.
///
/// # Safety
/// CPUID.1:ECX.OSXSAVE is set.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "xsave")]
unsafe fn xcr0() -> u64 {
    // SAFETY: the caller checked OSXSAVE; XGETBV(0) reads XCR0 and touches no memory.
    unsafe { std::arch::x86_64::_xgetbv(0) }
}

/// `Ok` when `xcr0` has both tile state bits (17 and 18).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn tile_bits_set(xcr0: u64) -> Result<(), String> {
    let tiles = (1u64 << 17) | (1u64 << XFEATURE_XTILEDATA);
    if xcr0 & tiles == tiles {
        Ok(())
    } else {
        Err(format!(
            "the OS has not enabled the tile state in XCR0 ({xcr0:#x})"
        ))
    }
}

/// Asks Linux for permission to use the tile data state (once per process is enough; not
/// at all where something else in the process — oneDNN under PyTorch, say — already has it),
/// then reads the permission back: granted means the bit is in the permitted set.
///
/// The permission is the process's: once granted, Linux refuses a thread an alternate signal
/// stack too small for a signal frame with the tile state, and it refuses the permission
/// where such a stack is already installed (`ENOSPC`; the refusal says so).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_data() -> Result<(), String> {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    if permitted_xsave()? & (1 << XFEATURE_XTILEDATA) != 0 {
        return Ok(());
    }
    // SAFETY: arch_prctl with ARCH_REQ_XCOMP_PERM takes an integer argument and only changes
    // this process's permitted xsave features; it reads or writes no memory of ours.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA as libc::c_long,
        )
    };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        let hint = match err.raw_os_error() {
            Some(libc::ENOSPC) => {
                ": a thread's alternate signal stack is too small for the tile state (Python's \
                 faulthandler installs one: import autokernel before enabling it)"
            }
            _ => "",
        };
        return Err(format!("arch_prctl(ARCH_REQ_XCOMP_PERM): {err}{hint}"));
    }
    let permitted = permitted_xsave()?;
    if permitted & (1 << XFEATURE_XTILEDATA) == 0 {
        return Err(format!(
            "arch_prctl(ARCH_REQ_XCOMP_PERM) returned 0 but the permitted set \
             ({permitted:#x}) lacks the tile data"
        ));
    }
    Ok(())
}

/// This process's permitted xsave features (`arch_prctl(ARCH_GET_XCOMP_PERM)`).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn permitted_xsave() -> Result<u64, String> {
    const ARCH_GET_XCOMP_PERM: libc::c_long = 0x1022;
    let mut permitted: u64 = 0;
    // SAFETY: ARCH_GET_XCOMP_PERM writes one u64, the permitted feature bitmap, through the
    // pointer, which points at `permitted`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_GET_XCOMP_PERM,
            &mut permitted as *mut u64,
        )
    };
    if rc != 0 {
        return Err(format!(
            "arch_prctl(ARCH_GET_XCOMP_PERM): {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(permitted)
}

#[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
fn request_tile_data() -> Result<(), String> {
    Err("AMX needs Linux's arch_prctl here".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The permission read-back runs on every x86-64 Linux (not only AMX ones): x87 and SSE
    /// state are always permitted.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    #[test]
    fn permitted_xsave_features_read_back() {
        let permitted = permitted_xsave().expect("ARCH_GET_XCOMP_PERM");
        assert_eq!(permitted & 0b11, 0b11, "{permitted:#x}");
    }

    /// The TMUL limits of leaf 0x1E decode from EBX, and tiles of 16 B rows of 64 bytes need
    /// both limits at least that large (Sapphire Rapids reports 16 and 64); a palette smaller
    /// than the kernels' tiles does not fit either.
    #[test]
    fn tile_limits_decode_and_bound_the_kernels_tiles() {
        let spr = Tmul::from_ebx(0x4010);
        assert_eq!((spr.max_k, spr.max_n_bytes), (16, 64));
        assert!(spr.fits());
        assert!(!Tmul::from_ebx(0x4008).fits());
        assert!(!Tmul::from_ebx(0x2010).fits());
        let spr = Palette1 {
            total_tile_bytes: 8192,
            bytes_per_tile: 1024,
            bytes_per_row: 64,
            max_names: 8,
            max_rows: 16,
        };
        assert!(spr.fits());
        assert!(!Palette1 { max_rows: 8, ..spr }.fits());
        assert!(!Palette1 {
            max_names: 4,
            ..spr
        }
        .fits());
    }

    #[test]
    fn both_tile_state_bits_are_needed_in_xcr0() {
        // x87, SSE, AVX, AVX-512 state (0xe7) and both tile bits: a Sapphire Rapids host.
        assert!(tile_bits_set(0x6_00e7).is_ok());
        for xcr0 in [0xe7, 0x2_00e7, 0x4_00e7] {
            let e = tile_bits_set(xcr0).unwrap_err();
            assert!(e.contains("XCR0"), "{e}");
        }
    }

    #[test]
    fn flags_are_granted_or_refused_with_a_reason_never_both() {
        let s = state();
        assert!(s.flags.is_empty() || s.refused.is_none(), "{s:?}");
        assert!(s.flags.iter().all(|f| AMX_FLAGS.contains(f)));
        assert!(s.flags.is_empty() || s.flags[0] == "amx_tile");
        match &s.refused {
            Some(why) => eprintln!("note: {why}"),
            None if s.flags.is_empty() => {
                eprintln!("note: this CPU has no AMX: AMX checks skipped")
            }
            None => {}
        }
    }
}
