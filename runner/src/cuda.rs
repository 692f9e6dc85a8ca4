//! The CUDA evaluator: candidates of the CUDA families verified and timed on a GPU, behind the
//! same [`Evaluator`] interface the tuning loop drives on the CPU.
//!
//! ```no_run
//! use kernels::{default_for, Workload};
//! use runner::{cuda::OnGpu, Evaluator, Protocol};
//!
//! let w: Workload = "gemm:4096x4096x4096".parse()?;
//! let mut ev = OnGpu::open(0)?;                      // a clear error without driver or GPU
//! let (family, config) = default_for(&w, ev.fingerprint())?;
//! ev.setup(&w, 1)?;                                  // inputs on the device + reference
//! let e = ev.evaluate(family, &config, &Protocol::quick())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The measurement protocol is the device's: CUDA events around each call with an L2 flush
//! before every sample ([`GpuTiming`]), its sample counts and time limits taken from the
//! [`Protocol`]. Verification is against cuBLAS (GEMM) or the f64 reference (attention). A
//! compile error is a `build_failed` outcome holding the NVRTC log. Candidates run in this
//! process: a CUDA context cannot be shared with a worker, and NVRTC reports a bad config as
//! a compile error rather than a crash.

use std::sync::Arc;
use std::time::Instant;

use kernels::cuda::{Gpu, GpuOutcome, GpuTask, GpuTiming};
use kernels::{Config, HardwareFingerprint, Kernel, Measurement, Status, Workload};

use crate::evaluator::{Contender, EvalError, Evaluation, Evaluator};
use crate::protocol::Protocol;
use crate::Outcome;

/// Evaluates on CUDA device `N` (see the module docs).
pub struct OnGpu {
    gpu: Arc<Gpu>,
    hw: HardwareFingerprint,
    task: Option<GpuTask>,
}

impl OnGpu {
    /// Opens CUDA device `ordinal`.
    pub fn open(ordinal: usize) -> Result<OnGpu, EvalError> {
        let gpu = Gpu::open(ordinal).map_err(|e| EvalError::Device(e.to_string()))?;
        Ok(OnGpu::on(Arc::new(gpu)))
    }

    /// An evaluator on an opened device (several may share one: one per workload).
    pub fn on(gpu: Arc<Gpu>) -> OnGpu {
        let hw = gpu.fingerprint().hardware();
        OnGpu {
            gpu,
            hw,
            task: None,
        }
    }

    /// The GPU as a fingerprint row: what records are stored under and spaces built for.
    pub fn fingerprint(&self) -> &HardwareFingerprint {
        &self.hw
    }

    /// The device.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }
}

/// The device timing with `protocol`'s budget (the L2 is always flushed between samples).
pub fn timing(protocol: &Protocol) -> GpuTiming {
    GpuTiming {
        warmup: protocol.warmup,
        min_samples: protocol.min_samples,
        max_samples: protocol.max_samples,
        max_time: protocol.max_time,
        target_ci: protocol.target_ci,
        flush_l2: true,
    }
}

fn outcome(o: GpuOutcome) -> Outcome {
    Outcome {
        status: o.status,
        message: o.message,
        measurement: o.measurement,
        accuracy: None,
    }
}

impl Evaluator for OnGpu {
    fn isolation(&self) -> &'static str {
        "none"
    }

    /// Thread counts are not a GPU config's.
    fn cpu_share(&mut self, _threads: usize) -> Option<f64> {
        None
    }

    fn setup(&mut self, workload: &Workload, seed: u64) -> Result<(), EvalError> {
        let task = GpuTask::new(&self.gpu, workload, seed)
            .map_err(|e| EvalError::Device(format!("{workload} on {}: {e}", self.gpu.arch())))?;
        self.task = Some(task);
        Ok(())
    }

    fn evaluate(
        &mut self,
        kernel: &dyn Kernel,
        config: &Config,
        protocol: &Protocol,
    ) -> Result<Evaluation, EvalError> {
        let start = Instant::now();
        let timing = timing(protocol);
        let gpu = &self.gpu;
        let task = self.task.as_mut().ok_or(EvalError::NotSetUp)?;
        let family = kernels::Kernel::name(&task.family());
        let outcome = if kernel.name() == family {
            outcome(task.evaluate(gpu, config, &timing))
        } else {
            Outcome::failed(
                Status::BuildFailed,
                format!(
                    "{} is not the CUDA family of {}",
                    kernel.name(),
                    task.workload()
                ),
            )
        };
        Ok(Evaluation {
            outcome,
            elapsed: start.elapsed(),
        })
    }

    /// Re-times the finalists one after another, `rounds` samples each after a fresh
    /// verification: on an idle GPU samples agree to about a percent, so interleaving
    /// (which guards the CPU against frequency and co-tenant drift) buys little here.
    fn remeasure(
        &mut self,
        finalists: &[Contender<'_>],
        protocol: &Protocol,
        rounds: usize,
    ) -> Result<Vec<Measurement>, EvalError> {
        let mut timing = timing(protocol);
        timing.min_samples = rounds.max(1);
        timing.max_samples = timing.max_samples.max(timing.min_samples);
        let OnGpu { gpu, task, .. } = self;
        let task = task.as_mut().ok_or(EvalError::NotSetUp)?;
        if let Some(f) = finalists
            .iter()
            .find(|f| f.dtype != task.workload().dtype())
        {
            return Err(EvalError::Remeasure {
                kernel: f.kernel.name().into(),
                config: f.config.to_json(),
                status: Status::BuildFailed,
                message: format!(
                    "the GPU re-measures {}'s own element type only, not {}",
                    task.workload(),
                    f.dtype
                ),
            });
        }
        let mut out = Vec::with_capacity(finalists.len());
        for Contender { kernel, config, .. } in finalists {
            let o = task.evaluate(gpu, config, &timing);
            match (o.status, o.measurement) {
                (Status::Ok, Some(m)) => out.push(m),
                (status, _) => {
                    return Err(EvalError::Remeasure {
                        kernel: kernel.name().into(),
                        config: config.to_json(),
                        status,
                        message: o.message.unwrap_or_default(),
                    })
                }
            }
        }
        Ok(out)
    }
}
