//! `bench --report DIR`: a Markdown report and SVG charts (plotters, SVG backend only).
//!
//! Files written:
//! - `report.md` — verdicts, tables and the charts below, linked relatively;
//! - `speed_vs_baseline.svg` — per workload, speed relative to the baseline (above 1 = faster)
//!   with its 95% bootstrap interval and the threshold band (only with a baseline);
//! - `speedup_vs_default.svg` — tuned vs the kernel default, per workload;
//! - `history.svg` — tuned GFLOP/s of each workload over every baseline of this fingerprint,
//!   plus the current run.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use plotters::coord::ranged1d::{IntoSegmentedCoord, SegmentValue, SegmentedCoord};
use plotters::coord::types::RangedCoordusize;
use plotters::prelude::*;
use runner::compare::{Comparison, Verdict};

use super::baseline::Baseline;

/// Everything a report shows.
pub struct ReportInput<'a> {
    pub current: &'a Baseline,
    /// The baseline compared with, and where it was read from.
    pub baseline: Option<(&'a Path, &'a Baseline)>,
    /// One entry per `current.workloads`, `None` where there was nothing to compare with.
    pub comparisons: &'a [Option<Comparison>],
    /// Earlier runs of this fingerprint, oldest first (the current run is added at the end),
    /// and the directory they were read from.
    pub history: &'a [(PathBuf, Baseline)],
    pub history_dir: &'a Path,
    pub threshold: f64,
    pub alpha: f64,
}

/// The names of the files [`write()`] writes.
const FILES: [&str; 4] = [
    "report.md",
    "speed_vs_baseline.svg",
    "speedup_vs_default.svg",
    "history.svg",
];

/// The first line of every `report.md` written here.
const TITLE: &str = "# Regression benchmark — ";

/// Refuses a report directory holding files of the report's names that an earlier report
/// did not write: a `report.md` of another title, or charts beside no report of ours.
pub fn check_dir(dir: &Path) -> anyhow::Result<()> {
    let ours = std::fs::read_to_string(dir.join("report.md"))
        .map(|text| text.starts_with(TITLE))
        .unwrap_or(false);
    if ours {
        return Ok(());
    }
    match FILES.iter().find(|f| dir.join(f).exists()) {
        Some(f) => anyhow::bail!(
            "--report {}: {f} is there and no report of autokernel's is (its report.md starts \
             '{}'); refusing to overwrite it (name a new or an earlier report's directory)",
            dir.display(),
            TITLE.trim_end()
        ),
        None => Ok(()),
    }
}

/// The files written, report first.
pub fn write(dir: &Path, input: &ReportInput) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating report directory {}", dir.display()))?;
    let mut written = Vec::new();
    let have_comparisons = input.comparisons.iter().any(Option::is_some);
    if have_comparisons {
        let p = dir.join("speed_vs_baseline.svg");
        speed_chart(&p, input).with_context(|| format!("drawing {}", p.display()))?;
        written.push(p);
    }
    let p = dir.join("speedup_vs_default.svg");
    speedup_chart(&p, input.current).with_context(|| format!("drawing {}", p.display()))?;
    written.push(p);
    let runs = history_runs(input);
    let p = dir.join("history.svg");
    history_chart(&p, &runs).with_context(|| format!("drawing {}", p.display()))?;
    written.push(p);
    let md = markdown(input, &runs, have_comparisons);
    let p = dir.join("report.md");
    std::fs::write(&p, md).with_context(|| format!("writing {}", p.display()))?;
    written.insert(0, p);
    Ok(written)
}

/// Earlier baselines, the one compared with, and the current run, oldest first; a run is
/// known by its fingerprint and time stamp (the current run may have just been saved).
fn history_runs<'a>(input: &'a ReportInput) -> Vec<&'a Baseline> {
    let same = |a: &Baseline, b: &Baseline| {
        a.created_at == b.created_at && a.fingerprint.id == b.fingerprint.id
    };
    let mut runs: Vec<&Baseline> = input
        .history
        .iter()
        .map(|(_, b)| b)
        .filter(|b| !same(b, input.current))
        .collect();
    if let Some((_, b)) = input.baseline {
        if b.fingerprint.id == input.current.fingerprint.id && !runs.iter().any(|r| same(r, b)) {
            runs.push(b);
        }
    }
    runs.sort_by(|a, b| a.created_at.cmp(&b.created_at));
    runs.push(input.current);
    runs
}

/// `n` category slots: plotters' integer range `0..k` holds k + 1 values. A one-value range
/// yields no axis labels, so a single category gets a spare, empty slot.
fn slots(n: usize) -> SegmentedCoord<RangedCoordusize> {
    (0..n.max(2) - 1).into_segmented()
}

