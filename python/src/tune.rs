//! `autokernel.tune`: the CLI's tuning job from Python (the same loop, progress bar and JSON
//! result), and the worker process it measures candidates in.

use std::path::{Path, PathBuf};

use kernels::{DeviceKind, HardwareFingerprint, Kernel, Workload};
use pyo3::exceptions::{PyRuntimeWarning, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyString;
use runner::{Evaluator, InProcess, Isolated, WorkerSpec};
use search::{StrategyKind, TuneOptions, INITIAL_TIMEOUT};
use tuning_db::TuningDb;

use crate::args::{int_in, positive, IntArg, PathArg, Real};
use crate::errors::{kernel_err, other_err};
use crate::threads::Threads;

/// The workload strings of `workloads` (one string, or an iterable of strings), parsed.
fn parse_workloads(workloads: &Bound<'_, PyAny>) -> PyResult<Vec<Workload>> {
    let names: Vec<String> = if let Ok(s) = workloads.cast::<PyString>() {
        vec![s.to_string()]
    } else {
        workloads
            .try_iter()
            .map_err(|_| {
                PyTypeError::new_err("workloads: expected a workload string or an iterable of them")
            })?
            .map(|item| item?.extract::<String>())
            .collect::<PyResult<_>>()?
    };
    let mut out: Vec<Workload> = Vec::new();
    for name in names {
        let w: Workload = name.parse().map_err(kernel_err)?;
        if !out.contains(&w) {
            out.push(w);
        }
    }
    if out.is_empty() {
        return Err(PyValueError::new_err(
            "workloads: give at least one workload",
        ));
    }
    Ok(out)
}

/// The workloads to tune for `precision` (a comma-separated list as the CLI's `--precision`:
/// 'f32', 'bf16', 'int8', 'auto' = all three; None: 'f32'): each f32 workload once per element
/// type a family serves on the CPU.
fn with_precision(ws: Vec<Workload>, precision: Option<&str>) -> PyResult<Vec<Workload>> {
    let dtypes = search::precision::parse_precisions(precision.unwrap_or("f32"))
        .map_err(|e| PyValueError::new_err(format!("precision: {e}")))?;
    let (out, _skipped) = search::precision::with_precisions(&ws, &dtypes, DeviceKind::Cpu);
    Ok(out)
}

/// Where candidates run: `Some(spec)` of a watched worker process (this Python interpreter
/// serving the worker protocol at the fingerprint's thread count), `None` for this process.
fn worker_spec(
    py: Python<'_>,
    isolation: &str,
    hw: &HardwareFingerprint,
) -> PyResult<Option<WorkerSpec>> {
    match isolation {
        "none" => Ok(None),
        "process" => {
            let sys = py.import("sys")?;
            let exe: PathBuf = sys.getattr("executable")?.extract()?;
            let path: Vec<String> = sys.getattr("path")?.extract()?;
            // Ctrl-C at a terminal reaches the worker too: the tuner (which stops the job)
            // ends it, not the signal, so a measurement in flight is not recorded as a crash.
            let code = "import signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); from autokernel import _native; _native._serve_worker(int(sys.argv[1]))";
            let mut spec = WorkerSpec::new(exe, ["-c", code, &hw.cores.to_string()]);
            let path: Vec<String> = path.into_iter().filter(|p| !p.is_empty()).collect();
            let joined = std::env::join_paths(path).map_err(other_err)?;
            spec.env.push(("PYTHONPATH".into(), joined));
            spec.fingerprint = Some(hw.id.clone());
            spec.mem_limit_bytes = Some(runner::DEFAULT_MEM_LIMIT_MB << 20);
            Ok(Some(spec))
        }
        other => Err(PyValueError::new_err(format!(
            "isolation='{other}': expected 'process' or 'none'"
        ))),
    }
}

/// Tunes each workload on this machine into the database `db` (created if missing) and
/// returns one dict per workload tuned, in order: the fields of `autokernel tune --json`
/// (workload, kernel, config, median_s, gflops, speedup_vs_default, trials, failures,
/// winner_reason, warnings, ...). A workload given twice is tuned once; with several
/// precisions, each f32 workload is tuned (and reported) once per element type — match
/// results to inputs by their 'workload' field. Ctrl-C (in the main thread, where Python
/// handles signals) stops the job before its next measurement and raises KeyboardInterrupt;
/// every trial measured so far is in `db`.
/// Each of a result's `warnings` (the machine's speed moved during the run, or other work
/// held the cores while thread counts were compared: re-tune on a quiet machine) is also
/// raised as a `RuntimeWarning`, after the database was written (under
/// `warnings.simplefilter("error")` the call raises, and the results are only in `db`).
///
/// workloads: a workload string ('gemm:128x768x768', 'gemm_bias_gelu:128x3072x768',
///     'attention:1x12x128x64') or an iterable of them (e.g. autokernel.torch.workloads()).
/// db: the tuning database (a str, bytes or os.PathLike path; created if missing).
/// budget: distinct configs to have tried per workload, counting those already in the
///     database (re-running resumes).
/// threads: threads to tune for (None: all CPUs); part of the hardware fingerprint.
/// precision: element types to tune each f32 workload in, comma-separated as the CLI's
///     `--precision`: 'f32' (default), 'bf16', 'int8', 'auto' (all three); types no kernel
///     family serves for a workload are left out; workloads with a suffix ('…:i8') as given.
/// strategy: 'model' (default), 'model-notransfer', 'model-linear',
///     'model-linear-notransfer', 'evolutionary', 'annealing', 'random' or 'exhaustive'.
/// seed: seed of the strategy and of the test inputs (the CLI's `--seed`).
/// isolation: 'process' (candidates run in a watched worker: a crash is recorded, not
///     fatal) or 'none' (in this process).
/// finalists: top configs re-measured interleaved before the winner is declared (0: none,
///     the fastest trial wins). With several precisions, the job then re-measures each
///     shape's precision winners side by side, in one set of interleaved rounds: the medians
///     the 'auto' policy compares (`Runtime.lookup(...)['precisions']` shows them).
/// timeout_s: time limit per candidate in seconds, from 0.1 (None: max(2, 50 × the default
///     config's evaluation time)); needs isolation='process'.
/// progress: draw the CLI's progress bar on stderr (when it is a terminal).
/// retry_failed: measure again the configs whose latest trial crashed, timed out or ran
///     out of memory (quarantined: otherwise never re-run), as the CLI's `--retry-failed`.
#[pyfunction]
#[pyo3(
    text_signature = "(workloads, db='tuning.db', budget=32, threads=None, precision=None, strategy='model', seed=0, isolation='process', finalists=3, timeout_s=None, progress=True, retry_failed=False)"
)]
#[pyo3(signature = (workloads, db=PathArg(PathBuf::from("tuning.db")), budget=IntArg::of(32), threads=None, precision=None, strategy="model", seed=IntArg::of(0), isolation="process", finalists=IntArg::of(3), timeout_s=None, progress=true, retry_failed=false))]
#[allow(clippy::too_many_arguments)]
pub fn tune<'py>(
    py: Python<'py>,
    workloads: &Bound<'py, PyAny>,
    db: PathArg,
    budget: IntArg,
    threads: Option<IntArg>,
    precision: Option<&str>,
    strategy: &str,
    seed: IntArg,
    isolation: &str,
    finalists: IntArg,
    timeout_s: Option<Real>,
    progress: bool,
    retry_failed: bool,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let workloads = with_precision(parse_workloads(workloads)?, precision)?;
    let db = db.0;
    let budget = positive("budget", budget)?;
    let seed = int_in("seed", seed, 0, u64::MAX)?;
    let finalists = int_in("finalists", finalists, 0, usize::MAX)?;
    let strategy: StrategyKind = strategy
        .parse()
        .map_err(|e: search::UnknownStrategy| PyValueError::new_err(e.to_string()))?;
    let timeout =
        TuneOptions::timeout_from_secs(timeout_s.map(|t| t.get("timeout_s")).transpose()?)
            .map_err(|e| PyValueError::new_err(format!("timeout_s {e}")))?;
    let (pool, hw) = Threads::new(threads)?;
    for w in &workloads {
        kernels::registry::check_runs_on(w, DeviceKind::Cpu).map_err(kernel_err)?;
        kernels::default_for(w, &hw).map_err(kernel_err)?;
    }
    let spec = worker_spec(py, isolation, &hw)?;
    if spec.is_none() && retry_failed {
        return Err(PyValueError::new_err(
            "retry_failed=True needs isolation='process' (the configs it re-runs crashed, hung or ran out of memory)",
        ));
    }
    let opts = TuneOptions {
        budget,
        strategy,
        seed,
        tool_version: format!("{} (python)", env!("CARGO_PKG_VERSION")),
        finalists,
        timeout,
        retry_failed,
        ..TuneOptions::default()
    };
    // Ctrl-C stops the job before its next measurement (what ran is stored), then raises.
    let reports = pool.run_interruptible(py, |stop| {
        let opts = TuneOptions {
            stop: Some(stop),
            ..opts
        };
        tune_each(&db, &workloads, &hw, &opts, spec, progress)
    })?;
    let reports = reports.map_err(other_err)?;
    raise_warnings(py, &reports)?;
    reports.iter().map(|r| crate::json::to_py(py, r)).collect()
}

