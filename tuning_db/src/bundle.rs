//! Bundles for fleets: a self-contained SQLite file holding one fingerprint's trials, with a
//! manifest and a checksum of its content; and the full check behind `autokernel db verify`.
//!
//! A bundle is an ordinary tuning database (same schema, same [`crate::APPLICATION_ID`]) in
//! rollback-journal mode, so it is one file that can be copied while nothing writes it. Its
//! manifest lives in the `meta` table under `bundle.*` keys ([`Manifest`]).
//!
//! ## The content checksum
//!
//! [`TuningDb::content_checksum`] is `sha256:` + the SHA-256 of this text, one line each:
//!
//! ```text
//! autokernel-content-v1
//! F <fingerprint id> <canonical JSON>                 one per fingerprint, sorted
//! T <JSON array: every trials column but id>          one per trial, sorted
//! W <fingerprint> <workload> <trial digest> <reason> <tie> <decided_at> <tool_version>
//! ```
//!
//! Trial columns are taken in column-name order; text and integers as JSON, reals as their
//! IEEE-754 bits (`"r:3f50624dd2f1a9fc"`) so no float formatting is involved; `W` lines are
//! the winner decisions in force (schema v2), naming their trial by the SHA-256 of its `T`
//! line. Row ids, `first_seen`, provenance and re-measurements are not covered: the same
//! measurements give the same checksum in any file, whatever order they were inserted in.
//!
//! ## Schema v3: provenance
//!
//! ```sql
//! CREATE TABLE provenance (
//!     id INTEGER PRIMARY KEY,
//!     trial_id INTEGER NOT NULL REFERENCES trials(id),
//!     source TEXT NOT NULL,            -- the bundle or database it was imported from
//!     source_checksum TEXT NOT NULL,   -- that file's content checksum
//!     imported_at TEXT NOT NULL,       -- RFC 3339 UTC
//!     UNIQUE (trial_id, source_checksum));
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use kernels::{HardwareFingerprint, Space, SpaceError, Workload};
use rusqlite::types::Value;
use rusqlite::{params, Connection};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::db::TuningDb;
use crate::error::{Ctx, DbError};
use crate::record::{now_rfc3339, Record, Stats};
use crate::schema::{OPTIONAL_TRIAL_COLUMNS, SCHEMA_VERSION};

/// The `bundle.format` value of bundles this version writes.
pub const BUNDLE_FORMAT: &str = "autokernel-bundle/1";

/// Errors of bundles, imports, merges, checks and diffs. Each names the file concerned and
/// renders as one line.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// An error of a database involved: opening, reading or writing it.
    #[error(transparent)]
    Db(#[from] DbError),

    /// An output file that already exists (exports and merges never overwrite).
    #[error("{}: already exists; choose another output path or remove it first", .path.display())]
    OutputExists {
        /// The output path.
        path: PathBuf,
    },

    /// A fingerprint that is not in the database.
    #[error("{}: no fingerprint '{id}' in this database{why} (it has: {known})", .path.display())]
    UnknownFingerprint {
        /// The database searched.
        path: PathBuf,
        /// The id as given: a full id, a prefix, or `current`.
        id: String,
        /// What the id was taken for (`current`: this machine's), or why a prefix did not
        /// resolve; empty otherwise.
        why: String,
        /// The ids the database holds, comma-separated (`none` when it holds none).
        known: String,
    },

    /// The bundle's content does not hash to its manifest's checksum.
    #[error("{}: bundle checksum mismatch: the manifest says {expected} but the content hashes to {found} (the file was modified or damaged)", .path.display())]
    ChecksumMismatch {
        /// The bundle.
        path: PathBuf,
        /// The manifest's `bundle.checksum`.
        expected: String,
        /// The content checksum recomputed from the file ([`TuningDb::content_checksum`]).
        found: String,
    },

    /// The check found problems (the first few are listed).
    #[error("{}: {} problem(s): {}", .path.display(), .problems.len(), summarize(.problems))]
    Invalid {
        /// The file checked; for an export, the database the bundle was written from.
        path: PathBuf,
        /// Every problem found, one sentence each; the message shows the first three.
        problems: Vec<String>,
    },

    /// A SQLite file with no tables where a database was expected (a 0-byte file is
    /// [`DbError::Empty`]).
    #[error("{}: an empty SQLite file (no tables), not a tuning database or bundle", .path.display())]
    Empty {
        /// The file opened.
        path: PathBuf,
    },

    /// Importing a database into itself.
    #[error("{}: cannot import a database into itself", .path.display())]
    SameFile {
        /// The database imported into.
        path: PathBuf,
    },

    /// A file-system error.
    #[error("{}: {context}: {cause}", .path.display())]
    Io {
        /// The file concerned (an export's or a merge's output).
        path: PathBuf,
        /// What was being done (`moving the finished bundle into place`, ...).
        context: String,
        /// The operating system's error.
        cause: std::io::Error,
    },
}

