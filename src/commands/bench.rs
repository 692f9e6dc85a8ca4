//! `autokernel bench`: re-measure the database's winners (and the kernel defaults), compare
//! with a stored baseline by a statistical test, save baselines, write a report with charts.
//!
//! Exit status: 0 when nothing regressed, 1 when at least one workload is a significant
//! regression beyond the threshold, 2 on an error (bad input, foreign baseline, wrong result).

mod baseline;
mod report;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;
use kernels::cuda::Gpu;
use kernels::{default_for, Config, HardwareFingerprint, Kernel, Measurement, Status, Workload};
use runner::compare::{compare_rounds, CompareOptions, Comparison, Verdict};
use runner::{Evaluator, Protocol};
use runtime::Runtime;
use serde_json::json;
use tuning_db::TuningDb;

use baseline::{Baseline, Timing, WorkloadResult};

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    db: crate::DbArg,
    /// Workload to measure, e.g. gemm:128x768x768; repeat for several. Default: every
    /// workload tuned in the database for this machine's fingerprint.
    #[arg(long = "workload", value_name = "W")]
    workloads: Vec<String>,
    /// Baseline file to compare with, or `latest` for the newest baseline of this
    /// fingerprint under the results directory.
    #[arg(long, value_name = "FILE")]
    baseline: Option<PathBuf>,
    /// Save this run as a baseline: to FILE, into a directory, or (no value) to
    /// RESULTS/FINGERPRINT/baseline-DATETIME.json (RESULTS: `--results`; the date in UTC).
    #[arg(long, value_name = "FILE|DIR", num_args = 0..=1)]
    save_baseline: Option<Option<PathBuf>>,
    /// Smallest slowdown that counts as a regression, in percent.
    #[arg(long, value_name = "PCT", default_value = "5", value_parser = parse_percent, allow_negative_numbers = true)]
    threshold: f64,
    /// Compare with a baseline measured on another hardware fingerprint (another machine,
    /// or another thread count) instead of refusing.
    #[arg(long)]
    allow_foreign_baseline: bool,
    /// Write report.md and SVG charts into DIR.
    #[arg(long, value_name = "DIR")]
    report: Option<PathBuf>,
    /// Where baselines live: DIR/FINGERPRINT/ (for `latest`, the default save
    /// location and the history chart).
    #[arg(long, value_name = "DIR", default_value = "bench_results")]
    results: PathBuf,
    /// Use the short tuning protocol instead of the thorough one (for tests and quick CI).
    #[arg(long)]
    quick: bool,
    /// Measure every workload this many times, in rounds spread over the run (each round
    /// measures all workloads once); the comparison resamples rounds, so a machine that got
    /// busier during the run widens the confidence interval instead of raising an alarm.
    #[arg(long, value_name = "R", default_value_t = 5, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=100))]
    rounds: u32,
    #[command(flatten)]
    threads: crate::ThreadsArg,
    #[command(flatten)]
    device: super::device::DeviceArg,
    /// One JSON object per workload per line, then a summary line.
    #[arg(long)]
    json: bool,
}

/// `5`, `5%` or `2.5` → 0.05, 0.05, 0.025.
fn parse_percent(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("'{s}' is not a percentage"))?;
    if !(v.is_finite() && (0.0..=1000.0).contains(&v)) {
        return Err(format!("'{s}' is not a percentage between 0 and 1000"));
    }
    Ok(v / 100.0)
}

/// Significance level of the Mann–Whitney test.
const ALPHA: f64 = 0.01;
/// Seed of the inputs every workload is verified and timed on.
const INPUT_SEED: u64 = 0xBE4C;

