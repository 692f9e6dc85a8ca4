//! The CUDA template families as [`Kernel`]s of the one registry ([`FAMILIES`]), and one
//! workload's problem on a device to verify and time their configs on ([`GpuTask`]).
//!
//! ```no_run
//! use kernels::cuda::{Gpu, GpuTask, GpuTiming};
//! use kernels::{default_for, Workload};
//!
//! let w: Workload = "gemm:4096x4096x4096".parse()?;
//! let gpu = Gpu::open(0)?;                              // a clear error without driver or device
//! let hw = gpu.fingerprint().hardware();                // the GPU as a fingerprint row
//! let (family, config) = default_for(&w, &hw)?;         // cuda_gemm_f32 and its default
//! let mut task = GpuTask::new(&gpu, &w, 1)?;            // inputs on the device + reference
//! let outcome = task.evaluate(&gpu, &config, &GpuTiming::thorough()); // verify, then time
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A CUDA family's space and default depend on the GPU's compute capability, which its
//! fingerprint row carries ([`GpuFingerprint::hardware`], [`gpu_arch`]); for a CPU's
//! fingerprint the space is empty. The element type of the workload picks the template:
//! `gemm:…` → [`GemmF32`], `gemm:…:bf16` → [`GemmBf16`] (tensor cores),
//! `attention:…[:bf16]` → [`Attention::F32`] / [`Attention::BF16`]. The families are built
//! and run on a device by [`GpuTask`], not as host [`Executable`]s.

use crate::device::DeviceKind;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::hardware::HardwareFingerprint;
use crate::kernel::{Executable, Kernel};
use crate::space::{Config, Space};
use crate::workload::Workload;

use super::{
    Arch, Attention, AttentionProblem, AttentionShape, CudaError, GemmBf16, GemmDtype, GemmF32,
    GemmProblem, GemmShape, Gpu, GpuFingerprint, GpuOutcome, GpuTiming, Template,
};

/// The CUDA template family that runs a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GpuFamily {
    /// `gemm:MxNxK` → [`GemmF32`].
    GemmF32,
    /// `gemm:MxNxK:bf16` → [`GemmBf16`]: bf16 operands on tensor cores, f32 accumulation.
    GemmBf16,
    /// `attention:BxHxSxD[:causal]` → [`Attention::F32`].
    AttentionF32,
    /// `attention:BxHxSxD[:causal]:bf16` → [`Attention::BF16`].
    AttentionBf16,
}

/// The CUDA families, as the registry lists them ([`crate::registry()`]).
pub static FAMILIES: &[&dyn Kernel] = &[
    &GpuFamily::GemmF32,
    &GpuFamily::GemmBf16,
    &GpuFamily::AttentionF32,
    &GpuFamily::AttentionBf16,
];

impl GpuFamily {
    /// The family for `w` (its op and element type), or [`CudaError::Unsupported`] naming
    /// what CUDA runs.
    pub fn for_workload(w: &Workload) -> Result<GpuFamily, CudaError> {
        match (w, w.dtype()) {
            (Workload::Gemm { .. }, DType::F32) => Ok(GpuFamily::GemmF32),
            (Workload::Gemm { .. }, DType::Bf16) => Ok(GpuFamily::GemmBf16),
            (Workload::Attention { .. }, DType::F32) => Ok(GpuFamily::AttentionF32),
            (Workload::Attention { .. }, DType::Bf16) => Ok(GpuFamily::AttentionBf16),
            (other, dtype) => Err(CudaError::Unsupported(format!(
                "no CUDA kernel family runs '{}' {dtype} workloads yet (CUDA runs gemm and \
                 attention in f32 and bf16; use --device cpu)",
                other.op().name()
            ))),
        }
    }

    /// Whether the family can run `w` on `arch`.
    pub fn supports_on(self, w: &Workload, arch: Arch) -> bool {
        if GpuFamily::for_workload(w).ok() != Some(self) {
            return false;
        }
        match (self, shape(w)) {
            (GpuFamily::GemmF32, Ok(Shape::Gemm(s))) => GemmF32.supports(&s, arch),
            (GpuFamily::GemmBf16, Ok(Shape::Gemm(s))) => GemmBf16.supports(&s, arch),
            (GpuFamily::AttentionF32, Ok(Shape::Attention(s))) => Attention::F32.supports(&s, arch),
            (GpuFamily::AttentionBf16, Ok(Shape::Attention(s))) => {
                Attention::BF16.supports(&s, arch)
            }
            _ => false,
        }
    }

