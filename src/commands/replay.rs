//! `autokernel replay`: evaluate search strategies (and cost models) offline, against
//! recorded search spaces; `--export` writes such a space from a tuning database.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{ArgAction, Args};
use costmodel::ModelKind;
use kernels::HardwareFingerprint;
use rayon::prelude::*;
use search::replay::{evaluate_model, summarize, ModelReport, Summary};
use search::{RecordedSpace, ReplayOptions, Replayer, StrategyKind};
use serde_json::json;
use tuning_db::TuningDb;

/// Strategies replayed when none is named.
const DEFAULT_STRATEGIES: [&str; 5] = [
    "random",
    "annealing",
    "evolutionary",
    "model-notransfer",
    "model",
];

#[derive(Args)]
pub struct ReplayArgs {
    /// Recorded space files (JSON lines; format in the `spaces/README.md` of a results
    /// directory, e.g. bench_results/e328fcad30c0f803/spaces/README.md). Takes one or
    /// more values and may repeat.
    #[arg(long = "space", value_name = "FILE", num_args = 1.., action = ArgAction::Append)]
    spaces: Vec<PathBuf>,
    /// Strategies to replay; one or more values, may repeat.
    /// Default: random annealing evolutionary model-notransfer model.
    #[arg(long = "strategy", value_name = "S", num_args = 1.., action = ArgAction::Append,
          value_parser = StrategyKind::NAMES)]
    strategies: Vec<String>,
    /// Seeds per (space, strategy); results are medians over them.
    #[arg(long, default_value_t = 20, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    seeds: u32,
    /// First seed (seeds are FIRST, FIRST+1, ..., wrapping past 2^64 - 1 to 0).
    #[arg(long = "first-seed", default_value_t = 0, value_name = "FIRST")]
    first_seed: u64,
    /// Trials per run.
    #[arg(long, default_value_t = 100, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    budget: u32,
    /// Candidates asked for at once (the tuner's batch).
    #[arg(long, default_value_t = 8, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=4096))]
    batch: u32,
    /// One JSON object per (space, strategy) per line.
    #[arg(long)]
    json: bool,
    /// Draw best-so-far vs trials curves (median over seeds), one line per strategy, to an SVG.
    #[arg(long, value_name = "SVG")]
    plot: Option<PathBuf>,
    /// Evaluate the cost models instead of strategies: fit on TRAIN random points of each
    /// space (with and without the other spaces as transfer, prepared as the `model` strategy
    /// prepares it), score the rest (Spearman, top-10 recall, regret), mean over seeds.
    #[arg(long, conflicts_with_all = ["strategies", "plot", "export"])]
    models: bool,
    /// Points of the space itself each model is fitted on (with --models).
    #[arg(long, default_value_t = 32, value_name = "TRAIN", requires = "models")]
    train: u32,
    /// Write the recorded space of workload W from the database instead (needs --out).
    #[arg(long, value_name = "W", conflicts_with_all = ["spaces", "strategies", "plot"])]
    export: Option<String>,
    /// Output file of --export.
    #[arg(long, value_name = "FILE", requires = "export")]
    out: Option<PathBuf>,
    /// Fingerprint id to export (default: this machine's, sized by --threads).
    #[arg(long, value_name = "ID", requires = "export")]
    fingerprint: Option<String>,
    #[command(flatten)]
    db: crate::DbArg,
    #[command(flatten)]
    threads: crate::ThreadsArg,
}

