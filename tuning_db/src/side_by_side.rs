//! The winners of one shape's precisions re-measured side by side (schema v5).
//!
//! Each element type of a shape (`gemm:128x768x768`, `…:bf16`, `…:i8`) is a workload of its
//! own, decided on its own finalists' interleaved rounds; those rounds run minutes apart, and
//! a machine's load may change in between. At the end of a job that tuned several precisions
//! of a shape, the tuner re-measures their winners together, in one set of interleaved rounds
//! on the same inputs, and records the set here. [`TuningDb::remeasured_medians`] serves,
//! per shape, the medians of the latest set whose decisions are all still in force: they are
//! what the runtime's `auto` policy compares. `verify` checks every set's shape (the content
//! checksum does not cover them).
//!
//! ```sql
//! CREATE TABLE side_by_side (            -- one row per precision's winner
//!     id INTEGER PRIMARY KEY,
//!     set_id INTEGER NOT NULL,           -- rows of one set of rounds share it: its first row's id
//!     winner_id INTEGER NOT NULL REFERENCES winners(id),   -- the decision whose winner ran
//!     median_s REAL NOT NULL, spread REAL NOT NULL,
//!     samples TEXT NOT NULL,             -- JSON array of seconds, one per round
//!     measured_at TEXT NOT NULL, tool_version TEXT NOT NULL);
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};

use kernels::{DType, Measurement, Workload};
use rusqlite::{params, OptionalExtension};

use crate::db::TuningDb;
use crate::error::{Ctx, DbError, Result};
use crate::record::now_rfc3339;
use crate::winners::{finite_timing, LATEST_DECISIONS};

/// One precision's winner in a side-by-side set: the decision whose winner ran, and its
/// timing in the set's rounds.
#[derive(Debug, Clone, PartialEq)]
pub struct SideBySide {
    /// The winner decision (`winners.id`) whose winning trial was re-measured.
    pub winner_id: i64,
    /// Its interleaved timing.
    pub measurement: Measurement,
}

