//! The one place where the CPU's SIMD level is detected, and the `AUTOKERNEL_ISA` cap that
//! lowers it (so one machine runs and tests every lower path too).

use std::sync::OnceLock;

use crate::HardwareFingerprint;

/// The environment variable that caps the ISA level the kernels use, so that one machine
/// can run (and test) every lower path too: `portable`, `avx2` or `avx512`. Read once per
/// process, where the ISA is detected; the capped level is what the fingerprint reports.
pub const ISA_ENV: &str = "AUTOKERNEL_ISA";

/// The SIMD instruction sets the CPU kernels are written for, lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// Plain Rust, auto-vectorised for the baseline target; runs everywhere.
    Portable,
    /// 256-bit AVX2 with FMA3.
    Avx2,
    /// 512-bit AVX-512F.
    Avx512,
}

impl Isa {
    /// Every level, lowest first.
    pub const ALL: [Isa; 3] = [Isa::Portable, Isa::Avx2, Isa::Avx512];

    /// The name used in config values (`avx2_6x16`, ...) and by [`ISA_ENV`].
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// f32 lanes of the level's vectors (the portable kernels' arrays are 8 wide).
    pub fn f32_lanes(self) -> usize {
        match self {
            Isa::Avx512 => 16,
            Isa::Avx2 | Isa::Portable => 8,
        }
    }

    /// The level called `name` ([`Isa::name`]).
    pub fn parse(name: &str) -> Option<Isa> {
        Isa::ALL.into_iter().find(|i| i.name() == name)
    }

    /// The level the fingerprint's ISA flags allow: what the kernel spaces and defaults for
    /// `hw` are built from, so a named fingerprint gives the same space on every CPU.
    pub fn of(hw: &HardwareFingerprint) -> Isa {
        Isa::of_flags(&hw.isa)
    }

    /// The level a set of fingerprint ISA flags allows.
    pub fn of_flags(flags: &[String]) -> Isa {
        let has = |f: &str| flags.iter().any(|x| x == f);
        if has("avx512f") {
            Isa::Avx512
        } else if has("avx2") && has("fma") {
            Isa::Avx2
        } else {
            Isa::Portable
        }
    }

    /// The level a fingerprint ISA flag belongs to: flags of a level above the cap are not
    /// reported ([`crate::hardware`]'s detection), so a capped process has its own
    /// fingerprint and never serves, or is served, records of the uncapped machine.
    pub fn of_flag(flag: &str) -> Isa {
        if flag.starts_with("avx512") || flag.starts_with("amx") {
            Isa::Avx512
        } else if matches!(flag, "avx" | "avx2" | "fma" | "f16c" | "avxvnni") {
            Isa::Avx2
        } else {
            Isa::Portable
        }
    }

    /// The best level this CPU runs, ignoring any cap.
    pub fn cpu_best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| Isa::of_flags(&crate::hardware::cpu_isa_flags()))
    }

    /// The cap set by [`ISA_ENV`]: `Ok(None)` when unset or empty, an error for an unknown
    /// level or one above what the CPU runs. Read once per process.
    pub fn cap() -> Result<Option<Isa>, crate::Error> {
        static CAP: OnceLock<Result<Option<Isa>, crate::Error>> = OnceLock::new();
        CAP.get_or_init(|| {
            let value = std::env::var(ISA_ENV).unwrap_or_default();
            resolve_cap(value.trim(), Isa::cpu_best())
        })
        .clone()
    }

    /// The best ISA the kernels use in this process: the CPU's, lowered by a valid
    /// [`ISA_ENV`] cap. An invalid cap is ignored here (with one warning on stderr); the CLI
    /// refuses it up front, and the correctness tests fail on it.
    pub fn detect() -> Isa {
        static ISA: OnceLock<Isa> = OnceLock::new();
        *ISA.get_or_init(|| match Isa::cap() {
            Ok(cap) => cap.unwrap_or_else(Isa::cpu_best),
            Err(e) => {
                eprintln!("warning: {e}; using {}", Isa::cpu_best().name());
                Isa::cpu_best()
            }
        })
    }

    /// Whether code written for `self` is offered (as knob values) where `best` is the best
    /// level: the best level's, AVX2's too under AVX-512 (its shapes win some workloads),
    /// portable code only where no SIMD level is there.
    pub fn offered_under(self, best: Isa) -> bool {
        self == best || (best == Isa::Avx512 && self == Isa::Avx2)
    }

    /// Whether this process can run code written for `self`.
    pub fn available(self) -> bool {
        self <= Isa::detect()
    }
}

