//! The GPU fingerprint: what about a CUDA device decides which config is fastest.
//!
//! Hashed like the CPU's [`HardwareFingerprint`](crate::HardwareFingerprint): the id is FNV-1a
//! 64 of the canonical JSON of every other field, so records tuned on one GPU model, driver and
//! toolchain are never served on another.

use serde::{Deserialize, Serialize};

use super::arch::Arch;

/// A CUDA device's identity for tuning purposes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFingerprint {
    /// 16 hex digits: FNV-1a 64 of the canonical JSON of every other field.
    pub id: String,
    /// Marketing name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Compute capability, e.g. `sm_90`.
    pub compute_capability: Arch,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Device memory, bytes.
    pub memory_bytes: u64,
    /// Kernel driver version (`/proc/driver/nvidia/version`), e.g. `550.54.15`; `unknown`
    /// where it cannot be read.
    pub driver_version: String,
    /// Highest CUDA version the driver supports (`cuDriverGetVersion`), e.g. `12.4`.
    pub cuda_version: String,
    /// NVRTC release that generates the code, e.g. `12.2`: a different compiler is a different
    /// kernel as far as timings go.
    pub nvrtc_version: String,
}

impl GpuFingerprint {
    /// Builds a fingerprint from its fields and computes its id.
    pub fn new(
        name: &str,
        compute_capability: Arch,
        sm_count: u32,
        memory_bytes: u64,
        driver_version: &str,
        cuda_version: &str,
        nvrtc_version: &str,
    ) -> Self {
        let mut fp = GpuFingerprint {
            id: String::new(),
            name: name.trim().to_string(),
            compute_capability,
            sm_count,
            memory_bytes,
            driver_version: driver_version.to_string(),
            cuda_version: cuda_version.to_string(),
            nvrtc_version: nvrtc_version.to_string(),
        };
        fp.id = fp.compute_id();
        fp
    }

    /// The canonical form: compact JSON of every field but `id`, keys in declaration order.
    pub fn canonical(&self) -> String {
        crate::hardware::canonical(self)
    }

    /// FNV-1a 64 of [`canonical`](Self::canonical), as 16 hex digits.
    pub fn compute_id(&self) -> String {
        crate::hardware::content_id(self)
    }

    /// Whether `id` matches the content.
    pub fn id_is_consistent(&self) -> bool {
        self.id == self.compute_id()
    }

    /// One-line human summary.
    pub fn summary(&self) -> String {
        format!(
            "{} ({}, {} SMs, {:.1} GiB), driver {}, CUDA {}, NVRTC {}",
            self.name,
            self.compute_capability,
            self.sm_count,
            self.memory_bytes as f64 / (1u64 << 30) as f64,
            self.driver_version,
            self.cuda_version,
            self.nvrtc_version
        )
    }
}

/// `12040` → `12.4` (the encoding of `cuDriverGetVersion`).
pub(crate) fn cuda_version_string(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// The kernel module's version from the text of `/proc/driver/nvidia/version`
/// (`NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 ...`).
pub(crate) fn parse_driver_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version"))?;
    let after = line.split("Kernel Module").nth(1).unwrap_or(line);
    after
        .split_whitespace()
        .find(|w| w.contains('.') && w.chars().all(|c| c.is_ascii_digit() || c == '.'))
        .map(str::to_string)
}

/// The installed kernel driver's version, or `unknown`.
pub(crate) fn driver_version() -> String {
    std::fs::read_to_string("/proc/driver/nvidia/version")
        .ok()
        .and_then(|t| parse_driver_version(&t))
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::fnv1a64;

    fn h100() -> GpuFingerprint {
        GpuFingerprint::new(
            "NVIDIA H100 80GB HBM3",
            Arch::SM90,
            132,
            85_045_510_144,
            "550.54.15",
            "12.4",
            "12.2",
        )
    }

    #[test]
    fn id_is_a_stable_hash_of_the_canonical_form() {
        let a = h100();
        assert_eq!(a.id.len(), 16);
        assert!(a.id_is_consistent());
        assert_eq!(a.id, format!("{:016x}", fnv1a64(a.canonical().as_bytes())));
        assert!(a.canonical().contains(r#""compute_capability":"sm_90""#));
        let mut b = h100();
        b.sm_count = 114;
        assert!(!b.id_is_consistent());
        assert_ne!(b.compute_id(), a.id);
        let c = GpuFingerprint::new(
            "NVIDIA H100 80GB HBM3",
            Arch::SM90,
            132,
            85_045_510_144,
            "550.54.15",
            "12.4",
            "12.8",
        );
        assert_ne!(c.id, a.id, "another NVRTC is another fingerprint");
        assert!(a.summary().contains("sm_90, 132 SMs, 79.2 GiB"));
    }

    #[test]
    fn versions_parse() {
        assert_eq!(cuda_version_string(12040), "12.4");
        assert_eq!(cuda_version_string(11080), "11.8");
        let text = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\nGCC version:  gcc version 12.2.0\n";
        assert_eq!(parse_driver_version(text).as_deref(), Some("550.54.15"));
        let open =
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build\n";
        assert_eq!(parse_driver_version(open).as_deref(), Some("570.86.15"));
        assert_eq!(parse_driver_version("garbage"), None);
    }
}
