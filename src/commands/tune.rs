//! `autokernel tune`: search, measure (in a watched worker process by default), store, and
//! decide each workload's winner on re-measured, interleaved timings.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use kernels::cuda::Gpu;
use kernels::{DType, HardwareFingerprint, Kernel, Workload};
use runner::{Evaluator, Isolated, WorkerSpec};
use search::{tune_with, SearchError, StrategyKind, TuneOptions, TuneSummary, INITIAL_TIMEOUT};
use serde_json::json;
use tuning_db::{Record, TuningDb};

/// The BERT-base (seq 128) projection and FFN shapes plus two skinny decoding shapes: the
/// default job when no `--workload` is given.
pub const DEFAULT_WORKLOADS: [&str; 5] = [
    "gemm:128x768x768",
    "gemm:128x3072x768",
    "gemm:128x768x3072",
    "gemm:1x3072x768",
    "gemm:8x3072x768",
];

#[derive(Args)]
pub struct TuneArgs {
    /// Workload to tune, e.g. gemm:128x768x768 (M×N×K); repeat for several.
    /// Default: the BERT-base shapes and two skinny shapes.
    #[arg(long = "workload", value_name = "W")]
    workloads: Vec<String>,
    /// Also tune every workload listed in FILE (one per line, `#` comments; e.g. the
    /// runtime's untuned-workload log).
    #[arg(long, value_name = "FILE")]
    workloads_from: Option<std::path::PathBuf>,
    /// Tune every workload of this model's forward pass (`bert-base`, `bert-large`,
    /// `bert-tiny`, or a Hugging Face BERT, RoBERTa, DistilBERT, ELECTRA or ALBERT directory: its
    /// config.json's sizes and activation) at each --batch × --seq (a directory's inputs.json
    /// batch when neither is given), deduplicated: the list `autokernel infer` calls (with
    /// --workload: those too).
    #[arg(long, value_name = "MODEL|DIR")]
    model: Option<String>,
    /// Batch sizes for --model, comma-separated [default: 1,2,4,8, as `infer`'s].
    #[arg(long, value_name = "B,..", requires = "model", value_parser = super::infer::positive_list)]
    batch: Option<super::infer::PositiveList>,
    /// Sequence lengths for --model, comma-separated [default: 32,64,128, as `infer`'s].
    #[arg(long, value_name = "S,..", requires = "model", value_parser = super::infer::positive_list)]
    seq: Option<super::infer::PositiveList>,
    /// Element types to tune each f32 workload in, comma-separated: `f32`, `bf16`, `int8`
    /// (or `auto` for all three). A workload written with a type suffix (`:i8`) is tuned in
    /// that type only; types no family serves for a workload on this device are skipped, with
    /// a note.
    #[arg(long, value_name = "P,..", default_value = "f32")]
    precision: String,
    /// With several --precision: the error budget of the closing summary, which shows the
    /// element type the runtime's `auto` policy will serve each shape in (default 1e-2).
    #[arg(long, value_name = "E", allow_negative_numbers = true)]
    max_rel_err: Option<f64>,
    #[command(flatten)]
    db: crate::DbArg,
    /// Distinct configs to have tried per workload (trials already in the database count,
    /// so re-running the same command resumes).
    #[arg(long, default_value_t = 32, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    budget: u32,
    /// Search strategy: `model` (cost-model-guided, with transfer from this machine's other
    /// tuned workloads), `model-notransfer`, `model-linear`, `model-linear-notransfer`,
    /// `evolutionary`, `annealing`, `random` or `exhaustive`.
    #[arg(long, default_value = "model", value_parser = search::StrategyKind::NAMES)]
    strategy: String,
    #[command(flatten)]
    threads: crate::ThreadsArg,
    /// Where candidates run: `cpu`, or CUDA device `cuda:N` (NVRTC-compiled templates,
    /// verified and timed on the device; records under the GPU's fingerprint).
    #[command(flatten)]
    device: super::device::DeviceArg,
    /// Seed of the strategy and of the test inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// One JSON object per workload per line.
    #[arg(long)]
    json: bool,
    /// Where candidates run: `process` (a watched worker process: a candidate that crashes,
    /// hangs or runs out of memory is recorded as crashed / timeout / oom and the job goes
    /// on) or `none` (in this process: faster start, no protection).
    #[arg(long, default_value = "process", value_parser = ["process", "none"])]
    isolation: String,
    /// Pin the measuring process to fixed CPUs (the last T of those allowed, T = --threads or
    /// all), so the scheduler does not migrate it between samples.
    #[arg(long)]
    pin: bool,
    /// Time limit per candidate, seconds, from 0.1 (default: max(2, 50 × the default
    /// config's evaluation time)). Needs --isolation process.
    #[arg(long, value_name = "SECS")]
    timeout_s: Option<f64>,
    /// Memory limit of the worker process, MiB (its private writable memory, RLIMIT_DATA);
    /// 0 for none. Default 4096. Needs --isolation process.
    #[arg(long, value_name = "MB")]
    mem_limit_mb: Option<u64>,
    /// Measure again the configs whose latest trial crashed, timed out or ran out of memory
    /// (quarantined: otherwise never re-run), e.g. after a run whose --timeout-s or
    /// --mem-limit-mb was too tight or whose worker was killed from outside.
    #[arg(long)]
    retry_failed: bool,
    /// Tune only this kernel family (repeat for several); default: every family.
    #[arg(long = "kernel", value_name = "NAME")]
    kernels: Vec<String>,
    /// Finalists re-measured interleaved before the winner is declared (0: none; the fastest
    /// trial wins).
    #[arg(long, default_value_t = 3, allow_negative_numbers = true, value_parser = clap::value_parser!(u16).range(0..=32))]
    finalists: u16,
    /// Tune only shard I of N of the workload list (I counted from 0; workloads dealt by
    /// estimated cost, identically in every shard of a job) into its own database: --db with
    /// `.shard-I-of-N` before the extension. Default: from a Slurm job array
    /// (SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_COUNT) or a Kubernetes Indexed Job
    /// (JOB_COMPLETION_INDEX, AUTOKERNEL_SHARD_COUNT) when set; `--shard 0/1` is the whole list.
    #[arg(long, value_name = "I/N")]
    shard: Option<search::shard::ShardSpec>,
    /// Print what would be tuned (this shard's workloads, their estimated cost, the database)
    /// and exit without measuring.
    #[arg(long)]
    dry_run: bool,
}

