//! `--device cpu|cuda:N`: the flag shared by `tune`, `lookup`, `run` and `bench`, and what
//! it selects: the fingerprint records are stored under and looked up for, and the evaluator
//! that verifies and times candidates.
//!
//! On `cuda:N` the records live in the same database under the GPU's fingerprint row
//! ([`GpuFingerprint::hardware`](kernels::cuda::GpuFingerprint::hardware)); the runtime opened
//! for that row answers lookups with the same levels as on the CPU (`exact`, `same_arch`,
//! `nearest_shape`, `default`), from the CUDA families of the one registry. Without a driver
//! or a device each command stops with an error naming the cause, before touching the
//! database.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use kernels::cuda::Gpu;
use kernels::{Device, HardwareFingerprint};
use runner::cuda::OnGpu;
use runner::{Evaluator, InProcess};
use runtime::Runtime;

/// The device option.
#[derive(Args, Debug, Clone)]
pub struct DeviceArg {
    /// Where kernels run: `cpu`, or CUDA device `cuda:N` (the ordinal nvidia-smi shows).
    #[arg(long, value_name = "DEVICE", default_value = "cpu")]
    pub device: Device,
}

impl DeviceArg {
    /// The CUDA ordinal, or `None` for the CPU.
    pub fn cuda(&self) -> Option<usize> {
        match self.device {
            Device::Cpu => None,
            Device::Cuda(n) => Some(n),
        }
    }

    /// Opens the device: `None` for the CPU, the GPU for `cuda:N` (or why it cannot be used).
    pub fn open(&self) -> anyhow::Result<Option<Arc<Gpu>>> {
        self.cuda()
            .map(open_gpu)
            .transpose()
            .map(|g| g.map(Arc::new))
    }
}

/// Opens CUDA device `n`, or says why it cannot be used and what to do.
pub fn open_gpu(n: usize) -> anyhow::Result<Gpu> {
    Gpu::open(n).with_context(|| {
        format!("--device cuda:{n} cannot be used (run with --device cpu, or on a machine with an NVIDIA driver and GPU)")
    })
}

/// The fingerprint of the device: this CPU (at the thread count in force), or the GPU's row.
pub fn fingerprint(gpu: Option<&Arc<Gpu>>) -> HardwareFingerprint {
    match gpu {
        Some(g) => g.fingerprint().hardware(),
        None => HardwareFingerprint::current().clone(),
    }
}

/// The runtime serving the device's fingerprint from `db`.
pub fn runtime(db: &Path, gpu: Option<&Arc<Gpu>>) -> anyhow::Result<Runtime> {
    match gpu {
        None => super::open_runtime(db),
        Some(g) => Runtime::open_for(db, g.fingerprint().hardware())
            .with_context(|| format!("opening {}", db.display())),
    }
}

/// An in-process evaluator on the device (the CPU's, or the GPU's: CUDA events, L2 flush).
pub fn evaluator(gpu: Option<&Arc<Gpu>>) -> Box<dyn Evaluator> {
    match gpu {
        Some(g) => Box::new(OnGpu::on(g.clone())),
        None => Box::new(InProcess::new()),
    }
}

/// How the device is named in `--json` output: `cpu` or `cuda:N`.
pub fn name(gpu: Option<&Arc<Gpu>>) -> String {
    gpu.map_or_else(|| "cpu".into(), |g| format!("cuda:{}", g.ordinal()))
}

/// A one-line description of the device for progress messages.
pub fn describe(gpu: Option<&Arc<Gpu>>, hw: &HardwareFingerprint) -> String {
    match gpu {
        Some(g) => format!("{} {}", name(gpu), g.fingerprint().summary()),
        None => hw.brand.clone(),
    }
}