pub fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let requested = super::parse_workloads(&args.workloads)?;
    super::require_db(&args.db.db)?;
    args.threads.apply()?;
    let gpu = args.device.open()?;
    let hw = &super::device::fingerprint(gpu.as_ref());
    let (workloads, base) = preflight(&args, hw, requested)?;
    let (protocol, protocol_name) = if args.quick {
        (Protocol::quick(), "quick")
    } else {
        (Protocol::thorough(), "thorough")
    };
    if !args.json {
        eprintln!(
            "benchmarking {} workload(s) on {} [{}] with the {protocol_name} protocol{}",
            workloads.len(),
            hw.brand,
            hw.id,
            base.as_ref()
                .map(|(p, b)| format!(", against {} ({})", p.display(), b.created_at))
                .unwrap_or_default()
        );
    }
    let rt = super::device::runtime(&args.db.db, gpu.as_ref())?;
    let workloads = measure_rounds(&args, &rt, &workloads, gpu.as_ref(), protocol)?;
    // Stamped when the measuring is done (it names the saved file and orders the history).
    let current = Baseline {
        format: baseline::FORMAT.into(),
        format_version: baseline::FORMAT_VERSION,
        tool_version: env!("CARGO_PKG_VERSION").into(),
        created_at: tuning_db::now_rfc3339(),
        fingerprint: hw.clone(),
        protocol: protocol_name.into(),
        db: args.db.db.display().to_string(),
        workloads,
    };
    let base = base.as_ref().map(|(p, b)| (p.as_path(), b));
    let comparisons = compare_with(&args, &current, base)?;
    let (saved, report_files) = write_outputs(&args, &current, base, &comparisons)?;
    let regressions = comparisons
        .iter()
        .flatten()
        .filter(|c| c.verdict == Verdict::Regression)
        .count();
    let code = u8::from(regressions > 0);
    let out = Output {
        current: &current,
        base,
        comparisons: &comparisons,
        saved: saved.as_deref(),
        report: report_files.first().map(PathBuf::as_path),
        threshold: args.threshold,
        code,
    };
    if args.json {
        out.json()?;
    } else {
        out.text();
    }
    Ok(ExitCode::from(code))
}

/// A baseline read from a file, with its path.
type Loaded = (PathBuf, Baseline);

/// Everything that can be refused, checked before anything is measured: the inputs (the
/// baseline, and that it shares a workload with this run), then an output that would
/// overwrite a file, a directory that cannot take the files (created here, once nothing
/// else can fail). Returns the workloads to measure (those asked for, or every tuned one)
/// and the baseline.
fn preflight(
    args: &BenchArgs,
    hw: &HardwareFingerprint,
    requested: Vec<Workload>,
) -> anyhow::Result<(Vec<Workload>, Option<Loaded>)> {
    refuse_overwrites(args)?;
    let base = load_baseline(args, hw)?;
    let workloads = if requested.is_empty() {
        tuned_workloads(&args.db.db, hw)?
    } else {
        requested
    };
    if let Some((path, b)) = &base {
        // A gate that compares nothing must not pass.
        if !workloads.iter().any(|w| b.get(&w.key()).is_some()) {
            bail!(
                "the baseline {} shares no workload with this run ({} of its own): nothing would be compared",
                path.display(),
                b.workloads.len()
            );
        }
    }
    if let Some(arg) = &args.save_baseline {
        let dir = baseline::save_dir(arg.as_deref(), &args.results, hw);
        super::check_writable_dir(&dir, "--save-baseline")?;
    }
    if let Some(dir) = &args.report {
        super::check_writable_dir(dir, "--report")?;
    }
    Ok((workloads, base))
}

/// Saves the run as a baseline (`--save-baseline`) and writes the report (`--report`):
/// the saved file's path and the report's files.
fn write_outputs(
    args: &BenchArgs,
    current: &Baseline,
    base: Option<(&Path, &Baseline)>,
    comparisons: &[Option<Comparison>],
) -> anyhow::Result<(Option<PathBuf>, Vec<PathBuf>)> {
    let saved = match &args.save_baseline {
        Some(arg) => {
            let p = baseline::save_path(arg.as_deref(), &args.results, current);
            current.save(&p)?;
            Some(p)
        }
        None => None,
    };
    let report_files = match &args.report {
        Some(dir) => {
            let history_dir = baseline::fingerprint_dir(&args.results, &current.fingerprint);
            let history = baseline::find_all(&history_dir, &current.fingerprint);
            let input = report::ReportInput {
                current,
                baseline: base,
                comparisons,
                history: &history,
                history_dir: &history_dir,
                threshold: args.threshold,
                alpha: ALPHA,
            };
            report::write(dir, &input)?
        }
        None => Vec::new(),
    };
    Ok((saved, report_files))
}