pub fn run(args: TuneArgs) -> anyhow::Result<ExitCode> {
    crate::with_budget(runtime::PrecisionPolicy::auto(), args.max_rel_err)?; // before any work
    let (workloads, dtypes) = requested_workloads(&args)?;
    if workloads.is_empty() {
        bail!("nothing to tune: no kernel family runs the workloads asked for in the precisions asked for on this device");
    }
    let plan = shard_plan(&args, workloads)?;
    let opts = options(&args)?;
    if args.dry_run {
        // What the real run would refuse, the dry run refuses too (a missing file is made),
        // before the plan is printed.
        TuningDb::check_writer(&plan.db_path)?;
        if args.device.device.kind() == kernels::DeviceKind::Cpu {
            let hw = HardwareFingerprint::current();
            select_families(&args.kernels, &plan.mine, hw)?;
        }
        plan.print(&args)?;
        return Ok(ExitCode::SUCCESS);
    }
    let (workloads, db_path) = (plan.mine, plan.db_path);
    let isolated = args.isolation == "process";
    for w in &workloads {
        kernels::registry::check_runs_on(w, args.device.device.kind())?;
    }
    let gpu = args.device.open()?;
    if let (Some(_), true) = (&gpu, args.pin || args.timeout_s.is_some()) {
        bail!(
            "--pin and --timeout-s apply to CPU tuning; drop them with --device {}",
            args.device.device
        );
    }
    let pin_cpus = if args.pin {
        let threads = args.threads.threads.map_or(usize::MAX, usize::from);
        Some(pin_set(threads)?)
    } else {
        None
    };
    if let (false, Some(cpus)) = (isolated, &pin_cpus) {
        // In-process: pin this thread before rayon's pool (which inherits it) exists.
        pin_here(cpus)?;
    }
    args.threads.apply()?;
    let hw = &super::device::fingerprint(gpu.as_ref());
    let families = select_families(&args.kernels, &workloads, hw)?;
    for w in &workloads {
        // Before the database is opened: a workload no family of this build runs (an
        // element type nobody serves yet) is a one-line error, not an empty tuning run.
        kernels::default_for(w, hw)?;
    }
    let db = TuningDb::open(&db_path)?;
    let mut evaluator = evaluator(&args, hw, gpu.as_ref(), opts.timeout, pin_cpus.clone())?;
    if !args.json {
        eprintln!(
            "tuning {} workload(s) on {} [{}], budget {} per workload, strategy {}, isolation {}{}, into {}",
            workloads.len(),
            super::device::describe(gpu.as_ref(), hw),
            hw.id,
            opts.budget,
            args.strategy,
            evaluator.isolation(),
            pin_cpus
                .as_ref()
                .map_or(String::new(), |c| format!(", pinned to CPUs {c:?}")),
            db_path.display()
        );
    }
    let (mut unverified, mut not_set_up) = (Vec::new(), Vec::new());
    for w in &workloads {
        let fams: Vec<&'static dyn Kernel> =
            families.iter().copied().filter(|k| k.supports(w)).collect();
        let tuned = tune_one(w, &opts, &mut |on_event| {
            tune_with(&db, w, hw, &fams, &opts, evaluator.as_mut(), on_event)
        });
        let summary = match tuned {
            // A problem too large to set up ends this workload, not the job: the others are
            // tuned, and the exit status says one has no verified config.
            Err(e) if matches!(e.downcast_ref(), Some(SearchError::Setup(_))) => {
                eprintln!("error: {e:#}; nothing measured, going on with the other workloads");
                not_set_up.push(w.key());
                continue;
            }
            r => r?,
        };
        report(&db, &summary, hw, &opts, args.json)?;
        if summary.best.is_none() {
            unverified.push(w.key());
        }
    }
    if dtypes.len() > 1 && gpu.is_none() {
        side_by_side(&db, hw, &workloads, &opts, evaluator.as_mut(), args.json)?;
        if !args.json {
            precision_summary(&db_path, hw, &workloads, args.max_rel_err)?;
        }
    }
    Ok(verdict(&unverified, &not_set_up, workloads.len()))
}