    /// The configs a search may try for `w` on `arch`.
    pub fn space_on(self, w: &Workload, arch: Arch) -> Result<Space, CudaError> {
        self.check(w, arch)?;
        Ok(match (self, shape(w)?) {
            (GpuFamily::GemmF32, Shape::Gemm(s)) => GemmF32.space(&s, arch),
            (GpuFamily::GemmBf16, Shape::Gemm(s)) => GemmBf16.space(&s, arch),
            (GpuFamily::AttentionF32, Shape::Attention(s)) => Attention::F32.space(&s, arch),
            (_, Shape::Attention(s)) => Attention::BF16.space(&s, arch),
            (_, Shape::Gemm(_)) => unreachable!("check() matched the family to the op"),
        })
    }

    /// A config valid for `w` on `arch`.
    pub fn default_on(self, w: &Workload, arch: Arch) -> Result<Config, CudaError> {
        self.check(w, arch)?;
        Ok(match (self, shape(w)?) {
            (GpuFamily::GemmF32, Shape::Gemm(s)) => GemmF32.default_config(&s, arch),
            (GpuFamily::GemmBf16, Shape::Gemm(s)) => GemmBf16.default_config(&s, arch),
            (GpuFamily::AttentionF32, Shape::Attention(s)) => {
                Attention::F32.default_config(&s, arch)
            }
            (_, Shape::Attention(s)) => Attention::BF16.default_config(&s, arch),
            (_, Shape::Gemm(_)) => unreachable!("check() matched the family to the op"),
        })
    }

    fn check(self, w: &Workload, arch: Arch) -> Result<(), CudaError> {
        if GpuFamily::for_workload(w)? != self {
            return Err(CudaError::Unsupported(format!(
                "{} does not run '{w}'",
                Kernel::name(&self)
            )));
        }
        if !self.supports_on(w, arch) {
            return Err(CudaError::Unsupported(format!(
                "{} cannot run '{w}' on {arch}",
                Kernel::name(&self)
            )));
        }
        Ok(())
    }
}

impl Kernel for GpuFamily {
    fn name(&self) -> &'static str {
        match self {
            GpuFamily::GemmF32 => GemmF32.name(),
            GpuFamily::GemmBf16 => GemmBf16.name(),
            GpuFamily::AttentionF32 => Attention::F32.name(),
            GpuFamily::AttentionBf16 => Attention::BF16.name(),
        }
    }

    fn version(&self) -> u32 {
        match self {
            GpuFamily::GemmF32 => GemmF32.version(),
            GpuFamily::GemmBf16 => GemmBf16.version(),
            GpuFamily::AttentionF32 => Attention::F32.version(),
            GpuFamily::AttentionBf16 => Attention::BF16.version(),
        }
    }

    fn device(&self) -> DeviceKind {
        DeviceKind::Cuda
    }

    fn dtypes(&self) -> &'static [DType] {
        match self {
            GpuFamily::GemmF32 | GpuFamily::AttentionF32 => &[DType::F32],
            GpuFamily::GemmBf16 | GpuFamily::AttentionBf16 => &[DType::Bf16],
        }
    }

    fn supports(&self, w: &Workload) -> bool {
        GpuFamily::for_workload(w).ok() == Some(*self) && shape(w).is_ok()
    }

    /// The family's space for the GPU `hw` describes; empty (every config refused) when the
    /// family cannot run `w` there or `hw` is not a GPU.
    fn space(&self, w: &Workload, hw: &HardwareFingerprint) -> Space {
        let arch = gpu_arch(hw);
        match arch.map(|a| self.space_on(w, a)) {
            Some(Ok(space)) => space,
            Some(Err(e)) => Space::unsatisfiable(&e.to_string()),
            None => Space::unsatisfiable(&format!(
                "{} runs on a CUDA GPU, {} is not one",
                self.name(),
                hw.id
            )),
        }
    }

    /// The default for the GPU `hw` describes; an empty config (which no space accepts) when
    /// there is none.
    fn default_config(&self, w: &Workload, hw: &HardwareFingerprint) -> Config {
        gpu_arch(hw)
            .and_then(|arch| self.default_on(w, arch).ok())
            .unwrap_or_default()
    }

    /// CUDA families run on a device through [`GpuTask`], not as host executables.
    fn build(&self, w: &Workload, _: &Config) -> Result<Box<dyn Executable>> {
        Err(Error::DeviceOnly {
            kernel: self.name().into(),
            workload: w.key(),
        })
    }

    /// [`build`](Kernel::build)'s answer, once `w` is one it serves: there is no host
    /// executable to prepare.
    fn prepare(&self, w: &Workload, c: &Config) -> Result<Box<dyn Executable>> {
        self.serves(w)?;
        self.build(w, c)
    }
}

