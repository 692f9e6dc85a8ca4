//! A CUDA device in use: context and stream, its fingerprint, loaded kernels, timing.
//!
//! ## Timing protocol on the GPU
//!
//! The CPU protocol's shape (`runner::protocol`), measured with CUDA events:
//! 1. **Warm-up**: launch and synchronise until `warmup` has passed (at least once): module
//!    JIT, clocks, TLBs.
//! 2. **Samples**: each sample is one launch between two CUDA events on the stream. With
//!    `flush_l2`, a buffer of twice the L2 size is overwritten (a memset, ahead of the start
//!    event) before every sample, so no sample finds its operands in L2 from the one before.
//! 3. **Stopping**: at least `min_samples`; stop when the 95% confidence interval of the median
//!    is within ±`target_ci`, at `max_samples`, or once `max_time` has been spent.
//! 4. **Statistic**: [`Measurement::from_samples`] — median, spread (MAD ÷ median), every
//!    sample kept — the same as on the CPU.
//!
//! A kernel that faults (illegal address) leaves the CUDA context unusable: every later call
//! on this [`Gpu`] fails. Tuning runs each candidate in a worker process for that reason.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags, CUfunction_attribute};
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig};

use crate::measurement::{Measurement, Status};
use crate::space::Config;

use super::arch::Arch;
use super::fingerprint::{cuda_version_string, driver_version, GpuFingerprint};
use super::template::{LaunchDims, Template};
use super::CudaError;

/// Default dynamic shared memory a kernel may use without opting in.
const SMEM_WITHOUT_OPT_IN: u32 = 48 * 1024;

/// Parameters of the GPU timing protocol (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuTiming {
    /// How long to launch and synchronise before the first sample (at least one launch).
    pub warmup: Duration,
    /// Samples taken at least, whatever the confidence interval or the time spent (unless
    /// `max_samples` is smaller).
    pub min_samples: usize,
    /// Samples taken at most (at least 1).
    pub max_samples: usize,
    /// Time after which sampling stops once `min_samples` are taken (the warm-up not counted).
    pub max_time: Duration,
    /// Target half-width of the median's 95% confidence interval, relative (0.02 = ±2%).
    pub target_ci: f64,
    /// Overwrite a buffer larger than L2 before every sample.
    pub flush_l2: bool,
}

impl GpuTiming {
    /// For tuning: enough to rank candidates, cheap enough to try many.
    pub fn quick() -> Self {
        GpuTiming {
            warmup: Duration::from_millis(5),
            min_samples: 5,
            max_samples: 25,
            max_time: Duration::from_millis(400),
            target_ci: 0.03,
            flush_l2: true,
        }
    }

    /// For reporting and regression runs: tighter and longer.
    pub fn thorough() -> Self {
        GpuTiming {
            warmup: Duration::from_millis(50),
            min_samples: 11,
            max_samples: 101,
            max_time: Duration::from_secs(3),
            target_ci: 0.01,
            flush_l2: true,
        }
    }
}

/// How one candidate config ended on the GPU: a timing, or a failure kept as data.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuOutcome {
    /// How the candidate ended: [`Status::Ok`], [`Status::BuildFailed`], [`Status::RunFailed`]
    /// or [`Status::WrongResult`].
    pub status: Status,
    /// The timing (samples in seconds), for [`Status::Ok`] only.
    pub measurement: Option<Measurement>,
    /// The failure's text: for `build_failed`, the NVRTC log.
    pub message: Option<String>,
}

impl GpuOutcome {
    fn ok(m: Measurement) -> Self {
        GpuOutcome {
            status: Status::Ok,
            measurement: Some(m),
            message: None,
        }
    }

    fn failed(status: Status, e: &CudaError) -> Self {
        GpuOutcome {
            status,
            measurement: None,
            message: Some(e.to_string()),
        }
    }
}

/// A kernel compiled for this device and ready to launch.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The kernel's entry point in its loaded module.
    pub function: CudaFunction,
    /// Grid, block and dynamic shared memory of its launches.
    pub dims: LaunchDims,
    /// The config it was compiled from (its run-time arguments derive from it too).
    pub config: Config,
}

impl Loaded {
    /// The launch configuration cudarc takes.
    pub fn launch_config(&self) -> LaunchConfig {
        LaunchConfig {
            grid_dim: self.dims.grid,
            block_dim: self.dims.block,
            shared_mem_bytes: self.dims.smem_bytes,
        }
    }
}