/// The job's settings from the command line, checked.
fn options(args: &TuneArgs) -> anyhow::Result<TuneOptions> {
    let strategy: StrategyKind = args.strategy.parse()?;
    let timeout = TuneOptions::timeout_from_secs(args.timeout_s)
        .map_err(|e| anyhow::anyhow!("--timeout-s {e}"))?;
    if args.isolation != "process" && (args.timeout_s.is_some() || args.mem_limit_mb.is_some()) {
        bail!("--timeout-s and --mem-limit-mb need --isolation process (in-process candidates cannot be stopped)");
    }
    if args.isolation != "process" && args.retry_failed {
        bail!("--retry-failed needs --isolation process (the configs it re-runs crashed, hung or ran out of memory)");
    }
    Ok(TuneOptions {
        budget: args.budget as usize,
        strategy,
        seed: args.seed,
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        finalists: usize::from(args.finalists),
        timeout,
        retry_failed: args.retry_failed,
        ..TuneOptions::default()
    })
}

/// Exit 0, or 1 when a workload ended with no verified config: every trial is in the
/// database, and the exit status tells a script that nothing is served for it; or when a
/// workload's problem could not be set up (nothing measured; the error was printed then).
fn verdict(unverified: &[String], not_set_up: &[String], total: usize) -> ExitCode {
    if unverified.is_empty() && not_set_up.is_empty() {
        return ExitCode::SUCCESS;
    }
    if !unverified.is_empty() {
        eprintln!(
            "error: {} of {total} workload(s) have no verified config (every trial failed; their records say why): {}",
            unverified.len(),
            unverified.join(", ")
        );
    }
    if !not_set_up.is_empty() {
        eprintln!(
            "error: {} of {total} workload(s) could not be set up, nothing measured (see above): {}",
            not_set_up.len(),
            not_set_up.join(", ")
        );
    }
    ExitCode::from(1)
}

