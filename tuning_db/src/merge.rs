//! Combining databases: [`TuningDb::import_from`] (a bundle or any tuning database into this
//! one) and [`merge_files`] (two files into a new third).
//!
//! Rules:
//! - **Every record is kept, once.** A trial is the same trial when every column but its row
//!   id is equal (fingerprint, workload, kernel and version, config, status, timing, samples,
//!   `created_at`, ...); such a trial is not inserted again, so importing the same bundle
//!   twice changes nothing.
//! - **Provenance.** Each trial an import adds gets a `provenance` row (schema v3) naming the
//!   source file and its content checksum, and keeps the provenance rows it had in the source.
//!   A trial the target already held gets neither: its provenance is the target's (a bundle of
//!   this database's own records, imported back directly or through another database, leaves
//!   them local).
//! - **The best is chosen by the measurements.** For every (fingerprint, workload) of the
//!   source, the source's best is compared with the target's best: the one whose median is
//!   faster *and* whose 95% confidence interval of the median does not overlap the other's
//!   wins; when the intervals overlap (within noise) the target's best stays (the incumbent),
//!   and if the two disagree on the config that is reported as a [`Conflict`], never hidden.
//!   When the outcome differs from what [`TuningDb::best`] would pick on its own, a row of
//!   `winners` records it (reason `merged_fastest`, `merged_tie_incumbent`, or the source's own
//!   decision when its winner is taken over).
//! - **All or nothing.** The source is checked first ([`check_file`]: integrity, checksum,
//!   configs), then everything is written in one transaction: a failed import leaves the
//!   target as it was.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use kernels::Config;
use rusqlite::types::Value;
use rusqlite::{params, OptionalExtension};
use serde::Serialize;

use crate::bundle::{
    check_file, insert_raw, open_existing, raw_rows, remove_db_files, require_parent, row_id,
    temp_beside, BundleError, RawRow,
};
use crate::db::TuningDb;
use crate::error::{Ctx, DbError};
use crate::record::{now_rfc3339, Record};
use crate::winners::LATEST_DECISIONS;

/// One side's best record for a (fingerprint, workload).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BestSummary {
    /// The file it is in.
    pub source: String,
    /// Its row id in that file.
    pub trial_id: i64,
    /// Kernel family name ([`Record::kernel`]).
    pub kernel: String,
    /// Kernel family version, as the record reads ([`Record::kernel_version`]).
    pub kernel_version: u32,
    /// Its config.
    pub config: Config,
    /// Its median time per call, seconds.
    pub median_s: f64,
    /// 95% confidence interval of the median (order statistics of the samples).
    pub ci_low_s: f64,
    /// Upper end of that interval, seconds (always finite: see [`median_ci`]).
    pub ci_high_s: f64,
}

impl BestSummary {
    /// From a timed record of file `source`.
    pub fn of(source: &str, r: &Record) -> Option<BestSummary> {
        let m = r.measurement.as_ref()?;
        let (lo, hi) = median_ci(&m.samples, m.median_s, m.spread);
        Some(BestSummary {
            source: source.to_string(),
            trial_id: r.id.unwrap_or(-1),
            kernel: r.kernel.clone(),
            kernel_version: r.kernel_version,
            config: r.config.clone(),
            median_s: m.median_s,
            ci_low_s: lo,
            ci_high_s: hi,
        })
    }

    /// Whether the two are the same variant (kernel, version, config).
    pub fn same_variant(&self, other: &BestSummary) -> bool {
        self.kernel == other.kernel
            && self.kernel_version == other.kernel_version
            && self.config == other.config
    }

    /// Whether the two medians are within noise: their confidence intervals overlap.
    pub fn within_noise(&self, other: &BestSummary) -> bool {
        self.ci_low_s <= other.ci_high_s && other.ci_low_s <= self.ci_high_s
    }
}