/// One CUDA device, opened.
pub struct Gpu {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arch: Arch,
    fingerprint: GpuFingerprint,
    l2_bytes: usize,
    smem_opt_in: usize,
    blas: OnceLock<Result<CudaBlas, CudaError>>,
    functions: Mutex<HashMap<(&'static str, String), CudaFunction>>,
    flush: Mutex<Option<CudaSlice<u8>>>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("ordinal", &self.ordinal)
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

impl Gpu {
    /// Opens CUDA device `ordinal`, or says why it cannot: no driver library, no such device.
    pub fn open(ordinal: usize) -> Result<Gpu, CudaError> {
        let found = super::device_count()?;
        if ordinal >= found {
            return Err(CudaError::NoDevice { ordinal, found });
        }
        let ctx = CudaContext::new(ordinal).map_err(CudaError::driver("creating a context"))?;
        let attr = |a: CUdevice_attribute, what: &str| {
            ctx.attribute(a)
                .map_err(CudaError::driver(format!("reading {what}")))
        };
        let (major, minor) = ctx
            .compute_capability()
            .map_err(CudaError::driver("reading the compute capability"))?;
        let arch = Arch::new(major.max(0) as u32, minor.max(0) as u32);
        let sm_count = attr(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            "the SM count",
        )?;
        let l2_bytes = attr(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE,
            "the L2 size",
        )?;
        let smem_opt_in = attr(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            "the shared memory limit",
        )?;
        let name = ctx.name().map_err(CudaError::driver("reading the name"))?;
        let memory = ctx
            .total_mem()
            .map_err(CudaError::driver("reading the memory size"))?;
        let mut cuda = 0i32;
        // SAFETY: cuDriverGetVersion writes one int through a pointer to a live local; the
        // driver library is loaded and initialised (device_count succeeded above).
        let status = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut cuda) };
        status
            .result()
            .map_err(CudaError::driver("reading the driver's CUDA version"))?;
        let nvrtc = super::nvrtc_version()
            .map(|(a, b)| format!("{a}.{b}"))
            .unwrap_or_else(|_| "none".into());
        let fingerprint = GpuFingerprint::new(
            &name,
            arch,
            sm_count.max(0) as u32,
            memory as u64,
            &driver_version(),
            &cuda_version_string(cuda),
            &nvrtc,
        );
        let stream = ctx.default_stream();
        Ok(Gpu {
            ordinal,
            ctx,
            stream,
            arch,
            fingerprint,
            l2_bytes: l2_bytes.max(0) as usize,
            smem_opt_in: smem_opt_in.max(0) as usize,
            blas: OnceLock::new(),
            functions: Mutex::new(HashMap::new()),
            flush: Mutex::new(None),
        })
    }

    /// The CUDA device ordinal it was opened with.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device's compute capability: what templates are compiled for.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// The device's identity: name, compute capability, SM count, memory, driver, CUDA and
    /// NVRTC versions.
    pub fn fingerprint(&self) -> &GpuFingerprint {
        &self.fingerprint
    }

    /// The L2 cache size, in bytes, as the driver reports it.
    pub fn l2_bytes(&self) -> usize {
        self.l2_bytes
    }