/// The workloads asked for (`--workload`, `--workloads-from`, `--model`; the embedded
/// default set without any), in each element type of `--precision` a family serves them in
/// on this device (the ones none does are noted), and those element types.
fn requested_workloads(args: &TuneArgs) -> anyhow::Result<(Vec<Workload>, Vec<DType>)> {
    let names: Vec<String> =
        if args.workloads.is_empty() && args.workloads_from.is_none() && args.model.is_none() {
            DEFAULT_WORKLOADS.iter().map(|s| s.to_string()).collect()
        } else {
            let mut names = args.workloads.clone();
            if let Some(file) = &args.workloads_from {
                names.extend(super::db::read_workload_list(file)?);
            }
            if let Some(name) = &args.model {
                let (config, max_seq) = super::infer::model_config(name)?;
                // As `infer` runs it: a checkpoint's saved batch when no shape is given.
                let saved = super::infer::saved_shape(name)?
                    .filter(|_| args.batch.is_none() && args.seq.is_none());
                let shapes = match saved {
                    Some(shape) => vec![shape],
                    None => {
                        super::infer::model_shapes(args.batch.as_ref(), args.seq.as_ref(), max_seq)?
                    }
                };
                names.extend(config.workload_list(&shapes).iter().map(|w| w.key()));
            }
            names
        };
    let dtypes = search::precision::parse_precisions(&args.precision)
        .map_err(|e| anyhow::anyhow!("--precision: {e}"))?;
    let (workloads, skipped) = search::precision::with_precisions(
        &super::parse_workloads(&names)?,
        &dtypes,
        args.device.device.kind(),
    );
    if !args.json {
        for w in skipped {
            eprintln!("note: no kernel family runs {w} on this device; skipped");
        }
        // Reduced precision is where AMX would serve: say once why it does not here.
        let reduced = workloads.iter().any(|w| w.dtype() != DType::F32);
        if let (true, Some(why)) = (reduced, &kernels::amx::state().refused) {
            eprintln!("note: {why}");
        }
    }
    Ok((workloads, dtypes))
}

/// Where candidates run: a worker process (`--isolation process` on a CPU, with its memory
/// limit and CPU set), else this process. On a GPU candidates run in this process: a CUDA
/// context cannot be shared with a worker, and NVRTC reports a bad config as a compile
/// error rather than a crash.
fn evaluator(
    args: &TuneArgs,
    hw: &HardwareFingerprint,
    gpu: Option<&Arc<Gpu>>,
    timeout: Option<Duration>,
    pin_cpus: Option<Vec<usize>>,
) -> anyhow::Result<Box<dyn Evaluator>> {
    if args.isolation != "process" || gpu.is_some() {
        return Ok(super::device::evaluator(gpu));
    }
    let exe = std::env::current_exe().context("locating the autokernel binary for the worker")?;
    let mut spec = WorkerSpec::new(exe, ["worker", "--threads", &hw.cores.to_string()]);
    spec.fingerprint = Some(hw.id.clone());
    spec.mem_limit_bytes = match args.mem_limit_mb.unwrap_or(runner::DEFAULT_MEM_LIMIT_MB) {
        0 => None,
        mb => Some(mb.saturating_mul(1 << 20)),
    };
    spec.cpus = pin_cpus.unwrap_or_default();
    Ok(Box::new(Isolated::new(
        spec,
        timeout.unwrap_or(INITIAL_TIMEOUT),
    )))
}

/// The result's warnings ([`search::report::warnings`]), on stderr.
fn print_warnings(s: &TuneSummary) {
    for w in search::report::warnings(s) {
        eprintln!("warning: {w}");
    }
}

/// Per shape this job tuned in several element types: their winners re-measured side by
/// side and recorded ([`search::compare_precisions`]), a line each on stderr (none with
/// `--json`: `lookup --json` reports the medians). A comparison that fails is a warning:
/// each precision keeps its own decision's median.
fn side_by_side(
    db: &TuningDb,
    hw: &HardwareFingerprint,
    workloads: &[Workload],
    opts: &TuneOptions,
    evaluator: &mut dyn runner::Evaluator,
    quiet: bool,
) -> anyhow::Result<()> {
    for (shape, dtypes) in search::shapes_and_types(workloads) {
        match search::compare_precisions(db, &shape, &dtypes, hw, opts, evaluator) {
            Ok(Some(c)) if !quiet => {
                let cells: Vec<String> = c
                    .timings
                    .iter()
                    .map(|t| {
                        let (lo, hi) = t.ci;
                        format!(
                            "{} {:.3} ms [{:.3}, {:.3}]",
                            t.record.workload.dtype(),
                            t.measurement.median_s * 1e3,
                            lo * 1e3,
                            hi * 1e3
                        )
                    })
                    .collect();
                eprintln!(
                    "side by side  {shape}: {} ({} rounds)",
                    cells.join(" | "),
                    c.timings[0].measurement.samples.len()
                );
            }
            Ok(_) => {}
            Err(e @ (SearchError::Db(_) | SearchError::Stopped)) => return Err(e.into()),
            Err(e) => eprintln!(
                "warning: {shape}: re-measuring its precisions' winners side by side failed ({e}); \
                 each keeps its own decision's median"
            ),
        }
    }
    Ok(())
}

