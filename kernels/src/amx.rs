//! AMX (Advanced Matrix Extensions, Sapphire Rapids and later): whether this process may use
//! the tile registers. The CPU says what it has (CPUID leaf 7: AMX-TILE, AMX-BF16, AMX-INT8);
//! on Linux a process must also ask the kernel for the tile data state once
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`), which older kernels and some
//! hypervisors refuse. The fingerprint reports the `amx_*` flags only when both say yes, so a
//! record that needs AMX is never served where tiles cannot run.

use std::sync::OnceLock;

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
    use std::arch::x86_64::__cpuid_count;
    // SAFETY: CPUID exists on every x86-64 CPU; leaf 0 gives the highest leaf, so leaf 7 is
    // only read where it exists.
    #[allow(unused_unsafe)]
    let (max_leaf, edx) = unsafe {
        let max = __cpuid_count(0, 0).eax;
        (max, if max >= 7 { __cpuid_count(7, 0).edx } else { 0 })
    };
    if max_leaf < 7 {
        return Vec::new();
    }
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

/// Asks Linux for permission to use the tile data state (once per process is enough).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_data() -> Result<(), String> {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with ARCH_REQ_XCOMP_PERM takes an integer argument and only changes
    // this process's permitted xsave features; it reads or writes no memory of ours.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!(
            "arch_prctl(ARCH_REQ_XCOMP_PERM): {}",
            std::io::Error::last_os_error()
        ))
    }
}

#[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
fn request_tile_data() -> Result<(), String> {
    Err("AMX needs Linux's arch_prctl here".into())
}

#[cfg(test)]
mod tests {
    use super::*;

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
