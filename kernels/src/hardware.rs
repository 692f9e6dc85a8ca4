//! The hardware fingerprint: what about this machine decides which config is fastest.
//!
//! Tuning results only transfer between machines that agree on the fields below, so every
//! record in the database carries the fingerprint's [`id`](HardwareFingerprint::id), a hash of
//! the canonical JSON form of everything else. Detection reads `/proc/cpuinfo` and
//! `/sys/devices/system/cpu` on Linux and the CPU's feature flags everywhere; it runs once per
//! process ([`HardwareFingerprint::current`]).

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::device::DeviceKind;

/// The ISA flags that change code generation, in the order they are reported (then the
/// AMX flags the OS granted, [`crate::amx`]; machines without AMX keep their ids). `avxvnni`
/// is reported only where `avx512vnni` is not ([`reported`]).
#[cfg(target_arch = "x86_64")]
const ISA_FLAGS: &[&str] = &[
    "sse4.2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512dq",
    "avx512bf16",
    "avx512vnni",
    "avxvnni",
];

/// A CPU's identity for tuning purposes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HardwareFingerprint {
    /// 16 hex digits: FNV-1a 64 of the canonical JSON of every other field.
    pub id: String,
    /// `x86_64`, `aarch64`, ...
    pub arch: String,
    /// CPU vendor string, e.g. `AuthenticAMD`.
    pub vendor: String,
    /// CPU family as `/proc/cpuinfo` reports it (`cpu family`; 0 when unknown); a GPU row's
    /// compute capability major.
    pub family: u32,
    /// CPU model as `/proc/cpuinfo` reports it (0 when unknown); a GPU row's compute capability
    /// minor.
    pub model: u32,
    /// CPU stepping as `/proc/cpuinfo` reports it (0 when unknown, and on a GPU row).
    pub stepping: u32,
    /// Marketing name, e.g. `AMD EPYC 9B45`.
    pub brand: String,
    /// Detected ISA flags that matter for code generation, sorted.
    pub isa: Vec<String>,
    /// Threads this process computes with (rayon's global pool size): tuning results for
    /// 2 threads say nothing about 16, so this is part of the identity.
    pub cores: usize,
    /// Per-core L1 data cache, per-core L2, shared L3, in bytes (0 when unknown).
    pub l1d_bytes: usize,
    /// Per-core L2 cache, in bytes (0 when unknown).
    pub l2_bytes: usize,
    /// Shared L3 cache, in bytes (0 when unknown).
    pub l3_bytes: usize,
}