/// 95% confidence interval of the median from the samples' order statistics (as the runner
/// computes it); with fewer than 3 samples, ± max(3 × spread, 2%) around the median.
pub fn median_ci(samples: &[f64], median_s: f64, spread: f64) -> (f64, f64) {
    kernels::measurement::median_ci(samples).unwrap_or_else(|| {
        let h = (3.0 * spread).max(0.02) * median_s;
        (median_s - h, median_s + h)
    })
}

/// Two bests of one (fingerprint, workload), within noise of each other, disagreeing on the
/// variant. The kept one is the target's (the incumbent).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Conflict {
    /// The fingerprint both bests are of.
    pub fingerprint_id: String,
    /// The workload key ([`Workload::key`](kernels::Workload::key)).
    pub workload: String,
    /// The target's best, which stays the winner (for [`merge_files`]: A's).
    pub kept: BestSummary,
    /// The source's best, as fast within noise but another variant; not made the winner.
    pub other: BestSummary,
}

/// What happened to the best of one (fingerprint, workload) the source has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The target had no best: the source's is taken.
    New,
    /// Both have the same trial.
    Same,
    /// The source's best is faster beyond noise: it replaces the target's.
    SourceFaster,
    /// The target's best is faster beyond noise: it stays.
    TargetFaster,
    /// Within noise: the target's best stays (a [`Conflict`] when the variants differ).
    WithinNoise,
}

/// One (fingerprint, workload) of an import.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkloadOutcome {
    /// The fingerprint id ([`HardwareFingerprint::id`](kernels::HardwareFingerprint::id)).
    pub fingerprint_id: String,
    /// The workload key ([`Workload::key`](kernels::Workload::key)).
    pub workload: String,
    /// How the source's best and the target's compared.
    pub outcome: Outcome,
    /// The best after the import.
    pub best: BestSummary,
}

/// What [`TuningDb::import_from`] did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ImportReport {
    /// The file imported, as given.
    pub source: PathBuf,
    /// Its content checksum ([`TuningDb::content_checksum`], `sha256:...`), as recorded in
    /// the provenance rows this import added.
    pub source_checksum: String,
    /// The database imported into.
    pub target: PathBuf,
    /// Trials in the source.
    pub source_records: u64,
    /// Trials inserted into the target.
    pub inserted: u64,
    /// Source trials the target already had.
    pub duplicates: u64,
    /// Fingerprint rows of the source the target lacked, now copied.
    pub fingerprints_added: u64,
    /// Rows added to `provenance`: for each inserted trial, its provenance rows in the
    /// source and one naming this import's source.
    pub provenance_added: u64,
    /// Rows added to `winners`.
    pub winners_recorded: u64,
    /// One entry per (fingerprint, workload) the source has a best for, sorted by
    /// fingerprint id, then workload key.
    pub workloads: Vec<WorkloadOutcome>,
    /// Bests within noise of each other that disagree on the variant; the target's was kept.
    pub conflicts: Vec<Conflict>,
}

impl ImportReport {
    /// Whether the import changed the target.
    pub fn changed(&self) -> bool {
        self.inserted + self.fingerprints_added + self.provenance_added + self.winners_recorded > 0
    }
}

/// What [`merge_files`] did: the import of A into an empty file, then of B.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MergeReport {
    /// The merged database, as given.
    pub out: PathBuf,
    /// The import of A into the new, empty file.
    pub a: ImportReport,
    /// The import of B into it, after A's.
    pub b: ImportReport,
    /// Records in the result.
    pub records: u64,
    /// Its content checksum.
    pub checksum: String,
    /// Bests of A and B within noise of each other with different variants (A's is kept).
    pub conflicts: Vec<Conflict>,
}

type Key = (String, String);