/// Refuses a `--save-baseline` file that exists and a `--report` that is not a directory.
fn refuse_overwrites(args: &BenchArgs) -> anyhow::Result<()> {
    if let Some(Some(p)) = &args.save_baseline {
        if p.exists() && !p.is_dir() {
            bail!(
                "--save-baseline {}: the file exists; refusing to overwrite it (name a new file or a directory)",
                p.display()
            );
        }
    }
    if let Some(dir) = args.report.as_ref().filter(|d| d.exists() && !d.is_dir()) {
        bail!(
            "--report {}: exists and is not a directory (the report is a directory of report.md and SVG charts)",
            dir.display()
        );
    }
    if let Some(dir) = &args.report {
        report::check_dir(dir)?;
    }
    Ok(())
}

/// The `--baseline` asked for, read and checked against this fingerprint.
fn load_baseline(args: &BenchArgs, hw: &HardwareFingerprint) -> anyhow::Result<Option<Loaded>> {
    let Some(spec) = &args.baseline else {
        return Ok(None);
    };
    let path = resolve_baseline(spec, &args.results, hw)?;
    let b = Baseline::load(&path)?;
    baseline::check_fingerprint(&b, &path, hw, args.allow_foreign_baseline)?;
    Ok(Some((path, b)))
}

/// Measures every workload `--rounds` times, tuned and default in alternating order, in
/// rounds spread over the run.
fn measure_rounds(
    args: &BenchArgs,
    rt: &Runtime,
    workloads: &[Workload],
    gpu: Option<&Arc<Gpu>>,
    protocol: Protocol,
) -> anyhow::Result<Vec<WorkloadResult>> {
    let mut prepared: Vec<Prepared> = workloads
        .iter()
        .map(|w| Prepared::new(rt, w, gpu, protocol.clone()))
        .collect::<anyhow::Result<_>>()?;
    let rounds = args.rounds as usize;
    let mut timings: Vec<(Vec<Measurement>, Vec<Measurement>)> =
        vec![(Vec::with_capacity(rounds), Vec::with_capacity(rounds)); prepared.len()];
    let count = prepared.len();
    for round in 0..rounds {
        for (i, p) in prepared.iter_mut().enumerate() {
            if !args.json {
                eprintln!(
                    "  round {}/{rounds}  [{}/{count}] {}",
                    round + 1,
                    i + 1,
                    p.workload
                );
            }
            // Alternate which goes first, so neither always follows the other.
            let (t, d) = p.measure_pair(round % 2 == 0)?;
            timings[i].0.push(t);
            timings[i].1.push(d);
        }
    }
    Ok(prepared
        .into_iter()
        .zip(timings)
        .map(|(p, (t, d))| p.result(t, d))
        .collect())
}

/// Each workload of `current` against the baseline's (None where either has none).
fn compare_with(
    args: &BenchArgs,
    current: &Baseline,
    base: Option<(&Path, &Baseline)>,
) -> anyhow::Result<Vec<Option<Comparison>>> {
    let Some((path, b)) = base else {
        return Ok(vec![None; current.workloads.len()]);
    };
    if b.protocol != current.protocol && !args.json {
        eprintln!(
            "warning: the baseline was measured with the {} protocol, this run with {}",
            b.protocol, current.protocol
        );
    }
    let opts = CompareOptions {
        threshold: args.threshold,
        alpha: ALPHA,
        ..CompareOptions::default()
    };
    current
        .workloads
        .iter()
        .map(|r| {
            b.get(&r.workload)
                .map(|old| {
                    compare_rounds(&old.tuned.rounds(), &r.tuned.rounds(), &opts).with_context(
                        || format!("comparing {} with {}", r.workload, path.display()),
                    )
                })
                .transpose()
        })
        .collect()
}

/// `latest` → the newest baseline of `hw` under `results`; anything else is a path.
fn resolve_baseline(
    spec: &Path,
    results: &Path,
    hw: &HardwareFingerprint,
) -> anyhow::Result<PathBuf> {
    if spec != Path::new("latest") || spec.exists() {
        match std::fs::metadata(spec) {
            Ok(m) if m.is_file() => {}
            Ok(_) => bail!(
                "baseline {} is not a file (a baseline is a JSON file)",
                spec.display()
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                bail!("baseline {} not found", spec.display())
            }
            Err(e) => bail!("baseline {}: {e}", spec.display()),
        }
        return Ok(spec.to_path_buf());
    }
    let dir = baseline::fingerprint_dir(results, hw);
    match baseline::find_all(&dir, hw).pop() {
        Some((p, _)) => Ok(p),
        None => bail!(
            "no baseline for fingerprint {} in {} (save one with `autokernel bench --save-baseline`)",
            hw.id,
            dir.display()
        ),
    }
}