/// The compute capability of a GPU fingerprint row ([`GpuFingerprint::hardware`]); `None` for
/// a CPU's fingerprint.
pub fn gpu_arch(hw: &HardwareFingerprint) -> Option<Arch> {
    (hw.arch == "cuda").then(|| Arch::new(hw.family, hw.model))
}

enum Shape {
    Gemm(GemmShape),
    Attention(AttentionShape),
}

fn shape(w: &Workload) -> Result<Shape, CudaError> {
    match *w {
        Workload::Gemm { m, n, k, .. } => Ok(Shape::Gemm(GemmShape::new(m, n, k)?)),
        Workload::Attention {
            b, h, s, d, causal, ..
        } => Ok(Shape::Attention(AttentionShape::new(
            b, h, s, s, d, causal,
        )?)),
        _ => GpuFamily::for_workload(w).map(|_| unreachable!("for_workload rejects other ops")),
    }
}

enum Problem {
    Gemm(GemmProblem),
    Attention(AttentionProblem),
}

/// One workload's inputs on the device and its reference output (cuBLAS for GEMM, the f64
/// CPU reference for attention): every config is verified against it, then timed.
pub struct GpuTask {
    workload: Workload,
    family: GpuFamily,
    problem: Problem,
}

impl GpuTask {
    /// Random inputs in `[-1, 1)` from `seed`, uploaded, and the reference computed.
    pub fn new(gpu: &Gpu, w: &Workload, seed: u64) -> Result<GpuTask, CudaError> {
        let family = GpuFamily::for_workload(w)?;
        family.check(w, gpu.arch())?;
        let bf16 = w.dtype() == DType::Bf16;
        let problem = match shape(w)? {
            Shape::Gemm(s) => {
                let dtype = if bf16 {
                    GemmDtype::Bf16
                } else {
                    GemmDtype::F32
                };
                Problem::Gemm(GemmProblem::new(gpu, s, dtype, seed)?)
            }
            Shape::Attention(s) => {
                let template = if bf16 {
                    Attention::BF16
                } else {
                    Attention::F32
                };
                Problem::Attention(AttentionProblem::new(gpu, s, template, seed)?)
            }
        };
        Ok(GpuTask {
            workload: *w,
            family,
            problem,
        })
    }

    /// The workload the task's inputs are for.
    pub fn workload(&self) -> Workload {
        self.workload
    }

    /// The family that runs the workload.
    pub fn family(&self) -> GpuFamily {
        self.family
    }

    /// Compiles (cached), runs once, verifies, then times `config` by `timing`. Every failure
    /// is an outcome with its status and message (for `build_failed`, the NVRTC log).
    pub fn evaluate(&mut self, gpu: &Gpu, config: &Config, timing: &GpuTiming) -> GpuOutcome {
        match &mut self.problem {
            Problem::Gemm(p) => p.evaluate(gpu, config, timing),
            Problem::Attention(p) => p.evaluate(gpu, config, timing),
        }
    }
}