impl TuningDb {
    /// Imports every record of `source` (a bundle or any tuning database) into this
    /// database, as described in the module documentation. The source is checked first and
    /// refused, with nothing written, if it fails [`check_file`].
    pub fn import_from(
        &self,
        source: &Path,
        tool_version: &str,
    ) -> Result<ImportReport, BundleError> {
        self.check_import_source(source)?;
        let checksum = check_file(source)?.into_result()?.checksum;
        let src = open_existing(source)?;
        // Reads first: the bests on both sides, and the raw rows to copy.
        let rows = SourceRows::read(&src, self)?;
        let tx = self.begin_write("importing")?;
        let mut report = ImportReport {
            source: source.to_path_buf(),
            source_checksum: checksum.clone(),
            target: self.path.clone(),
            source_records: rows.trials.len() as u64,
            inserted: 0,
            duplicates: 0,
            fingerprints_added: 0,
            provenance_added: 0,
            winners_recorded: 0,
            workloads: Vec::new(),
            conflicts: Vec::new(),
        };
        let mut import = Import {
            db: self,
            tx: &tx,
            source_name: source.display().to_string(),
            checksum,
            tool_version,
            rows: &rows,
            ids: HashMap::new(),
            inserted: Vec::new(),
        };
        report.fingerprints_added = import.fingerprints()?;
        import.trials(&mut report)?;
        report.provenance_added = import.provenance()?;
        // The best of every (fingerprint, workload) the source has.
        for s in &rows.src_best {
            import.best(s, &mut report)?;
        }
        import.side_by_side()?;
        tx.commit().ctx(&self.path, "committing the import")?;
        Ok(report)
    }

    /// Refuses an import into a read-only database, or of the database into itself (by
    /// device and inode: a second path, a symlink or a hard link).
    fn check_import_source(&self, source: &Path) -> Result<(), BundleError> {
        if self.is_read_only() {
            return Err(DbError::ReadOnly {
                path: self.path.clone(),
                action: "import".into(),
            }
            .into());
        }
        use std::os::unix::fs::MetadataExt;
        if let (Ok(a), Ok(b)) = (std::fs::metadata(source), std::fs::metadata(&self.path)) {
            if (a.dev(), a.ino()) == (b.dev(), b.ino()) {
                return Err(BundleError::SameFile {
                    path: self.path.clone(),
                });
            }
        }
        Ok(())
    }
}

/// A hash of the columns that identify a trial's content (trials of the same content agree on
/// all of them, so a hash no target trial has means no match).
fn content_hash(row: &RawRow) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for c in [
        "fingerprint_id",
        "workload",
        "kernel",
        "kernel_version",
        "config",
        "status",
        "median_s",
        "samples",
        "created_at",
    ] {
        match row.get(c) {
            None | Some(Value::Null) => 0u8.hash(&mut h),
            Some(Value::Integer(i)) => (1u8, i).hash(&mut h),
            Some(Value::Real(f)) => (2u8, f.to_bits()).hash(&mut h),
            Some(Value::Text(s)) => (3u8, s).hash(&mut h),
            Some(Value::Blob(b)) => (4u8, b).hash(&mut h),
        }
    }
    h.finish()
}

/// What an import reads before it writes anything.
struct SourceRows {
    /// The source's best of every (fingerprint, workload).
    src_best: Vec<Record>,
    /// The target's bests of the source's fingerprints, before the import.
    tgt_best: HashMap<Key, Record>,
    /// The source's winner decisions in force: their trial ids.
    src_decisions: HashMap<Key, i64>,
    fingerprints: Vec<RawRow>,
    trials: Vec<RawRow>,
    provenance: Vec<RawRow>,
    /// The latest winner row of each (fingerprint, workload).
    winners: Vec<RawRow>,
    remeasured: Vec<RawRow>,
    /// The side-by-side rows (schema v5; none from older sources).
    side_by_side: Vec<RawRow>,
    /// Every target trial of the source's fingerprints.
    target_trials: TrialIndex,
}

/// Trials by [`content_hash`]: the id and the row of each.
type TrialIndex = HashMap<u64, Vec<(i64, RawRow)>>;

/// Whether a trial row holds the content of `stored` (every column of it but the id; a
/// column the row lacks reads NULL).
fn same_content(stored: &RawRow, row: &RawRow) -> bool {
    stored
        .iter()
        .all(|(c, v)| c == "id" || row.get(c).unwrap_or(&Value::Null) == v)
}

