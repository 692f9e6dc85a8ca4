//! Recorded winner decisions (schema v2): which trial a tuning job declared the winner of a
//! workload, why, and the interleaved re-measurement of the finalists it was decided on.
//!
//! Picking the fastest row at query time makes the winner flip between reruns on a noisy
//! machine whenever two configs are within noise of each other. The tuner therefore
//! re-measures the finalists side by side, declares a tie when their confidence intervals
//! overlap (keeping the incumbent or the simpler config), and records its decision here;
//! [`TuningDb::best`] and [`TuningDb::best_all`] serve the latest decision of a workload as
//! long as its trial is still usable (kernel version still registered, config still in the
//! space), and fall back to the fastest usable trial otherwise.
//!
//! ```sql
//! CREATE TABLE winners (
//!     id INTEGER PRIMARY KEY,                -- the latest decision per workload is in force
//!     fingerprint_id TEXT NOT NULL REFERENCES fingerprints(id),
//!     workload TEXT NOT NULL,
//!     trial_id INTEGER NOT NULL REFERENCES trials(id),   -- the winning trial (status ok)
//!     reason TEXT NOT NULL,                  -- fastest | tie_incumbent | tie_simpler | ...
//!     tie INTEGER NOT NULL,                  -- 1 when finalists' intervals overlapped
//!     decided_at TEXT NOT NULL, tool_version TEXT NOT NULL);
//! CREATE TABLE remeasurements (              -- one row per re-measured finalist
//!     id INTEGER PRIMARY KEY,
//!     winner_id INTEGER NOT NULL REFERENCES winners(id),
//!     trial_id INTEGER NOT NULL REFERENCES trials(id),
//!     median_s REAL NOT NULL, spread REAL NOT NULL,
//!     ci_low_s REAL NOT NULL, ci_high_s REAL,  -- 95% CI of the median; NULL = unbounded
//!     samples TEXT NOT NULL);                -- JSON array of seconds
//! ```

use std::collections::{HashMap, HashSet};

use kernels::{Measurement, Status, Workload};
use rusqlite::{params, OptionalExtension};

use crate::db::{record_from_row, TuningDb};
use crate::error::{Ctx, DbError, Result};
use crate::record::{now_rfc3339, Record};

/// The ids of the decisions in force, as SQL: the latest row of each (fingerprint, workload).
pub(crate) const LATEST_DECISIONS: &str =
    "SELECT max(id) FROM winners GROUP BY fingerprint_id, workload";

/// Whether `m` is a finite positive timing with samples, as every stored re-measurement must be.
pub(crate) fn finite_timing(m: &Measurement) -> bool {
    m.median_s.is_finite()
        && m.median_s > 0.0
        && m.spread.is_finite()
        && !m.samples.is_empty()
        && m.samples.iter().all(|s| s.is_finite())
}

/// A winner's re-measured median ([`TuningDb::winner_medians`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WinnerMedian {
    /// Seconds per call.
    pub median_s: f64,
    /// Taken side by side with its shape's other precisions' winners (else in its own
    /// decision's rounds).
    pub side_by_side: bool,
}

/// One finalist's interleaved re-measurement.
#[derive(Debug, Clone, PartialEq)]
pub struct Remeasurement {
    /// The finalist's trial.
    pub trial_id: i64,
    /// The interleaved timing: its samples (seconds), median and spread.
    pub measurement: Measurement,
    /// 95% confidence interval of the median, seconds (`ci_high_s` may be infinite).
    pub ci_low_s: f64,
    /// Upper end of that interval, seconds; infinite when it is unbounded (fewer than 3
    /// samples), stored as NULL.
    pub ci_high_s: f64,
}