/// Per shape tuned in several element types: each type's best time and stored error, and
/// the type the runtime's `auto` policy serves it in under `max_rel_err`.
fn precision_summary(
    db_path: &std::path::Path,
    hw: &kernels::HardwareFingerprint,
    workloads: &[Workload],
    max_rel_err: Option<f64>,
) -> anyhow::Result<()> {
    let policy = crate::with_budget(runtime::PrecisionPolicy::auto(), max_rel_err)?;
    let rt = runtime::Runtime::open_for(db_path, hw.clone())?;
    rt.set_precision(policy);
    eprintln!("precision summary ({policy}):");
    for (w, _) in search::shapes_and_types(workloads) {
        // Each type's record as `auto` sees it (a winner's side-by-side or re-measured median).
        let cells: Vec<String> = DType::PRECISIONS
            .iter()
            .filter_map(|&d| {
                let c = rt.choose(&w.with_dtype(d)).ok()?;
                let s = c.source.filter(|_| c.level == runtime::Level::Exact)?;
                let err = s
                    .accuracy
                    .map_or(String::new(), |a| format!(" (err {:.1e})", a.max_rel_err));
                let ms = s.median_s.unwrap_or(f64::NAN) * 1e3;
                Some(format!("{d} {ms:.3} ms{err}"))
            })
            .collect();
        eprintln!(
            "  {w}: {} -> serves {}",
            cells.join(" | "),
            rt.serve_as(&w).dtype()
        );
    }
    Ok(())
}

/// The registered families of `hw`'s kind of device named by `--kernel` (all of them when
/// none is named); each named one must support every workload of the job.
fn select_families(
    names: &[String],
    workloads: &[Workload],
    hw: &HardwareFingerprint,
) -> anyhow::Result<Vec<&'static dyn Kernel>> {
    let all: Vec<&'static dyn Kernel> = kernels::registry()
        .iter()
        .copied()
        .filter(|k| k.device() == hw.device_kind())
        .collect();
    if names.is_empty() {
        return Ok(all);
    }
    let mut out: Vec<&'static dyn Kernel> = Vec::new();
    for name in names {
        let Some(k) = all.iter().copied().find(|k| k.name() == name) else {
            let known: Vec<&str> = all.iter().map(|k| k.name()).collect();
            bail!(
                "unknown kernel family '{name}' (known on {}: {})",
                hw.device_kind(),
                known.join(", ")
            );
        };
        // The family's own answer: the element types it serves, then op and shape.
        if let Some(Err(e)) = workloads.iter().map(|w| k.serves(w)).find(Result::is_err) {
            bail!("--kernel {name}: {e}");
        }
        if !out.iter().any(|o| o.name() == k.name()) {
            out.push(k);
        }
    }
    Ok(out)
}

#[cfg(target_os = "linux")]
fn pin_set(threads: usize) -> anyhow::Result<Vec<usize>> {
    runner::worker::pin_set(threads).context("reading this process's CPU affinity for --pin")
}

#[cfg(target_os = "linux")]
fn pin_here(cpus: &[usize]) -> anyhow::Result<()> {
    runner::worker::pin_current_thread(cpus).context("--pin")
}

#[cfg(not(target_os = "linux"))]
fn pin_set(_threads: usize) -> anyhow::Result<Vec<usize>> {
    bail!("--pin is only supported on Linux")
}

#[cfg(not(target_os = "linux"))]
fn pin_here(_cpus: &[usize]) -> anyhow::Result<()> {
    bail!("--pin is only supported on Linux")
}

