//! The tuning loop on a CUDA device: the same ask/tell strategies, database and resumption as
//! [`tune`](crate::tune), over a CUDA template family's space.
//!
//! ```no_run
//! use kernels::cuda::Gpu;
//! use search::{gpu::tune_gpu, StrategyKind, TuneOptions};
//! use tuning_db::TuningDb;
//!
//! let db = TuningDb::open("tuning.db")?;
//! let gpu = Gpu::open(0)?;
//! let w = "gemm:4096x4096x4096".parse()?;
//! let opts = TuneOptions { budget: 64, strategy: StrategyKind::Evolutionary, ..TuneOptions::default() };
//! let summary = tune_gpu(&db, &w, &gpu, &opts, &mut |_event| {})?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Differences from the CPU loop, and why:
//! - candidates are configs of one [`GpuFamily`] (the one that runs the workload), checked and
//!   compiled by NVRTC per config; a compile error is a `build_failed` record holding the NVRTC
//!   log;
//! - timing is [`GpuTiming`]: CUDA events around each call with an L2 flush before every
//!   sample. Samples on an idle GPU agree to about a percent, so the winner is the fastest
//!   trial median and no interleaved re-measurement is run (no [`Decision`](crate::Decision));
//! - the cost model's features describe CPU kernels (micro-kernel shape, cache footprints), so
//!   `--strategy model` searches evolutionarily here instead of pretending to learn.
//!
//! Records go to the same database under the GPU's fingerprint row
//! ([`GpuFingerprint::hardware`](kernels::cuda::GpuFingerprint::hardware)).

use std::collections::HashSet;
use std::sync::Arc;

use kernels::cuda::{Arch, Gpu, GpuFamily, GpuOutcome, GpuTask, GpuTiming};
use kernels::{Config, HardwareFingerprint, Measurement, Status, Workload};
use tuning_db::{Record, TuningDb};

use crate::strategy::{Point, Prior, SearchContext, StrategyKind};
use crate::tuner::{cv, median_of, Event, SearchError, TuneOptions, TuneSummary};