/// Distinct, readable line colours for the history chart.
const SERIES: [RGBColor; 8] = [
    RGBColor(40, 90, 170),
    RGBColor(200, 30, 30),
    RGBColor(20, 140, 60),
    RGBColor(230, 130, 0),
    RGBColor(120, 60, 170),
    RGBColor(120, 80, 40),
    RGBColor(0, 150, 150),
    RGBColor(200, 0, 140),
];

fn verdict_color(v: Option<Verdict>) -> RGBColor {
    match v {
        Some(Verdict::Regression) => RGBColor(200, 30, 30),
        Some(Verdict::Improvement) => RGBColor(20, 140, 60),
        _ => RGBColor(40, 90, 170),
    }
}

/// Room for the longest workload name on a label axis.
fn label_area(names: &[&str]) -> u32 {
    let longest = names.iter().map(|n| n.len()).max().unwrap_or(8) as u32;
    40 + 8 * longest
}

fn speed_chart(path: &Path, input: &ReportInput) -> anyhow::Result<()> {
    let rows: Vec<(&str, &Comparison)> = input
        .current
        .workloads
        .iter()
        .zip(input.comparisons)
        .filter_map(|(r, c)| c.as_ref().map(|c| (r.workload.as_str(), c)))
        .collect();
    let n = rows.len();
    let t = input.threshold;
    let (lo_band, hi_band) = (1.0 / (1.0 + t), 1.0 + t);
    let lo = rows
        .iter()
        .map(|(_, c)| c.speed_ci().0)
        .fold(lo_band, f64::min);
    let hi = rows
        .iter()
        .map(|(_, c)| c.speed_ci().1)
        .fold(hi_band, f64::max);
    let pad = 0.1 * (hi - lo).max(0.05);
    let names: Vec<&str> = rows.iter().map(|r| r.0).collect();

    let root = SVGBackend::new(path, (960, 120 + 44 * n as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Speed vs baseline (×, above 1 = faster), 95% bootstrap CI",
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(label_area(&names))
        .build_cartesian_2d((lo - pad)..(hi + 2.5 * pad), slots(n))?;
    // Row i is drawn at the top for i = 0.
    let row = |i: usize| SegmentValue::CenterOf(n - 1 - i);
    let label = |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(j) if *j < n => names[n - 1 - *j].to_string(),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 16))
        .y_labels(n)
        .y_label_formatter(&label)
        .x_label_formatter(&|x| format!("{x:.2}"))
        .x_desc(format!(
            "baseline time ÷ current time (dashed: ±{:.0}% threshold)",
            100.0 * t
        ))
        .disable_y_mesh()
        .draw()?;
    let full = |x: f64| vec![(x, SegmentValue::Exact(0)), (x, SegmentValue::Last)];
    chart.draw_series([PathElement::new(full(1.0), BLACK.stroke_width(2))])?;
    for x in [lo_band, hi_band] {
        chart.draw_series(DashedLineSeries::new(full(x), 6, 4, BLACK.mix(0.6).into()))?;
    }
    for (i, (_, c)) in rows.iter().enumerate() {
        let color = verdict_color(Some(c.verdict));
        let (clo, chi) = c.speed_ci();
        chart.draw_series([ErrorBar::new_horizontal(
            row(i),
            clo,
            c.speed_ratio(),
            chi,
            color.stroke_width(2),
            14,
        )])?;
        chart.draw_series([Circle::new((c.speed_ratio(), row(i)), 5, color.filled())])?;
        chart.draw_series([EmptyElement::at((chi, row(i)))
            + Text::new(
                format!("{:.3}× {}", c.speed_ratio(), c.verdict),
                (8, -7),
                ("sans-serif", 16).into_font().color(&color),
            )])?;
    }
    root.present()?;
    Ok(())
}