impl SourceRows {
    fn read(src: &TuningDb, target: &TuningDb) -> Result<SourceRows, BundleError> {
        let (conn, sp) = (&src.conn, &src.path);
        let mut src_best: Vec<Record> = Vec::new();
        let mut tgt_best: HashMap<Key, Record> = HashMap::new();
        let mut target_trials = TrialIndex::new();
        for fp in &src.fingerprint_ids()? {
            src_best.extend(src.best_all(fp)?);
            for r in target.best_all(fp)? {
                tgt_best.insert((fp.clone(), r.workload.key()), r);
            }
            let theirs = raw_rows(
                &target.conn,
                &target.path,
                "trials",
                "fingerprint_id = ?1",
                [fp],
            )?;
            for row in theirs {
                let at = target_trials.entry(content_hash(&row)).or_default();
                at.push((row_id(&row), row));
            }
        }
        let src_decisions = src
            .winners_in_force()?
            .into_iter()
            .map(|w| ((w.fingerprint_id, w.workload), w.trial_id))
            .collect();
        let latest = format!("id IN ({LATEST_DECISIONS})");
        Ok(SourceRows {
            src_best,
            tgt_best,
            src_decisions,
            fingerprints: raw_rows(conn, sp, "fingerprints", "1 = 1", [])?,
            trials: raw_rows(conn, sp, "trials", "1 = 1", [])?,
            provenance: raw_rows(conn, sp, "provenance", "1 = 1", [])?,
            winners: raw_rows(conn, sp, "winners", &latest, [])?,
            remeasured: raw_rows(conn, sp, "remeasurements", "1 = 1", [])?,
            side_by_side: if src.version >= 5 {
                raw_rows(conn, sp, "side_by_side", "1 = 1", [])?
            } else {
                Vec::new()
            },
            target_trials,
        })
    }
}

/// One import's writes, inside its transaction.
struct Import<'a> {
    db: &'a TuningDb,
    tx: &'a rusqlite::Transaction<'a>,
    source_name: String,
    checksum: String,
    tool_version: &'a str,
    rows: &'a SourceRows,
    /// The target's id of each source trial.
    ids: HashMap<i64, i64>,
    /// The target ids of the trials this import inserted.
    inserted: Vec<i64>,
}

const IMPORTING: &str = "importing";