pub fn run(args: ReplayArgs) -> anyhow::Result<ExitCode> {
    if let Some(w) = &args.export {
        return export(&args, w);
    }
    if args.spaces.is_empty() {
        bail!("give at least one --space FILE (or --export W --out FILE to write one)");
    }
    if let Some(svg) = &args.plot {
        super::check_chart_file(svg, "--plot")?;
    }
    args.threads.apply()?;
    let spaces: Vec<RecordedSpace> = args
        .spaces
        .iter()
        .map(|p| RecordedSpace::read(p).with_context(|| format!("reading space {}", p.display())))
        .collect::<anyhow::Result<_>>()?;
    if args.models {
        return models(&args, &spaces);
    }
    let names: Vec<String> = if args.strategies.is_empty() {
        DEFAULT_STRATEGIES.iter().map(|s| s.to_string()).collect()
    } else {
        let mut v = args.strategies.clone();
        v.dedup();
        v
    };
    let kinds: Vec<StrategyKind> = names
        .iter()
        .map(|s| Ok(s.parse()?))
        .collect::<anyhow::Result<_>>()?;
    let opts = ReplayOptions {
        budget: args.budget as usize,
        batch: args.batch as usize,
    };
    let mut all: Vec<Summary> = Vec::new();
    for (path, space) in args.spaces.iter().zip(&spaces) {
        let others: Vec<&RecordedSpace> =
            spaces.iter().filter(|s| !std::ptr::eq(*s, space)).collect();
        let replayer = Replayer::new(space, &others);
        let label = path.display().to_string();
        let summaries: Vec<Summary> = kinds
            .par_iter()
            .map(|&k| {
                summarize(
                    &replayer,
                    &label,
                    k,
                    args.first_seed,
                    args.seeds as usize,
                    &opts,
                )
            })
            .collect();
        let random = summaries
            .iter()
            .find(|s| s.strategy == "random")
            .and_then(|s| s.trials_to_95);
        if args.json {
            for s in &summaries {
                let mut v = serde_json::to_value(s).context("serialising a summary")?;
                v["ratio_to_random_95"] = json!(ratio(s.trials_to_95, random));
                super::print_json(&v)?;
            }
        } else {
            print_table(space, &label, &summaries, random, &opts);
        }
        all.extend(summaries);
    }
    if let Some(svg) = &args.plot {
        plot(svg, &all).with_context(|| format!("drawing {}", svg.display()))?;
        if !args.json {
            println!("plot: {}", svg.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Seconds in a readable unit.
fn fmt_time(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.3} ms", s * 1e3)
    } else {
        format!("{:.2} µs", s * 1e6)
    }
}

fn ratio(x: Option<f64>, random: Option<f64>) -> Option<f64> {
    Some(x? / random?)
}

fn fmt_trials(t: Option<f64>, budget: usize) -> String {
    match t {
        Some(t) => format!("{t:.1}"),
        None => format!(">{budget}"),
    }
}

fn print_table(
    space: &RecordedSpace,
    label: &str,
    rows: &[Summary],
    random: Option<f64>,
    opts: &ReplayOptions,
) {
    let first = &rows[0];
    println!(
        "{label}: {} on {}, {} candidates, best {}; random search needs (N+1)/(k+1) = {:.1} draws for the top 95%",
        space.workload,
        space.hw.id,
        first.space_size,
        fmt_time(first.space_best_s),
        first.random_expected_95
    );
    println!(
        "  {:<18} {:>8} {:>8} {:>12} {:>12}",
        "strategy",
        "to 95%",
        "to 99%",
        format!("best@{}", opts.budget),
        "95% vs random"
    );
    for s in rows {
        let r = ratio(s.trials_to_95, random).map_or("-".to_string(), |r| format!("{r:.2}×"));
        println!(
            "  {:<18} {:>8} {:>8} {:>12.3} {:>12}",
            s.strategy,
            fmt_trials(s.trials_to_95, s.budget),
            fmt_trials(s.trials_to_99, s.budget),
            s.best_at_budget,
            r
        );
    }
    println!(
        "  (median over {} seeds; trials to reach 95%/99% of the best speed; best@budget = fraction of the best speed found)",
        first.seeds
    );
}

fn plot(path: &Path, all: &[Summary]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let mut spaces: Vec<&str> = all.iter().map(|s| s.space.as_str()).collect();
    spaces.dedup();
    let root = SVGBackend::new(path, (960, 360 * spaces.len() as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((spaces.len(), 1));
    for (panel, space) in panels.iter().zip(&spaces) {
        let rows: Vec<&Summary> = all.iter().filter(|s| s.space == *space).collect();
        let budget = rows.iter().map(|s| s.curve.len()).max().unwrap_or(1).max(2);
        let lo = rows
            .iter()
            .flat_map(|s| s.curve.iter().copied())
            .filter(|v| v.is_finite() && *v > 0.0)
            .fold(1.0f64, f64::min)
            .max(0.0);
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!("{} ({}): best so far vs trials", rows[0].workload, space),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(1f64..budget as f64, (lo - 0.02).max(0.0)..1.01f64)?;
        chart
            .configure_mesh()
            .x_desc("trials")
            .y_desc("fraction of the best speed (median over seeds)")
            .draw()?;
        for (i, s) in rows.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let pts: Vec<(f64, f64)> = s
                .curve
                .iter()
                .enumerate()
                .map(|(t, v)| ((t + 1) as f64, if v.is_finite() { *v } else { 0.0 }))
                .collect();
            chart
                .draw_series(LineSeries::new(pts, color.stroke_width(2)))?
                .label(s.strategy.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

fn models(args: &ReplayArgs, spaces: &[RecordedSpace]) -> anyhow::Result<ExitCode> {
    let mut jobs = Vec::new();
    for (si, _) in spaces.iter().enumerate() {
        for kind in ModelKind::ALL {
            for transfer in [false, true] {
                if transfer && spaces.len() < 2 {
                    continue;
                }
                jobs.push((si, kind, transfer));
            }
        }
    }
    let reports: Vec<ModelReport> = jobs
        .par_iter()
        .map(|&(si, kind, transfer)| {
            let others: Vec<&RecordedSpace> = spaces
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != si)
                .map(|(_, s)| s)
                .collect();
            let target = &spaces[si];
            evaluate_model(
                target,
                if transfer { &others } else { &[] },
                kind,
                args.train as usize,
                args.first_seed,
                args.seeds as usize,
            )
            .with_context(|| format!("evaluating {kind} on {}", args.spaces[si].display()))
        })
        .collect::<anyhow::Result<_>>()?;
    if !args.json {
        println!(
            "{:<40} {:<7} {:>5} {:>9} {:>9} {:>11} {:>8}",
            "space", "model", "train", "transfer", "spearman", "top10recall", "regret"
        );
    }
    for (r, &(si, _, _)) in reports.into_iter().zip(&jobs) {
        let label = args.spaces[si].display().to_string();
        if args.json {
            let mut v = serde_json::to_value(&r).context("serialising a report")?;
            v["space"] = json!(label);
            super::print_json(&v)?;
        } else {
            println!(
                "{:<40} {:<7} {:>5} {:>9} {:>9.3} {:>11.3} {:>8.3}",
                label,
                r.model,
                r.train,
                if r.transfer { "yes" } else { "no" },
                r.spearman,
                r.top_k_recall,
                r.regret
            );
        }
    }
    if !args.json {
        println!(
            "(held-out: the space's other measured configs; means over {} seeds; regret = time of the model's pick / best)",
            args.seeds
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn export(args: &ReplayArgs, w: &str) -> anyhow::Result<ExitCode> {
    let Some(out) = &args.out else {
        bail!("--export needs --out FILE");
    };
    let w: kernels::Workload = w.parse()?;
    super::require_db(&args.db.db)?;
    super::check_new_file(out, "--out")?;
    let db = TuningDb::open_read_only(&args.db.db)?;
    let hw: HardwareFingerprint = match &args.fingerprint {
        Some(id) => db
            .fingerprint(id)?
            .with_context(|| format!("fingerprint {id} is not in {}", args.db.db.display()))?,
        None => {
            args.threads.apply()?;
            HardwareFingerprint::current().clone()
        }
    };
    let space = RecordedSpace::from_db(&db, &w, &hw)?;
    space.write(out, env!("CARGO_PKG_VERSION"))?;
    let ok = space
        .entries
        .iter()
        .filter(|e| e.median_s.is_some())
        .count();
    if args.json {
        super::print_json(&json!({
            "workload": w.key(),
            "fingerprint": hw.id,
            "candidates": space.entries.len(),
            "ok": ok,
            "best_s": space.best_s(),
            "out": out.display().to_string(),
        }))?;
    } else {
        println!(
            "{}: {} candidates ({} timed, best {}) on {} → {}",
            w,
            space.entries.len(),
            ok,
            space.best_s().map_or("-".to_string(), fmt_time),
            hw.id,
            out.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