/// Tunes each of `workloads` into the database at `db` (candidates run where `spec` says) and
/// returns the `tune --json` report of each.
fn tune_each(
    db: &Path,
    workloads: &[Workload],
    hw: &HardwareFingerprint,
    opts: &TuneOptions,
    spec: Option<WorkerSpec>,
    progress: bool,
) -> Result<Vec<serde_json::Value>, String> {
    let db = TuningDb::open(db).map_err(|e| e.to_string())?;
    let mut evaluator: Box<dyn Evaluator> = match spec {
        Some(spec) => Box::new(Isolated::new(spec, opts.timeout.unwrap_or(INITIAL_TIMEOUT))),
        None => Box::new(InProcess::new()),
    };
    let mut reports = Vec::new();
    for w in workloads {
        let families: Vec<&'static dyn Kernel> = kernels::registry()
            .iter()
            .copied()
            .filter(|k| k.device() == DeviceKind::Cpu && k.supports(w))
            .collect();
        let mut job = |on_event: &mut dyn FnMut(search::Event<'_>)| {
            search::tune_with(&db, w, hw, &families, opts, evaluator.as_mut(), on_event)
        };
        let summary = if progress {
            search::progress::with_progress_bar(w, opts.budget, &mut job)
        } else {
            job(&mut |_| {})
        }
        .map_err(|e| format!("tuning {w}: {e}"))?;
        let counts =
            search::report::TrialCounts::of(&db, &summary, hw).map_err(|e| e.to_string())?;
        reports.push(search::report::summary_json(&summary, &counts, hw));
    }
    // The precisions of each shape tuned in several, re-measured side by side (what `auto`
    // then compares); a failure is a warning of each of those workloads' reports.
    for (shape, dtypes) in search::shapes_and_types(workloads) {
        let compared =
            search::compare_precisions(&db, &shape, &dtypes, hw, opts, evaluator.as_mut());
        if let Err(e @ (search::SearchError::Db(_) | search::SearchError::Stopped)) = compared {
            return Err(format!("{shape}: {e}"));
        }
        if let Err(e) = compared {
            let text = format!(
                "{shape}: re-measuring its precisions' winners side by side failed ({e}); \
                 each keeps its own decision's median"
            );
            for r in reports.iter_mut().filter(|r| {
                r["workload"]
                    .as_str()
                    .and_then(|k| k.parse::<Workload>().ok())
                    .is_some_and(|w| w.with_dtype(kernels::DType::F32) == shape)
            }) {
                if let Some(ws) = r["warnings"].as_array_mut() {
                    ws.push(text.clone().into());
                }
            }
        }
    }
    Ok(reports)
}

/// Raises each of the reports' `warnings` as a `RuntimeWarning`.
fn raise_warnings(py: Python<'_>, reports: &[serde_json::Value]) -> PyResult<()> {
    for text in reports
        .iter()
        .flat_map(|r| r["warnings"].as_array().into_iter().flatten())
    {
        let text = text.as_str().unwrap_or_default().replace('\0', " ");
        let text = std::ffi::CString::new(text).expect("NUL bytes replaced");
        PyErr::warn(py, &py.get_type::<PyRuntimeWarning>(), &text, 1)?;
    }
    Ok(())
}

/// The far end of `tune(isolation='process')`: sizes this (fresh) process's thread pool,
/// then answers the tuner's requests on stdin/stdout until it closes them. Internal.
#[pyfunction]
#[pyo3(name = "_serve_worker")]
pub fn serve_worker(py: Python<'_>, threads: usize) -> PyResult<()> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .map_err(|e| other_err(format!("worker: sizing the thread pool to {threads}: {e}")))?;
    py.detach(|| runner::worker::serve_stdio(&|name| kernels::kernel(name).ok()))
        .map_err(|e| other_err(format!("worker: {e}")))
}
