//! `autokernel db ...`: inspect, ship and combine tuning databases.
//!
//! - `stats` — records, fingerprints, workloads, failures;
//! - `export --out FILE [--fingerprint ID|current]` — a self-contained bundle of one machine;
//! - `import FILE` — a bundle (or any tuning database) into `--db`;
//! - `merge A B --out C` — two databases into a new one;
//! - `verify [FILE]` — integrity, schema, checksum, every servable config still valid;
//! - `diff A B` — per workload: did the winner change, and the speed ratio.
//!
//! Every subcommand has `--json` (one JSON object on stdout) and a human summary otherwise.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::json;
use tuning_db::{
    check_file, diff_files, merge_files, open_existing, BestSummary, CheckReport, Conflict,
    ImportReport, Outcome, TuningDb,
};

const TOOL_VERSION: &str = env!("CARGO_PKG_VERSION");

#[derive(Args)]
pub struct DbArgs {
    #[command(subcommand)]
    command: DbCommand,
}

#[derive(Subcommand)]
enum DbCommand {
    /// Counts: records, fingerprints, workloads, failures, imports.
    Stats(StatsArgs),
    /// Write a self-contained bundle of one fingerprint's records, with a manifest.
    Export(ExportArgs),
    /// Import a bundle (or any tuning database) into --db, keeping provenance.
    Import(ImportArgs),
    /// Merge two databases into a new one.
    Merge(MergeArgs),
    /// Check a database or bundle: integrity, schema, checksum, configs.
    Verify(VerifyArgs),
    /// Compare the winners of two databases, workload by workload.
    Diff(DiffArgs),
}

#[derive(Args)]
struct JsonArg {
    /// Machine-readable output: one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct StatsArgs {
    #[command(flatten)]
    db: crate::DbArg,
    #[command(flatten)]
    out: JsonArg,
}

#[derive(Args)]
struct ExportArgs {
    #[command(flatten)]
    db: crate::DbArg,
    /// The bundle file to write (must not exist).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Fingerprint id (or a unique prefix), or `current` for this machine at all its threads.
    /// Default: the only fingerprint in the database, else `current`.
    #[arg(long, value_name = "ID|current")]
    fingerprint: Option<String>,
    #[command(flatten)]
    json: JsonArg,
}

#[derive(Args)]
struct ImportArgs {
    /// The bundle or database to import.
    #[arg(value_name = "FILE")]
    file: PathBuf,
    #[command(flatten)]
    db: crate::DbArg,
    #[command(flatten)]
    json: JsonArg,
}

#[derive(Args)]
struct MergeArgs {
    /// First database (its best wins ties).
    #[arg(value_name = "A")]
    a: PathBuf,
    /// Second database.
    #[arg(value_name = "B")]
    b: PathBuf,
    /// The merged database to write (must not exist).
    #[arg(long, value_name = "C")]
    out: PathBuf,
    #[command(flatten)]
    json: JsonArg,
}

#[derive(Args)]
struct VerifyArgs {
    /// The file to check (default: --db).
    #[arg(value_name = "FILE")]
    file: Option<PathBuf>,
    #[command(flatten)]
    db: crate::DbArg,
    #[command(flatten)]
    json: JsonArg,
}

#[derive(Args)]
struct DiffArgs {
    #[arg(value_name = "A")]
    a: PathBuf,
    #[arg(value_name = "B")]
    b: PathBuf,
    #[command(flatten)]
    json: JsonArg,
}

pub fn run(args: DbArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        DbCommand::Stats(a) => stats(a),
        DbCommand::Export(a) => export(a),
        DbCommand::Import(a) => import(a),
        DbCommand::Merge(a) => merge(a),
        DbCommand::Verify(a) => verify(a),
        DbCommand::Diff(a) => diff(a),
    }
}

/// Fails with the usual one-line message when a file to read does not exist.
fn require(path: &Path) -> anyhow::Result<()> {
    if !path.exists() {
        anyhow::bail!("{}: no such file", path.display());
    }
    Ok(())
}

fn ms(s: f64) -> String {
    if s < 1e-3 {
        format!("{:.1} µs", s * 1e6)
    } else {
        format!("{:.3} ms", s * 1e3)
    }
}

fn best_line(b: &BestSummary) -> String {
    format!(
        "{} {} {} [{} .. {}]",
        b.kernel,
        b.config,
        ms(b.median_s),
        ms(b.ci_low_s),
        if b.ci_high_s.is_finite() {
            ms(b.ci_high_s)
        } else {
            "∞".into()
        }
    )
}