/// The workloads with a verified winner for `hw` in the database, in key order.
fn tuned_workloads(db: &Path, hw: &HardwareFingerprint) -> anyhow::Result<Vec<Workload>> {
    let db = TuningDb::open_read_only(db)?;
    let mut ws: Vec<Workload> = db
        .best_all(&hw.id)?
        .into_iter()
        .map(|r| r.workload)
        .collect();
    ws.sort_by_key(|w| w.dims());
    ws.dedup();
    if ws.is_empty() {
        bail!(
            "{} has no tuned workload for this machine's fingerprint {} (tune first, or name workloads with --workload)",
            db.path().display(),
            hw.id
        );
    }
    Ok(ws)
}

/// A workload ready to time on its device: the runtime's choice for the device's fingerprint
/// and the kernel default, each verified against the reference by the device's evaluator
/// before every timing (on the CPU in this process, on a GPU with CUDA events).
struct Prepared {
    workload: Workload,
    choice: runtime::Choice,
    default_kernel: &'static dyn Kernel,
    default_config: Config,
    evaluator: Box<dyn Evaluator>,
    protocol: Protocol,
}

impl Prepared {
    fn new(
        rt: &Runtime,
        w: &Workload,
        gpu: Option<&Arc<Gpu>>,
        protocol: Protocol,
    ) -> anyhow::Result<Prepared> {
        let choice = rt.choose(w)?;
        let (default_kernel, default_config) = default_for(w, rt.fingerprint())?;
        let mut evaluator = super::device::evaluator(gpu);
        evaluator.setup(w, INPUT_SEED)?;
        Ok(Prepared {
            workload: *w,
            choice,
            default_kernel,
            default_config,
            evaluator,
            protocol,
        })
    }

    /// One verified timing of `kernel` `config`; a failure is an error naming them.
    fn one(&mut self, kernel: &dyn Kernel, config: &Config) -> anyhow::Result<Measurement> {
        let o = self
            .evaluator
            .evaluate(kernel, config, &self.protocol)?
            .outcome;
        match (o.status, o.measurement) {
            (Status::Ok, Some(m)) => Ok(m),
            (status, _) => bail!(
                "{} {config} on {}: {status}: {}",
                kernel.name(),
                self.workload,
                o.message.unwrap_or_default()
            ),
        }
    }

    /// The tuned choice and the default, measured back to back (`tuned_first` picks the order).
    fn measure_pair(&mut self, tuned_first: bool) -> anyhow::Result<(Measurement, Measurement)> {
        let (tk, tc) = (self.choice.kernel, self.choice.config.clone());
        let (dk, dc) = (self.default_kernel, self.default_config.clone());
        Ok(if tuned_first {
            let t = self.one(tk, &tc)?;
            (t, self.one(dk, &dc)?)
        } else {
            let d = self.one(dk, &dc)?;
            (self.one(tk, &tc)?, d)
        })
    }

    fn result(self, tuned: Vec<Measurement>, default: Vec<Measurement>) -> WorkloadResult {
        let w = &self.workload;
        WorkloadResult {
            workload: w.key(),
            level: self.choice.level.as_str().into(),
            kernel: self.choice.kernel.name().into(),
            config: self.choice.config.clone(),
            tuned: Timing::new(tuned, w),
            default_kernel: self.default_kernel.name().into(),
            default_config: self.default_config,
            default: Timing::new(default, w),
        }
    }
}

struct Output<'a> {
    current: &'a Baseline,
    base: Option<(&'a Path, &'a Baseline)>,
    comparisons: &'a [Option<Comparison>],
    saved: Option<&'a Path>,
    report: Option<&'a Path>,
    threshold: f64,
    code: u8,
}