/// Tunes `w` on `gpu`: verifies against cuBLAS (GEMM) or the f64 reference (attention), times
/// by [`GpuTiming::quick`], and writes every trial to `db` under the GPU's fingerprint.
pub fn tune_gpu(
    db: &TuningDb,
    w: &Workload,
    gpu: &Gpu,
    opts: &TuneOptions,
    on_event: &mut dyn FnMut(Event<'_>),
) -> Result<TuneSummary, SearchError> {
    let family = GpuFamily::for_workload(w).map_err(|e| SearchError::Unsupported(e.to_string()))?;
    let mut task = GpuTask::new(gpu, w, opts.seed ^ 0x5EED)
        .map_err(|e| SearchError::Unsupported(format!("{w} on {}: {e}", gpu.arch())))?;
    let hw = gpu.fingerprint().hardware();
    let timing = GpuTiming::quick();
    tune_gpu_with(
        db,
        w,
        &hw,
        family,
        gpu.arch(),
        opts,
        &mut |config| task.evaluate(gpu, config, &timing),
        on_event,
    )
}

/// [`tune_gpu`] with configs evaluated by `evaluate` (the device, in [`tune_gpu`]): the loop
/// itself — default first, strategy batches, resumption, one record per trial.
#[allow(clippy::too_many_arguments)]
pub fn tune_gpu_with(
    db: &TuningDb,
    w: &Workload,
    hw: &HardwareFingerprint,
    family: GpuFamily,
    arch: Arch,
    opts: &TuneOptions,
    evaluate: &mut dyn FnMut(&Config) -> GpuOutcome,
    on_event: &mut dyn FnMut(Event<'_>),
) -> Result<TuneSummary, SearchError> {
    let unsupported = |e: kernels::cuda::CudaError| SearchError::Unsupported(e.to_string());
    let space = family.space(w, arch).map_err(unsupported)?;
    let configs: Vec<Config> = space.iter_valid().collect();
    let default_config = family.default_config(w, arch).map_err(unsupported)?;
    db.upsert_fingerprint(hw)?;

    let (name, version) = (family.name(), family.version());
    let mut tried: HashSet<String> = db
        .tried_configs(&hw.id, w, name, version)?
        .into_iter()
        .collect();
    let history = db.trials(&hw.id, w)?;
    on_event(Event::Started {
        workload: w,
        space_size: configs.len(),
        budget: opts.budget,
        already_tried: tried.len(),
    });

    let record = |config: &Config, outcome: GpuOutcome| -> Record {
        match outcome.measurement {
            Some(m) if outcome.status == Status::Ok => Record::ok(
                &hw.id,
                *w,
                name,
                version,
                config.clone(),
                m,
                &opts.tool_version,
            ),
            _ => Record::failed(
                &hw.id,
                *w,
                name,
                version,
                config.clone(),
                outcome.status,
                outcome.message.unwrap_or_default(),
                &opts.tool_version,
            ),
        }
    };
    let mut timed: Vec<Measurement> = Vec::new();

    // The default first: the speedup's baseline. Already measured → its earlier record.
    let default_json = default_config.to_json();
    let earlier_default = history
        .iter()
        .rev()
        .find(|r| r.kernel == name && r.kernel_version == version && r.config == default_config)
        .cloned();
    let default = match earlier_default {
        Some(r) => r,
        None => {
            let mut rec = record(&default_config, evaluate(&default_config));
            rec.id = Some(db.insert(&rec)?);
            tried.insert(default_json.clone());
            timed.extend(rec.measurement.clone());
            rec
        }
    };
    on_event(Event::Default { record: &default });

    let kind = match opts.strategy {
        StrategyKind::Model { .. } => StrategyKind::Evolutionary,
        k => k,
    };
    let points: Vec<Point> = configs
        .iter()
        .map(|c| Point {
            kernel: name.to_string(),
            config: c.clone(),
        })
        .collect();
    let mut ctx = SearchContext::new(*w, hw.clone(), points, opts.seed);
    let own = Arc::new(hw.clone());
    ctx.history = db
        .trials(&hw.id, w)?
        .into_iter()
        .filter(|r| r.kernel == name && r.kernel_version == version)
        .filter_map(|r| {
            Some(Prior {
                workload: r.workload,
                hw: own.clone(),
                seconds: r.median_s()?,
                kernel: r.kernel,
                config: r.config,
                weight: 1.0,
            })
        })
        .collect();
    let mut strategy = kind.build(ctx);

    let (mut measured, mut resumed, mut failures) = (0, 0, 0);
    let mut done = tried.len().min(opts.budget);
    let mut best_gflops = db.best(&hw.id, w)?.and_then(|r| r.gflops);
    while done < opts.budget {
        let batch = strategy.ask(opts.batch.min(opts.budget - done).max(1));
        if batch.is_empty() {
            break;
        }
        let mut told = Vec::with_capacity(batch.len());
        for i in batch {
            let config = &configs[i];
            if !tried.insert(config.to_json()) {
                told.push((i, None));
                resumed += 1;
                continue;
            }
            let mut rec = record(config, evaluate(config));
            rec.id = Some(db.insert(&rec)?);
            measured += 1;
            done += 1;
            match &rec.measurement {
                Some(m) => timed.push(m.clone()),
                None => failures += 1,
            }
            if let Some(g) = rec.gflops {
                best_gflops = Some(best_gflops.map_or(g, |b: f64| b.max(g)));
            }
            told.push((i, rec.median_s()));
            on_event(Event::Trial {
                record: &rec,
                done,
                budget: opts.budget,
                best_gflops,
            });
        }
        done = done.max(tried.len().min(opts.budget));
        strategy.tell(&told);
    }

    Ok(TuneSummary {
        workload: *w,
        best: db.best(&hw.id, w)?,
        default,
        space_size: configs.len(),
        measured,
        resumed,
        failures,
        decision: None,
        timed: timed.len(),
        median_spread: median_of(timed.iter().map(|m| m.spread)),
        median_cv: median_of(timed.iter().filter_map(cv)),
        isolation: "none",
        timeout: None,
        restarts: 0,
        quarantined: 0,
    })
}

#[cfg(test)]
mod tests {
    use kernels::cuda::GpuFingerprint;

    use super::*;

    /// The loop over a synthetic device: a config's "time" is a fixed function of its knobs,
    /// one config fails to build. (The real device path runs in kernels' GPU tests.)
    fn fake(config: &Config) -> GpuOutcome {
        let json = config.to_json();
        let h = json
            .bytes()
            .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
        if h % 13 == 0 {
            return GpuOutcome {
                status: Status::BuildFailed,
                measurement: None,
                message: Some("nvrtc: error: planted".into()),
            };
        }
        let t = 1e-3 * (1.0 + (h % 1000) as f64 / 1000.0);
        GpuOutcome {
            status: Status::Ok,
            measurement: Some(Measurement::from_samples(vec![t, t * 1.01, t * 0.99])),
            message: None,
        }
    }

    #[test]
    fn records_every_trial_and_resumes_without_remeasuring() {
        let db = TuningDb::in_memory().unwrap();
        let hw = GpuFingerprint::new(
            "NVIDIA H100",
            Arch::SM90,
            132,
            80 << 30,
            "550",
            "12.4",
            "12.2",
        )
        .hardware();
        let w: Workload = "gemm:4096x4096x4096".parse().unwrap();
        let opts = TuneOptions {
            budget: 12,
            strategy: StrategyKind::DEFAULT,
            seed: 3,
            ..TuneOptions::default()
        };
        let mut calls = 0;
        let mut eval = |c: &Config| {
            calls += 1;
            fake(c)
        };
        let s = tune_gpu_with(
            &db,
            &w,
            &hw,
            GpuFamily::GemmF32,
            Arch::SM90,
            &opts,
            &mut eval,
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(calls, 12);
        assert_eq!(s.measured, 11, "the default plus 11 searched configs");
        let trials = db.trials(&hw.id, &w).unwrap();
        assert_eq!(trials.len(), 12);
        let best = s.best.expect("some config verified");
        assert_eq!(best.kernel, "cuda_gemm_f32");
        let fastest = trials
            .iter()
            .filter_map(|r| r.median_s())
            .fold(f64::INFINITY, f64::min);
        assert_eq!(best.median_s(), Some(fastest));
        assert_eq!(
            trials
                .iter()
                .filter(|r| r.status == Status::BuildFailed)
                .count(),
            s.failures + usize::from(s.default.status == Status::BuildFailed)
        );

        // The same job again: nothing new to measure.
        let mut again = |c: &Config| -> GpuOutcome { panic!("re-measured {c}") };
        let s2 = tune_gpu_with(
            &db,
            &w,
            &hw,
            GpuFamily::GemmF32,
            Arch::SM90,
            &opts,
            &mut again,
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(s2.measured, 0);
        assert_eq!(db.trials(&hw.id, &w).unwrap().len(), 12);

        // A bigger budget continues where the first job stopped.
        let more = TuneOptions { budget: 16, ..opts };
        let s3 = tune_gpu_with(
            &db,
            &w,
            &hw,
            GpuFamily::GemmF32,
            Arch::SM90,
            &more,
            &mut fake,
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(s3.measured, 4);
        assert_eq!(db.trials(&hw.id, &w).unwrap().len(), 16);
    }

    #[test]
    fn other_ops_are_refused_by_name() {
        let db = TuningDb::in_memory().unwrap();
        let hw =
            GpuFingerprint::new("x", Arch::SM80, 108, 40 << 30, "1", "12.2", "12.2").hardware();
        let w: Workload = "gemm_bias_relu:64x64x64".parse().unwrap();
        let e = tune_gpu_with(
            &db,
            &w,
            &hw,
            GpuFamily::GemmF32,
            Arch::SM80,
            &TuneOptions::default(),
            &mut fake,
            &mut |_| {},
        )
        .unwrap_err();
        assert!(e.to_string().contains("gemm_bias_relu"), "{e}");
    }
}
