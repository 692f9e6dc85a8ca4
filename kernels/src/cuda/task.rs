//! Workloads on a CUDA device: which template family runs a [`Workload`], that family's space
//! and default for the device's arch, and one problem instance to verify and time configs on.
//!
//! ```no_run
//! use kernels::cuda::{Gpu, GpuFamily, GpuTask, GpuTiming};
//! use kernels::Workload;
//!
//! let w: Workload = "gemm:4096x4096x4096".parse()?;
//! let family = GpuFamily::for_workload(&w)?;            // cuda_gemm_f32; no GPU needed
//! let gpu = Gpu::open(0)?;                              // a clear error without driver or device
//! let config = family.default_config(&w, gpu.arch())?;
//! let mut task = GpuTask::new(&gpu, &w, 1)?;            // inputs on the device + reference
//! let outcome = task.evaluate(&gpu, &config, &GpuTiming::thorough()); // verify, then time
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! This is the one seam between the device-independent vocabulary and the CUDA families: the
//! CLI's `--device cuda:N` and the GPU tuning loop (`search::gpu`) go through it. Workload
//! strings carry no element type, so `gemm:…` and `attention:…` map to the f32 families
//! ([`GemmF32`], [`Attention::F32`]); the bf16 families are reached through their own
//! [`GemmProblem`] / [`AttentionProblem`] API.

use crate::hardware::HardwareFingerprint;
use crate::space::{Config, Space};
use crate::workload::Workload;

use super::{
    Arch, Attention, AttentionProblem, AttentionShape, CudaError, GemmDtype, GemmF32, GemmProblem,
    GemmShape, Gpu, GpuFingerprint, GpuOutcome, GpuTiming, Template,
};

/// The CUDA template family that runs a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GpuFamily {
    /// `gemm:MxNxK` → [`GemmF32`].
    GemmF32,
    /// `attention:BxHxSxD[:causal]` → [`Attention::F32`].
    AttentionF32,
}

impl GpuFamily {
    /// Every family, in the order the CLI lists them.
    pub const ALL: [GpuFamily; 2] = [GpuFamily::GemmF32, GpuFamily::AttentionF32];

    /// The family for `w`, or [`CudaError::Unsupported`] naming the ops CUDA runs.
    pub fn for_workload(w: &Workload) -> Result<GpuFamily, CudaError> {
        match w {
            Workload::Gemm { .. } => Ok(GpuFamily::GemmF32),
            Workload::Attention { .. } => Ok(GpuFamily::AttentionF32),
            other => Err(CudaError::Unsupported(format!(
                "no CUDA kernel family runs '{}' workloads yet (CUDA runs gemm and attention; \
                 use --device cpu)",
                other.op().name()
            ))),
        }
    }

    /// The family whose stored name is `name`.
    pub fn by_name(name: &str) -> Option<GpuFamily> {
        GpuFamily::ALL.into_iter().find(|f| f.name() == name)
    }

