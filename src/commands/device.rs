//! `--device cpu|cuda:N`: the flag shared by `tune`, `lookup`, `run` and `bench`, and what
//! those commands do on a CUDA device.
//!
//! On `cuda:N` the records live in the same database under the GPU's fingerprint row
//! ([`GpuFingerprint::hardware`](kernels::cuda::GpuFingerprint::hardware)); a lookup answers
//! `exact` (this GPU, driver and NVRTC), `same_arch` (another GPU of the same compute
//! capability) or `default` (the family's default config). Without a driver or a device each
//! command stops with an error naming the cause, before touching the database.

use std::path::Path;

use anyhow::{bail, Context};
use clap::Args;
use kernels::cuda::{Gpu, GpuFamily, GpuTask, GpuTiming};
use kernels::{Config, Device, HardwareFingerprint, Measurement, Status, Workload};
use serde_json::json;
use tuning_db::{Record, TuningDb};

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
}

/// Opens CUDA device `n`, or says why it cannot be used and what to do.
pub fn open_gpu(n: usize) -> anyhow::Result<Gpu> {
    Gpu::open(n).with_context(|| {
        format!("--device cuda:{n} cannot be used (run with --device cpu, or on a machine with an NVIDIA driver and GPU)")
    })
}

/// Where a GPU lookup's config came from.
pub enum GpuLevel {
    Exact(Record),
    SameArch(Record),
    Default,
}

impl GpuLevel {
    pub fn as_str(&self) -> &'static str {
        match self {
            GpuLevel::Exact(_) => "exact",
            GpuLevel::SameArch(_) => "same_arch",
            GpuLevel::Default => "default",
        }
    }

    fn record(&self) -> Option<&Record> {
        match self {
            GpuLevel::Exact(r) | GpuLevel::SameArch(r) => Some(r),
            GpuLevel::Default => None,
        }
    }
}

/// The config a GPU runs for a workload, and why.
pub struct GpuChoice {
    pub family: GpuFamily,
    pub config: Config,
    pub level: GpuLevel,
}

/// The GPU twin of the runtime's lookup: the database's best verified record for this GPU,
/// else the fastest of the GPUs with the same compute capability, else the family default.
pub fn choose(
    db: Option<&TuningDb>,
    w: &Workload,
    hw: &HardwareFingerprint,
    gpu: &Gpu,
) -> anyhow::Result<GpuChoice> {
    let family = GpuFamily::for_workload(w)?;
    if let Some(db) = db {
        if let Some(r) = db.best(&hw.id, w)? {
            return Ok(GpuChoice {
                family,
                config: r.config.clone(),
                level: GpuLevel::Exact(r),
            });
        }
        let mut same: Vec<Record> = Vec::new();
        for fp in db.fingerprints()? {
            if fp.id != hw.id && fp.arch_key() == hw.arch_key() {
                same.extend(db.best(&fp.id, w)?);
            }
        }
        if let Some(r) = same.into_iter().min_by(|a, b| {
            let t = |r: &Record| r.median_s().unwrap_or(f64::INFINITY);
            t(a).total_cmp(&t(b))
        }) {
            return Ok(GpuChoice {
                family,
                config: r.config.clone(),
                level: GpuLevel::SameArch(r),
            });
        }
    }
    Ok(GpuChoice {
        family,
        config: family.default_config(w, gpu.arch())?,
        level: GpuLevel::Default,
    })
}

/// `lookup --device cuda:N`.
pub fn lookup(
    db_path: &Path,
    workloads: &[Workload],
    n: usize,
    as_json: bool,
) -> anyhow::Result<()> {
    let gpu = open_gpu(n)?;
    let hw = gpu.fingerprint().hardware();
    let db = TuningDb::open_read_only(db_path)?;
    for w in workloads {
        let c = choose(Some(&db), w, &hw, &gpu)?;
        if as_json {
            super::print_json(&choice_json(w, &format!("cuda:{n}"), &c, &hw))?;
        } else {
            println!(
                "{w}: {} {} {} [{} on {}]",
                c.level.as_str(),
                c.family.name(),
                c.config,
                hw.id,
                gpu.fingerprint().summary()
            );
        }
    }
    Ok(())
}

fn choice_json(
    w: &Workload,
    device: &str,
    c: &GpuChoice,
    hw: &HardwareFingerprint,
) -> serde_json::Value {
    json!({
        "workload": w.key(),
        "dtype": w.dtype(),
        "device": device,
        "level": c.level.as_str(),
        "kernel": c.family.name(),
        "kernel_version": c.family.version(),
        "config": c.config,
        "fingerprint": hw.id,
        "source": c.level.record().map(|r| json!({
            "fingerprint": r.fingerprint_id,
            "trial_id": r.id,
            "median_s": r.median_s(),
        })),
    })
}

/// Verifies and times one config on the GPU; a failure is an error naming the config.
pub fn measure(
    task: &mut GpuTask,
    gpu: &Gpu,
    config: &Config,
    timing: &GpuTiming,
) -> anyhow::Result<Measurement> {
    let outcome = task.evaluate(gpu, config, timing);
    match (outcome.status, outcome.measurement) {
        (Status::Ok, Some(m)) => Ok(m),
        (status, _) => bail!(
            "{} {config} on {}: {status}: {}",
            task.family().name(),
            task.workload(),
            outcome.message.unwrap_or_default()
        ),
    }
}

/// `run --device cuda:N`: the chosen config, verified, then timed by the thorough protocol.
pub fn run(db_path: &Path, w: &Workload, n: usize, as_json: bool) -> anyhow::Result<()> {
    let gpu = open_gpu(n)?;
    let hw = gpu.fingerprint().hardware();
    let db = TuningDb::open_read_only(db_path)?;
    let c = choose(Some(&db), w, &hw, &gpu)?;
    let mut task = GpuTask::new(&gpu, w, 0xA0C0)?;
    let m = measure(&mut task, &gpu, &c.config, &GpuTiming::thorough())?;
    let gflops = m.gflops(w.flops());
    if as_json {
        super::print_json(&json!({
            "workload": w.key(),
            "device": format!("cuda:{n}"),
            "level": c.level.as_str(),
            "kernel": c.family.name(),
            "config": c.config,
            "median_s": m.median_s,
            "gflops": gflops,
            "spread": m.spread,
            "samples": m.samples.len(),
            "fingerprint": hw.id,
        }))?;
    } else {
        println!(
            "{w}: {:.3} ms median, {gflops:.1} GFLOP/s (±{:.1}% MAD, {} samples) via {} {} [{}] on {}",
            m.median_s * 1e3,
            m.spread * 100.0,
            m.samples.len(),
            c.family.name(),
            c.config,
            c.level.as_str(),
            gpu.fingerprint().summary()
        );
    }
    Ok(())
}
