//! The winners of one shape's precisions re-measured side by side (schema v5).
//!
//! Each element type of a shape (`gemm:128x768x768`, `…:bf16`, `…:i8`) is a workload of its
//! own, decided on its own finalists' interleaved rounds; those rounds run minutes apart, and
//! a machine's load may change in between. At the end of a job that tuned several precisions
//! of a shape, the tuner re-measures their winners together, in one set of interleaved rounds
//! on the same inputs, and records the set here. [`TuningDb::remeasured_medians`] serves a
//! set's medians while every decision it measured is still in force: they are what the
//! runtime's `auto` policy compares.
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

use std::collections::{HashMap, HashSet};

use kernels::{DType, Measurement, Workload};
use rusqlite::{params, OptionalExtension};

use crate::db::TuningDb;
use crate::error::{Ctx, DbError, Result};
use crate::record::now_rfc3339;

/// One precision's winner in a side-by-side set: the decision whose winner ran, and its
/// timing in the set's rounds.
#[derive(Debug, Clone, PartialEq)]
pub struct SideBySide {
    /// The winner decision (`winners.id`) whose winning trial was re-measured.
    pub winner_id: i64,
    /// Its interleaved timing.
    pub measurement: Measurement,
}

/// The columns of the `in force` test: a decision is in force while no later one of its
/// (fingerprint, workload) exists.
const IN_FORCE: &str = "SELECT max(id) FROM winners GROUP BY fingerprint_id, workload";

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
        if rows.len() < 2 {
            return Err(bad("a side-by-side set needs two or more winners".into()));
        }
        let mut decision = conn
            .prepare("SELECT fingerprint_id, workload FROM winners WHERE id = ?1")
            .ctx(p, "recording a side-by-side re-measurement")?;
        let (mut shape, mut dtypes) = (None, HashSet::new());
        for r in rows {
            let row: Option<(String, String)> = decision
                .query_row([r.winner_id], |x| Ok((x.get(0)?, x.get(1)?)))
                .optional()
                .ctx(p, "recording a side-by-side re-measurement")?;
            let Some((fp, key)) = row else {
                return Err(bad(format!(
                    "winner decision {} does not exist",
                    r.winner_id
                )));
            };
            let w: Workload = key
                .parse()
                .map_err(|e| bad(format!("winner decision {}: {e}", r.winner_id)))?;
            let this = (fp, w.with_dtype(DType::F32));
            if shape.get_or_insert_with(|| this.clone()) != &this {
                return Err(bad(format!(
                    "{w} on {} is not of the set's shape and machine",
                    this.0
                )));
            }
            if !dtypes.insert(w.dtype()) {
                return Err(bad(format!("two rows of the set are {}", w.dtype())));
            }
            let m = &r.measurement;
            let finite = m.median_s.is_finite()
                && m.median_s > 0.0
                && m.spread.is_finite()
                && !m.samples.is_empty()
                && m.samples.iter().all(|s| s.is_finite());
            if !finite {
                return Err(bad(format!(
                    "the side-by-side timing of {w} is not a finite positive timing"
                )));
            }
        }
        Ok(())
    }

    /// The side-by-side median of each winning trial on `fingerprint_id` (by trial id), from
    /// the latest set whose decisions are all still in force; none before schema v5.
    pub(crate) fn side_by_side_medians(&self, fingerprint_id: &str) -> Result<HashMap<i64, f64>> {
        if self.version < 5 {
            return Ok(HashMap::new());
        }
        let p = &self.path;
        let ctx = "reading side-by-side medians";
        let sql = format!(
            "SELECT w.trial_id, s.median_s FROM side_by_side s \
             JOIN winners w ON w.id = s.winner_id \
             WHERE w.fingerprint_id = ?1 AND NOT EXISTS \
             (SELECT 1 FROM side_by_side o WHERE o.set_id = s.set_id \
              AND o.winner_id NOT IN ({IN_FORCE})) \
             ORDER BY s.set_id, s.id"
        );
        let mut stmt = self.conn.prepare(&sql).ctx(p, ctx)?;
        let rows = stmt
            .query_map([fingerprint_id], |r| Ok((r.get(0)?, r.get(1)?)))
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<(i64, f64)>>>())
            .ctx(p, ctx)?;
        // Later sets come last and override earlier ones.
        Ok(rows.into_iter().collect())
    }
}