impl HardwareFingerprint {
    /// This machine's fingerprint, detected once per process.
    pub fn current() -> &'static HardwareFingerprint {
        static FP: OnceLock<HardwareFingerprint> = OnceLock::new();
        FP.get_or_init(detect)
    }

    /// Builds a fingerprint from its fields and computes its id.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        arch: &str,
        vendor: &str,
        (family, model, stepping): (u32, u32, u32),
        brand: &str,
        mut isa: Vec<String>,
        cores: usize,
        (l1d_bytes, l2_bytes, l3_bytes): (usize, usize, usize),
    ) -> Self {
        isa.sort();
        isa.dedup();
        let mut fp = HardwareFingerprint {
            id: String::new(),
            arch: arch.into(),
            vendor: vendor.into(),
            family,
            model,
            stepping,
            brand: brand.into(),
            isa,
            cores,
            l1d_bytes,
            l2_bytes,
            l3_bytes,
        };
        fp.id = fp.compute_id();
        fp
    }

    /// The canonical form: compact JSON of every field but `id`, keys in declaration order.
    pub fn canonical(&self) -> String {
        canonical(self)
    }

    /// FNV-1a 64 of [`canonical`](Self::canonical), as 16 hex digits.
    pub fn compute_id(&self) -> String {
        content_id(self)
    }

    /// The kind of device this fingerprint describes: a row of a CUDA GPU has arch `cuda`
    /// (`kernels::cuda::GpuFingerprint::hardware`), every other row is a CPU.
    pub fn device_kind(&self) -> DeviceKind {
        if self.arch == "cuda" {
            DeviceKind::Cuda
        } else {
            DeviceKind::Cpu
        }
    }

    /// The same machine computing with `threads` threads (a different fingerprint: configs
    /// tuned for one thread count are not the best for another).
    pub fn with_cores(&self, threads: usize) -> HardwareFingerprint {
        let mut fp = self.clone();
        fp.cores = threads;
        fp.id = fp.compute_id();
        fp
    }

    /// The same machine without the AMX flags ([`crate::amx`]): what it is where the OS
    /// refuses the tile state.
    pub fn without_amx(&self) -> HardwareFingerprint {
        let mut fp = self.clone();
        fp.isa.retain(|f| !f.starts_with("amx"));
        fp.id = fp.compute_id();
        fp
    }

    /// The micro-architecture and ISA, without the core count, caches or brand string:
    /// `arch/vendor/family/model/isa+isa+...` (e.g. `x86_64/AuthenticAMD/26/2/avx2+fma`).
    ///
    /// Two fingerprints with the same key run the same code paths at the same speed per core,
    /// so a config tuned on one is a sound fallback on the other (the runtime's `same_arch`
    /// level); different keys never share configs.
    pub fn arch_key(&self) -> String {
        format!(
            "{}/{}/{}/{}/{}",
            self.arch,
            self.vendor,
            self.family,
            self.model,
            self.isa.join("+")
        )
    }

    /// A named reference machine, `zen3`: the 2-core AMD EPYC Zen 3 VM (AVX2 + FMA) whose
    /// recorded search spaces are under `bench_results/e328fcad30c0f803/spaces/` (this is
    /// its fingerprint, id `e328fcad30c0f803`). Tests that judge search behaviour or
    /// structure build spaces for it instead of [`current`](Self::current), so they judge the
    /// same problem on every CPU.
    pub fn reference_zen3() -> HardwareFingerprint {
        let isa = ["avx", "avx2", "f16c", "fma", "sse4.2"];
        HardwareFingerprint::new(
            "x86_64",
            "AuthenticAMD",
            (25, 1, 1),
            "AMD EPYC",
            isa.iter().map(|f| f.to_string()).collect(),
            2,
            (32 << 10, 512 << 10, 32 << 20),
        )
    }

    /// Whether `id` matches the content (false for a hand-edited or foreign record).
    pub fn id_is_consistent(&self) -> bool {
        self.id == self.compute_id()
    }

    /// Whether the CPU reports `flag` (e.g. `avx2`).
    pub fn has(&self, flag: &str) -> bool {
        self.isa.iter().any(|f| f == flag)
    }

    /// One-line human summary.
    pub fn summary(&self) -> String {
        format!(
            "{} ({} family {} model {}), {} threads, L1d {} KiB / L2 {} KiB / L3 {} MiB, ISA: {}",
            self.brand,
            self.vendor,
            self.family,
            self.model,
            self.cores,
            self.l1d_bytes / 1024,
            self.l2_bytes / 1024,
            self.l3_bytes / (1024 * 1024),
            self.isa.join(" ")
        )
    }
}

/// FNV-1a, 64-bit: stable across platforms and Rust versions, unlike `DefaultHasher`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The canonical form of a fingerprint (the CPU's, or a GPU's): compact JSON of every field
/// but `id`, keys in declaration order.
pub(crate) fn canonical(fingerprint: &impl Serialize) -> String {
    let mut v = serde_json::to_value(fingerprint).expect("plain data serialises");
    v.as_object_mut().expect("struct is an object").remove("id");
    v.to_string()
}

/// The id of a fingerprint: FNV-1a 64 of its [`canonical`] form, as 16 hex digits.
pub(crate) fn content_id(fingerprint: &impl Serialize) -> String {
    format!("{:016x}", fnv1a64(canonical(fingerprint).as_bytes()))
}

