//! GPU architectures (`sm_80`, `sm_90`, ...): what NVRTC compiles for, and the per-arch limits
//! the search spaces' rules need.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A CUDA compute capability, written `sm_XY` (major X, minor Y).
/// Serialised as its text form (`"sm_90"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct Arch {
    /// Major compute capability (9 for sm_90).
    pub major: u32,
    /// Minor compute capability (0 for sm_90).
    pub minor: u32,
}

/// Why an arch string does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad GPU arch '{0}' (expected sm_XY, e.g. sm_80 or sm_90)")]
pub struct ArchParseError(pub String);

impl Arch {
    /// Ampere A100.
    pub const SM80: Arch = Arch::new(8, 0);
    /// Hopper H100 / H200.
    pub const SM90: Arch = Arch::new(9, 0);
    /// The archs CI compiles every template for.
    pub const CI: [Arch; 2] = [Arch::SM80, Arch::SM90];

    /// Compute capability `major.minor` (`sm_{major}{minor}`).
    pub const fn new(major: u32, minor: u32) -> Self {
        Arch { major, minor }
    }

    /// `major * 10 + minor` (80, 90, ...), the number `__CUDA_ARCH__ / 10` gives.
    pub const fn number(self) -> u32 {
        self.major * 10 + self.minor
    }

    /// The NVRTC option selecting this arch. A real arch (`sm_XY`, not `compute_XY`), so NVRTC
    /// also runs ptxas on the PTX: inline-assembly mistakes fail at compile time, not at load.
    pub fn nvrtc_option(self) -> String {
        format!("--gpu-architecture={self}")
    }

    /// Largest dynamic shared memory one block may opt in to, in bytes
    /// (CUDA C Programming Guide, "Technical Specifications per Compute Capability").
    pub const fn max_smem_per_block(self) -> usize {
        match self.number() {
            70 | 72 => 96 * 1024,
            75 => 64 * 1024,
            80 | 87 => 163 * 1024,
            86 | 89 => 99 * 1024,
            90 | 100 | 101 | 103 => 227 * 1024,
            120 | 121 => 99 * 1024,
            _ => 48 * 1024,
        }
    }

    /// Whether `cp.async` (asynchronous global→shared copies) exists: sm_80 and newer.
    pub const fn has_cp_async(self) -> bool {
        self.number() >= 80
    }

    /// Whether bf16 tensor-core `mma.sync.m16n8k16` exists: sm_80 and newer.
    pub const fn has_bf16_mma(self) -> bool {
        self.number() >= 80
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}{}", self.major, self.minor)
    }
}

impl From<Arch> for String {
    fn from(a: Arch) -> String {
        a.to_string()
    }
}

impl TryFrom<String> for Arch {
    type Error = ArchParseError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl FromStr for Arch {
    type Err = ArchParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ArchParseError(s.to_string());
        let digits = s.trim().strip_prefix("sm_").ok_or_else(bad)?;
        if digits.len() < 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let (maj, min) = digits.split_at(digits.len() - 1);
        let major: u32 = maj.parse().map_err(|_| bad())?;
        let minor: u32 = min.parse().map_err(|_| bad())?;
        if !(3..=20).contains(&major) {
            return Err(bad());
        }
        Ok(Arch::new(major, minor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        assert_eq!("sm_80".parse::<Arch>(), Ok(Arch::SM80));
        assert_eq!("sm_90".parse::<Arch>(), Ok(Arch::SM90));
        assert_eq!("sm_120".parse::<Arch>(), Ok(Arch::new(12, 0)));
        assert_eq!(Arch::SM90.to_string(), "sm_90");
        assert_eq!(Arch::new(8, 6).nvrtc_option(), "--gpu-architecture=sm_86");
        for bad in ["80", "sm_", "sm_8", "sm_8x", "compute_80", "sm_990"] {
            assert!(bad.parse::<Arch>().is_err(), "{bad}");
        }
    }

    #[test]
    fn limits() {
        assert_eq!(Arch::SM80.max_smem_per_block(), 166_912);
        assert_eq!(Arch::SM90.max_smem_per_block(), 232_448);
        assert_eq!(Arch::new(8, 6).max_smem_per_block(), 101_376);
        assert!(Arch::SM80.has_cp_async() && !Arch::new(7, 5).has_cp_async());
        assert!(Arch::SM80 < Arch::SM90);
    }
}