/// Runs one workload's tuning (`job`, given the event sink) behind the progress bar.
fn tune_one(
    w: &Workload,
    opts: &TuneOptions,
    job: &mut search::progress::TuneJob<'_>,
) -> anyhow::Result<TuneSummary> {
    search::progress::with_progress_bar(w, opts.budget, job).with_context(|| format!("tuning {w}"))
}

/// One workload's result: a JSON line (`--json`), or the plain summary lines.
fn report(
    db: &TuningDb,
    s: &TuneSummary,
    hw: &HardwareFingerprint,
    opts: &TuneOptions,
    as_json: bool,
) -> anyhow::Result<()> {
    let counts = search::report::TrialCounts::of(db, s, hw)?;
    if as_json {
        // On stderr: `--json` output stays one JSON line per workload.
        print_warnings(s);
        return super::print_json(&search::report::summary_json(s, &counts, hw));
    }
    println!("{:>20}  {}", s.workload.key(), result_line(s, &counts));
    print_warnings(s);
    println!("{:>20}  {}", "", noise_line(s, opts));
    if let (Some(a), true) = (s.best_accuracy, s.workload.dtype() != DType::F32) {
        println!(
            "{:>20}  accuracy of the best vs the f32 problem: max error {:.2e} of max |C|, Frobenius {:.2e}",
            "", a.max_rel_err, a.fro_rel_err
        );
    }
    if s.isolation == "process" && (s.restarts > 0 || s.quarantined > 0) {
        println!("{:>20}  {}", "", isolation_line(s));
    }
    Ok(())
}

/// The winner against the default, at the speeds the decision saw (re-measured side by
/// side when both were finalists), or that nothing verified.
fn result_line(s: &TuneSummary, counts: &search::report::TrialCounts) -> String {
    let (trials, failures) = (counts.trials, counts.failures);
    let Some(b) = s.best.as_ref() else {
        return format!("no verified config ({trials} trials, {failures} failed)");
    };
    let decided = s.decided_medians();
    // The decision's speeds where it has both; else each record's own (a default that
    // failed has none: said so, not printed as 0).
    let speed = |decided: Option<f64>, r: &Record| match decided
        .map(|t| s.workload.flops() / t / 1e9)
        .or(r.gflops)
    {
        Some(g) => format!("{g:>7.1} GFLOP/s"),
        None => "not measured".to_string(),
    };
    format!(
        "best {}  {} {}  default {}  speedup {}{}  ({trials} trials, {failures} failed, {} new; space {})",
        speed(decided.map(|d| d.0), b),
        b.kernel,
        b.config,
        speed(decided.map(|d| d.1), &s.default),
        s.speedup_vs_default()
            .map_or("-".to_string(), |x| format!("{x:.2}x")),
        match s.speedup_source() {
            Some("this_run") => " (re-measured)",
            Some("earlier_decision") => " (as re-measured when decided)",
            _ => "",
        },
        s.measured,
        s.space_size
    )
}

/// How noisy the timings were, and how the winner was decided.
fn noise_line(s: &TuneSummary, opts: &TuneOptions) -> String {
    let pct = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{:.1}%", 100.0 * v));
    let verdict = match &s.decision {
        None if opts.finalists == 0 => "no re-measurement (--finalists 0)".to_string(),
        None => "nothing new measured: the earlier decision stands".to_string(),
        Some(d) if d.rounds == 0 => match &d.note {
            Some(note) => format!("re-measurement failed ({note}); fastest trial kept"),
            None => format!("{} finalist: {}", d.finalists.len(), d.reason),
        },
        Some(d) => format!(
            "{} finalists re-measured × {} interleaved rounds: {}{}",
            d.remeasured(),
            d.rounds,
            if d.tie { "tie, " } else { "" },
            d.reason
        ),
    };
    if s.measured == 0 {
        // A resumed run times the default alone (its first run in a fresh worker is often
        // the noisiest): one run's spread says little about the machine.
        return format!(
            "noise: only the default was timed this run (spread {}, CV {}: one run, not the \
             machine's noise); {verdict}",
            pct(s.median_spread),
            pct(s.median_cv),
        );
    }
    format!(
        "noise: median spread {} (MAD/median), median CV {} over {} timed run{}; {verdict}",
        pct(s.median_spread),
        pct(s.median_cv),
        s.timed,
        if s.timed == 1 { "" } else { "s" },
    )
}