/// A tuning job's decision of the winner of one workload on one machine.
#[derive(Debug, Clone, PartialEq)]
pub struct WinnerDecision {
    /// Row id, `None` until recorded.
    pub id: Option<i64>,
    /// [`HardwareFingerprint::id`](kernels::HardwareFingerprint::id) of the machine.
    pub fingerprint_id: String,
    /// The workload decided, stored as its key ([`Workload::key`]).
    pub workload: Workload,
    /// The winning trial: an `ok` record of this fingerprint and workload.
    pub trial_id: i64,
    /// Why it won (the tuner's `WinReason`: `fastest`, `tie_incumbent`, `tie_simpler`, ...).
    pub reason: String,
    /// Whether the finalists' confidence intervals overlapped.
    pub tie: bool,
    /// The finalists' re-measurements (empty when there was nothing to compare).
    pub remeasured: Vec<Remeasurement>,
    /// RFC 3339 UTC; empty means "now" when recorded.
    pub decided_at: String,
    /// Version of the tool that decided it.
    pub tool_version: String,
}

impl TuningDb {
    /// Records a decision (with its re-measurements, in one transaction) and returns its id.
    /// It becomes the workload's winner for [`best`](Self::best) and
    /// [`best_all`](Self::best_all). The winning trial, and every re-measured one, must be an
    /// `ok` trial of the same fingerprint and workload.
    pub fn record_winner(&self, d: &WinnerDecision) -> Result<i64> {
        let p = &self.path;
        let ctx = "recording a winner";
        let tx = self.begin_write(ctx)?;
        self.check_decision(&tx, d)?;
        let decided_at = if d.decided_at.is_empty() {
            now_rfc3339()
        } else {
            d.decided_at.clone()
        };
        tx.execute(
            "INSERT INTO winners (fingerprint_id, workload, trial_id, reason, tie, decided_at, \
             tool_version) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                d.fingerprint_id,
                d.workload.key(),
                d.trial_id,
                d.reason,
                d.tie,
                decided_at,
                d.tool_version
            ],
        )
        .ctx(p, ctx)?;
        let winner_id = tx.last_insert_rowid();
        {
            let mut ins = tx
                .prepare(
                    "INSERT INTO remeasurements (winner_id, trial_id, median_s, spread, \
                     ci_low_s, ci_high_s, samples) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )
                .ctx(p, ctx)?;
            for r in &d.remeasured {
                let samples =
                    serde_json::to_string(&r.measurement.samples).expect("finite floats serialise");
                ins.execute(params![
                    winner_id,
                    r.trial_id,
                    r.measurement.median_s,
                    r.measurement.spread,
                    r.ci_low_s,
                    r.ci_high_s.is_finite().then_some(r.ci_high_s),
                    samples
                ])
                .ctx(p, ctx)?;
            }
        }
        tx.commit().ctx(p, ctx)?;
        Ok(winner_id)
    }