fn speedup_chart(path: &Path, current: &Baseline) -> anyhow::Result<()> {
    let n = current.workloads.len();
    let names: Vec<&str> = current
        .workloads
        .iter()
        .map(|r| r.workload.as_str())
        .collect();
    let speedups: Vec<f64> = current
        .workloads
        .iter()
        .map(|r| r.speedup_vs_default())
        .collect();
    let hi = speedups.iter().copied().fold(1.0, f64::max) * 1.25;

    let root = SVGBackend::new(path, (960, 120 + 44 * n as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Tuned vs kernel default (× faster, same run)",
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(label_area(&names))
        .build_cartesian_2d(0.0..hi, slots(n))?;
    let label = |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(j) if *j < n => names[n - 1 - *j].to_string(),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 16))
        .y_labels(n)
        .y_label_formatter(&label)
        .x_label_formatter(&|x| format!("{x:.1}"))
        .x_desc("default time ÷ tuned time")
        .disable_y_mesh()
        .draw()?;
    for (i, s) in speedups.iter().enumerate() {
        let slot = n - 1 - i;
        let color = if *s >= 1.0 {
            RGBColor(40, 90, 170)
        } else {
            RGBColor(200, 120, 30)
        };
        let mut bar = Rectangle::new(
            [
                (0.0, SegmentValue::Exact(slot)),
                (*s, SegmentValue::Exact(slot + 1)),
            ],
            color.filled(),
        );
        bar.set_margin(8, 8, 0, 0);
        chart.draw_series([bar])?;
        chart.draw_series([EmptyElement::at((*s, SegmentValue::CenterOf(slot)))
            + Text::new(
                format!("{s:.2}×  {}", current.workloads[i].kernel),
                (6, -7),
                ("sans-serif", 16).into_font(),
            )])?;
    }
    chart.draw_series([PathElement::new(
        vec![(1.0, SegmentValue::Exact(0)), (1.0, SegmentValue::Last)],
        BLACK.stroke_width(2),
    )])?;
    root.present()?;
    Ok(())
}

fn history_chart(path: &Path, runs: &[&Baseline]) -> anyhow::Result<()> {
    let h = runs.len();
    let mut names: Vec<&str> = Vec::new();
    for r in runs {
        for w in &r.workloads {
            if !names.contains(&w.workload.as_str()) {
                names.push(&w.workload);
            }
        }
    }
    let top = runs
        .iter()
        .flat_map(|r| r.workloads.iter().map(|w| w.tuned.gflops))
        .fold(1e-9, f64::max)
        * 1.15;
    let dates: Vec<String> = runs
        .iter()
        .map(|r| {
            r.created_at
                .replace('T', " ")
                .trim_end_matches('Z')
                .to_string()
        })
        .collect();

    let root = SVGBackend::new(path, (960, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "History: tuned GFLOP/s per run, fingerprint {}",
                runs[h - 1].fingerprint.id
            ),
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(60)
        .y_label_area_size(70)
        .build_cartesian_2d(slots(h), 0.0..top)?;
    let label = |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(j) if *j < h => dates[*j].clone(),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 16))
        .x_labels(h.min(8))
        .x_label_formatter(&label)
        .y_desc("GFLOP/s (median)")
        .x_desc("run (UTC); the last is the current one")
        .disable_x_mesh()
        .draw()?;
    for (si, name) in names.iter().enumerate() {
        let color = SERIES[si % SERIES.len()];
        let points: Vec<(SegmentValue<usize>, f64)> = runs
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                r.get(name)
                    .map(|w| (SegmentValue::CenterOf(i), w.tuned.gflops))
            })
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 4, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font(("sans-serif", 16))
        .draw()?;
    root.present()?;
    Ok(())
}

fn markdown(input: &ReportInput, runs: &[&Baseline], have_comparisons: bool) -> String {
    let mut md = String::new();
    md_header(&mut md, input);
    match input.baseline {
        Some(base) => md_vs_baseline(&mut md, input, base, have_comparisons),
        None => md += "No baseline given: this report shows the current run only.\n",
    }
    md_tuned_vs_default(&mut md, input.current);
    md_history(&mut md, input, runs);
    md_method(&mut md, input);
    md
}

/// The title and the machine.
fn md_header(md: &mut String, input: &ReportInput) {
    let cur = input.current;
    let hw = &cur.fingerprint;
    let _ = writeln!(md, "{TITLE}{}\n", cur.created_at);
    let _ = writeln!(
        md,
        "Machine: {}\n\nFingerprint `{}` · autokernel {} · protocol `{}` · database `{}`\n",
        hw.summary(),
        hw.id,
        cur.tool_version,
        cur.protocol,
        cur.db
    );
}

