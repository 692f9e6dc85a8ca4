//! `autokernel tune`: search, measure, store.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use kernels::{HardwareFingerprint, Workload};
use search::{tune, Event, StrategyKind, TuneOptions, TuneSummary};
use serde_json::json;
use tuning_db::TuningDb;

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
    #[command(flatten)]
    db: crate::DbArg,
    /// Distinct configs to have tried per workload (trials already in the database count,
    /// so re-running the same command resumes).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    budget: u32,
    /// Search strategy.
    #[arg(long, default_value = "random", value_parser = ["exhaustive", "random"])]
    strategy: String,
    #[command(flatten)]
    threads: crate::ThreadsArg,
    /// Seed of the strategy and of the test inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// One JSON object per workload per line.
    #[arg(long)]
    json: bool,
}

pub fn run(args: TuneArgs) -> anyhow::Result<ExitCode> {
    let names: Vec<String> = if args.workloads.is_empty() {
        DEFAULT_WORKLOADS.iter().map(|s| s.to_string()).collect()
    } else {
        args.workloads.clone()
    };
    let workloads = super::parse_workloads(&names)?;
    let strategy: StrategyKind = args.strategy.parse().map_err(anyhow::Error::msg)?;
    args.threads.apply()?;
    let hw = HardwareFingerprint::current();
    let db =
        TuningDb::open(&args.db.db).with_context(|| format!("opening {}", args.db.db.display()))?;
    let opts = TuneOptions {
        budget: args.budget as usize,
        strategy,
        seed: args.seed,
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        ..TuneOptions::default()
    };
    if !args.json {
        eprintln!(
            "tuning {} workload(s) on {} [{}], budget {} per workload, strategy {}, into {}",
            workloads.len(),
            hw.brand,
            hw.id,
            opts.budget,
            args.strategy,
            args.db.db.display()
        );
    }
    for w in &workloads {
        let summary = tune_one(&db, w, hw, &opts)?;
        report(&db, &summary, hw, args.json)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn tune_one(
    db: &TuningDb,
    w: &Workload,
    hw: &HardwareFingerprint,
    opts: &TuneOptions,
) -> anyhow::Result<TuneSummary> {
    let bar = ProgressBar::new(opts.budget as u64);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>20} [{bar:30}] {pos}/{len} {msg} ({elapsed})")
            .expect("static template")
            .progress_chars("=> "),
    );
    bar.set_prefix(w.key());
    bar.enable_steady_tick(Duration::from_millis(200));
    let summary = tune(db, w, hw, opts, &mut |event| match event {
        Event::Started {
            already_tried,
            budget,
            ..
        } => bar.set_position(already_tried.min(budget) as u64),
        Event::Default { record } => {
            bar.set_message(format!(
                "default {:.1} GFLOP/s",
                record.gflops.unwrap_or(0.0)
            ));
        }
        Event::Trial {
            record,
            done,
            best_gflops,
            ..
        } => {
            bar.set_position(done as u64);
            let current = record
                .gflops
                .map_or_else(|| record.status.to_string(), |g| format!("{g:.1}"));
            bar.set_message(format!(
                "current {current}, best {:.1} GFLOP/s",
                best_gflops.unwrap_or(0.0)
            ));
        }
    })
    .with_context(|| format!("tuning {w}"))?;
    bar.finish_and_clear();
    Ok(summary)
}

fn report(
    db: &TuningDb,
    s: &TuneSummary,
    hw: &HardwareFingerprint,
    as_json: bool,
) -> anyhow::Result<()> {
    let history = db.trials(&hw.id, &s.workload)?;
    let trials = history.len();
    let failures = history.iter().filter(|r| r.measurement.is_none()).count();
    let default_median = s.default.measurement.as_ref().map(|m| m.median_s);
    let best = s.best.as_ref();
    let best_median = best
        .and_then(|b| b.measurement.as_ref())
        .map(|m| m.median_s);
    if as_json {
        super::print_json(&json!({
            "workload": s.workload.key(),
            "kernel": best.map(|b| b.kernel.clone()),
            "config": best.map(|b| b.config.clone()),
            "median_s": best_median,
            "gflops": best.and_then(|b| b.gflops),
            "spread": best.and_then(|b| b.measurement.as_ref()).map(|m| m.spread),
            "default_kernel": s.default.kernel,
            "default_config": s.default.config,
            "default_median_s": default_median,
            "speedup_vs_default": s.speedup_vs_default(),
            "trials": trials,
            "failures": failures,
            "measured_now": s.measured,
            "space_size": s.space_size,
            "fingerprint": hw.id,
        }))?;
    } else {
        match best {
            Some(b) => println!(
                "{:>20}  best {:>7.1} GFLOP/s  {} {}  default {:>7.1} GFLOP/s  speedup {:.2}x  ({} trials, {} failed, {} new; space {})",
                s.workload.key(),
                b.gflops.unwrap_or(0.0),
                b.kernel,
                b.config,
                s.default.gflops.unwrap_or(0.0),
                s.speedup_vs_default().unwrap_or(1.0),
                trials,
                failures,
                s.measured,
                s.space_size
            ),
            None => println!("{:>20}  no verified config ({trials} trials, {failures} failed)", s.workload.key()),
        }
    }
    Ok(())
}