fn summarize(problems: &[String]) -> String {
    const SHOWN: usize = 3;
    let mut s = problems
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join("; ");
    if problems.len() > SHOWN {
        s.push_str(&format!("; ... and {} more", problems.len() - SHOWN));
    }
    s
}

/// A bundle's manifest: the `bundle.*` rows of its `meta` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Manifest {
    /// [`BUNDLE_FORMAT`].
    pub format: String,
    /// Schema version the bundle was written with.
    pub schema_version: i64,
    /// Version of the tool that wrote it.
    pub tool_version: String,
    /// Rows in `trials`.
    pub record_count: u64,
    /// The one fingerprint it holds.
    pub fingerprint: String,
    /// RFC 3339 UTC.
    pub created_at: String,
    /// [`TuningDb::content_checksum`] when it was written.
    pub checksum: String,
    /// The database it was exported from, as given to the exporter.
    pub source: String,
}

/// The `meta` key that marks a file as a bundle.
pub(crate) const FORMAT_KEY: &str = "bundle.format";

const MANIFEST_KEYS: [&str; 8] = [
    FORMAT_KEY,
    "bundle.schema_version",
    "bundle.tool_version",
    "bundle.record_count",
    "bundle.fingerprint",
    "bundle.created_at",
    "bundle.checksum",
    "bundle.source",
];

/// Per-fingerprint counts, for `autokernel db stats`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FingerprintStats {
    /// The fingerprint id ([`HardwareFingerprint::id`]).
    pub id: String,
    /// Marketing name, `?` when the row does not read back.
    pub brand: String,
    /// Hardware threads the tuner could use, `-1` when the row does not read back.
    pub cores: i64,
    /// [`HardwareFingerprint::arch_key`].
    pub arch_key: String,
    /// Its rows in `trials`, failures included.
    pub records: u64,
    /// Its rows with `status = 'ok'`.
    pub ok: u64,
    /// Its rows with any other status.
    pub failures: u64,
    /// Distinct workload keys among its trials.
    pub workloads: u64,
}

/// Everything `autokernel db stats` shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// The database file.
    pub path: PathBuf,
    /// Its schema version (`PRAGMA user_version`).
    pub schema_version: i64,
    /// Counts over the whole file (flattened into the summary's JSON form).
    #[serde(flatten)]
    pub totals: Stats,
    /// Counts per stored fingerprint, sorted by id.
    pub fingerprints_detail: Vec<FingerprintStats>,
    /// Trials with at least one provenance row (imported from a bundle or merged).
    pub imported_records: u64,
    /// Distinct sources (by checksum) trials were imported from.
    pub sources: u64,
    /// Winner decisions in force (schema v2).
    pub winners: u64,
    /// The bundle manifest; `None` unless the file is a bundle.
    pub manifest: Option<Manifest>,
}

/// What [`check_file`] found. `problems` empty means the file passes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckReport {
    /// The file checked, as given.
    pub path: PathBuf,
    /// Its schema version (`PRAGMA user_version`).
    pub schema_version: i64,
    /// Rows in `trials`.
    pub records: u64,
    /// Rows in `fingerprints`.
    pub fingerprints: u64,
    /// The content checksum, recomputed.
    pub checksum: String,
    /// The bundle manifest; `None` unless the file is a bundle.
    pub manifest: Option<Manifest>,
    /// Whether the recomputed checksum equals the manifest's (`None` without a manifest).
    pub checksum_ok: Option<bool>,
    /// `ok` records of a current kernel version whose config was checked against its space.
    pub configs_checked: u64,
    /// `ok` records of kernel versions this build no longer has (kept as history, never served).
    pub stale: u64,
    /// Problems: each makes the check fail.
    pub problems: Vec<String>,
    /// Things worth knowing that are not problems.
    pub notes: Vec<String>,
}

impl CheckReport {
    /// Whether the file passed.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }

    /// The report itself if it passed, else [`BundleError::ChecksumMismatch`] (when that is
    /// the problem) or [`BundleError::Invalid`].
    pub fn into_result(self) -> Result<CheckReport, BundleError> {
        let no_checksum = self
            .manifest
            .as_ref()
            .is_some_and(|m| m.checksum.is_empty());
        if self.checksum_ok == Some(false) && !no_checksum {
            return Err(BundleError::ChecksumMismatch {
                path: self.path.clone(),
                expected: self.manifest.map(|m| m.checksum).unwrap_or_default(),
                found: self.checksum,
            });
        }
        if self.is_ok() {
            Ok(self)
        } else {
            Err(BundleError::Invalid {
                path: self.path,
                problems: self.problems,
            })
        }
    }
}

/// A raw row: column name → value, in column-name order.
pub(crate) type RawRow = BTreeMap<String, Value>;

impl TuningDb {
    /// The content checksum of the whole file (see the module documentation).
    pub fn content_checksum(&self) -> Result<String, DbError> {
        let p = &self.path;
        let ctx = "computing the content checksum";
        let mut lines: Vec<String> = Vec::new();
        let mut stmt = self
            .conn
            .prepare("SELECT id, canonical FROM fingerprints ORDER BY id")
            .ctx(p, ctx)?;
        let fps = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .ctx(p, ctx)?;
        for (id, canonical) in fps {
            lines.push(format!("F {id} {canonical}"));
        }
        let trials = raw_rows(&self.conn, p, "trials", "1 = 1", [])?;
        let mut digest_of: HashMap<i64, String> = HashMap::new();
        for row in &trials {
            let line = trial_line(row);
            digest_of.insert(row_id(row), hex(&Sha256::digest(line.as_bytes())));
            lines.push(line);
        }
        for w in self.winners_in_force()? {
            let digest = digest_of.get(&w.trial_id).cloned().unwrap_or_default();
            lines.push(format!(
                "W {} {} {} {} {} {} {}",
                w.fingerprint_id,
                w.workload,
                digest,
                w.reason,
                u8::from(w.tie),
                w.decided_at,
                w.tool_version
            ));
        }
        lines.sort();
        let mut h = Sha256::new();
        h.update(b"autokernel-content-v1\n");
        for l in &lines {
            h.update(l.as_bytes());
            h.update(b"\n");
        }
        Ok(format!("sha256:{}", hex(&h.finalize())))
    }

    /// The bundle manifest, if this file is a bundle: it has any `bundle.*` meta row (a
    /// manifest missing some of its rows, `bundle.format` included, is a damaged or altered
    /// bundle, which [`verify`] reports, not an ordinary database).
    pub fn manifest(&self) -> Result<Option<Manifest>, DbError> {
        if !self.is_bundle()? {
            return Ok(None);
        }
        let get = |k: &str| -> Result<String, DbError> { Ok(self.meta(k)?.unwrap_or_default()) };
        Ok(Some(Manifest {
            format: get(FORMAT_KEY)?,
            schema_version: get("bundle.schema_version")?.parse().unwrap_or(-1),
            tool_version: get("bundle.tool_version")?,
            record_count: get("bundle.record_count")?.parse().unwrap_or(u64::MAX),
            fingerprint: get("bundle.fingerprint")?,
            created_at: get("bundle.created_at")?,
            checksum: get("bundle.checksum")?,
            source: get("bundle.source")?,
        }))
    }

    /// Resolves `id` to a stored fingerprint id: an exact id, `current` (this machine as
    /// [`HardwareFingerprint::current`] reports it, at the threads this process uses), or a
    /// unique prefix of at least 4 hex digits.
    pub fn resolve_fingerprint(&self, id: &str) -> Result<String, BundleError> {
        let ids = self.fingerprint_ids()?;
        let wanted = if id == "current" {
            HardwareFingerprint::current().id.clone()
        } else {
            id.to_string()
        };
        if ids.contains(&wanted) {
            return Ok(wanted);
        }
        let matches: Vec<&String> = ids
            .iter()
            .filter(|x| wanted.len() >= 4 && x.starts_with(&wanted))
            .collect();
        if let [one] = matches[..] {
            return Ok(one.clone());
        }
        let why = match () {
            _ if id == "current" => format!(" (this machine is {wanted})"),
            _ if matches.len() > 1 => format!(" (a prefix of {} of them)", matches.len()),
            _ if wanted.len() < 4 && ids.iter().any(|x| x.starts_with(&wanted)) => {
                " (a prefix takes 4 digits or more)".into()
            }
            _ => String::new(),
        };
        Err(BundleError::UnknownFingerprint {
            path: self.path.clone(),
            id: id.to_string(),
            why,
            known: if ids.is_empty() {
                "none".into()
            } else {
                ids.join(", ")
            },
        })
    }