impl Import<'_> {
    /// Copies the fingerprints the target lacks; how many.
    fn fingerprints(&self) -> Result<u64, BundleError> {
        let tp = &self.db.path;
        let mut added = 0;
        for row in &self.rows.fingerprints {
            let id = row.get("id").cloned().unwrap_or(Value::Null);
            let exists: bool = self
                .tx
                .query_row(
                    "SELECT count(*) FROM fingerprints WHERE id = ?1",
                    [id],
                    |r| r.get::<_, i64>(0),
                )
                .ctx(tp, IMPORTING)?
                > 0;
            if !exists {
                insert_raw(self.tx, tp, "fingerprints", std::slice::from_ref(row), true)?;
                added += 1;
            }
        }
        Ok(added)
    }

    /// Copies the trials the target lacks (content equal but for the id), noting every
    /// source trial's id in the target.
    fn trials(&mut self, report: &mut ImportReport) -> Result<(), BundleError> {
        let tp = &self.db.path;
        // Matched in memory: a lookup per trial had made importing 25.6k duplicates of a few
        // configs take 27 s.
        let mut added = TrialIndex::new();
        for row in &self.rows.trials {
            let hash = content_hash(row);
            let there = self.rows.target_trials.get(&hash).into_iter().flatten();
            let added_here = added.entry(hash).or_default();
            let same = there
                .chain(added_here.iter())
                .find(|(_, t)| same_content(t, row))
                .map(|(id, _)| *id);
            let new_id = match same {
                Some(id) => {
                    report.duplicates += 1;
                    id
                }
                None => {
                    report.inserted += 1;
                    let id =
                        insert_raw(self.tx, tp, "trials", std::slice::from_ref(row), false)?[0];
                    self.inserted.push(id);
                    added_here.push((id, row.clone()));
                    id
                }
            };
            self.ids.insert(row_id(row), new_id);
        }
        Ok(())
    }

    /// For each trial this import inserted: its provenance rows in the source, and one row
    /// naming this import; how many rows were new.
    fn provenance(&self) -> Result<u64, BundleError> {
        let tp = &self.db.path;
        let mut ins = self
            .tx
            .prepare(
                "INSERT OR IGNORE INTO provenance (trial_id, source, source_checksum, \
                 imported_at) VALUES (?1, ?2, ?3, ?4)",
            )
            .ctx(tp, IMPORTING)?;
        let mut added = 0;
        let inserted: HashSet<i64> = self.inserted.iter().copied().collect();
        for p in &self.rows.provenance {
            let Some(Value::Integer(t)) = p.get("trial_id") else {
                continue;
            };
            let Some(&t) = self.ids.get(t).filter(|id| inserted.contains(id)) else {
                continue;
            };
            let row = params![
                t,
                p.get("source"),
                p.get("source_checksum"),
                p.get("imported_at")
            ];
            added += ins.execute(row).ctx(tp, IMPORTING)? as u64;
        }
        let now = now_rfc3339();
        for &t in &self.inserted {
            let row = params![t, self.source_name, self.checksum, now];
            added += ins.execute(row).ctx(tp, IMPORTING)? as u64;
        }
        Ok(added)
    }

    /// Decides the best of the (fingerprint, workload) of the source's best `s` and records
    /// the decision where it changes what the target serves, or copies the source's where
    /// that decided it.
    fn best(&self, s: &Record, report: &mut ImportReport) -> Result<(), BundleError> {
        let tp = self.db.path.display().to_string();
        let key: Key = (s.fingerprint_id.clone(), s.workload.key());
        let (Some(s_sum), Some(&s_new)) = (
            BestSummary::of(&self.source_name, s),
            s.id.and_then(|id| self.ids.get(&id)),
        ) else {
            return Ok(());
        };
        let t = self.rows.tgt_best.get(&key);
        let t_sum = t.and_then(|t| BestSummary::of(&tp, t));
        let (outcome, chosen, chosen_sum) = match (t, t_sum) {
            (Some(t), Some(t_sum)) => {
                let t_id = t.id.unwrap_or(-1);
                if t_id == s_new {
                    (Outcome::Same, t_id, t_sum)
                } else if t_sum.within_noise(&s_sum) {
                    if !t_sum.same_variant(&s_sum) {
                        report.conflicts.push(Conflict {
                            fingerprint_id: key.0.clone(),
                            workload: key.1.clone(),
                            kept: t_sum.clone(),
                            other: s_sum.clone(),
                        });
                    }
                    (Outcome::WithinNoise, t_id, t_sum)
                } else if s_sum.median_s < t_sum.median_s {
                    (Outcome::SourceFaster, s_new, s_sum.clone())
                } else {
                    (Outcome::TargetFaster, t_id, t_sum)
                }
            }
            _ => (Outcome::New, s_new, s_sum.clone()),
        };
        let decided_by_source = chosen == s_new
            && self
                .rows
                .src_decisions
                .get(&key)
                .is_some_and(|&w| Some(w) == s.id);
        // The source's decision travels with its re-measurements even where the target
        // would serve the same trial without it (it is then the raw fastest), unless a
        // decision for that trial is already in force (an import repeated).
        if decided_by_source {
            let in_force = self.db.winner_trial(&key.0, &s.workload)?;
            if in_force.and_then(|r| r.id) != Some(chosen) {
                self.copy_decision(&key, s_new)?;
                report.winners_recorded += 1;
            }
        } else if self.db.best(&key.0, &s.workload)?.and_then(|r| r.id) != Some(chosen) {
            self.record_decision(&key, chosen, outcome)?;
            report.winners_recorded += 1;
        }
        let mut best = chosen_sum;
        best.trial_id = chosen;
        best.source = tp;
        report.workloads.push(WorkloadOutcome {
            fingerprint_id: key.0,
            workload: key.1,
            outcome,
            best,
        });
        Ok(())
    }

    /// Copies the source's winner decision of `key` (its trial now `trial`), with its
    /// re-measurements.
    fn copy_decision(&self, key: &Key, trial: i64) -> Result<(), BundleError> {
        let tp = &self.db.path;
        let w = self
            .rows
            .winners
            .iter()
            .find(|w| {
                w.get("fingerprint_id") == Some(&Value::Text(key.0.clone()))
                    && w.get("workload") == Some(&Value::Text(key.1.clone()))
            })
            .expect("the decision in force was read");
        let mut w2 = w.clone();
        w2.insert("trial_id".into(), Value::Integer(trial));
        let wid = insert_raw(self.tx, tp, "winners", &[w2], false)?[0];
        let rows: Vec<_> = self
            .rows
            .remeasured
            .iter()
            .filter(|r| r.get("winner_id") == w.get("id"))
            .filter_map(|r| {
                let Some(Value::Integer(t)) = r.get("trial_id") else {
                    return None;
                };
                let mut r2 = r.clone();
                r2.insert("winner_id".into(), Value::Integer(wid));
                r2.insert("trial_id".into(), Value::Integer(*self.ids.get(t)?));
                Some(r2)
            })
            .collect();
        insert_raw(self.tx, tp, "remeasurements", &rows, false)?;
        Ok(())
    }

    /// Copies each side-by-side set of the source whose decisions are all in force on both
    /// sides after the import (the target's decision of each row's workload names the same
    /// trial), and that the target does not hold yet. A set of which one decision lost to
    /// the target's would compare winners that no longer serve together: it stays behind.
    fn side_by_side(&self) -> Result<(), BundleError> {
        let tp = &self.db.path;
        let mut sets: BTreeMap<i64, Vec<&RawRow>> = BTreeMap::new();
        for r in &self.rows.side_by_side {
            if let Some(Value::Integer(set)) = r.get("set_id") {
                sets.entry(*set).or_default().push(r);
            }
        }
        'sets: for rows in sets.values() {
            let mut copied = Vec::with_capacity(rows.len());
            for r in rows {
                let Some(wid) = self.target_decision_of(r.get("winner_id"))? else {
                    continue 'sets;
                };
                let mut r2 = (*r).clone();
                r2.insert("winner_id".into(), Value::Integer(wid));
                copied.push(r2);
            }
            let held: bool = self
                .tx
                .query_row(
                    "SELECT count(*) > 0 FROM side_by_side WHERE winner_id = ?1 \
                     AND measured_at = ?2 AND median_s = ?3",
                    params![
                        copied[0].get("winner_id"),
                        copied[0].get("measured_at"),
                        copied[0].get("median_s")
                    ],
                    |x| x.get(0),
                )
                .ctx(tp, IMPORTING)?;
            if held {
                continue;
            }
            // The copy is a set of its own, named after its first row.
            let ids = insert_raw(self.tx, tp, "side_by_side", &copied, false)?;
            for id in &ids {
                self.tx
                    .execute(
                        "UPDATE side_by_side SET set_id = ?1 WHERE id = ?2",
                        [ids[0], *id],
                    )
                    .ctx(tp, IMPORTING)?;
            }
        }
        Ok(())
    }

    /// The target's decision in force that matches the source decision `winner_id` (a
    /// latest one of its workload): same fingerprint and workload, and its trial the
    /// imported copy of the source's winning trial.
    fn target_decision_of(&self, winner_id: Option<&Value>) -> Result<Option<i64>, BundleError> {
        let tp = &self.db.path;
        let Some(w) = self.rows.winners.iter().find(|w| w.get("id") == winner_id) else {
            return Ok(None);
        };
        let (Some(Value::Integer(trial)), Some(fp), Some(workload)) = (
            w.get("trial_id"),
            w.get("fingerprint_id"),
            w.get("workload"),
        ) else {
            return Ok(None);
        };
        let Some(&trial) = self.ids.get(trial) else {
            return Ok(None);
        };
        let in_force: Option<(i64, i64)> = self
            .tx
            .query_row(
                "SELECT id, trial_id FROM winners WHERE fingerprint_id = ?1 AND workload = ?2 \
                 ORDER BY id DESC LIMIT 1",
                params![fp, workload],
                |x| Ok((x.get(0)?, x.get(1)?)),
            )
            .optional()
            .ctx(tp, IMPORTING)?;
        Ok(in_force.filter(|&(_, t)| t == trial).map(|(id, _)| id))
    }

    /// Records this merge's own decision for `key`: `chosen`, the incumbent on a tie.
    fn record_decision(&self, key: &Key, chosen: i64, outcome: Outcome) -> Result<(), BundleError> {
        let reason = match outcome {
            Outcome::WithinNoise => "merged_tie_incumbent",
            _ => "merged_fastest",
        };
        self.tx
            .execute(
                "INSERT INTO winners (fingerprint_id, workload, trial_id, reason, tie, \
                 decided_at, tool_version) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    key.0,
                    key.1,
                    chosen,
                    reason,
                    outcome == Outcome::WithinNoise,
                    now_rfc3339(),
                    self.tool_version
                ],
            )
            .ctx(&self.db.path, IMPORTING)?;
        Ok(())
    }
}