/// The verdict against the baseline, and each workload's comparison.
fn md_vs_baseline(
    md: &mut String,
    input: &ReportInput,
    (path, b): (&Path, &Baseline),
    have_comparisons: bool,
) {
    let cur = input.current;
    let hw = &cur.fingerprint;
    let count = |v: Verdict| {
        input
            .comparisons
            .iter()
            .flatten()
            .filter(|c| c.verdict == v)
            .count()
    };
    let regressions = count(Verdict::Regression);
    let _ = writeln!(
        md,
        "Baseline `{}` ({}, autokernel {}, protocol `{}`{}).\n",
        path.display(),
        b.created_at,
        b.tool_version,
        b.protocol,
        if b.fingerprint.id == hw.id {
            String::new()
        } else {
            format!(", **foreign fingerprint `{}`**", b.fingerprint.id)
        }
    );
    let _ = writeln!(
        md,
        "**{}** — {regressions} regression(s), {} improvement(s), {} unchanged, {} without a baseline (threshold {:.1}%).\n",
        if regressions > 0 { "FAIL" } else { "PASS" },
        count(Verdict::Improvement),
        count(Verdict::Unchanged),
        input.comparisons.iter().filter(|c| c.is_none()).count(),
        100.0 * input.threshold
    );
    *md += "| workload | kernel | GFLOP/s now | GFLOP/s baseline | speed vs baseline | 95% CI | p (Mann–Whitney) | verdict |\n";
    *md += "|---|---|---:|---:|---:|---|---:|---|\n";
    for (r, c) in cur.workloads.iter().zip(input.comparisons) {
        let base = b.get(&r.workload);
        let _ = match c {
            Some(c) => {
                let (lo, hi) = c.speed_ci();
                writeln!(
                    md,
                    "| {} | {} | {:.1} | {:.1} | {:.3}× | [{lo:.3}, {hi:.3}] | {:.2e} | {} |",
                    r.workload,
                    r.kernel,
                    r.tuned.gflops,
                    base.map_or(f64::NAN, |x| x.tuned.gflops),
                    c.speed_ratio(),
                    c.p_value,
                    if c.verdict == Verdict::Regression {
                        "**regression**".to_string()
                    } else {
                        c.verdict.to_string()
                    }
                )
            }
            None => writeln!(
                md,
                "| {} | {} | {:.1} | — | — | — | — | new |",
                r.workload, r.kernel, r.tuned.gflops
            ),
        };
    }
    if have_comparisons {
        *md += "\n![speed vs baseline](speed_vs_baseline.svg)\n";
    }
}

/// The tuned config of every workload against the kernel default.
fn md_tuned_vs_default(md: &mut String, cur: &Baseline) {
    *md += "\n## Tuned vs default\n\n";
    *md += "| workload | level | tuned kernel | config | tuned GFLOP/s | ±MAD | default kernel | default GFLOP/s | speedup |\n";
    *md += "|---|---|---|---|---:|---:|---|---:|---:|\n";
    for r in &cur.workloads {
        let _ = writeln!(
            md,
            "| {} | {} | {} | `{}` | {:.1} | {:.1}% | {} | {:.1} | {:.2}× |",
            r.workload,
            r.level,
            r.kernel,
            r.config,
            r.tuned.gflops,
            100.0 * r.tuned.spread,
            r.default_kernel,
            r.default.gflops,
            r.speedup_vs_default()
        );
    }
    *md += "\n![tuned vs default](speedup_vs_default.svg)\n";
}

/// Tuned GFLOP/s of every saved run of this fingerprint.
fn md_history(md: &mut String, input: &ReportInput, runs: &[&Baseline]) {
    let cur = input.current;
    let hw = &cur.fingerprint;
    *md += "\n## History\n\n";
    let _ = writeln!(
        md,
        "{} run(s) of fingerprint `{}` (the saved baselines in `{}/` and this run), tuned GFLOP/s:\n",
        runs.len(),
        hw.id,
        input.history_dir.display()
    );
    let mut names: Vec<&str> = Vec::new();
    for r in runs {
        for w in &r.workloads {
            if !names.contains(&w.workload.as_str()) {
                names.push(&w.workload);
            }
        }
    }
    let _ = writeln!(md, "| run (UTC) | autokernel | {} |", names.join(" | "));
    let _ = writeln!(md, "|---|---|{}", "---:|".repeat(names.len()));
    for r in runs {
        let cells: Vec<String> = names
            .iter()
            .map(|n| {
                r.get(n)
                    .map_or("—".into(), |w| format!("{:.1}", w.tuned.gflops))
            })
            .collect();
        let _ = writeln!(
            md,
            "| {}{} | {} | {} |",
            r.created_at,
            if std::ptr::eq(*r, cur) {
                " (this run)"
            } else {
                ""
            },
            r.tool_version,
            cells.join(" | ")
        );
    }
    *md += "\n![history](history.svg)\n";
}

/// How the numbers were measured and judged.
fn md_method(md: &mut String, input: &ReportInput) {
    let _ = writeln!(
        md,
        "\n## Method\n\nEach workload is run through the runtime's choice (the database's verified winner, or the \
         kernel default when untuned) and through the kernel default, both verified against the f64 reference, then \
         timed by the `{}` protocol (`runner/src/protocol.rs`), the one named above. Speed vs baseline is the ratio of median times; \
         its 95% interval is a percentile bootstrap ({} resamples of each run's samples). A workload is a \
         regression only when a two-sided Mann–Whitney U test on the samples gives p < {} **and** the whole \
         interval lies beyond the {:.1}% threshold; improvements mirror that; everything else is unchanged.",
        input.current.protocol,
        runner::CompareOptions::default().resamples,
        input.alpha,
        100.0 * input.threshold
    );
}