    /// Refuses a decision whose winning or re-measured trials are missing, of another
    /// fingerprint or workload, or not `ok`, or whose re-measurements are not finite
    /// positive timings.
    fn check_decision(&self, conn: &rusqlite::Connection, d: &WinnerDecision) -> Result<()> {
        let p = &self.path;
        let bad = |reason: String| DbError::InvalidRecord {
            path: p.clone(),
            reason,
        };
        let mut trial = conn
            .prepare("SELECT fingerprint_id, workload, status FROM trials WHERE id = ?1")
            .ctx(p, "recording a winner")?;
        let ids = std::iter::once(d.trial_id).chain(d.remeasured.iter().map(|r| r.trial_id));
        for id in ids {
            let row: Option<(String, String, String)> = trial
                .query_row([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .optional()
                .ctx(p, "recording a winner")?;
            let Some((fp, w, status)) = row else {
                return Err(bad(format!(
                    "winner decision names trial {id}, which does not exist"
                )));
            };
            if fp != d.fingerprint_id || w != d.workload.key() {
                return Err(bad(format!(
                    "trial {id} is of {w} on {fp}, not of {} on {}",
                    d.workload, d.fingerprint_id
                )));
            }
            if status != Status::Ok.as_str() {
                return Err(bad(format!(
                    "trial {id} has status {status}; only ok trials can win"
                )));
            }
        }
        for r in &d.remeasured {
            let finite =
                finite_timing(&r.measurement) && r.ci_low_s.is_finite() && !r.ci_high_s.is_nan();
            if !finite {
                return Err(bad(format!(
                    "re-measurement of trial {} is not a finite positive timing",
                    r.trial_id
                )));
            }
        }
        Ok(())
    }

    /// The decision in force for `workload` on `fingerprint_id` (the latest recorded), with
    /// its re-measurements; `None` if no job decided one. Says nothing about whether its
    /// trial is still usable: [`best`](Self::best) checks that.
    pub fn winner(
        &self,
        fingerprint_id: &str,
        workload: &Workload,
    ) -> Result<Option<WinnerDecision>> {
        let p = &self.path;
        let ctx = "reading the winner";
        let row = self
            .conn
            .query_row(
                "SELECT id, trial_id, reason, tie, decided_at, tool_version FROM winners \
                 WHERE fingerprint_id = ?1 AND workload = ?2 ORDER BY id DESC LIMIT 1",
                params![fingerprint_id, workload.key()],
                |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, bool>(3)?,
                        r.get::<_, String>(4)?,
                        r.get::<_, String>(5)?,
                    ))
                },
            )
            .optional()
            .ctx(p, ctx)?;
        let Some((id, trial_id, reason, tie, decided_at, tool_version)) = row else {
            return Ok(None);
        };
        let mut stmt = self
            .conn
            .prepare(
                "SELECT trial_id, median_s, spread, ci_low_s, ci_high_s, samples \
                 FROM remeasurements WHERE winner_id = ?1 ORDER BY id",
            )
            .ctx(p, ctx)?;
        let rows = stmt
            .query_map([id], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, f64>(1)?,
                    r.get::<_, f64>(2)?,
                    r.get::<_, f64>(3)?,
                    r.get::<_, Option<f64>>(4)?,
                    r.get::<_, String>(5)?,
                ))
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .ctx(p, ctx)?;
        let mut remeasured = Vec::with_capacity(rows.len());
        for (trial_id, median_s, spread, ci_low_s, ci_high_s, samples) in rows {
            // A row whose samples do not parse is skipped, like a damaged trial row.
            let Ok(samples) = serde_json::from_str::<Vec<f64>>(&samples) else {
                continue;
            };
            remeasured.push(Remeasurement {
                trial_id,
                measurement: Measurement {
                    samples,
                    median_s,
                    spread,
                },
                ci_low_s,
                ci_high_s: ci_high_s.unwrap_or(f64::INFINITY),
            });
        }
        Ok(Some(WinnerDecision {
            id: Some(id),
            fingerprint_id: fingerprint_id.to_string(),
            workload: *workload,
            trial_id,
            reason,
            tie,
            remeasured,
            decided_at,
            tool_version,
        }))
    }

    /// The trial of the decision in force for `workload`, if any and if it still reads back
    /// as a record (usability is the caller's check).
    pub(crate) fn winner_trial(
        &self,
        fingerprint_id: &str,
        workload: &Workload,
    ) -> Result<Option<Record>> {
        let sql = format!(
            "SELECT {} FROM trials WHERE status = 'ok' AND id = \
             (SELECT trial_id FROM winners WHERE fingerprint_id = ?1 AND workload = ?2 \
              ORDER BY id DESC LIMIT 1)",
            self.record_columns()
        );
        let row = self
            .conn
            .query_row(&sql, params![fingerprint_id, workload.key()], |r| {
                Ok(record_from_row(r))
            })
            .optional()
            .ctx(&self.path, "reading the winner")?;
        Ok(row.flatten())
    }

    /// The trial ids of the decisions in force on `fingerprint_id`.
    pub fn winner_ids(&self, fingerprint_id: &str) -> Result<HashSet<i64>> {
        Ok(self
            .winner_trials(fingerprint_id)?
            .into_iter()
            .filter_map(|r| r.id)
            .collect())
    }

    /// The interleaved re-measured median of each winning trial on `fingerprint_id` (by
    /// trial id): a steadier figure than the trial's search median, which other work on the
    /// machine inflates while it searches. The median in its shape's latest side-by-side
    /// set ([`record_side_by_side`](Self::record_side_by_side)) whose decisions are all in
    /// force, where that set measured the trial (the precisions it holds then compare in the
    /// same rounds); else the decision in force's own re-measurement, where it re-measured it.
    pub fn remeasured_medians(&self, fingerprint_id: &str) -> Result<HashMap<i64, f64>> {
        Ok(self
            .winner_medians(fingerprint_id)?
            .into_iter()
            .map(|(id, m)| (id, m.median_s))
            .collect())
    }

    /// [`remeasured_medians`](Self::remeasured_medians), each with where it was taken.
    pub fn winner_medians(&self, fingerprint_id: &str) -> Result<HashMap<i64, WinnerMedian>> {
        let tag = |side_by_side| {
            move |(id, median_s)| {
                (
                    id,
                    WinnerMedian {
                        median_s,
                        side_by_side,
                    },
                )
            }
        };
        let mut medians: HashMap<i64, WinnerMedian> = self
            .decided_medians(fingerprint_id)?
            .into_iter()
            .map(tag(false))
            .collect();
        medians.extend(
            self.side_by_side_medians(fingerprint_id)?
                .into_iter()
                .map(tag(true)),
        );
        Ok(medians)
    }

    /// The decisions in force's own re-measured medians of their winners (by trial id).
    fn decided_medians(&self, fingerprint_id: &str) -> Result<HashMap<i64, f64>> {
        let p = &self.path;
        let mut stmt = self
            .conn
            .prepare(
                "SELECT w.trial_id, r.median_s FROM winners w \
                 JOIN remeasurements r ON r.winner_id = w.id AND r.trial_id = w.trial_id \
                 WHERE w.fingerprint_id = ?1 AND w.id = \
                 (SELECT max(l.id) FROM winners l \
                  WHERE l.fingerprint_id = w.fingerprint_id AND l.workload = w.workload)",
            )
            .ctx(p, "reading re-measured medians")?;
        let rows = stmt
            .query_map([fingerprint_id], |r| Ok((r.get(0)?, r.get(1)?)))
            .and_then(|rows| rows.collect::<rusqlite::Result<HashMap<i64, f64>>>())
            .ctx(p, "reading re-measured medians")?;
        Ok(rows)
    }

    /// The trials of the decisions in force for every workload of `fingerprint_id`.
    pub(crate) fn winner_trials(&self, fingerprint_id: &str) -> Result<Vec<Record>> {
        let sql = format!(
            "SELECT {} FROM trials WHERE status = 'ok' AND id IN \
             (SELECT w.trial_id FROM winners w WHERE w.fingerprint_id = ?1 AND w.id = \
              (SELECT max(l.id) FROM winners l \
               WHERE l.fingerprint_id = w.fingerprint_id AND l.workload = w.workload))",
            self.record_columns()
        );
        let p = &self.path;
        let mut stmt = self.conn.prepare(&sql).ctx(p, "reading winners")?;
        let rows = stmt
            .query_map([fingerprint_id], |r| Ok(record_from_row(r)))
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .ctx(p, "reading winners")?;
        Ok(rows.into_iter().flatten().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels::{default_for, Config, HardwareFingerprint};

    fn setup() -> (TuningDb, HardwareFingerprint, Workload, Vec<i64>) {
        let db = TuningDb::in_memory().unwrap();
        let hw = HardwareFingerprint::current().clone();
        db.upsert_fingerprint(&hw).unwrap();
        let w: Workload = "gemm:64x64x64".parse().unwrap();
        let (k, c) = default_for(&w, &hw).unwrap();
        let configs: Vec<Config> = k.space(&w, &hw).iter_valid().take(2).collect();
        let mut ids = Vec::new();
        for (cfg, t) in [
            (c, 3e-5),
            (configs[0].clone(), 1e-5),
            (configs[1].clone(), 2e-5),
        ] {
            let m = Measurement::from_samples(vec![t, t * 1.01, t * 0.99]);
            let r = Record::ok(&hw.id, w, k.name(), k.version(), cfg, m, "t");
            ids.push(db.insert(&r).unwrap());
        }
        (db, hw, w, ids)
    }

    fn decision(hw: &HardwareFingerprint, w: Workload, trial_id: i64) -> WinnerDecision {
        WinnerDecision {
            id: None,
            fingerprint_id: hw.id.clone(),
            workload: w,
            trial_id,
            reason: "tie_simpler".into(),
            tie: true,
            remeasured: vec![Remeasurement {
                trial_id,
                measurement: Measurement::from_samples(vec![2e-5, 2.1e-5, 1.9e-5]),
                ci_low_s: 1.9e-5,
                ci_high_s: f64::INFINITY,
            }],
            decided_at: String::new(),
            tool_version: "t".into(),
        }
    }

    #[test]
    fn best_serves_the_recorded_winner_over_the_fastest_trial() {
        let (db, hw, w, ids) = setup();
        assert_eq!(db.best(&hw.id, &w).unwrap().unwrap().id, Some(ids[1]));
        assert_eq!(db.winner(&hw.id, &w).unwrap(), None);

        let id = db.record_winner(&decision(&hw, w, ids[2])).unwrap();
        let got = db.winner(&hw.id, &w).unwrap().unwrap();
        assert_eq!(got.id, Some(id));
        assert_eq!(
            (got.trial_id, got.reason.as_str(), got.tie),
            (ids[2], "tie_simpler", true)
        );
        assert_eq!(got.remeasured.len(), 1);
        assert!(got.remeasured[0].ci_high_s.is_infinite());
        assert_eq!(got.decided_at.len(), 20);
        assert_eq!(db.best(&hw.id, &w).unwrap().unwrap().id, Some(ids[2]));
        assert_eq!(db.best_all(&hw.id).unwrap()[0].id, Some(ids[2]));

        // A later decision replaces it.
        db.record_winner(&decision(&hw, w, ids[0])).unwrap();
        assert_eq!(db.best(&hw.id, &w).unwrap().unwrap().id, Some(ids[0]));
        assert_eq!(db.best_all(&hw.id).unwrap().len(), 1);
        assert_eq!(db.best_all(&hw.id).unwrap()[0].id, Some(ids[0]));
    }

    #[test]
    fn remeasured_medians_are_those_of_the_winners_in_force() {
        let (db, hw, w, ids) = setup();
        assert!(db.remeasured_medians(&hw.id).unwrap().is_empty());
        db.record_winner(&decision(&hw, w, ids[0])).unwrap();
        assert_eq!(
            db.remeasured_medians(&hw.id).unwrap(),
            HashMap::from([(ids[0], 2e-5)])
        );
        // A later decision is the one in force; one without a re-measurement of its winner
        // gives none.
        let mut later = decision(&hw, w, ids[1]);
        later.remeasured[0].trial_id = ids[2];
        later.remeasured.push(Remeasurement {
            trial_id: ids[1],
            ..later.remeasured[0].clone()
        });
        later.remeasured[1].measurement = Measurement::from_samples(vec![7e-6; 3]);
        db.record_winner(&later).unwrap();
        assert_eq!(
            db.remeasured_medians(&hw.id).unwrap(),
            HashMap::from([(ids[1], 7e-6)])
        );
        let mut bare = decision(&hw, w, ids[2]);
        bare.remeasured.clear();
        db.record_winner(&bare).unwrap();
        assert!(db.remeasured_medians(&hw.id).unwrap().is_empty());
    }

    #[test]
    fn a_winner_that_is_no_longer_usable_falls_back_to_the_fastest() {
        let (db, hw, w, ids) = setup();
        // A record of a kernel version that is not registered cannot be served.
        let (k, c) = default_for(&w, &hw).unwrap();
        let m = Measurement::from_samples(vec![5e-6; 3]);
        let stale = Record::ok(&hw.id, w, k.name(), k.version() + 1, c, m, "t");
        let stale_id = db.insert(&stale).unwrap();
        db.record_winner(&decision(&hw, w, stale_id)).unwrap();
        assert_eq!(db.best(&hw.id, &w).unwrap().unwrap().id, Some(ids[1]));
        assert_eq!(db.best_all(&hw.id).unwrap()[0].id, Some(ids[1]));
    }

    #[test]
    fn a_v1_file_migrates_to_v2_keeping_its_trials() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v1.db");
        let hw = HardwareFingerprint::current().clone();
        let w: Workload = "gemm:16x16x16".parse().unwrap();
        {
            let db = TuningDb::open(&path).unwrap();
            db.upsert_fingerprint(&hw).unwrap();
            let (k, c) = default_for(&w, &hw).unwrap();
            let m = Measurement::from_samples(vec![1e-6; 3]);
            db.insert(&Record::ok(&hw.id, w, k.name(), k.version(), c, m, "t"))
                .unwrap();
        }
        // Turn it back into what a v1 build wrote.
        let raw = rusqlite::Connection::open(&path).unwrap();
        raw.execute_batch(
            "DROP TABLE side_by_side; DROP TABLE remeasurements; DROP TABLE winners; \
             DROP TABLE provenance; \
             ALTER TABLE trials DROP COLUMN max_rel_err; \
             ALTER TABLE trials DROP COLUMN fro_rel_err; PRAGMA user_version = 1;",
        )
        .unwrap();
        drop(raw);
        assert!(matches!(
            TuningDb::open_read_only(&path).unwrap_err(),
            DbError::OlderSchemaReadOnly { found: 1, .. }
        ));
        let db = TuningDb::open(&path).unwrap();
        assert_eq!(db.schema_version().unwrap(), crate::SCHEMA_VERSION);
        let trial = db.best(&hw.id, &w).unwrap().unwrap();
        db.record_winner(&decision(&hw, w, trial.id.unwrap()))
            .unwrap();
        assert_eq!(
            db.winner(&hw.id, &w).unwrap().unwrap().trial_id,
            trial.id.unwrap()
        );
        db.verify().unwrap();
    }

    #[test]
    fn decisions_naming_bad_trials_are_refused() {
        let (db, hw, w, ids) = setup();
        let e = db.record_winner(&decision(&hw, w, 999)).unwrap_err();
        assert!(e.to_string().contains("trial 999"), "{e}");
        let other: Workload = "gemm:8x8x8".parse().unwrap();
        let e = db.record_winner(&decision(&hw, other, ids[0])).unwrap_err();
        assert!(e.to_string().contains("not of gemm:8x8x8"), "{e}");
        let (k, c) = default_for(&w, &hw).unwrap();
        let crashed = Record::failed(
            &hw.id,
            w,
            k.name(),
            k.version(),
            c,
            Status::Crashed,
            "SIGSEGV",
            "t",
        );
        let cid = db.insert(&crashed).unwrap();
        let e = db.record_winner(&decision(&hw, w, cid)).unwrap_err();
        assert!(e.to_string().contains("status crashed"), "{e}");
        let mut nan = decision(&hw, w, ids[0]);
        nan.remeasured[0].measurement.median_s = f64::NAN;
        assert!(db.record_winner(&nan).is_err());
        assert_eq!(db.winner(&hw.id, &w).unwrap(), None, "nothing half-written");
    }
}
