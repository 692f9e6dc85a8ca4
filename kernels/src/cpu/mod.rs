//! CPU kernel families and the one place where the CPU's SIMD level is detected.

pub mod attention;
pub mod gemm;
pub mod peak;
#[cfg(feature = "planted-faults")]
pub mod planted;

use std::sync::OnceLock;

/// The SIMD instruction sets the CPU kernels are written for.
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
    /// The name used in config values (`avx2_6x16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// The best ISA this CPU runs, detected once per process.
    pub fn detect() -> Isa {
        static ISA: OnceLock<Isa> = OnceLock::new();
        *ISA.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx512f") {
                    return Isa::Avx512;
                }
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    return Isa::Avx2;
                }
            }
            Isa::Portable
        })
    }

    /// Whether this CPU can run code written for `self`.
    pub fn available(self) -> bool {
        self <= Isa::detect()
    }
}