/// One line on ISA coverage for test output: the level this process runs, the lower levels
/// a capped run covers, and the levels skipped here and why.
pub fn level_report() -> String {
    let (level, cpu) = (Isa::detect(), Isa::cpu_best());
    let mut line = format!("ISA level {}", level.name());
    line += &match Isa::cap() {
        Ok(Some(_)) => format!(" (capped by {ISA_ENV}; the CPU runs {})", cpu.name()),
        _ => " (the CPU's best)".to_string(),
    };
    let lower: Vec<&str> = Isa::ALL
        .iter()
        .filter(|&&i| i < level)
        .map(|i| i.name())
        .collect();
    if !lower.is_empty() {
        line += &format!("; lower levels run with {ISA_ENV}={}", lower.join("|"));
    }
    for isa in Isa::ALL.into_iter().filter(|&i| i > level) {
        let why = if isa <= cpu {
            "capped"
        } else {
            "this CPU does not run it"
        };
        line += &format!("; skipped {}: {why}", isa.name());
    }
    line
}

/// For the kernel correctness tests: refuses an invalid [`ISA_ENV`] cap, and writes
/// `suite: ` + [`level_report`] to stderr directly, past the test harness's capture of
/// `eprintln!`, so every run (CI's included) shows which level it tested and which it
/// skipped.
pub fn announce_level(suite: &str) -> Result<(), crate::Error> {
    Isa::cap()?;
    let line = format!("{suite}: {}\n", level_report());
    // Best effort: a closed stderr is no reason to fail a test.
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    Ok(())
}

/// The cap `value` asks for on a CPU whose best level is `cpu` (`""` = no cap).
pub fn resolve_cap(value: &str, cpu: Isa) -> Result<Option<Isa>, crate::Error> {
    if value.is_empty() {
        return Ok(None);
    }
    let err = |reason: String| crate::Error::IsaCap {
        value: value.to_string(),
        reason,
    };
    let isa = Isa::parse(value).ok_or_else(|| {
        let names: Vec<&str> = Isa::ALL.iter().map(|i| i.name()).collect();
        err(format!("unknown ISA level (one of {})", names.join(", ")))
    })?;
    if isa > cpu {
        return Err(err(format!(
            "above what this CPU runs (its best level is {})",
            cpu.name()
        )));
    }
    Ok(Some(isa))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cap_parses_and_may_not_exceed_the_cpu() {
        assert_eq!(resolve_cap("", Isa::Avx2), Ok(None));
        assert_eq!(resolve_cap("avx2", Isa::Avx512), Ok(Some(Isa::Avx2)));
        assert_eq!(
            resolve_cap("portable", Isa::Portable),
            Ok(Some(Isa::Portable))
        );
        assert_eq!(resolve_cap("avx512", Isa::Avx512), Ok(Some(Isa::Avx512)));
        let e = resolve_cap("avx512", Isa::Avx2).unwrap_err().to_string();
        assert!(
            e.contains("AUTOKERNEL_ISA=avx512") && e.contains("best level is avx2"),
            "{e}"
        );
        let e = resolve_cap("sse9", Isa::Avx512).unwrap_err().to_string();
        assert!(
            e.contains("unknown ISA level (one of portable, avx2, avx512)"),
            "{e}"
        );
    }

    #[test]
    fn levels_follow_the_flags() {
        let flags = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(Isa::of_flags(&flags(&["sse4.2"])), Isa::Portable);
        assert_eq!(
            Isa::of_flags(&flags(&["avx2"])),
            Isa::Portable,
            "AVX2 needs FMA"
        );
        assert_eq!(Isa::of_flags(&flags(&["avx2", "fma"])), Isa::Avx2);
        assert_eq!(
            Isa::of_flags(&flags(&["avx512f", "avx2", "fma"])),
            Isa::Avx512
        );
        for f in [
            "avx512vnni",
            "avx512bf16",
            "avx512f",
            "amx_tile",
            "amx_int8",
        ] {
            assert_eq!(Isa::of_flag(f), Isa::Avx512);
        }
        for f in ["avx", "avx2", "fma", "f16c", "avxvnni"] {
            assert_eq!(Isa::of_flag(f), Isa::Avx2);
        }
        assert_eq!(Isa::of_flag("sse4.2"), Isa::Portable);
    }

    #[test]
    fn detection_agrees_with_the_fingerprint() {
        assert!(Isa::detect() <= Isa::cpu_best());
        assert_eq!(Isa::of(HardwareFingerprint::current()), Isa::detect());
    }
}