    /// Stable name, as stored in the database.
    pub fn name(self) -> &'static str {
        match self {
            GpuFamily::GemmF32 => GemmF32.name(),
            GpuFamily::AttentionF32 => Attention::F32.name(),
        }
    }

    /// The template's version (records of other versions are stale).
    pub fn version(self) -> u32 {
        match self {
            GpuFamily::GemmF32 => GemmF32.version(),
            GpuFamily::AttentionF32 => Attention::F32.version(),
        }
    }

    /// Whether the family can run `w` on `arch`.
    pub fn supports(self, w: &Workload, arch: Arch) -> bool {
        match (self, shape(w)) {
            (GpuFamily::GemmF32, Ok(Shape::Gemm(s))) => GemmF32.supports(&s, arch),
            (GpuFamily::AttentionF32, Ok(Shape::Attention(s))) => Attention::F32.supports(&s, arch),
            _ => false,
        }
    }

    /// The configs a search may try for `w` on `arch`.
    pub fn space(self, w: &Workload, arch: Arch) -> Result<Space, CudaError> {
        self.check(w, arch)?;
        Ok(match shape(w)? {
            Shape::Gemm(s) => GemmF32.space(&s, arch),
            Shape::Attention(s) => Attention::F32.space(&s, arch),
        })
    }

    /// A config valid for `w` on `arch`.
    pub fn default_config(self, w: &Workload, arch: Arch) -> Result<Config, CudaError> {
        self.check(w, arch)?;
        Ok(match shape(w)? {
            Shape::Gemm(s) => GemmF32.default_config(&s, arch),
            Shape::Attention(s) => Attention::F32.default_config(&s, arch),
        })
    }

    /// Whether a stored `config` of this family fits `w` on the GPU that `hw` describes (a row
    /// made by [`GpuFingerprint::hardware`]): the tuning database's check before it serves a
    /// record, the GPU twin of checking a CPU family's space.
    pub fn check_config(
        self,
        w: &Workload,
        config: &Config,
        hw: &HardwareFingerprint,
    ) -> Result<(), String> {
        let arch = gpu_arch(hw)
            .ok_or_else(|| format!("{} is a CUDA family, {} is not a GPU", self.name(), hw.id))?;
        let space = self.space(w, arch).map_err(|e| e.to_string())?;
        space.check(config).map_err(|e| e.to_string())
    }

    fn check(self, w: &Workload, arch: Arch) -> Result<(), CudaError> {
        if GpuFamily::for_workload(w)? != self {
            return Err(CudaError::Unsupported(format!(
                "{} does not run '{w}'",
                self.name()
            )));
        }
        if !self.supports(w, arch) {
            return Err(CudaError::Unsupported(format!(
                "{} cannot run '{w}' on {arch}",
                self.name()
            )));
        }
        Ok(())
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
        let problem = match shape(w)? {
            Shape::Gemm(s) => Problem::Gemm(GemmProblem::new(gpu, s, GemmDtype::F32, seed)?),
            Shape::Attention(s) => {
                Problem::Attention(AttentionProblem::new(gpu, s, Attention::F32, seed)?)
            }
        };
        Ok(GpuTask {
            workload: *w,
            family,
            problem,
        })
    }

    pub fn workload(&self) -> Workload {
        self.workload
    }

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

    #[test]
    fn workloads_map_to_families_without_a_gpu() {
        let gemm: Workload = "gemm:4096x4096x4096".parse().unwrap();
        let attn: Workload = "attention:1x12x512x64:causal".parse().unwrap();
        assert_eq!(GpuFamily::for_workload(&gemm).unwrap(), GpuFamily::GemmF32);
        assert_eq!(
            GpuFamily::for_workload(&attn).unwrap(),
            GpuFamily::AttentionF32
        );
        for (w, f) in [(gemm, GpuFamily::GemmF32), (attn, GpuFamily::AttentionF32)] {
            for arch in Arch::CI {
                let space = f.space(&w, arch).unwrap();
                let default = f.default_config(&w, arch).unwrap();
                space.check(&default).unwrap();
                assert!(space.iter_valid().count() > 1);
            }
            assert_eq!(GpuFamily::by_name(f.name()), Some(f));
        }
        let fused: Workload = "gemm_bias_gelu:128x3072x768".parse().unwrap();
        let e = GpuFamily::for_workload(&fused).unwrap_err().to_string();
        assert!(
            e.contains("gemm_bias_gelu") && e.contains("--device cpu"),
            "{e}"
        );
        assert!(GpuFamily::GemmF32.space(&attn, Arch::SM90).is_err());
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
        assert!(hw.id_is_consistent());
        assert_eq!(hw.arch_key(), "cuda/NVIDIA/9/0/sm_90");
        assert_eq!(hw.cores, 132);
        assert_eq!(gpu_arch(&hw), Some(Arch::SM90));
        assert_eq!(gpu_arch(crate::HardwareFingerprint::current()), None);
        let w: Workload = "gemm:256x256x256".parse().unwrap();
        let good = GpuFamily::GemmF32.default_config(&w, Arch::SM90).unwrap();
        GpuFamily::GemmF32.check_config(&w, &good, &hw).unwrap();
        let mut bad = good.clone();
        bad.set("bm", 3i64);
        assert!(GpuFamily::GemmF32.check_config(&w, &bad, &hw).is_err());
        assert!(GpuFamily::GemmF32
            .check_config(&w, &good, crate::HardwareFingerprint::current())
            .unwrap_err()
            .contains("not a GPU"));
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