    /// The device's CUDA context (cudarc's), for allocating and loading beyond this API.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every launch, copy and timing event of this `Gpu` goes to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Waits for all queued work; surfaces asynchronous launch errors.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.stream
            .synchronize()
            .map_err(CudaError::driver("waiting for the stream"))
    }

    /// Compiles `config` of `template` for this device (NVRTC, cached), loads it, and opts in
    /// to the shared memory it needs. Loaded functions are cached per source.
    pub fn load<T: Template>(
        &self,
        template: &T,
        shape: &T::Shape,
        config: &Config,
    ) -> Result<Loaded, CudaError> {
        let dims = template.launch_dims(shape, config)?;
        if dims.smem_bytes as usize > self.smem_opt_in {
            return Err(CudaError::Compile(super::CompileError::InvalidConfig {
                kernel: template.name().into(),
                config: config.to_json(),
                arch: self.arch,
                reason: format!(
                    "needs {} bytes of shared memory, the device allows {}",
                    dims.smem_bytes, self.smem_opt_in
                ),
            }));
        }
        let ptx = template.compile(shape, config, self.arch)?;
        let key = (template.entry(), template.source(shape, config)?);
        let mut functions = self.functions.lock().unwrap_or_else(|p| p.into_inner());
        let function = match functions.get(&key) {
            Some(f) => f.clone(),
            None => {
                let module = self
                    .ctx
                    .load_module((*ptx).clone())
                    .map_err(CudaError::driver(format!("loading {}", template.name())))?;
                let f = module
                    .load_function(template.entry())
                    .map_err(CudaError::driver(format!("finding {}", template.entry())))?;
                if dims.smem_bytes > SMEM_WITHOUT_OPT_IN {
                    f.set_attribute(
                        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        dims.smem_bytes as i32,
                    )
                    .map_err(CudaError::driver("opting in to shared memory"))?;
                }
                functions.insert(key, f.clone());
                f
            }
        };
        Ok(Loaded {
            function,
            dims,
            config: config.clone(),
        })
    }

    /// cuBLAS on this device's stream (the GEMM reference), loaded on first use.
    pub(crate) fn blas(&self) -> Result<&CudaBlas, CudaError> {
        self.blas
            .get_or_init(|| {
                // SAFETY: only dlopen()s the candidate names of libcublas and closes them.
                if !unsafe { cudarc::cublas::sys::is_culib_present() } {
                    return Err(CudaError::Cublas {
                        context: "loading cuBLAS".into(),
                        reason: format!(
                            "none of {} is on the loader's path",
                            super::lib_names("cublas")
                        ),
                    });
                }
                CudaBlas::new(self.stream.clone()).map_err(|e| CudaError::Cublas {
                    context: "creating a handle".into(),
                    reason: e.to_string(),
                })
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Overwrites a buffer of twice the L2 size (at least 8 MiB), evicting whatever the last
    /// kernel left there.
    pub fn flush_l2(&self) -> Result<(), CudaError> {
        let mut flush = self.flush.lock().unwrap_or_else(|p| p.into_inner());
        if flush.is_none() {
            let bytes = (2 * self.l2_bytes).max(8 << 20);
            *flush = Some(
                self.stream
                    .alloc_zeros::<u8>(bytes)
                    .map_err(CudaError::driver("allocating the L2 flush buffer"))?,
            );
        }
        let buf = flush.as_mut().expect("allocated above");
        self.stream
            .memset_zeros(buf)
            .map_err(CudaError::driver("flushing L2"))
    }

    /// Times `run` (which queues one call on [`stream`](Gpu::stream)) by `timing`.
    pub fn time(
        &self,
        timing: &GpuTiming,
        mut run: impl FnMut() -> Result<(), CudaError>,
    ) -> Result<Measurement, CudaError> {
        let warm = Instant::now();
        loop {
            run()?;
            self.synchronize()?;
            if warm.elapsed() >= timing.warmup {
                break;
            }
        }
        let started = Instant::now();
        let mut samples = Vec::with_capacity(timing.min_samples);
        loop {
            if timing.flush_l2 {
                self.flush_l2()?;
            }
            let event = || {
                self.stream
                    .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(CudaError::driver("recording an event"))
            };
            let start = event()?;
            run()?;
            let end = event()?;
            let ms = start
                .elapsed_ms(&end)
                .map_err(CudaError::driver("reading event times"))?;
            samples.push(ms as f64 * 1e-3);
            let n = samples.len();
            if n >= timing.max_samples.max(1)
                || (n >= timing.min_samples
                    && (crate::measurement::median_ci_halfwidth(&samples) <= timing.target_ci
                        || started.elapsed() >= timing.max_time))
            {
                break;
            }
        }
        Ok(Measurement::from_samples(samples))
    }
}

/// A verification case on the GPU: inputs and reference for one shape, run with any config.
pub(crate) trait GpuCase {
    /// Compiles and loads `config`.
    fn prepare(&self, gpu: &Gpu, config: &Config) -> Result<Loaded, CudaError>;
    /// Queues one call.
    fn launch(&mut self, gpu: &Gpu, loaded: &Loaded) -> Result<(), CudaError>;
    /// Compares the output of the last call with the reference.
    fn check(&self, gpu: &Gpu) -> Result<(), CudaError>;
}

/// Compile → run once → verify → time; each failure becomes an outcome with its message.
pub(crate) fn trial(
    gpu: &Gpu,
    case: &mut impl GpuCase,
    config: &Config,
    timing: &GpuTiming,
) -> GpuOutcome {
    let loaded = match case.prepare(gpu, config) {
        Ok(l) => l,
        Err(e) => return GpuOutcome::failed(Status::BuildFailed, &e),
    };
    if let Err(e) = case.launch(gpu, &loaded).and_then(|()| gpu.synchronize()) {
        return GpuOutcome::failed(Status::RunFailed, &e);
    }
    match case.check(gpu) {
        Ok(()) => {}
        Err(e @ CudaError::WrongResult(_)) => return GpuOutcome::failed(Status::WrongResult, &e),
        Err(e) => return GpuOutcome::failed(Status::RunFailed, &e),
    }
    match gpu.time(timing, || case.launch(gpu, &loaded)) {
        Ok(m) => GpuOutcome::ok(m),
        Err(e) => GpuOutcome::failed(Status::RunFailed, &e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_without_a_device_is_a_clear_error() {
        match Gpu::open(0) {
            Ok(gpu) => println!("CUDA device 0: {}", gpu.fingerprint().summary()),
            Err(e) => {
                let msg = e.to_string();
                println!("skipping: no CUDA device ({msg})");
                assert!(
                    msg.starts_with("no CUDA driver found") || msg.starts_with("no CUDA device 0"),
                    "{msg}"
                );
            }
        }
        match Gpu::open(4096) {
            Ok(_) => panic!("device 4096 should not exist"),
            Err(e) => assert!(
                matches!(
                    e,
                    CudaError::NoDriver { .. } | CudaError::NoDevice { ordinal: 4096, .. }
                ),
                "{e}"
            ),
        }
    }
}