fn detect() -> HardwareFingerprint {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| -> Option<String> {
        cpuinfo.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == name).then(|| v.trim().to_string())
        })
    };
    let num = |name: &str| field(name).and_then(|v| v.parse().ok()).unwrap_or(0);
    // The threads this process computes with: rayon's global pool (all cores unless the
    // program sized the pool first, as `autokernel --threads T` does).
    let cores = rayon::current_num_threads();
    HardwareFingerprint::new(
        std::env::consts::ARCH,
        &field("vendor_id").unwrap_or_else(|| "unknown".into()),
        (num("cpu family"), num("model"), num("stepping")),
        &field("model name").unwrap_or_else(|| "unknown".into()),
        detect_isa(),
        cores,
        cache_sizes(),
    )
}

/// The ISA flags this process reports: the CPU's, without those above the
/// [`Isa::detect`](crate::isa::Isa::detect) level when `AUTOKERNEL_ISA` caps it.
fn detect_isa() -> Vec<String> {
    reported(cpu_isa_flags(), crate::isa::Isa::detect())
}

/// The flags of `cpu` a process capped at `level` reports: none above the level, and
/// `avxvnni` only without `avx512vnni`. The int8 GEMM offers its AVX-VNNI kernels only where
/// the flag is reported (where both exist the 16-lane `vpdpbusd` is at least as fast), so
/// machines with AVX512_VNNI keep their ids, and a process capped at AVX2 on them runs the
/// AVX-VNNI kernels.
fn reported(cpu: Vec<String>, level: crate::isa::Isa) -> Vec<String> {
    let capped: Vec<String> = cpu
        .into_iter()
        .filter(|f| crate::isa::Isa::of_flag(f) <= level)
        .collect();
    let vnni512 = capped.iter().any(|f| f == "avx512vnni");
    capped
        .into_iter()
        .filter(|f| !(vnni512 && f == "avxvnni"))
        .collect()
}