impl Output<'_> {
    fn verdict_name(&self, c: &Option<Comparison>) -> Option<&'static str> {
        match (self.base, c) {
            (_, Some(c)) => Some(c.verdict.as_str()),
            (Some(_), None) => Some("new"),
            (None, None) => None,
        }
    }

    fn count(&self, v: Verdict) -> usize {
        self.comparisons
            .iter()
            .flatten()
            .filter(|c| c.verdict == v)
            .count()
    }

    fn json(&self) -> anyhow::Result<()> {
        for (r, c) in self.current.workloads.iter().zip(self.comparisons) {
            let old = self.base.and_then(|(_, b)| b.get(&r.workload));
            super::print_json(&json!({
                "type": "workload",
                "workload": r.workload,
                "level": r.level,
                "kernel": r.kernel,
                "config": r.config,
                "median_s": r.tuned.median_s,
                "gflops": r.tuned.gflops,
                "spread": r.tuned.spread,
                "samples": r.tuned.samples.len(),
                "default_kernel": r.default_kernel,
                "default_config": r.default_config,
                "default_median_s": r.default.median_s,
                "default_gflops": r.default.gflops,
                "speedup_vs_default": r.speedup_vs_default(),
                "baseline_kernel": old.map(|o| &o.kernel),
                "baseline_config": old.map(|o| &o.config),
                "baseline_median_s": c.as_ref().map(|c| c.baseline_median_s),
                "time_ratio": c.as_ref().map(|c| c.time_ratio),
                "time_ratio_ci": c.as_ref().map(|c| [c.ci_low, c.ci_high]),
                "speed_ratio": c.as_ref().map(Comparison::speed_ratio),
                "p_value": c.as_ref().map(|c| c.p_value),
                "verdict": self.verdict_name(c),
            }))?;
        }
        super::print_json(&json!({
            "type": "summary",
            "fingerprint": self.current.fingerprint.id,
            "protocol": self.current.protocol,
            "workloads": self.current.workloads.len(),
            "threshold": self.threshold,
            "alpha": ALPHA,
            "baseline": self.base.map(|(p, _)| p.display().to_string()),
            "regressions": self.count(Verdict::Regression),
            "improvements": self.count(Verdict::Improvement),
            "unchanged": self.count(Verdict::Unchanged),
            "new": if self.base.is_some() { self.comparisons.iter().filter(|c| c.is_none()).count() } else { 0 },
            "saved_baseline": self.saved.map(|p| p.display().to_string()),
            "report": self.report.map(|p| p.display().to_string()),
            "exit_code": self.code,
        }))
    }

    fn text(&self) {
        println!(
            "{:>20}  {:>13}  {:>15}  {:>8}  {:<12}{}",
            "workload",
            "tuned GFLOP/s",
            "default GFLOP/s",
            "speedup",
            "kernel",
            if self.base.is_some() {
                "  speed vs baseline [95% CI]      p        verdict"
            } else {
                ""
            }
        );
        for (r, c) in self.current.workloads.iter().zip(self.comparisons) {
            let vs = match (self.base, c) {
                (Some(_), Some(c)) => {
                    let (lo, hi) = c.speed_ci();
                    format!(
                        "  {:>6.3}x [{lo:.3}, {hi:.3}]  {:>9.2e}  {}",
                        c.speed_ratio(),
                        c.p_value,
                        if c.verdict == Verdict::Regression {
                            "REGRESSION"
                        } else {
                            c.verdict.as_str()
                        }
                    )
                }
                (Some(_), None) => "  (not in the baseline)".into(),
                (None, _) => String::new(),
            };
            println!(
                "{:>20}  {:>7.1} ±{:>3.1}%  {:>15.1}  {:>7.2}x  {:<12}{vs}",
                r.workload,
                r.tuned.gflops,
                100.0 * r.tuned.spread,
                r.default.gflops,
                r.speedup_vs_default(),
                r.kernel,
            );
        }
        if let Some((p, b)) = self.base {
            println!(
                "{} regression(s), {} improvement(s), {} unchanged against {} ({}), threshold {:.1}%",
                self.count(Verdict::Regression),
                self.count(Verdict::Improvement),
                self.count(Verdict::Unchanged),
                p.display(),
                b.created_at,
                100.0 * self.threshold
            );
        }
        if let Some(p) = self.saved {
            println!("saved baseline {}", p.display());
        }
        if let Some(p) = self.report {
            println!("wrote report {}", p.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_percent;

    #[test]
    fn percentages_parse() {
        assert_eq!(parse_percent("5"), Ok(0.05));
        assert_eq!(parse_percent("12.5%"), Ok(0.125));
        assert_eq!(parse_percent("0"), Ok(0.0));
        for bad in ["-1", "abc", "nan", "inf", "5000"] {
            assert!(parse_percent(bad).is_err(), "{bad}");
        }
    }
}