/// Merges `a` and `b` into a new database `out` (which must not exist): every record of
/// both with its provenance; per (fingerprint, workload) the best by the measurements, A's
/// kept when the two are within noise (reported as conflicts). `out` appears complete or not
/// at all.
pub fn merge_files(
    a: &Path,
    b: &Path,
    out: &Path,
    tool_version: &str,
) -> Result<MergeReport, BundleError> {
    if out.exists() {
        return Err(BundleError::OutputExists {
            path: out.to_path_buf(),
        });
    }
    // Check both before creating anything.
    check_file(a)?.into_result()?;
    check_file(b)?.into_result()?;
    require_parent(out)?;
    let tmp = temp_beside(out);
    let result = (|| {
        let db = TuningDb::open(&tmp)?;
        let ra = db.import_from(a, tool_version)?;
        let rb = db.import_from(b, tool_version)?;
        let records = db.stats()?.records;
        let checksum = db.content_checksum()?;
        db.into_one_file()?;
        Ok::<_, BundleError>((ra, rb, records, checksum))
    })();
    let (mut ra, mut rb, records, checksum) = match result {
        Ok(r) => r,
        Err(e) => {
            remove_db_files(&tmp);
            return Err(e);
        }
    };
    if out.exists() {
        remove_db_files(&tmp);
        return Err(BundleError::OutputExists {
            path: out.to_path_buf(),
        });
    }
    std::fs::rename(&tmp, out).map_err(|e| {
        remove_db_files(&tmp);
        BundleError::Io {
            path: out.to_path_buf(),
            context: "moving the merged database into place".into(),
            cause: e,
        }
    })?;
    // Report the final name, not the temporary one.
    let name = out.display().to_string();
    let tmp_name = tmp.display().to_string();
    for r in [&mut ra, &mut rb] {
        r.target = out.to_path_buf();
        for w in &mut r.workloads {
            if w.best.source == tmp_name {
                w.best.source = name.clone();
            }
        }
        for c in &mut r.conflicts {
            if c.kept.source == tmp_name {
                c.kept.source = a.display().to_string();
            }
        }
    }
    let conflicts = rb.conflicts.clone();
    Ok(MergeReport {
        out: out.to_path_buf(),
        a: ra,
        b: rb,
        records,
        checksum,
        conflicts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confidence_intervals_of_the_median() {
        let s: Vec<f64> = (1..=11).map(f64::from).collect();
        let (lo, hi) = median_ci(&s, 6.0, 0.1);
        assert!(lo < 6.0 && hi > 6.0 && lo >= 1.0 && hi <= 11.0, "{lo} {hi}");
        let (lo, hi) = median_ci(&[1.0], 1.0, 0.0);
        assert!((lo - 0.98).abs() < 1e-12 && (hi - 1.02).abs() < 1e-12);
    }
}