impl TuningDb {
    /// Records one set of side-by-side re-measurements and returns its id. The rows must
    /// name at least two decisions, of one fingerprint and one shape in distinct element
    /// types, with finite positive timings.
    pub fn record_side_by_side(&self, rows: &[SideBySide], tool_version: &str) -> Result<i64> {
        let p = &self.path;
        let ctx = "recording a side-by-side re-measurement";
        let tx = self.begin_write(ctx)?;
        self.check_side_by_side(&tx, rows)?;
        let measured_at = now_rfc3339();
        let mut set_id: Option<i64> = None;
        for r in rows {
            let m = &r.measurement;
            let samples = serde_json::to_string(&m.samples).expect("finite floats serialise");
            tx.execute(
                "INSERT INTO side_by_side (set_id, winner_id, median_s, spread, samples, \
                 measured_at, tool_version) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    set_id.unwrap_or(0),
                    r.winner_id,
                    m.median_s,
                    m.spread,
                    samples,
                    measured_at,
                    tool_version
                ],
            )
            .ctx(p, ctx)?;
            if set_id.is_none() {
                // The set is named after its first row.
                let id = tx.last_insert_rowid();
                tx.execute("UPDATE side_by_side SET set_id = id WHERE id = ?1", [id])
                    .ctx(p, ctx)?;
                set_id = Some(id);
            }
        }
        tx.commit().ctx(p, ctx)?;
        Ok(set_id.expect("a checked set has rows"))
    }

    /// Refuses a set that is not two or more decisions of one fingerprint and one shape in
    /// distinct element types, each with a finite positive timing.
    fn check_side_by_side(&self, conn: &rusqlite::Connection, rows: &[SideBySide]) -> Result<()> {
        let p = &self.path;
        let bad = |reason: String| DbError::InvalidRecord {
            path: p.clone(),
            reason,
        };
        let mut decision = conn
            .prepare("SELECT fingerprint_id, workload FROM winners WHERE id = ?1")
            .ctx(p, "recording a side-by-side re-measurement")?;
        let mut members = Vec::with_capacity(rows.len());
        for r in rows {
            let row: Option<(String, String)> = decision
                .query_row([r.winner_id], |x| Ok((x.get(0)?, x.get(1)?)))
                .optional()
                .ctx(p, "recording a side-by-side re-measurement")?;
            let Some(member) = row else {
                return Err(bad(format!(
                    "winner decision {} does not exist",
                    r.winner_id
                )));
            };
            if !finite_timing(&r.measurement) {
                return Err(bad(format!(
                    "the side-by-side timing of {} is not a finite positive timing",
                    member.1
                )));
            }
            members.push(member);
        }
        check_members(&members).map_err(bad)
    }

    /// The side-by-side median of each winning trial on `fingerprint_id` (by trial id): per
    /// shape, the rows of its latest set (by when it was measured) whose decisions are all
    /// still in force; none before schema v5. One set per shape, so the precisions `auto`
    /// compares were all timed in the same rounds.
    pub(crate) fn side_by_side_medians(&self, fingerprint_id: &str) -> Result<HashMap<i64, f64>> {
        if self.version < 5 {
            return Ok(HashMap::new());
        }
        let p = &self.path;
        let ctx = "reading side-by-side medians";
        let sql = format!(
            "SELECT s.set_id, s.measured_at, w.workload, w.trial_id, s.median_s \
             FROM side_by_side s JOIN winners w ON w.id = s.winner_id \
             WHERE w.fingerprint_id = ?1 AND NOT EXISTS \
             (SELECT 1 FROM side_by_side o WHERE o.set_id = s.set_id \
              AND o.winner_id NOT IN ({LATEST_DECISIONS}))"
        );
        let mut stmt = self.conn.prepare(&sql).ctx(p, ctx)?;
        type Row = (i64, String, String, i64, f64);
        let rows = stmt
            .query_map([fingerprint_id], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<Row>>>())
            .ctx(p, ctx)?;
        // Each row's shape, parsed once (a key that no longer parses names no shape).
        let rows: Vec<(i64, String, Workload, i64, f64)> = rows
            .into_iter()
            .filter_map(|(set, at, key, trial, median)| {
                let shape = key.parse::<Workload>().ok()?.with_dtype(DType::F32);
                Some((set, at, shape, trial, median))
            })
            .collect();
        // The latest current set of each shape: (measured_at, set_id) is its age.
        let mut latest: HashMap<Workload, (&str, i64)> = HashMap::new();
        for (set, at, shape, _, _) in &rows {
            let age = latest.entry(*shape).or_insert((at, *set));
            if (at.as_str(), *set) > *age {
                *age = (at, *set);
            }
        }
        Ok(rows
            .iter()
            .filter(|(set, _, shape, _, _)| latest.get(shape).map(|l| l.1) == Some(*set))
            .map(|(_, _, _, trial, median)| (*trial, *median))
            .collect())
    }

    /// What is wrong with the file's side-by-side sets, for [`verify`](Self::verify): each
    /// must hold two or more rows of one fingerprint and one shape in distinct element types,
    /// with samples that parse and a finite positive median (the content checksum does not
    /// cover them, so an altered bundle is caught here).
    pub(crate) fn side_by_side_problems(&self) -> Result<Vec<String>> {
        if self.version < 5 {
            return Ok(Vec::new());
        }
        let p = &self.path;
        let ctx = "checking side-by-side sets";
        let mut stmt = self
            .conn
            .prepare(
                "SELECT s.set_id, w.fingerprint_id, w.workload, s.median_s, s.spread, s.samples \
                 FROM side_by_side s JOIN winners w ON w.id = s.winner_id ORDER BY s.set_id, s.id",
            )
            .ctx(p, ctx)?;
        type Row = (i64, String, String, f64, f64, String);
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<Row>>>())
            .ctx(p, ctx)?;
        let mut sets: BTreeMap<i64, Vec<&Row>> = BTreeMap::new();
        for r in &rows {
            sets.entry(r.0).or_default().push(r);
        }
        let mut problems = Vec::new();
        for (set, rows) in sets {
            let members: Vec<(String, String)> =
                rows.iter().map(|r| (r.1.clone(), r.2.clone())).collect();
            if let Err(reason) = check_members(&members) {
                problems.push(format!("side-by-side set {set}: {reason}"));
            }
            for (_, _, key, median_s, spread, samples) in rows {
                let timing = serde_json::from_str::<Vec<f64>>(samples).map(|samples| Measurement {
                    samples,
                    median_s: *median_s,
                    spread: *spread,
                });
                if !timing.is_ok_and(|m| finite_timing(&m)) {
                    problems.push(format!(
                        "side-by-side set {set}: the timing of {key} is not a finite positive \
                         median with parseable samples"
                    ));
                }
            }
        }
        Ok(problems)
    }
}

/// Whether `(fingerprint, workload key)` pairs form a set: two or more, one fingerprint and
/// one shape, distinct element types.
fn check_members(members: &[(String, String)]) -> std::result::Result<(), String> {
    if members.len() < 2 {
        return Err("a side-by-side set needs two or more winners".into());
    }
    let (mut shape, mut dtypes) = (None, HashSet::new());
    for (fp, key) in members {
        let w: Workload = key.parse().map_err(|e| format!("{key}: {e}"))?;
        let this = (fp.clone(), w.with_dtype(DType::F32));
        if shape.get_or_insert_with(|| this.clone()) != &this {
            return Err(format!("{w} on {fp} is not of the set's shape and machine"));
        }
        if !dtypes.insert(w.dtype()) {
            return Err(format!("two rows of the set are {}", w.dtype()));
        }
    }
    Ok(())
}
