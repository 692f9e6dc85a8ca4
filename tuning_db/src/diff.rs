//! Comparing two databases: per workload, did the winner change, and how much faster is it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::bundle::{open_existing, BundleError};
use crate::db::TuningDb;
use crate::merge::BestSummary;

/// How a workload's winner compares between A and B.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DiffStatus {
    /// Same kernel, version and config.
    Same,
    /// Another variant wins in B.
    Changed,
    /// Only A has a best for it.
    OnlyA,
    /// Only B has a best for it.
    OnlyB,
}

impl DiffStatus {
    /// The status as reports and JSON spell it: `same`, `changed`, `only_a`, `only_b`.
    pub fn as_str(self) -> &'static str {
        match self {
            DiffStatus::Same => "same",
            DiffStatus::Changed => "changed",
            DiffStatus::OnlyA => "only_a",
            DiffStatus::OnlyB => "only_b",
        }
    }
}

/// One workload of a diff.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiffRow {
    /// The fingerprint both sides are of; `A-id→B-id` when each file holds one different
    /// fingerprint and workloads are matched across them.
    pub fingerprint_id: String,
    /// The workload key ([`Workload::key`](kernels::Workload::key): `gemm:128x768x768`).
    pub workload: String,
    /// How the two winners compare.
    pub status: DiffStatus,
    /// A's best for the workload; `None` when A has none.
    pub a: Option<BestSummary>,
    /// B's best for the workload; `None` when B has none.
    pub b: Option<BestSummary>,
    /// A's median ÷ B's median: above 1 means B's winner is faster.
    pub ratio: Option<f64>,
    /// Whether the two medians are within noise (confidence intervals overlap).
    pub within_noise: Option<bool>,
}

/// What [`diff_files`] found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiffReport {
    /// The first file, as given.
    pub a: PathBuf,
    /// The second file, as given.
    pub b: PathBuf,
    /// `fingerprint` (rows pair the same fingerprint and workload) or `workload` (each file
    /// holds one, different, fingerprint; rows pair workloads across machines).
    pub matched_by: &'static str,
    /// One row per (fingerprint, workload) with a best in either file, sorted by fingerprint,
    /// then workload key.
    pub rows: Vec<DiffRow>,
    /// Rows whose status is [`DiffStatus::Same`].
    pub same: usize,
    /// Rows whose status is [`DiffStatus::Changed`].
    pub changed: usize,
    /// Rows whose status is [`DiffStatus::OnlyA`].
    pub only_a: usize,
    /// Rows whose status is [`DiffStatus::OnlyB`].
    pub only_b: usize,
    /// Median over the rows present in both of [`DiffRow::ratio`].
    pub median_ratio: Option<f64>,
}

/// Compares the best record of every (fingerprint, workload) of `a` and `b` (both opened
/// read-only; neither is modified).
pub fn diff_files(a: &Path, b: &Path) -> Result<DiffReport, BundleError> {
    let da = open_existing(a)?;
    let db = open_existing(b)?;
    let (fa, fb) = (da.fingerprint_ids()?, db.fingerprint_ids()?);
    let across = fa.len() == 1 && fb.len() == 1 && fa != fb;
    let name_a = a.display().to_string();
    let name_b = b.display().to_string();
    type Side = BTreeMap<(String, String), BestSummary>;
    let collect = |d: &TuningDb, fps: &[String], name: &str| -> Result<Side, BundleError> {
        let mut out = Side::new();
        for fp in fps {
            for r in d.best_all(fp)? {
                if let Some(s) = BestSummary::of(name, &r) {
                    let fp_key = if across { String::new() } else { fp.clone() };
                    out.insert((fp_key, r.workload.key()), s);
                }
            }
        }
        Ok(out)
    };
    let mut sa = collect(&da, &fa, &name_a)?;
    let mut sb = collect(&db, &fb, &name_b)?;
    let mut keys: Vec<(String, String)> = sa.keys().chain(sb.keys()).cloned().collect();
    keys.sort();
    keys.dedup();
    let mut rows = Vec::new();
    for key in keys {
        let (x, y) = (sa.remove(&key), sb.remove(&key));
        let status = match (&x, &y) {
            (Some(x), Some(y)) if x.same_variant(y) => DiffStatus::Same,
            (Some(_), Some(_)) => DiffStatus::Changed,
            (Some(_), None) => DiffStatus::OnlyA,
            _ => DiffStatus::OnlyB,
        };
        let (ratio, within_noise) = match (&x, &y) {
            (Some(x), Some(y)) => (Some(x.median_s / y.median_s), Some(x.within_noise(y))),
            _ => (None, None),
        };
        rows.push(DiffRow {
            fingerprint_id: if across {
                format!("{}→{}", fa[0], fb[0])
            } else {
                key.0
            },
            workload: key.1,
            status,
            a: x,
            b: y,
            ratio,
            within_noise,
        });
    }
    let count = |s: DiffStatus| rows.iter().filter(|r| r.status == s).count();
    let mut ratios: Vec<f64> = rows.iter().filter_map(|r| r.ratio).collect();
    ratios.sort_by(f64::total_cmp);
    let median_ratio = (!ratios.is_empty()).then(|| kernels::measurement::median(&ratios));
    Ok(DiffReport {
        a: a.to_path_buf(),
        b: b.to_path_buf(),
        matched_by: if across { "workload" } else { "fingerprint" },
        same: count(DiffStatus::Same),
        changed: count(DiffStatus::Changed),
        only_a: count(DiffStatus::OnlyA),
        only_b: count(DiffStatus::OnlyB),
        rows,
        median_ratio,
    })
}