    /// Ids of every stored fingerprint, sorted (rows whose numbers are out of range too).
    pub fn fingerprint_ids(&self) -> Result<Vec<String>, DbError> {
        let mut stmt = self
            .conn
            .prepare("SELECT id FROM fingerprints ORDER BY id")
            .ctx(&self.path, "reading fingerprints")?;
        let ids = stmt
            .query_map([], |r| r.get::<_, String>(0))
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .ctx(&self.path, "reading fingerprints")?;
        Ok(ids)
    }

    /// Writes a bundle of fingerprint `fingerprint_id` to `out` (which must not exist): its
    /// fingerprint row, every trial of it (failures too), their provenance, the winner
    /// decisions in force with their re-measurements, and the manifest. The file appears
    /// complete or not at all (written beside `out`, then renamed).
    pub fn export_bundle(
        &self,
        fingerprint_id: &str,
        out: &Path,
        tool_version: &str,
    ) -> Result<Manifest, BundleError> {
        let id = self.resolve_fingerprint(fingerprint_id)?;
        if out.exists() {
            return Err(BundleError::OutputExists {
                path: out.to_path_buf(),
            });
        }
        require_parent(out)?;
        let tmp = temp_beside(out);
        // What the receiver's check would refuse is not shipped: the problems are reported
        // against this database, the file they came from.
        let result = self.write_bundle(&id, &tmp, tool_version).and_then(|m| {
            let report = check_file(&tmp)?;
            if report.problems.is_empty() {
                Ok(m)
            } else {
                Err(BundleError::Invalid {
                    path: self.path.clone(),
                    problems: report.problems,
                })
            }
        });
        match result {
            Ok(manifest) => {
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
                        context: "moving the finished bundle into place".into(),
                        cause: e,
                    }
                })?;
                Ok(manifest)
            }
            Err(e) => {
                remove_db_files(&tmp);
                Err(e)
            }
        }
    }

    fn write_bundle(
        &self,
        id: &str,
        tmp: &Path,
        tool_version: &str,
    ) -> Result<Manifest, BundleError> {
        let src = &self.conn;
        let sp = &self.path;
        let bundle = TuningDb::open(tmp)?;
        let bp = bundle.path.clone();
        let ctx = "writing the bundle";
        let tx = bundle.begin_write(ctx)?;
        let fp_rows = raw_rows(src, sp, "fingerprints", "id = ?1", [id])?;
        insert_raw(&tx, &bp, "fingerprints", &fp_rows, true)?;
        let trials = raw_rows(src, sp, "trials", "fingerprint_id = ?1", [id])?;
        insert_raw(&tx, &bp, "trials", &trials, true)?;
        let prov = raw_rows(
            src,
            sp,
            "provenance",
            "trial_id IN (SELECT id FROM trials WHERE fingerprint_id = ?1)",
            [id],
        )?;
        insert_raw(&tx, &bp, "provenance", &prov, true)?;
        let in_force = "id IN (SELECT max(id) FROM winners WHERE fingerprint_id = ?1 \
                        GROUP BY workload)";
        let winners = raw_rows(src, sp, "winners", in_force, [id])?;
        insert_raw(&tx, &bp, "winners", &winners, true)?;
        let remeasured = raw_rows(
            src,
            sp,
            "remeasurements",
            &format!("winner_id IN (SELECT id FROM winners WHERE {in_force})"),
            [id],
        )?;
        insert_raw(&tx, &bp, "remeasurements", &remeasured, true)?;
        if self.version >= 5 {
            // The side-by-side sets whose decisions are all in force.
            let decided = format!("SELECT id FROM winners WHERE {in_force}");
            let side_by_side = raw_rows(
                src,
                sp,
                "side_by_side",
                &format!(
                    "winner_id IN ({decided}) AND set_id NOT IN \
                     (SELECT set_id FROM side_by_side WHERE winner_id NOT IN ({decided}))"
                ),
                [id],
            )?;
            insert_raw(&tx, &bp, "side_by_side", &side_by_side, true)?;
        }
        tx.commit().ctx(&bp, ctx)?;

        let manifest = Manifest {
            format: BUNDLE_FORMAT.into(),
            schema_version: SCHEMA_VERSION,
            tool_version: tool_version.into(),
            record_count: trials.len() as u64,
            fingerprint: id.into(),
            created_at: now_rfc3339(),
            checksum: bundle.content_checksum()?,
            source: self.path.display().to_string(),
        };
        let values = [
            manifest.format.clone(),
            manifest.schema_version.to_string(),
            manifest.tool_version.clone(),
            manifest.record_count.to_string(),
            manifest.fingerprint.clone(),
            manifest.created_at.clone(),
            manifest.checksum.clone(),
            manifest.source.clone(),
        ];
        let tx = bundle.begin_write(ctx)?;
        for (k, v) in MANIFEST_KEYS.iter().zip(values) {
            tx.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)",
                params![k, v],
            )
            .ctx(&bp, ctx)?;
        }
        tx.commit().ctx(&bp, ctx)?;
        bundle.into_one_file()?;
        Ok(manifest)
    }

    /// Closes a database written in WAL mode as one self-contained file (what is moved into
    /// place or shipped): the log checkpointed in full and checked, then a rollback journal.
    /// A checkpoint that cannot complete (a full disk) is an error: the file alone would
    /// lack the pages still in its `-wal`.
    pub(crate) fn into_one_file(self) -> Result<(), DbError> {
        let (p, what) = (&self.path, "writing the file's last pages (checkpoint)");
        let (busy, log, done): (i64, i64, i64) = self
            .conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .ctx(p, what)?;
        let mode: String = self
            .conn
            .query_row("PRAGMA journal_mode = DELETE", [], |r| r.get(0))
            .ctx(p, "switching to a rollback journal")?;
        if busy != 0 || log != done || !mode.eq_ignore_ascii_case("delete") {
            return Err(DbError::Io {
                path: p.clone(),
                context: what.into(),
                cause: std::io::Error::other(format!(
                    "the write-ahead log was not written back (busy {busy}, {done} of {log} \
                     frames, journal mode {mode}): is the disk full?"
                )),
            });
        }
        Ok(())
    }

    /// The workloads with at least one `ok` record on `fingerprint_id`, with how many,
    /// sorted by key (keys that no longer parse are left out; `verify` reports them).
    pub fn ok_workloads(&self, fingerprint_id: &str) -> Result<Vec<(Workload, u64)>, DbError> {
        let p = &self.path;
        let mut stmt = self
            .conn
            .prepare(
                "SELECT workload, count(*) FROM trials WHERE fingerprint_id = ?1 \
                 AND status = 'ok' GROUP BY workload ORDER BY workload",
            )
            .ctx(p, "listing workloads")?;
        let rows = stmt
            .query_map([fingerprint_id], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .ctx(p, "listing workloads")?;
        Ok(rows
            .into_iter()
            .filter_map(|(w, n)| Some((w.parse().ok()?, n.max(0) as u64)))
            .collect())
    }

    /// Counts for `autokernel db stats`.
    pub fn summary(&self) -> Result<Summary, DbError> {
        let p = &self.path;
        let ctx = "computing stats";
        // A damaged page is reported, not summed around (the counts may never read it).
        self.check_pages()?;
        let totals = self.stats()?;
        let mut stmt = self
            .conn
            .prepare(
                "SELECT f.id, count(t.id), coalesce(sum(t.status = 'ok'), 0), \
                 count(DISTINCT t.workload) FROM fingerprints f \
                 LEFT JOIN trials t ON t.fingerprint_id = f.id GROUP BY f.id ORDER BY f.id",
            )
            .ctx(p, ctx)?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, i64>(3)?,
                ))
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .ctx(p, ctx)?;
        drop(stmt);
        let mut detail = Vec::new();
        for (id, records, ok, workloads) in rows {
            let fp = self.fingerprint(&id)?;
            let u = |v: i64| v.max(0) as u64;
            detail.push(FingerprintStats {
                brand: fp.as_ref().map_or("?".into(), |f| f.brand.clone()),
                cores: fp.as_ref().map_or(-1, |f| f.cores as i64),
                arch_key: fp.as_ref().map_or("?".into(), |f| f.arch_key()),
                id,
                records: u(records),
                ok: u(ok),
                failures: u(records - ok),
                workloads: u(workloads),
            });
        }
        let (imported, sources): (i64, i64) = self
            .conn
            .query_row(
                "SELECT count(DISTINCT trial_id), count(DISTINCT source_checksum) FROM provenance",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .ctx(p, ctx)?;
        let winners: i64 = self
            .conn
            .query_row(
                "SELECT count(*) FROM (SELECT DISTINCT fingerprint_id, workload FROM winners)",
                [],
                |r| r.get(0),
            )
            .ctx(p, ctx)?;
        Ok(Summary {
            path: p.clone(),
            schema_version: self.schema_version()?,
            totals,
            fingerprints_detail: detail,
            imported_records: imported.max(0) as u64,
            sources: sources.max(0) as u64,
            winners: winners.max(0) as u64,
            manifest: self.manifest()?,
        })
    }

    /// The winner decisions in force (the latest per fingerprint and workload).
    pub(crate) fn winners_in_force(&self) -> Result<Vec<InForce>, DbError> {
        let p = &self.path;
        let ctx = "reading winners";
        let mut stmt = self
            .conn
            .prepare(
                "SELECT fingerprint_id, workload, trial_id, reason, tie, decided_at, \
                 tool_version FROM winners WHERE id IN \
                 (SELECT max(id) FROM winners GROUP BY fingerprint_id, workload) ORDER BY id",
            )
            .ctx(p, ctx)?;
        let rows = stmt
            .query_map([], |r| {
                Ok(InForce {
                    fingerprint_id: r.get(0)?,
                    workload: r.get(1)?,
                    trial_id: r.get(2)?,
                    reason: r.get(3)?,
                    tie: r.get(4)?,
                    decided_at: r.get(5)?,
                    tool_version: r.get(6)?,
                })
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .ctx(p, ctx)?;
        Ok(rows)
    }
}

/// A winner decision in force, as stored.
pub(crate) struct InForce {
    pub fingerprint_id: String,
    pub workload: String,
    pub trial_id: i64,
    pub reason: String,
    pub tie: bool,
    pub decided_at: String,
    pub tool_version: String,
}

/// Opens an existing database or bundle read-only for inspection, with a clear error for a
/// SQLite file without tables (which [`TuningDb::open_read_only`] would call a schema-0
/// database).
pub fn open_existing(path: &Path) -> Result<TuningDb, BundleError> {
    match TuningDb::open_read_only(path) {
        Err(DbError::OlderSchemaReadOnly { found: 0, .. }) => Err(BundleError::Empty {
            path: path.to_path_buf(),
        }),
        other => Ok(other?),
    }
}

/// The full check of `path` behind `autokernel db verify`: opens it read-only (damaged,
/// foreign and newer files are refused with their error), runs [`TuningDb::verify`]
/// (SQLite's integrity and foreign-key checks, every row reads back), recomputes the content
/// checksum and compares it and the record count with the manifest if there is one, and
/// checks that every `ok` record of a current kernel version still fits its kernel's space
/// for its fingerprint — so every record the runtime could serve is valid.
///
/// For fingerprints of another micro-architecture than this machine, values of name-valued
/// knobs (micro-kernel variants this CPU may lack) are not checked; a note says so.
pub fn check_file(path: &Path) -> Result<CheckReport, BundleError> {
    let db = open_existing(path)?;
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    match db.verify() {
        Ok(()) => {}
        Err(DbError::Verify { problems: p, .. }) => problems.extend(p),
        Err(e) => return Err(e.into()),
    }
    let stats = db.stats()?;
    let checksum = db.content_checksum()?;
    let manifest = db.manifest()?;
    let mut checksum_ok = None;
    if let Some(m) = &manifest {
        checksum_ok = Some(m.checksum == checksum);
        if m.checksum.is_empty() {
            problems.push("the manifest has no bundle.checksum".into());
        } else if m.checksum != checksum {
            problems.push(format!(
                "checksum mismatch: the manifest says {} but the content hashes to {checksum}",
                m.checksum
            ));
        }
        if m.format.is_empty() {
            problems.push(
                "the manifest has no bundle.format, but other bundle.* rows: a damaged or \
                 altered bundle"
                    .into(),
            );
        } else if m.format != BUNDLE_FORMAT {
            problems.push(format!(
                "unknown bundle format '{}' (this build writes {BUNDLE_FORMAT})",
                m.format
            ));
        }
        // The file's schema can only have moved up since the export (a migration), never
        // below what the manifest says it was written in.
        let file_schema = db.schema_version()?;
        if !(1..=file_schema).contains(&m.schema_version) {
            problems.push(format!(
                "the manifest says schema v{} but the file is v{file_schema}",
                m.schema_version
            ));
        }
        if m.record_count != stats.records {
            problems.push(format!(
                "the manifest counts {} records but the file holds {}",
                m.record_count, stats.records
            ));
        }
        let ids = db.fingerprint_ids()?;
        if ids != [m.fingerprint.clone()] {
            problems.push(format!(
                "the manifest names fingerprint {} but the file holds {}",
                m.fingerprint,
                ids.join(", ")
            ));
        }
    }
    let (configs_checked, stale) = check_configs(&db, &mut problems, &mut notes)?;
    Ok(CheckReport {
        path: path.to_path_buf(),
        schema_version: db.schema_version()?,
        records: stats.records,
        fingerprints: stats.fingerprints,
        checksum,
        manifest,
        checksum_ok,
        configs_checked,
        stale,
        problems,
        notes,
    })
}

/// Checks every `ok` record of a registered (kernel, version) against its space.
fn check_configs(
    db: &TuningDb,
    problems: &mut Vec<String>,
    notes: &mut Vec<String>,
) -> Result<(u64, u64), DbError> {
    let here = HardwareFingerprint::current().arch_key();
    let fps: HashMap<String, HardwareFingerprint> = db
        .fingerprints()?
        .into_iter()
        .map(|f| (f.id.clone(), f))
        .collect();
    let mut spaces: HashMap<(String, &'static str, Workload), Space> = HashMap::new();
    let (mut checked, mut stale, mut unchecked) = (0u64, 0u64, 0u64);
    for r in db.all_ok_records()? {
        let Ok(family) = kernels::kernel(&r.kernel) else {
            stale += 1;
            continue;
        };
        if family.version() != r.kernel_version {
            stale += 1;
            continue;
        }
        let what = format!(
            "trial {} ({} {} on {})",
            r.id.unwrap_or(-1),
            r.kernel,
            r.workload,
            r.fingerprint_id
        );
        if !family.supports(&r.workload) {
            problems.push(format!(
                "{what}: kernel {} does not support this workload",
                r.kernel
            ));
            continue;
        }
        let Some(fp) = fps.get(&r.fingerprint_id) else {
            continue; // verify() reports the broken reference
        };
        checked += 1;
        if family.device() != fp.device_kind() {
            problems.push(format!(
                "{what}: kernel {} runs on {}, the fingerprint is a {}",
                r.kernel,
                family.device(),
                fp.device_kind()
            ));
            continue;
        }
        let space = spaces
            .entry((fp.id.clone(), family.name(), r.workload))
            .or_insert_with(|| family.space(&r.workload, fp));
        match space.check(&r.config) {
            Ok(()) => {}
            Err(SpaceError::ValueNotListed { knob, .. })
                if fp.arch_key() != here && is_name_knob(space, &knob) =>
            {
                unchecked += 1;
            }
            Err(e) => problems.push(format!(
                "{what}: config {} no longer fits {} v{}: {e}",
                r.config,
                family.name(),
                family.version()
            )),
        }
    }
    if stale > 0 {
        notes.push(format!(
            "{stale} ok record(s) of kernel versions this build does not have: kept as history, never served"
        ));
    }
    if unchecked > 0 {
        notes.push(format!(
            "{unchecked} config(s) of another micro-architecture name variants this CPU lacks; not checked here"
        ));
    }
    Ok((checked, stale))
}

fn is_name_knob(space: &Space, knob: &str) -> bool {
    space
        .knobs()
        .iter()
        .find(|k| k.name == knob)
        .is_some_and(|k| k.values.iter().all(|v| matches!(v, kernels::Value::Str(_))))
}

impl TuningDb {
    /// Every `ok` record that reads back, any fingerprint, in id order.
    pub(crate) fn all_ok_records(&self) -> Result<Vec<Record>, DbError> {
        let sql = format!(
            "SELECT {} FROM trials WHERE status = 'ok' ORDER BY id",
            self.record_columns()
        );
        let p = &self.path;
        let mut stmt = self.conn.prepare(&sql).ctx(p, "reading trials")?;
        let rows = stmt
            .query_map([], |r| Ok(crate::db::record_from_row(r)))
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .ctx(p, "reading trials")?;
        Ok(rows.into_iter().flatten().collect())
    }
}

/// Every row of `table` matching `filter` (SQL after WHERE), as column → value, by id.
pub(crate) fn raw_rows<P: rusqlite::Params>(
    conn: &Connection,
    path: &Path,
    table: &str,
    filter: &str,
    params: P,
) -> Result<Vec<RawRow>, DbError> {
    let ctx = format!("reading {table}");
    let mut stmt = conn
        .prepare(&format!("SELECT * FROM {table} WHERE {filter} ORDER BY id"))
        .ctx(path, &ctx)?;
    let names: Vec<String> = stmt.column_names().map(|s| s.to_string()).collect();
    let rows = stmt
        .query_map(params, |r| {
            let mut row = RawRow::new();
            for (i, n) in names.iter().enumerate() {
                row.insert(n.clone(), r.get::<_, Value>(i)?);
            }
            Ok(row)
        })
        .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
        .ctx(path, &ctx)?;
    Ok(rows)
}

/// Inserts raw rows into `table` (with their ids when `keep_ids`); returns the new row ids.
pub(crate) fn insert_raw(
    conn: &Connection,
    path: &Path,
    table: &str,
    rows: &[RawRow],
    keep_ids: bool,
) -> Result<Vec<i64>, DbError> {
    let ctx = format!("writing {table}");
    let mut ids = Vec::with_capacity(rows.len());
    let Some(first) = rows.first() else {
        return Ok(ids);
    };
    // Rows of one table share their columns: one statement for all.
    let cols: Vec<&String> = first.keys().filter(|k| keep_ids || *k != "id").collect();
    let sql = format!(
        "INSERT INTO {table} ({}) VALUES ({})",
        cols.iter()
            .map(|c| c.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        (1..=cols.len())
            .map(|i| format!("?{i}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut stmt = conn.prepare(&sql).ctx(path, &ctx)?;
    for row in rows {
        let values: Vec<&Value> = cols
            .iter()
            .map(|c| row.get(*c).unwrap_or(&Value::Null))
            .collect();
        stmt.execute(rusqlite::params_from_iter(values))
            .ctx(path, &ctx)?;
        ids.push(conn.last_insert_rowid());
    }
    Ok(ids)
}

/// The `id` column of a raw row (-1 if absent).
pub(crate) fn row_id(row: &RawRow) -> i64 {
    match row.get("id") {
        Some(Value::Integer(i)) => *i,
        _ => -1,
    }
}

/// The canonical `T` line of a trial row: every column but `id`, in name order; an optional
/// column (schema v4's accuracy) only when it holds a value, so a trial without one has the
/// line (and a file the checksum) it had before v4.
pub(crate) fn trial_line(row: &RawRow) -> String {
    let cells: Vec<serde_json::Value> = row
        .iter()
        .filter(|(k, _)| *k != "id")
        .filter(|(k, v)| !(OPTIONAL_TRIAL_COLUMNS.contains(&k.as_str()) && **v == Value::Null))
        .map(|(_, v)| canonical_value(v))
        .collect();
    format!("T {}", serde_json::Value::Array(cells))
}

fn canonical_value(v: &Value) -> serde_json::Value {
    match v {
        Value::Null => serde_json::Value::Null,
        Value::Integer(i) => (*i).into(),
        Value::Real(f) => format!("r:{:016x}", f.to_bits()).into(),
        Value::Text(s) => s.clone().into(),
        Value::Blob(b) => format!("b:{}", hex(b)).into(),
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Fails unless the directory `out` is to be written in exists and takes new files (a probe
/// file is made there and removed).
pub(crate) fn require_parent(out: &Path) -> Result<(), DbError> {
    let dir = crate::db::existing_dir_of(out)?;
    crate::temp::probe(out).map_err(|e| DbError::DirNotWritable {
        path: out.to_path_buf(),
        dir: dir.to_path_buf(),
        why: e.to_string(),
    })
}

/// A private name for `out` being written, in the same directory (so the final rename is
/// atomic); what killed writers of `out` on this host left there is removed first.
pub(crate) fn temp_beside(out: &Path) -> PathBuf {
    crate::temp::sweep(out, "tmp");
    crate::temp::beside(out, "tmp")
}

/// Removes a database file and its WAL companions, ignoring errors.
pub(crate) fn remove_db_files(path: &Path) {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut p = path.as_os_str().to_os_string();
        p.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(p));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reals_are_canonical_by_their_bits() {
        assert_eq!(
            canonical_value(&Value::Real(1e-3)),
            serde_json::json!(format!("r:{:016x}", 1e-3f64.to_bits()))
        );
        assert_eq!(canonical_value(&Value::Integer(3)), serde_json::json!(3));
        assert_eq!(canonical_value(&Value::Null), serde_json::Value::Null);
    }

    #[test]
    fn temp_names_sit_beside_the_output() {
        let t = temp_beside(Path::new("/x/y/out.db"));
        assert_eq!(t.parent(), Some(Path::new("/x/y")));
        assert!(t
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("out.db.tmp-"));
        // A long valid name leaves room for the tag and SQLite's suffixes.
        let long = format!("/x/{}.db", "é".repeat(120));
        let t = temp_beside(Path::new(&long));
        assert!(
            t.file_name().unwrap().len() + "-journal".len() < 255,
            "{t:?}"
        );
    }
}