impl GpuFingerprint {
    /// This GPU as a row of the tuning database's `fingerprints` table, so GPU records live
    /// beside CPU ones and every database command (export, merge, verify, diff) handles them:
    /// `arch` `cuda`, `vendor` `NVIDIA`, `family.model` the compute capability, `isa` the
    /// `sm_XY` arch, `cores` the SM count, and the name, memory, driver, CUDA and NVRTC
    /// versions in `brand`. Its `arch_key` is `cuda/NVIDIA/9/0/sm_90`, so the runtime's
    /// `same_arch` level matches GPUs of one compute capability, whatever their driver.
    pub fn hardware(&self) -> HardwareFingerprint {
        HardwareFingerprint::new(
            "cuda",
            "NVIDIA",
            (
                self.compute_capability.major,
                self.compute_capability.minor,
                0,
            ),
            &self.summary(),
            vec![self.compute_capability.to_string()],
            self.sm_count as usize,
            (0, 0, 0),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100() -> HardwareFingerprint {
        GpuFingerprint::new(
            "NVIDIA H100 80GB HBM3",
            Arch::SM90,
            132,
            80 << 30,
            "550.54.15",
            "12.4",
            "12.2",
        )
        .hardware()
    }

    #[test]
    fn workloads_map_to_registered_families_without_a_gpu() {
        let hw = h100();
        for (text, f) in [
            ("gemm:4096x4096x4096", GpuFamily::GemmF32),
            ("gemm:4096x4096x4096:bf16", GpuFamily::GemmBf16),
            ("attention:1x12x512x64:causal", GpuFamily::AttentionF32),
            (
                "attention:1x12x512x64:causal:bf16",
                GpuFamily::AttentionBf16,
            ),
        ] {
            let w: Workload = text.parse().unwrap();
            assert_eq!(GpuFamily::for_workload(&w).unwrap(), f);
            for arch in Arch::CI {
                let space = f.space_on(&w, arch).unwrap();
                let default = f.default_on(&w, arch).unwrap();
                space.check(&default).unwrap();
                assert!(space.iter_valid().count() > 1);
            }
            // The same through the one registry, for the GPU's fingerprint row.
            assert_eq!(crate::kernel(f.name()).unwrap().name(), f.name());
            assert_eq!(
                crate::kernels_for(&w, &hw)
                    .iter()
                    .map(|k| k.name())
                    .collect::<Vec<_>>(),
                [f.name()]
            );
            let (k, c) = crate::default_for(&w, &hw).unwrap();
            assert_eq!(
                (k.name(), &c),
                (f.name(), &f.default_on(&w, Arch::SM90).unwrap())
            );
            assert!(k.config_fits(&w, &hw, &c));
            // A CPU fingerprint gets an empty space, and no CUDA family.
            let cpu = crate::HardwareFingerprint::current();
            assert!(k.space(&w, cpu).check(&c).is_err());
            assert!(crate::kernels_for(&w, cpu)
                .iter()
                .all(|k| k.device() == DeviceKind::Cpu));
            assert!(matches!(k.prepare(&w, &c), Err(Error::DeviceOnly { .. })));
        }
        let fused: Workload = "gemm_bias_gelu:128x3072x768".parse().unwrap();
        let e = GpuFamily::for_workload(&fused).unwrap_err().to_string();
        assert!(
            e.contains("gemm_bias_gelu") && e.contains("--device cpu"),
            "{e}"
        );
        let e = crate::default_for(&fused, &hw)
            .err()
            .expect("no CUDA fused epilogue")
            .to_string();
        assert!(
            e.contains("gemm_bias_gelu") && e.contains("--device cpu"),
            "{e}"
        );
        let attn: Workload = "attention:1x12x512x64".parse().unwrap();
        assert!(GpuFamily::GemmF32.space_on(&attn, Arch::SM90).is_err());
        assert!(crate::default_for(&"gemm:8x8x8:i8".parse().unwrap(), &hw).is_err());
    }

    #[test]
    fn a_gpu_is_a_fingerprint_row_with_its_own_arch_key() {
        let fp = GpuFingerprint::new(
            "NVIDIA H100 80GB HBM3",
            Arch::SM90,
            132,
            80 << 30,
            "550.54.15",
            "12.4",
            "12.2",
        );
        let hw = fp.hardware();
        assert_eq!(hw, h100());
        assert!(hw.id_is_consistent());
        assert_eq!(hw.arch_key(), "cuda/NVIDIA/9/0/sm_90");
        assert_eq!(hw.cores, 132);
        assert_eq!(gpu_arch(&hw), Some(Arch::SM90));
        assert_eq!(gpu_arch(crate::HardwareFingerprint::current()), None);
        let w: Workload = "gemm:256x256x256".parse().unwrap();
        let good = GpuFamily::GemmF32.default_on(&w, Arch::SM90).unwrap();
        let check = |c: &Config, hw: &HardwareFingerprint| {
            crate::registry::check_record("cuda_gemm_f32", 1, &w, c, hw).map(|_| ())
        };
        check(&good, &hw).unwrap();
        let mut bad = good.clone();
        bad.set("bm", 3i64);
        assert!(check(&bad, &hw).is_err());
        let on_cpu = check(&good, crate::HardwareFingerprint::current()).unwrap_err();
        assert!(on_cpu.contains("runs on cuda"), "{on_cpu}");
        assert!(hw.brand.contains("H100") && hw.brand.contains("550.54.15"));
        let newer = GpuFingerprint::new(
            "NVIDIA H100 80GB HBM3",
            Arch::SM90,
            132,
            80 << 30,
            "560.1",
            "12.6",
            "12.2",
        );
        assert_ne!(newer.hardware().id, hw.id);
        assert_eq!(newer.hardware().arch_key(), hw.arch_key());
    }
}