/// Worker restarts and the quarantine (by each config's latest status), with how to lift it.
fn isolation_line(s: &TuneSummary) -> String {
    let bad: Vec<String> = (s.quarantined_by_status.iter())
        .map(|(status, n)| format!("{n} {}", status.as_str()))
        .collect();
    format!(
        "isolation: {} worker restart(s), {} quarantined config(s) ({}), timeout {:.1} s{}",
        s.restarts,
        s.quarantined,
        bad.join(", "),
        s.timeout.map_or(0.0, |t| t.as_secs_f64()),
        if s.quarantined > 0 {
            " (--retry-failed measures them again, e.g. after limits that were too tight)"
        } else {
            ""
        }
    )
}

/// This run's share of the job: `--shard` (or the batch system's shard variables) applied.
struct ShardPlan {
    all: Vec<Workload>,
    mine: Vec<Workload>,
    db_path: std::path::PathBuf,
    name: String,
    source: &'static str,
}

/// Applies `--shard` (or the batch system's shard variables): this run's workloads and its
/// database; a line on stderr for a shard (not with `--dry-run`, which prints the plan once
/// its checks pass: [`ShardPlan::print`]).
fn shard_plan(args: &TuneArgs, all: Vec<Workload>) -> anyhow::Result<ShardPlan> {
    use search::shard::{ShardSource, ShardSpec};
    let shard = match args.shard {
        Some(s) => Some((s, ShardSource::Flag)),
        None => ShardSpec::from_env().context("choosing this task's shard (--shard not given)")?,
    };
    let budget = args.budget as usize;
    let (mine, db_path) = match shard {
        Some((s, _)) => (s.select(&all, budget), s.db_path(&args.db.db)),
        None => (all.clone(), args.db.db.clone()),
    };
    let name = shard.map_or("0/1".to_string(), |(s, _)| s.to_string());
    let source = shard.map_or("none", |(_, src)| src.as_str());
    if shard.is_some() && !args.json && !args.dry_run {
        eprintln!(
            "shard {name} (from {source}): {} of the job's {} workload(s){}",
            mine.len(),
            all.len(),
            if mine.is_empty() {
                ", nothing to tune (more shards than workloads)"
            } else {
                ""
            }
        );
    }
    Ok(ShardPlan {
        all,
        mine,
        db_path,
        name,
        source,
    })
}

impl ShardPlan {
    /// The dry run's plan: one JSON object with `--json`, lines otherwise.
    fn print(&self, args: &TuneArgs) -> anyhow::Result<()> {
        use search::shard::estimated_cost_s;
        let budget = args.budget as usize;
        let cost = |ws: &[Workload]| {
            ws.iter()
                .map(|w| estimated_cost_s(w, budget))
                .fold(0.0, |a, b| a + b)
        }; // sum() of none is -0.0
        let (name, source, all, mine) = (&self.name, self.source, &self.all, &self.mine);
        if args.json {
            return super::print_json(&json!({
                "shard": name,
                "shard_source": source,
                "db": self.db_path.display().to_string(),
                "workloads": mine.iter().map(|w| w.key()).collect::<Vec<_>>(),
                "estimated_cost_s": mine.iter().map(|w| estimated_cost_s(w, budget)).collect::<Vec<_>>(),
                "shard_estimated_cost_s": cost(mine),
                "job_workloads": all.len(),
                "job_estimated_cost_s": cost(all),
            }));
        }
        println!(
            "shard {name} (from {source}): {} of {} workload(s), estimated {} of {}, into {}",
            mine.len(),
            all.len(),
            duration(cost(mine)),
            duration(cost(all)),
            self.db_path.display()
        );
        let width = mine.iter().map(|w| w.key().len()).max().unwrap_or(0);
        for w in mine {
            println!(
                "  {:<width$}  ~{}",
                w.key(),
                duration(estimated_cost_s(w, budget))
            );
        }
        Ok(())
    }
}

/// `4.2 s`, `95 s`, `12 min`, `3.5 h`.
fn duration(s: f64) -> String {
    match s {
        s if s < 10.0 => format!("{s:.1} s"),
        s if s < 120.0 => format!("{s:.0} s"),
        s if s < 7200.0 => format!("{:.0} min", s / 60.0),
        s => format!("{:.1} h", s / 3600.0),
    }
}