/// The ISA flags the CPU reports, uncapped.
#[cfg(target_arch = "x86_64")]
pub(crate) fn cpu_isa_flags() -> Vec<String> {
    ISA_FLAGS
        .iter()
        .filter(|f| match **f {
            "sse4.2" => std::arch::is_x86_feature_detected!("sse4.2"),
            "avx" => std::arch::is_x86_feature_detected!("avx"),
            "avx2" => std::arch::is_x86_feature_detected!("avx2"),
            "fma" => std::arch::is_x86_feature_detected!("fma"),
            "f16c" => std::arch::is_x86_feature_detected!("f16c"),
            "avx512f" => std::arch::is_x86_feature_detected!("avx512f"),
            "avx512bw" => std::arch::is_x86_feature_detected!("avx512bw"),
            "avx512vl" => std::arch::is_x86_feature_detected!("avx512vl"),
            "avx512dq" => std::arch::is_x86_feature_detected!("avx512dq"),
            "avx512bf16" => std::arch::is_x86_feature_detected!("avx512bf16"),
            "avx512vnni" => std::arch::is_x86_feature_detected!("avx512vnni"),
            "avxvnni" => std::arch::is_x86_feature_detected!("avxvnni"),
            _ => false,
        })
        .chain(crate::amx::state().flags.iter())
        .map(|f| f.to_string())
        .collect()
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn cpu_isa_flags() -> Vec<String> {
    Vec::new()
}

/// (L1d, L2, L3) in bytes from sysfs; conservative defaults where it is unreadable.
fn cache_sizes() -> (usize, usize, usize) {
    let (mut l1, mut l2, mut l3) = (0, 0, 0);
    for idx in 0..8 {
        let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{idx}");
        let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok();
        let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size"))
        else {
            continue;
        };
        let Some(bytes) = parse_size(size.trim()) else {
            continue;
        };
        match (level.trim(), kind.trim()) {
            ("1", "Data") | ("1", "Unified") => l1 = bytes,
            ("2", _) => l2 = bytes,
            ("3", _) => l3 = bytes,
            _ => {}
        }
    }
    (
        if l1 == 0 { 32 << 10 } else { l1 },
        if l2 == 0 { 512 << 10 } else { l2 },
        if l3 == 0 { 8 << 20 } else { l3 },
    )
}

fn parse_size(s: &str) -> Option<usize> {
    let (digits, mult) = match s.chars().last()? {
        'K' => (&s[..s.len() - 1], 1 << 10),
        'M' => (&s[..s.len() - 1], 1 << 20),
        'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    digits.parse::<usize>().ok().map(|d| d * mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> HardwareFingerprint {
        HardwareFingerprint::new(
            "x86_64",
            "AuthenticAMD",
            (26, 2, 1),
            "AMD EPYC",
            vec!["fma".into(), "avx2".into()],
            2,
            (48 << 10, 1 << 20, 32 << 20),
        )
    }

    #[test]
    fn id_is_a_stable_hash_of_the_canonical_form() {
        let a = sample();
        assert_eq!(a.id.len(), 16);
        assert!(a.id_is_consistent());
        assert_eq!(a.isa, vec!["avx2", "fma"], "flags are sorted");
        // The exact value is part of the on-disk contract: changing it orphans every database.
        assert_eq!(a.id, format!("{:016x}", fnv1a64(a.canonical().as_bytes())));
        let mut b = sample();
        b.cores = 4;
        assert!(!b.id_is_consistent());
        assert_ne!(b.compute_id(), a.id);
    }

    #[test]
    fn avxvnni_is_reported_only_without_avx512vnni_and_capped_like_the_others() {
        use crate::isa::Isa;
        let flags = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let client = flags(&["avx", "avx2", "avxvnni", "fma"]);
        assert_eq!(reported(client.clone(), Isa::Avx2), client);
        assert_eq!(reported(client, Isa::Portable), Vec::<String>::new());
        let server = flags(&["avx2", "avx512f", "avx512vnni", "avxvnni", "fma"]);
        assert_eq!(
            reported(server.clone(), Isa::Avx512),
            flags(&["avx2", "avx512f", "avx512vnni", "fma"]),
            "the flags (and so the id) of an AVX512_VNNI machine are those it had before"
        );
        assert_eq!(
            reported(server, Isa::Avx2),
            flags(&["avx2", "avxvnni", "fma"]),
            "capped at AVX2 it runs the AVX-VNNI kernels"
        );
    }

    #[test]
    fn arch_key_ignores_cores_caches_and_brand_but_not_the_isa() {
        let a = sample();
        assert_eq!(a.arch_key(), "x86_64/AuthenticAMD/26/2/avx2+fma");
        let mut b = a.with_cores(16);
        b.l2_bytes *= 2;
        b.brand = "AMD EPYC (other SKU)".into();
        b.stepping = 2;
        assert_eq!(a.arch_key(), b.arch_key());
        let mut c = a.clone();
        c.isa.push("avx512f".into());
        assert_ne!(a.arch_key(), c.arch_key());
        let mut d = a.clone();
        d.model = 3;
        assert_ne!(a.arch_key(), d.arch_key());
    }

    #[test]
    fn the_reference_machine_is_the_one_the_spaces_were_recorded_on() {
        assert_eq!(HardwareFingerprint::reference_zen3().id, "e328fcad30c0f803");
    }

    #[test]
    fn fnv_matches_known_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
    }

    #[test]
    fn current_machine_is_detected() {
        let fp = HardwareFingerprint::current();
        assert!(fp.cores >= 1);
        assert!(fp.l1d_bytes > 0 && fp.l2_bytes > 0 && fp.l3_bytes > 0);
        assert!(fp.id_is_consistent());
        assert!(!fp.summary().is_empty());
    }

    #[test]
    fn parses_sysfs_sizes() {
        assert_eq!(parse_size("32K"), Some(32 << 10));
        assert_eq!(parse_size("1024K"), Some(1 << 20));
        assert_eq!(parse_size("32M"), Some(32 << 20));
        assert_eq!(parse_size("junk"), None);
    }
}