fn stats(a: StatsArgs) -> anyhow::Result<ExitCode> {
    super::require_db(&a.db.db)?;
    let db = open_existing(&a.db.db)?;
    let s = db.summary()?;
    if a.out.json {
        super::print_json(&serde_json::to_value(&s)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let t = &s.totals;
    println!(
        "{}: schema v{}, {} records ({} ok, {} failed), {} fingerprint(s), {} workload(s), {} winner decision(s) in force",
        s.path.display(),
        s.schema_version,
        t.records,
        t.ok,
        t.failures,
        t.fingerprints,
        t.workloads,
        s.winners
    );
    let here = kernels::HardwareFingerprint::current();
    for f in &s.fingerprints_detail {
        let mark = if f.id == here.id {
            " (this machine)"
        } else if f.arch_key == here.arch_key() {
            " (same arch as this machine)"
        } else {
            ""
        };
        println!(
            "  {} {}, {}{mark}: {} records ({} ok, {} failed), {} workload(s)",
            f.id,
            f.brand,
            threads(f.cores),
            f.records,
            f.ok,
            f.failures,
            f.workloads
        );
    }
    if s.imported_records > 0 {
        println!(
            "  imported: {} record(s) from {} source(s)",
            s.imported_records, s.sources
        );
    }
    if let Some(m) = &s.manifest {
        println!(
            "  bundle of {} ({} records), written {} by autokernel {}, checksum {}",
            m.fingerprint, m.record_count, m.created_at, m.tool_version, m.checksum
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn export(a: ExportArgs) -> anyhow::Result<ExitCode> {
    super::require_db(&a.db.db)?;
    let db = open_existing(&a.db.db)?;
    let fp = match &a.fingerprint {
        Some(f) => f.clone(),
        None => match db.fingerprint_ids()?.as_slice() {
            [one] => one.clone(),
            _ => "current".into(),
        },
    };
    let m = db
        .export_bundle(&fp, &a.out, TOOL_VERSION)
        .with_context(|| format!("exporting {} to {}", a.db.db.display(), a.out.display()))?;
    if a.json.json {
        let mut v = serde_json::to_value(&m)?;
        v["out"] = json!(a.out);
        super::print_json(&v)?;
    } else {
        let brand = db
            .fingerprint(&m.fingerprint)?
            .map_or_else(String::new, |f| {
                format!(" ({}, {})", f.brand, threads(f.cores as i64))
            });
        println!(
            "wrote {}: fingerprint {}{brand}, {} records, schema v{}, checksum {}",
            a.out.display(),
            m.fingerprint,
            m.record_count,
            m.schema_version,
            m.checksum
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `1 thread`, `2 threads`.
fn threads(n: i64) -> String {
    format!("{n} thread{}", if n == 1 { "" } else { "s" })
}

fn outcome_counts(r: &ImportReport) -> String {
    let n = |o: Outcome| r.workloads.iter().filter(|w| w.outcome == o).count();
    format!(
        "{} workload(s): {} new, {} unchanged, {} faster in the source, {} faster in the target, {} within noise",
        r.workloads.len(),
        n(Outcome::New),
        n(Outcome::Same),
        n(Outcome::SourceFaster),
        n(Outcome::TargetFaster),
        n(Outcome::WithinNoise)
    )
}

/// The workloads of a merge's result (A imported first, then B): how many each side alone
/// had, and how B's compare with A's.
fn merge_counts(a: &ImportReport, b: &ImportReport) -> String {
    let key = |w: &tuning_db::WorkloadOutcome| (w.fingerprint_id.clone(), w.workload.clone());
    let in_b: std::collections::HashSet<_> = b.workloads.iter().map(key).collect();
    let only_a = a
        .workloads
        .iter()
        .filter(|w| !in_b.contains(&key(w)))
        .count();
    let n = |o: Outcome| b.workloads.iter().filter(|w| w.outcome == o).count();
    format!(
        "{} workload(s): {only_a} only in A, {} only in B, {} the same in both, {} faster in B, {} faster in A, {} within noise",
        only_a + b.workloads.len(),
        n(Outcome::New),
        n(Outcome::Same),
        n(Outcome::SourceFaster),
        n(Outcome::TargetFaster),
        n(Outcome::WithinNoise)
    )
}

fn print_conflicts(conflicts: &[Conflict]) {
    if conflicts.is_empty() {
        println!("no conflicts");
        return;
    }
    println!(
        "{} conflict(s): bests within noise of each other that disagree (the first is kept):",
        conflicts.len()
    );
    for c in conflicts {
        println!("  {} on {}:", c.workload, c.fingerprint_id);
        println!("    kept   {}  ({})", best_line(&c.kept), c.kept.source);
        println!("    other  {}  ({})", best_line(&c.other), c.other.source);
    }
}

fn import(a: ImportArgs) -> anyhow::Result<ExitCode> {
    require(&a.file)?;
    // Check the source before touching (or creating) the target.
    check_file(&a.file)?.into_result()?;
    let db = TuningDb::open(&a.db.db)?;
    let r = db
        .import_from(&a.file, TOOL_VERSION)
        .with_context(|| format!("importing {} into {}", a.file.display(), a.db.db.display()))?;
    if a.json.json {
        let mut v = serde_json::to_value(&r)?;
        v["changed"] = json!(r.changed());
        super::print_json(&v)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "imported {} into {}: {} new record(s), {} already present, {} fingerprint(s) added{}",
        a.file.display(),
        a.db.db.display(),
        r.inserted,
        r.duplicates,
        r.fingerprints_added,
        if r.changed() {
            ""
        } else {
            " (nothing changed)"
        }
    );
    println!("{}", outcome_counts(&r));
    print_conflicts(&r.conflicts);
    Ok(ExitCode::SUCCESS)
}

fn merge(a: MergeArgs) -> anyhow::Result<ExitCode> {
    require(&a.a)?;
    require(&a.b)?;
    let r = merge_files(&a.a, &a.b, &a.out, TOOL_VERSION).with_context(|| {
        format!(
            "merging {} and {} into {}",
            a.a.display(),
            a.b.display(),
            a.out.display()
        )
    })?;
    if a.json.json {
        super::print_json(&serde_json::to_value(&r)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "merged {} ({} records) and {} ({} records, {} new) into {}: {} records, checksum {}",
        a.a.display(),
        r.a.source_records,
        a.b.display(),
        r.b.source_records,
        r.b.inserted,
        a.out.display(),
        r.records,
        r.checksum
    );
    println!("{}", merge_counts(&r.a, &r.b));
    print_conflicts(&r.conflicts);
    Ok(ExitCode::SUCCESS)
}

fn verify(a: VerifyArgs) -> anyhow::Result<ExitCode> {
    let path = a.file.unwrap_or(a.db.db);
    require(&path)?;
    let report: CheckReport = check_file(&path)?;
    if a.json.json {
        let mut v = serde_json::to_value(&report)?;
        v["ok"] = json!(report.is_ok());
        super::print_json(&v)?;
    } else if report.is_ok() {
        let checksum = match report.checksum_ok {
            Some(true) => format!("checksum {} matches the manifest", report.checksum),
            _ => format!("checksum {} (no manifest: not a bundle)", report.checksum),
        };
        println!(
            "{}: ok — schema v{}, {} records, {} fingerprint(s), {checksum}, {} servable config(s) checked",
            path.display(),
            report.schema_version,
            report.records,
            report.fingerprints,
            report.configs_checked
        );
        for n in &report.notes {
            println!("  note: {n}");
        }
    } else {
        for p in &report.problems {
            println!("  problem: {p}");
        }
    }
    report.into_result()?;
    Ok(ExitCode::SUCCESS)
}

fn diff(a: DiffArgs) -> anyhow::Result<ExitCode> {
    require(&a.a)?;
    require(&a.b)?;
    let d = diff_files(&a.a, &a.b)?;
    if a.json.json {
        super::print_json(&serde_json::to_value(&d)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{} vs {} (matched by {}): {} same, {} changed, {} only in A, {} only in B{}",
        a.a.display(),
        a.b.display(),
        d.matched_by,
        d.same,
        d.changed,
        d.only_a,
        d.only_b,
        d.median_ratio
            .map_or(String::new(), |r| format!(", median A/B time ratio {r:.3}"))
    );
    // One fingerprint (or one pair matched across): named once; several: on every row.
    let mut fps: Vec<&str> = d.rows.iter().map(|r| r.fingerprint_id.as_str()).collect();
    fps.sort_unstable();
    fps.dedup();
    let per_row = fps.len() > 1;
    if let [fp] = fps[..] {
        println!("  fingerprint {fp}");
    }
    for r in &d.rows {
        let side = |b: &Option<BestSummary>| {
            b.as_ref().map_or("—".to_string(), |b| {
                format!("{} {} {}", b.kernel, b.config, ms(b.median_s))
            })
        };
        let ratio = match (r.ratio, r.within_noise) {
            (Some(x), Some(true)) => format!("A/B {x:.3} (within noise)"),
            (Some(x), _) => format!("A/B {x:.3}"),
            _ => String::new(),
        };
        let fp = if per_row {
            format!(" [{}]", r.fingerprint_id)
        } else {
            String::new()
        };
        println!(
            "  {:<28} {:<8} {ratio}{fp}\n      A: {}\n      B: {}",
            r.workload,
            r.status.as_str(),
            side(&r.a),
            side(&r.b)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Reads a workload list (`tune --workloads-from FILE`): one workload per line, `#` starts a
/// comment, blank lines are skipped — the format of the runtime's untuned-workload log. The
/// first bad line fails with `FILE:LINE: reason`.
pub fn read_workload_list(path: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{}: cannot read the workload list", path.display()))?;
    let mut out = Vec::new();
    for entry in runtime::parse_workload_list(&text) {
        match entry {
            Ok(w) => out.push(w.key()),
            Err(e) => anyhow::bail!("{}:{}: {}", path.display(), e.line, e.error),
        }
    }
    if out.is_empty() {
        anyhow::bail!(
            "{}: lists no workloads (one per line, e.g. gemm:128x768x768; `#` starts a comment)",
            path.display()
        );
    }
    Ok(out)
}
