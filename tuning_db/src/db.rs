//! [`TuningDb`]: opening (identification, migrations), writing and querying.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kernels::{Accuracy, Config, HardwareFingerprint, Measurement, Status, Workload};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, Row, Transaction};
use rusqlite::{ErrorCode, TransactionBehavior};

use crate::error::{Ctx, DbError, Result};
use crate::record::{now_rfc3339, Record, Stats};
use crate::schema::{tables_of, APPLICATION_ID, MIGRATIONS, OLDEST_READ_ONLY, SCHEMA_VERSION};

/// How long a writer waits for another writer's transaction before giving up.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// What [`TuningDb`] writes into `meta.created_by`.
const CREATED_BY: &str = concat!("autokernel tuning_db ", env!("CARGO_PKG_VERSION"));

/// Columns of `trials` in the order [`record_from_row`] reads them.
const RECORD_COLUMNS: &str = "id, fingerprint_id, workload, kernel, kernel_version, config, \
     status, message, median_s, spread, samples, gflops, created_at, tool_version, \
     max_rel_err, fro_rel_err";

/// [`RECORD_COLUMNS`] in a file older than schema v4 (opened read-only): no accuracy.
const RECORD_COLUMNS_V3: &str = "id, fingerprint_id, workload, kernel, kernel_version, config, \
     status, message, median_s, spread, samples, gflops, created_at, tool_version, \
     NULL, NULL";

const FINGERPRINT_COLUMNS: &str =
    "id, arch, vendor, family, model, stepping, brand, isa, cores, l1d_bytes, l2_bytes, l3_bytes";

/// A tuning database: one SQLite file (WAL mode) holding hardware fingerprints and every
/// trial ever made on them. See the crate documentation for the schema.
///
/// Writers ([`open`](Self::open)) may run in several processes at once; readers
/// ([`open_read_only`](Self::open_read_only)) never write and never wait for writers.
/// Methods take `&self`; a `TuningDb` is `Send` but not `Sync` (one per thread).
#[derive(Debug)]
pub struct TuningDb {
    pub(crate) conn: Connection,
    pub(crate) path: PathBuf,
    read_only: bool,
    /// The schema version of the file: [`SCHEMA_VERSION`] once opened for writing; a
    /// read-only open may serve an older one ([`OLDEST_READ_ONLY`]).
    pub(crate) version: i64,
}

/// What [`identify`] found in a file.
enum Identity {
    /// No tables, no ids: a new or empty file we may initialise.
    Blank,
    /// One of ours at this schema version (`1..=SCHEMA_VERSION`).
    Ours(i64),
}

impl TuningDb {
    /// Opens (creating if missing) the database at `path` for reading and writing, migrating
    /// it to [`SCHEMA_VERSION`].
    ///
    /// The parent directory must exist. A 0-byte file is initialised. Files of other
    /// applications, damaged files and files of a newer schema are refused, and a refused file
    /// is never modified: every check is a read made before the first write.
    pub fn open(path: impl AsRef<Path>) -> Result<TuningDb> {
        let path = path.as_ref().to_path_buf();
        precheck_writer(&path)?;
        // Left by creators killed before they linked their file into place (another process
        // may have made the database meanwhile, so this is not only for a missing file).
        crate::temp::sweep(&path, "init");
        if !path.exists() {
            create_complete(&path)?;
        }
        let conn = Connection::open_with_flags(
            plain_path(&path),
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .ctx(&path, "opening the database")?;
        let db = TuningDb {
            conn,
            path,
            read_only: false,
            version: SCHEMA_VERSION,
        };
        db.configure()?;
        let version = match db.identify()? {
            Identity::Blank => 0,
            Identity::Ours(v) => v,
        };
        if version >= 3 && db.is_bundle()? {
            return Err(DbError::Bundle { path: db.path });
        }
        db.check_pages()?;
        // Everything below writes; the file is known to be ours or blank, and whole.
        db.ensure_wal()?;
        db.migrate(version)?;
        Ok(db)
    }

    /// What [`TuningDb::open`] would refuse at `path`, checked without changing it (for dry
    /// runs; a probe file is made and removed beside it): a missing directory, a file that is
    /// not a database of ours, of a schema this build reads, or is a bundle, a file or
    /// directory this process cannot write.
    pub fn check_writer(path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        precheck_writer(path)?;
        if !path.exists() {
            return Ok(());
        }
        match TuningDb::open_read_only(path) {
            Ok(db) if db.version >= 3 && db.is_bundle()? => Err(DbError::Bundle { path: db.path }),
            Ok(db) => db.check_pages(),
            // Older files are migrated by the writer.
            Err(DbError::OlderSchemaReadOnly { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Opens an existing database for reading only: no migrations, no writes, and (WAL)
    /// no waiting for writers. For the inference runtime and for inspection tools.
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<TuningDb> {
        let path = path.as_ref().to_path_buf();
        match std::fs::metadata(&path) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(DbError::NotFound { path })
            }
            Err(e) => {
                return Err(DbError::Io {
                    path,
                    context: "reading file metadata".into(),
                    cause: e,
                })
            }
        }
        precheck_file(&path)?;
        // A WAL database is read through its -wal and -shm files, which SQLite creates when
        // they are missing and leaves behind: impossible in a directory this process cannot
        // write (a read-only deployment), litter anywhere else. Without a -wal file no
        // connection has the database open and every change is in the main file, so it is
        // read `immutable` (no locks, no side files; a writer that starts meanwhile would not
        // be seen, as with any snapshot). A -wal file means a writer is at work, or crashed
        // before its checkpoint: read through it.
        let through_wal = sidecar(&path, "-wal").exists();
        let (mode, context) = if through_wal {
            (
                "mode=ro",
                "reading through its -wal file (a writer has it open or did not finish; \
                 where this process cannot write its directory, let a writer finish there \
                 or deploy a bundle made by `autokernel db export`)",
            )
        } else {
            ("immutable=1", "opening the database read-only")
        };
        let conn = Connection::open_with_flags(
            sqlite_uri(&path, mode),
            OpenFlags::SQLITE_OPEN_READ_ONLY
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_URI,
        )
        .ctx(&path, context)?;
        let db = TuningDb {
            conn,
            path,
            read_only: true,
            version: SCHEMA_VERSION,
        };
        db.configure().map_err(|e| match e {
            DbError::Sqlite { path, cause, .. } if through_wal => DbError::Sqlite {
                path,
                context: context.into(),
                cause,
            },
            e => e,
        })?;
        let found = match db.identify()? {
            Identity::Blank => 0,
            Identity::Ours(v) => v,
        };
        if found < OLDEST_READ_ONLY {
            return Err(DbError::OlderSchemaReadOnly {
                path: db.path,
                found,
                supported: OLDEST_READ_ONLY,
            });
        }
        Ok(TuningDb {
            version: found,
            ..db
        })
    }

    /// A private database in memory, at the current schema (for tests and dry runs).
    pub fn in_memory() -> Result<TuningDb> {
        let path = PathBuf::from(":memory:");
        let conn = Connection::open_in_memory().ctx(&path, "opening an in-memory database")?;
        let db = TuningDb {
            conn,
            path,
            read_only: false,
            version: SCHEMA_VERSION,
        };
        db.configure()?;
        db.migrate(0)?;
        Ok(db)
    }

    /// The file this database lives in (`:memory:` for [`in_memory`](Self::in_memory)).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this handle came from [`open_read_only`](Self::open_read_only).
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// The columns [`record_from_row`] reads, for this file's schema version.
    pub(crate) fn record_columns(&self) -> &'static str {
        if self.version >= 4 {
            RECORD_COLUMNS
        } else {
            RECORD_COLUMNS_V3
        }
    }

    /// The schema version stored in the file (`PRAGMA user_version`).
    pub fn schema_version(&self) -> Result<i64> {
        self.conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .ctx(&self.path, "reading the schema version")
    }

    /// A value of the `meta` table (`created_by`, `created_at`).
    pub fn meta(&self, key: &str) -> Result<Option<String>> {
        self.conn
            .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .optional()
            .ctx(&self.path, "reading meta")
    }

    /// Whether this file is a bundle: any `bundle.*` row in `meta` (see
    /// [`TuningDb::manifest`]).
    pub fn is_bundle(&self) -> Result<bool> {
        self.conn
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM meta WHERE key LIKE 'bundle.%')",
                [],
                |r| r.get(0),
            )
            .ctx(&self.path, "reading meta")
    }

    // ---- opening ------------------------------------------------------------------------

    /// Connection-level settings; none of them writes to the file.
    fn configure(&self) -> Result<()> {
        let p = &self.path;
        self.conn
            .busy_timeout(BUSY_TIMEOUT)
            .ctx(p, "setting the busy timeout")?;
        self.conn
            // A page cache of up to 32 MiB (SQLite's default is 2 MiB): an import or merge
            // looks every incoming trial up among the target's, which in a database of tens of
            // thousands of trials re-read the same pages from the OS for each one.
            .execute_batch(
                "PRAGMA foreign_keys = ON; PRAGMA synchronous = NORMAL; PRAGMA cache_size = -32768;",
            )
            .ctx(p, "configuring the connection")?;
        if self.read_only {
            self.conn
                .execute_batch("PRAGMA query_only = ON;")
                .ctx(p, "configuring the connection")?;
        }
        Ok(())
    }

    /// Decides, by reading only, whether the file is blank, ours (and which version), or to
    /// be refused. The reads share one read transaction, so a concurrent initialisation is
    /// seen either entirely or not at all.
    /// SQLite's `quick_check` of every page (a writer checks before it writes: a damaged
    /// file gets an error saying so, untouched, not trials added to it).
    pub(crate) fn check_pages(&self) -> Result<()> {
        let first: String = self
            .conn
            .query_row("PRAGMA quick_check(1)", [], |r| r.get(0))
            .ctx(&self.path, "checking the database's pages")?;
        match first.as_str() {
            "ok" => Ok(()),
            _ => Err(DbError::NotSqlite {
                path: self.path.clone(),
                detail: format!("SQLite's quick_check: {}", first.replace('\n', " ")),
            }),
        }
    }

    fn identify(&self) -> Result<Identity> {
        let tx = Transaction::new_unchecked(&self.conn, TransactionBehavior::Deferred)
            .ctx(&self.path, "starting a read transaction")?;
        let identity = self.identify_in_snapshot();
        drop(tx); // rolls back: nothing was written
        identity
    }

    fn identify_in_snapshot(&self) -> Result<Identity> {
        let p = &self.path;
        let app_id: i32 = self
            .conn
            .query_row("PRAGMA application_id", [], |r| r.get(0))
            .ctx(p, "reading the application id")?;
        let version: i64 = self
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .ctx(p, "reading the schema version")?;
        let mut stmt = self
            .conn
            .prepare("SELECT name FROM sqlite_master WHERE type IN ('table', 'view') ORDER BY name")
            .ctx(p, "reading the schema")?;
        let tables = stmt
            .query_map([], |r| r.get::<_, String>(0))
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<String>>>())
            .ctx(p, "reading the schema")?;
        drop(stmt);
        let foreign = |detail: String| DbError::ForeignApplication {
            path: p.clone(),
            detail,
        };
        if app_id != APPLICATION_ID {
            if app_id != 0 {
                return Err(foreign(format!(
                    "application_id is {app_id:#010x}, autokernel's is {APPLICATION_ID:#010x}"
                )));
            }
            if !tables.is_empty() {
                return Err(foreign(format!(
                    "it holds tables {} and no autokernel application_id",
                    list(&tables)
                )));
            }
            if version != 0 {
                return Err(foreign(format!(
                    "it is empty but its user_version is {version}"
                )));
            }
            return Ok(Identity::Blank);
        }
        if version > SCHEMA_VERSION {
            return Err(DbError::NewerSchema {
                path: p.clone(),
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        if version <= 0 {
            if tables.is_empty() && version == 0 {
                return Ok(Identity::Blank);
            }
            return Err(DbError::NotSqlite {
                path: p.clone(),
                detail: format!(
                    "it has autokernel's application_id but schema version {version} and tables {}",
                    list(&tables)
                ),
            });
        }
        if let Some(missing) = tables_of(version).find(|t| !tables.iter().any(|x| x == t)) {
            return Err(DbError::NotSqlite {
                path: p.clone(),
                detail: format!("autokernel table '{missing}' of schema v{version} is missing"),
            });
        }
        // Touch the root page of each table: cheap, and catches files cut short.
        for t in tables_of(version) {
            self.conn
                .query_row(
                    &format!("SELECT count(*) FROM (SELECT 1 FROM {t} LIMIT 1)"),
                    [],
                    |r| r.get::<_, i64>(0),
                )
                .ctx(p, &format!("reading table {t}"))?;
        }
        Ok(Identity::Ours(version))
    }

    /// Switches a new file to WAL. Changing the journal mode does not go through SQLite's busy
    /// handler, so when two processes initialise one file at once the loser retries here.
    fn ensure_wal(&self) -> Result<()> {
        let p = &self.path;
        let start = std::time::Instant::now();
        let mode = loop {
            let attempt = self
                .conn
                .query_row("PRAGMA journal_mode", [], |r| r.get::<_, String>(0))
                .and_then(|mode| {
                    if mode.eq_ignore_ascii_case("wal") {
                        Ok(mode)
                    } else {
                        self.conn
                            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
                    }
                })
                .ctx(p, "switching to WAL mode");
            match attempt {
                Err(e) if is_busy(&e) && start.elapsed() < BUSY_TIMEOUT => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                other => break other?,
            }
        };
        if !mode.eq_ignore_ascii_case("wal") && p.as_os_str() != ":memory:" {
            return Err(DbError::Sqlite {
                path: p.clone(),
                context: format!("switching to WAL mode (the file system gave '{mode}')"),
                cause: rusqlite::Error::InvalidQuery,
            });
        }
        Ok(())
    }

    /// Applies the migration steps after `from`, each in its own immediate transaction that
    /// re-reads the version first (another process may have migrated meanwhile).
    fn migrate(&self, from: i64) -> Result<()> {
        let p = &self.path;
        for (i, step) in MIGRATIONS.iter().enumerate() {
            let target = i as i64 + 1;
            if target <= from {
                continue;
            }
            let tx = self.begin_write("migrating the schema")?;
            let current: i64 = tx
                .query_row("PRAGMA user_version", [], |r| r.get(0))
                .ctx(p, "reading the schema version")?;
            if current >= target {
                continue; // dropping tx rolls back the empty transaction
            }
            let ctx = format!("migrating the schema to version {target}");
            tx.execute_batch(step).ctx(p, &ctx)?;
            tx.execute_batch(&format!(
                "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {target};"
            ))
            .ctx(p, &ctx)?;
            if current == 0 {
                let mut ins = tx
                    .prepare("INSERT OR IGNORE INTO meta (key, value) VALUES (?1, ?2)")
                    .ctx(p, &ctx)?;
                ins.execute(["created_by", CREATED_BY]).ctx(p, &ctx)?;
                ins.execute(["created_at", &now_rfc3339()]).ctx(p, &ctx)?;
            }
            tx.commit().ctx(p, &ctx)?;
        }
        Ok(())
    }

    pub(crate) fn begin_write(&self, action: &str) -> Result<Transaction<'_>> {
        if self.read_only {
            return Err(DbError::ReadOnly {
                path: self.path.clone(),
                action: action.to_string(),
            });
        }
        Transaction::new_unchecked(&self.conn, TransactionBehavior::Immediate).ctx(
            &self.path,
            &format!("{action}: starting a write transaction"),
        )
    }

    // ---- fingerprints -------------------------------------------------------------------

    /// Stores `fp` (or refreshes its fields; `first_seen` is kept).
    pub fn upsert_fingerprint(&self, fp: &HardwareFingerprint) -> Result<()> {
        let tx = self.begin_write("store a fingerprint")?;
        upsert_fingerprint_in(&tx, &self.path, fp)?;
        tx.commit().ctx(&self.path, "storing a fingerprint")
    }

    /// The stored fingerprint `id`, if any (a row whose numbers do not fit reads as `None`).
    pub fn fingerprint(&self, id: &str) -> Result<Option<HardwareFingerprint>> {
        let sql = format!("SELECT {FINGERPRINT_COLUMNS} FROM fingerprints WHERE id = ?1");
        let row = self
            .conn
            .query_row(&sql, [id], fingerprint_from_row)
            .optional()
            .ctx(&self.path, "reading a fingerprint")?;
        Ok(row.flatten())
    }

    /// Every stored fingerprint, by id.
    pub fn fingerprints(&self) -> Result<Vec<HardwareFingerprint>> {
        let sql = format!("SELECT {FINGERPRINT_COLUMNS} FROM fingerprints ORDER BY id");
        let p = &self.path;
        let mut stmt = self.conn.prepare(&sql).ctx(p, "reading fingerprints")?;
        let rows = stmt
            .query_map([], fingerprint_from_row)
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .ctx(p, "reading fingerprints")?;
        Ok(rows.into_iter().flatten().collect())
    }

    // ---- writing records ----------------------------------------------------------------

    /// Stores one record and returns its id. Its fingerprint must have been stored with
    /// [`upsert_fingerprint`](Self::upsert_fingerprint).
    pub fn insert(&self, record: &Record) -> Result<i64> {
        Ok(self.insert_many(std::slice::from_ref(record))?[0])
    }

    /// Stores records in one transaction (all or none) and returns their ids, in order.
    pub fn insert_many(&self, records: &[Record]) -> Result<Vec<i64>> {
        for r in records {
            self.validate(r)?;
        }
        let p = &self.path;
        let tx = self.begin_write("insert records")?;
        let mut known: HashSet<&str> = HashSet::new();
        let mut ids = Vec::with_capacity(records.len());
        {
            let mut exists = tx
                .prepare("SELECT 1 FROM fingerprints WHERE id = ?1")
                .ctx(p, "inserting records")?;
            let mut ins = tx
                .prepare(
                    "INSERT INTO trials (fingerprint_id, workload, op, kernel, kernel_version, \
                     config, status, message, median_s, spread, samples, gflops, created_at, \
                     tool_version, max_rel_err, fro_rel_err) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, \
                     ?15, ?16)",
                )
                .ctx(p, "inserting records")?;
            for r in records {
                let fp = r.fingerprint_id.as_str();
                if !known.contains(fp) {
                    if !exists.exists([fp]).ctx(p, "inserting records")? {
                        return Err(DbError::UnknownFingerprint {
                            path: p.clone(),
                            id: fp.to_string(),
                        });
                    }
                    known.insert(fp);
                }
                let m = r.measurement.as_ref();
                let samples =
                    m.map(|m| serde_json::to_string(&m.samples).expect("finite floats serialise"));
                let created = if r.created_at.is_empty() {
                    now_rfc3339()
                } else {
                    r.created_at.clone()
                };
                ins.execute(params![
                    fp,
                    r.workload.key(),
                    r.workload.op().name(),
                    r.kernel,
                    r.kernel_version,
                    r.config.to_json(),
                    r.status.as_str(),
                    r.message,
                    m.map(|m| m.median_s),
                    m.map(|m| m.spread),
                    samples,
                    r.gflops.filter(|g| g.is_finite()),
                    created,
                    r.tool_version,
                    r.accuracy.map(|a| a.max_rel_err),
                    r.accuracy.map(|a| a.fro_rel_err),
                ])
                .ctx(p, "inserting a record")?;
                ids.push(tx.last_insert_rowid());
            }
        }
        tx.commit().ctx(p, "committing records")?;
        Ok(ids)
    }

    fn validate(&self, r: &Record) -> Result<()> {
        let bad = |reason: String| {
            Err(DbError::InvalidRecord {
                path: self.path.clone(),
                reason,
            })
        };
        let what = format!("{} {} on {}", r.kernel, r.config, r.workload);
        if r.fingerprint_id.is_empty() || r.kernel.is_empty() {
            return bad(format!(
                "{what}: fingerprint id and kernel name must be set"
            ));
        }
        if let Some(a) = r.accuracy {
            let fine = |x: f64| x.is_finite() && x >= 0.0;
            if !(fine(a.max_rel_err) && fine(a.fro_rel_err)) {
                return bad(format!(
                    "{what}: accuracy {} / {} is not a finite error ≥ 0",
                    a.max_rel_err, a.fro_rel_err
                ));
            }
        }
        match (&r.status, &r.measurement) {
            (Status::Ok, None) => bad(format!("{what}: status ok needs a measurement")),
            (Status::Ok, Some(m)) => match timing_problem(m) {
                Some(why) => bad(format!("{what}: {why}")),
                None => Ok(()),
            },
            (s, Some(_)) => bad(format!(
                "{what}: a {s} record cannot carry a measurement (only ok records are timed)"
            )),
            (_, None) => Ok(()),
        }
    }

    // ---- queries ------------------------------------------------------------------------

    /// The fastest usable `ok` record for `workload` on fingerprint `fingerprint_id`.
    ///
    /// Usable means what [`kernels::registry::check_record`] says: its (kernel, version) is a
    /// registered family of the fingerprint's kind of device that supports the workload
    /// (records of other versions are stale and ignored), and its config still fits that
    /// family's space for the stored fingerprint. Rows that fail any of this are skipped,
    /// never an error.
    pub fn best(&self, fingerprint_id: &str, workload: &Workload) -> Result<Option<Record>> {
        let sql = format!(
            "SELECT {} FROM trials \
             WHERE fingerprint_id = ?1 AND workload = ?2 AND status = 'ok' \
             ORDER BY median_s ASC, id ASC",
            self.record_columns()
        );
        let p = &self.path;
        let mut filter = Usable::new(self.fingerprint(fingerprint_id)?);
        // A winner decided by a tuning job (schema v2, see winners.rs) comes first.
        if let Some(winner) = self.winner_trial(fingerprint_id, workload)? {
            if filter.accepts(&winner) {
                return Ok(Some(winner));
            }
        }
        let mut stmt = self.conn.prepare(&sql).ctx(p, "querying best")?;
        let mut rows = stmt
            .query(params![fingerprint_id, workload.key()])
            .ctx(p, "querying best")?;
        while let Some(row) = rows.next().ctx(p, "querying best")? {
            if let Some(r) = record_from_row(row) {
                if filter.accepts(&r) {
                    return Ok(Some(r));
                }
            }
        }
        Ok(None)
    }

    /// [`best`](Self::best) for every workload tuned on `fingerprint_id`, sorted by workload
    /// key: one query, for the runtime's in-memory index.
    pub fn best_all(&self, fingerprint_id: &str) -> Result<Vec<Record>> {
        Ok(self.best_all_reporting(fingerprint_id)?.0)
    }

    /// [`best_all`](Self::best_all), and the `ok` rows faster than what it picked (of a
    /// workload that reads) that do not read back — a config or status damaged in the file:
    /// what a runtime serves in their place should not pass silently.
    pub fn best_all_reporting(
        &self,
        fingerprint_id: &str,
    ) -> Result<(Vec<Record>, Vec<Unreadable>)> {
        let sql = format!(
            "SELECT {} FROM trials \
             WHERE fingerprint_id = ?1 AND status = 'ok' \
             ORDER BY workload ASC, median_s ASC, id ASC",
            self.record_columns()
        );
        let p = &self.path;
        let mut filter = Usable::new(self.fingerprint(fingerprint_id)?);
        let mut winners: HashMap<String, Record> = HashMap::new();
        for w in self.winner_trials(fingerprint_id)? {
            if filter.accepts(&w) {
                winners.insert(w.workload.key(), w);
            }
        }
        let mut stmt = self.conn.prepare(&sql).ctx(p, "querying best_all")?;
        let mut rows = stmt.query([fingerprint_id]).ctx(p, "querying best_all")?;
        let mut out: Vec<Record> = Vec::new();
        let mut unreadable = Vec::new();
        let mut last_done: Option<String> = None;
        while let Some(row) = rows.next().ctx(p, "querying best_all")? {
            let key: String = row.get(2).ctx(p, "querying best_all")?;
            if last_done.as_deref() == Some(key.as_str()) {
                continue;
            }
            match check_row(row) {
                Ok(r) if filter.accepts(&r) => {
                    out.push(winners.remove(&key).unwrap_or(r));
                    last_done = Some(key);
                }
                Ok(_) => {}
                Err(reason) => unreadable.push(Unreadable {
                    id: row.get(0).ctx(p, "querying best_all")?,
                    workload: key,
                    reason,
                }),
            }
        }
        Ok((out, unreadable))
    }

    /// The fastest `ok` median of each workload tuned on `fingerprint_id`, over all of its
    /// records: stale versions and configs that no longer fit included (what a usable
    /// record is measured against before it is served in their place).
    pub fn fastest_medians(&self, fingerprint_id: &str) -> Result<HashMap<Workload, f64>> {
        let p = &self.path;
        let mut stmt = self
            .conn
            .prepare(
                "SELECT workload, min(median_s) FROM trials \
                 WHERE fingerprint_id = ?1 AND status = 'ok' GROUP BY workload",
            )
            .ctx(p, "querying fastest medians")?;
        let rows = stmt
            .query_map([fingerprint_id], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, Option<f64>>(1)?))
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .ctx(p, "querying fastest medians")?;
        Ok(rows
            .into_iter()
            .filter_map(|(w, m)| Some((w.parse().ok()?, m?)))
            .collect())
    }

    /// Every trial for `workload` on `fingerprint_id`, all statuses, in insertion order.
    /// Rows that no longer parse (config, workload) are skipped; [`verify`](Self::verify)
    /// reports them.
    pub fn trials(&self, fingerprint_id: &str, workload: &Workload) -> Result<Vec<Record>> {
        let sql = format!(
            "SELECT {} FROM trials \
             WHERE fingerprint_id = ?1 AND workload = ?2 ORDER BY id ASC",
            self.record_columns()
        );
        let p = &self.path;
        let mut stmt = self.conn.prepare(&sql).ctx(p, "querying trials")?;
        let mut rows = stmt
            .query(params![fingerprint_id, workload.key()])
            .ctx(p, "querying trials")?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().ctx(p, "querying trials")? {
            out.extend(record_from_row(row));
        }
        Ok(out)
    }

    /// Counts over the whole database.
    pub fn stats(&self) -> Result<Stats> {
        let (records, ok, fingerprints, workloads): (i64, i64, i64, i64) = self
            .conn
            .query_row(
                "SELECT count(*), coalesce(sum(status = 'ok'), 0), \
                 (SELECT count(*) FROM fingerprints), count(DISTINCT workload) FROM trials",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .ctx(&self.path, "computing stats")?;
        let u = |v: i64| v.max(0) as u64;
        Ok(Stats {
            records: u(records),
            ok: u(ok),
            failures: u(records - ok),
            fingerprints: u(fingerprints),
            workloads: u(workloads),
        })
    }

    /// Full check: SQLite's `integrity_check` and `foreign_key_check`, then every row: its
    /// workload, config JSON, status and timing must read back. O(size of the file).
    pub fn verify(&self) -> Result<()> {
        let p = &self.path;
        let mut problems = Vec::new();
        {
            let mut stmt = self
                .conn
                .prepare("PRAGMA integrity_check")
                .ctx(p, "running integrity_check")?;
            let rows = stmt
                .query_map([], |r| r.get::<_, String>(0))
                .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
                .ctx(p, "running integrity_check")?;
            problems.extend(rows.into_iter().filter(|r| r != "ok"));
        }
        {
            let mut stmt = self
                .conn
                .prepare("PRAGMA foreign_key_check")
                .ctx(p, "running foreign_key_check")?;
            let rows = stmt
                .query_map([], |r| {
                    Ok(format!(
                        "row {} of {} refers to a missing {}",
                        r.get::<_, Option<i64>>(1)?.unwrap_or(-1),
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(2)?
                    ))
                })
                .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
                .ctx(p, "running foreign_key_check")?;
            problems.extend(rows);
        }
        {
            let sql = format!("SELECT {} FROM trials ORDER BY id", self.record_columns());
            let mut stmt = self.conn.prepare(&sql).ctx(p, "reading trials")?;
            let mut rows = stmt.query([]).ctx(p, "reading trials")?;
            while let Some(row) = rows.next().ctx(p, "reading trials")? {
                if let Err(e) = check_row(row) {
                    let id: i64 = row.get(0).unwrap_or(-1);
                    problems.push(format!("trial {id}: {e}"));
                }
            }
        }
        problems.extend(self.fingerprint_problems()?);
        problems.extend(self.op_problems()?);
        problems.extend(self.winner_problems()?);
        problems.extend(self.side_by_side_problems()?);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(DbError::Verify {
                path: p.clone(),
                problems,
            })
        }
    }
}

impl TuningDb {
    /// [`TuningDb::verify`]'s check of the fingerprint rows: every field in range, and the
    /// columns the runtime reads agreeing with the `canonical` form the content checksum
    /// covers — and, for a CPU, with the id (the hash of that form).
    fn fingerprint_problems(&self) -> Result<Vec<String>> {
        let p = &self.path;
        let sql = format!("SELECT {FINGERPRINT_COLUMNS}, canonical FROM fingerprints ORDER BY id");
        let mut stmt = self.conn.prepare(&sql).ctx(p, "reading fingerprints")?;
        let mut rows = stmt.query([]).ctx(p, "reading fingerprints")?;
        let mut problems = Vec::new();
        while let Some(row) = rows.next().ctx(p, "reading fingerprints")? {
            let id: String = row.get(0).unwrap_or_default();
            let canonical: String = row.get(12).unwrap_or_default();
            let Some(fp) = fingerprint_from_row(row).ok().flatten() else {
                problems.push(format!("fingerprint {id}: a field is out of range"));
                continue;
            };
            if fp.canonical() != canonical {
                problems.push(format!(
                    "fingerprint {id}: its columns do not match its canonical form (modified?)"
                ));
            } else if fp.device_kind() == kernels::DeviceKind::Cpu && fp.compute_id() != id {
                problems.push(format!(
                    "fingerprint {id}: its fields hash to {}, not to its id (modified?)",
                    fp.compute_id()
                ));
            }
        }
        Ok(problems)
    }

    /// [`TuningDb::verify`]'s check of the `op` column against each trial's workload.
    fn op_problems(&self) -> Result<Vec<String>> {
        let p = &self.path;
        let mut stmt = self
            .conn
            .prepare("SELECT id, workload, op FROM trials ORDER BY id")
            .ctx(p, "reading trials")?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                ))
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .ctx(p, "reading trials")?;
        Ok(rows
            .into_iter()
            .filter_map(|(id, w, op)| {
                let want = w.parse::<Workload>().ok()?.op().name();
                (op != want).then(|| format!("trial {id}: op '{op}' but workload {w} is a {want}"))
            })
            .collect())
    }

    /// [`TuningDb::verify`]'s check of the winner decisions: each names an `ok` trial of its
    /// own fingerprint and workload (a missing one is the foreign-key check's).
    fn winner_problems(&self) -> Result<Vec<String>> {
        let p = &self.path;
        let mut stmt = self
            .conn
            .prepare(
                "SELECT w.id, w.fingerprint_id, w.workload, t.id, t.fingerprint_id, t.workload, \
                 t.status FROM winners w JOIN trials t ON t.id = w.trial_id ORDER BY w.id",
            )
            .ctx(p, "reading winners")?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    (r.get::<_, String>(1)?, r.get::<_, String>(2)?),
                    r.get::<_, i64>(3)?,
                    (r.get::<_, String>(4)?, r.get::<_, String>(5)?),
                    r.get::<_, String>(6)?,
                ))
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .ctx(p, "reading winners")?;
        let mut problems = Vec::new();
        for (id, (fp, w), trial, (trial_fp, trial_w), status) in rows {
            if (&fp, &w) != (&trial_fp, &trial_w) {
                problems.push(format!(
                    "winner {id} ({w} on {fp}) names trial {trial}, of {trial_w} on {trial_fp}"
                ));
            } else if status != "ok" {
                problems.push(format!(
                    "winner {id} ({w} on {fp}) names trial {trial}, which is {status}"
                ));
            }
        }
        Ok(problems)
    }
}

fn list(names: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut s = names
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        s.push_str(&format!(", ... ({} in all)", names.len()));
    }
    s
}

/// Reads the first 100 bytes (the SQLite header) of an existing file and refuses what cannot
/// be one of ours: directories, non-SQLite files, files shorter than their header promises.
/// A missing file passes (a writer creates it); a 0-byte file is refused by every open,
/// reader or writer alike: it is no database, and a tuning job creates its database at a path
/// that does not exist yet ([`create_complete`]).
fn precheck_file(path: &Path) -> Result<()> {
    let not_sqlite = |detail: String| DbError::NotSqlite {
        path: path.to_path_buf(),
        detail,
    };
    let io = |context: &str, source| DbError::Io {
        path: path.to_path_buf(),
        context: context.into(),
        cause: source,
    };
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io("reading file metadata", e)),
    };
    if meta.is_dir() {
        return Err(not_sqlite("it is a directory".into()));
    }
    if !meta.is_file() {
        // A FIFO would block the first read for ever; a device reads as endless or no data.
        return Err(not_sqlite(format!(
            "it is not a regular file (a {})",
            file_kind(&meta.file_type())
        )));
    }
    let len = meta.len();
    if len == 0 {
        return Err(DbError::Empty {
            path: path.to_path_buf(),
        });
    }
    let mut header = Vec::with_capacity(100);
    std::fs::File::open(path)
        .and_then(|f| f.take(100).read_to_end(&mut header))
        .map_err(|e| io("reading the file header", e))?;
    if header.len() < 100 {
        return Err(not_sqlite(format!(
            "it holds {} bytes, fewer than a SQLite header",
            header.len()
        )));
    }
    if &header[..16] != b"SQLite format 3\0" {
        return Err(not_sqlite(
            "it does not start with the SQLite header".into(),
        ));
    }
    let be16 = |at: usize| u16::from_be_bytes([header[at], header[at + 1]]);
    let be32 = |at: usize| u32::from_be_bytes(header[at..at + 4].try_into().expect("4 bytes"));
    let page_size: u64 = match be16(16) {
        1 => 65_536,
        n if n >= 512 && n.is_power_of_two() => u64::from(n),
        n => return Err(not_sqlite(format!("invalid page size {n} in its header"))),
    };
    let (change_counter, pages, valid_for) = (be32(24), be32(28), be32(92));
    let expected = u64::from(pages) * page_size;
    // The in-header size is authoritative when valid-for matches the change counter. With a
    // non-empty WAL the file may legitimately lag behind, so only judge a WAL-less file.
    if pages > 0 && change_counter == valid_for && len < expected && !wal_has_content(path) {
        return Err(not_sqlite(format!(
            "it is truncated: its header promises {pages} pages of {page_size} bytes \
             ({expected} bytes) but the file holds {len}"
        )));
    }
    Ok(())
}

/// What a file that is neither a regular file nor a directory is, for messages.
fn file_kind(t: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_fifo() {
        "named pipe"
    } else if t.is_char_device() {
        "character device"
    } else if t.is_block_device() {
        "block device"
    } else if t.is_socket() {
        "socket"
    } else {
        "special file"
    }
}

/// The directory `path` is in (`.` for a bare file name), or [`DbError::NoParentDir`] when
/// it does not exist.
pub(crate) fn existing_dir_of(path: &Path) -> Result<&Path> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(DbError::NoParentDir {
            path: path.to_path_buf(),
            dir: dir.to_path_buf(),
        });
    }
    Ok(dir)
}

/// The checks before a writer opens `path`: its directory exists, the file (if any) is a
/// regular, non-empty file that opens for writing (without changing it), and the directory
/// takes new files (the database itself, or SQLite's -wal and -shm beside it: a probe file
/// is made there and removed) — so a refused run leaves nothing behind.
fn precheck_writer(path: &Path) -> Result<()> {
    let dir = existing_dir_of(path)?;
    precheck_file(path)?;
    let not_writable = |detail: String| DbError::NotWritable {
        path: path.to_path_buf(),
        detail,
    };
    if path.exists() {
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| not_writable(format!("opening it for writing: {e}")))?;
    }
    if !(sidecar(path, "-wal").exists() && sidecar(path, "-shm").exists()) {
        crate::temp::probe(path).map_err(|e| {
            not_writable(format!(
                "its directory {} takes no new files: {e}",
                dir.display()
            ))
        })?;
    }
    Ok(())
}

/// `path` as SQLite takes it as a file name: a relative path that starts with `file:` would
/// be read as a URI (`file:x.db?mode=ro`), so it goes as `./file:…`.
fn plain_path(path: &Path) -> PathBuf {
    if path.is_relative() && path.to_string_lossy().starts_with("file:") {
        Path::new(".").join(path)
    } else {
        path.to_path_buf()
    }
}

/// Creates the database at `path`, which did not exist, so that it appears complete: made
/// and migrated under a private name beside it, then linked into place (never over a file
/// another process created meanwhile; then that one is used). So no process ever sees a
/// half-made or empty database of ours, and an empty file is always refused.
fn create_complete(path: &Path) -> Result<()> {
    let tmp = crate::temp::beside(path, "init");
    let made = (|| {
        let conn = Connection::open(plain_path(&tmp)).ctx(
            path,
            "creating the database (its directory must be writable)",
        )?;
        let db = TuningDb {
            conn,
            path: tmp.clone(),
            read_only: false,
            version: SCHEMA_VERSION,
        };
        db.configure()?;
        db.ensure_wal()?;
        db.migrate(0)
    })();
    let linked = made.and_then(|()| match std::fs::hard_link(&tmp, path) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(DbError::Io {
            path: path.to_path_buf(),
            context: "creating the database".into(),
            cause: e,
        }),
        _ => Ok(()),
    });
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let _ = std::fs::remove_file(sidecar(&tmp, suffix));
    }
    linked
}

/// What makes `m` an impossible measurement, if anything: a median that is not a positive
/// time, or samples or a spread that are not finite times ≥ 0 (`insert` refuses such a
/// record, reading skips such a row).
fn timing_problem(m: &Measurement) -> Option<String> {
    let time = |x: f64| x.is_finite() && x >= 0.0;
    if !(m.median_s.is_finite() && m.median_s > 0.0) {
        Some(format!("median {} s is not a positive time", m.median_s))
    } else if !(time(m.spread) && m.samples.iter().all(|&x| time(x))) {
        Some("samples and spread must be finite times ≥ 0".into())
    } else {
        None
    }
}

fn wal_has_content(path: &Path) -> bool {
    std::fs::metadata(sidecar(path, "-wal")).is_ok_and(|m| m.len() > 0)
}

/// A temporary file beside `path`: its name (cut to its first 128 bytes, so that a long but
/// valid name still leaves room for the tag and SQLite's `-journal`) then `tag`.
pub(crate) fn temp_name(path: &Path, tag: &str) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let name = path.file_name().unwrap_or_default().as_bytes();
    let mut short = OsString::from(std::ffi::OsStr::from_bytes(&name[..name.len().min(128)]));
    short.push(tag);
    path.with_file_name(short)
}

/// `path` with `suffix` appended (`-wal`, `-shm`).
fn sidecar(path: &Path, suffix: &str) -> PathBuf {
    let mut p = OsString::from(path.as_os_str());
    p.push(suffix);
    PathBuf::from(p)
}

/// An SQLite `file:` URI for `path` with the query `query`: every byte outside the URI's
/// unreserved set and `/` percent-encoded, so `?`, `#`, `%` and non-UTF-8 names survive.
fn sqlite_uri(path: &Path, query: &str) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut uri = String::from("file:");
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            uri.push(b as char);
        } else {
            uri += &format!("%{b:02X}");
        }
    }
    uri + "?" + query
}

fn upsert_fingerprint_in(
    tx: &Transaction<'_>,
    path: &Path,
    fp: &HardwareFingerprint,
) -> Result<()> {
    tx.prepare(
        "INSERT INTO fingerprints (id, arch, vendor, family, model, stepping, brand, isa, cores, \
         l1d_bytes, l2_bytes, l3_bytes, canonical, first_seen) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14) \
         ON CONFLICT(id) DO UPDATE SET arch = excluded.arch, vendor = excluded.vendor, \
         family = excluded.family, model = excluded.model, stepping = excluded.stepping, \
         brand = excluded.brand, isa = excluded.isa, cores = excluded.cores, \
         l1d_bytes = excluded.l1d_bytes, l2_bytes = excluded.l2_bytes, \
         l3_bytes = excluded.l3_bytes, canonical = excluded.canonical",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            fp.id,
            fp.arch,
            fp.vendor,
            fp.family,
            fp.model,
            fp.stepping,
            fp.brand,
            fp.isa.join(" "),
            fp.cores as i64,
            fp.l1d_bytes as i64,
            fp.l2_bytes as i64,
            fp.l3_bytes as i64,
            fp.canonical(),
            now_rfc3339(),
        ])
    })
    .ctx(path, "storing a fingerprint")?;
    Ok(())
}

/// A fingerprint from a row of [`FINGERPRINT_COLUMNS`]; `Ok(None)` if a number is out of range.
fn fingerprint_from_row(r: &Row<'_>) -> rusqlite::Result<Option<HardwareFingerprint>> {
    let int = |i: usize| -> rusqlite::Result<Option<i64>> { r.get::<_, Option<i64>>(i) };
    let u32_at = |i: usize| int(i).map(|v| v.and_then(|v| u32::try_from(v).ok()));
    let usize_at = |i: usize| int(i).map(|v| v.and_then(|v| usize::try_from(v).ok()));
    let (Some(family), Some(model), Some(stepping)) = (u32_at(3)?, u32_at(4)?, u32_at(5)?) else {
        return Ok(None);
    };
    let (Some(cores), Some(l1d), Some(l2), Some(l3)) =
        (usize_at(8)?, usize_at(9)?, usize_at(10)?, usize_at(11)?)
    else {
        return Ok(None);
    };
    let isa: String = r.get(7)?;
    Ok(Some(HardwareFingerprint {
        id: r.get(0)?,
        arch: r.get(1)?,
        vendor: r.get(2)?,
        family,
        model,
        stepping,
        brand: r.get(6)?,
        isa: isa.split_whitespace().map(str::to_string).collect(),
        cores,
        l1d_bytes: l1d,
        l2_bytes: l2,
        l3_bytes: l3,
    }))
}

/// A record from a row of [`RECORD_COLUMNS`], or `None` if anything in it does not read back.
/// A stored row that does not read back as a record ([`TuningDb::best_all_reporting`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// The row's id.
    pub id: i64,
    /// Its workload column, as stored.
    pub workload: String,
    /// What is wrong with it.
    pub reason: String,
}

pub(crate) fn record_from_row(r: &Row<'_>) -> Option<Record> {
    check_row(r).ok()
}

/// Like [`record_from_row`], saying what is wrong.
fn check_row(r: &Row<'_>) -> Result<Record, String> {
    let sql = |e: rusqlite::Error| e.to_string();
    let workload: String = r.get(2).map_err(sql)?;
    let workload: Workload = workload.parse().map_err(|e| format!("bad workload: {e}"))?;
    let version: i64 = r.get(4).map_err(sql)?;
    let kernel_version =
        u32::try_from(version).map_err(|_| format!("kernel_version {version} out of range"))?;
    let config: String = r.get(5).map_err(sql)?;
    let config =
        Config::from_json(&config).map_err(|e| format!("config {config:?} does not parse: {e}"))?;
    let kernel: String = r.get(3).map_err(sql)?;
    // A record of an older family version this build still runs reads as the current one.
    let (kernel_version, config) =
        kernels::registry::upgrade_record(&kernel, kernel_version, config);
    let status: String = r.get(6).map_err(sql)?;
    let status = Status::parse(&status).ok_or_else(|| format!("unknown status '{status}'"))?;
    let median: Option<f64> = r.get(8).map_err(sql)?;
    let spread: Option<f64> = r.get(9).map_err(sql)?;
    let samples: Option<String> = r.get(10).map_err(sql)?;
    let measurement = match median {
        None if status == Status::Ok => return Err("status ok without median_s".into()),
        None => None,
        Some(median_s) => {
            let samples = match samples {
                None => Vec::new(),
                Some(s) => serde_json::from_str::<Vec<f64>>(&s)
                    .map_err(|e| format!("samples {s:?} do not parse: {e}"))?,
            };
            let m = Measurement {
                samples,
                median_s,
                spread: spread.unwrap_or(0.0),
            };
            // What `insert` refuses, refused on reading too: such a row is never served.
            if let Some(why) = timing_problem(&m) {
                return Err(why);
            }
            Some(m)
        }
    };
    let max_rel_err: Option<f64> = r.get(14).map_err(sql)?;
    let fro_rel_err: Option<f64> = r.get(15).map_err(sql)?;
    let accuracy = match (max_rel_err, fro_rel_err) {
        (Some(max_rel_err), Some(fro_rel_err)) => Some(Accuracy {
            max_rel_err,
            fro_rel_err,
        }),
        _ => None,
    };
    Ok(Record {
        id: Some(r.get(0).map_err(sql)?),
        fingerprint_id: r.get(1).map_err(sql)?,
        workload,
        kernel,
        kernel_version,
        config,
        status,
        message: r.get(7).map_err(sql)?,
        measurement,
        gflops: r.get(11).map_err(sql)?,
        created_at: r.get(12).map_err(sql)?,
        tool_version: r.get(13).map_err(sql)?,
        accuracy,
    })
}

/// The "still usable" filter of `best` / `best_all`: the kernel layer's policy
/// ([`kernels::registry::check_record`]), answered once per (kernel, version, workload,
/// config) since many rows repeat them.
struct Usable {
    fingerprint: Option<HardwareFingerprint>,
    answers: HashMap<(String, u32, Workload, String), bool>,
}

impl Usable {
    fn new(fingerprint: Option<HardwareFingerprint>) -> Self {
        Usable {
            fingerprint,
            answers: HashMap::new(),
        }
    }

    fn accepts(&mut self, r: &Record) -> bool {
        let key = (
            r.kernel.clone(),
            r.kernel_version,
            r.workload,
            r.config.to_json(),
        );
        let fingerprint = &self.fingerprint;
        *self
            .answers
            .entry(key)
            .or_insert_with(|| match fingerprint {
                Some(hw) => kernels::registry::check_record(
                    &r.kernel,
                    r.kernel_version,
                    &r.workload,
                    &r.config,
                    hw,
                )
                .is_ok(),
                // No fingerprint row (a broken reference): the family and version must still run
                // the workload; the config cannot be checked.
                None => kernels::kernel(&r.kernel)
                    .is_ok_and(|k| k.version() == r.kernel_version && k.supports(&r.workload)),
            })
    }
}

/// Whether `e` is SQLite's "database is locked" (for callers that want to retry).
pub fn is_busy(e: &DbError) -> bool {
    match e {
        DbError::Sqlite { cause, .. } => matches!(
            cause.sqlite_error_code(),
            Some(ErrorCode::DatabaseBusy) | Some(ErrorCode::DatabaseLocked)
        ),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::sqlite_err;

    #[test]
    fn opening_sweeps_what_killed_creators_left_beside_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        TuningDb::open(&path).unwrap();
        // The name a creator that has ended would have left (an id no process has).
        let ours = crate::temp::beside(&path, "init");
        let name = ours
            .to_string_lossy()
            .replace(&format!("-{}-", std::process::id()), "-4000000000-");
        let left = PathBuf::from(name);
        std::fs::write(&left, b"half made").unwrap();
        TuningDb::open(&path).unwrap();
        if Path::new("/proc/sys/kernel/random/boot_id").exists() {
            assert!(!left.exists(), "{}", left.display());
        } else {
            eprintln!("skipped: no boot id here, nothing is swept");
        }
    }

    #[test]
    fn a_relative_path_starting_with_file_is_a_file_name_not_a_uri() {
        // `--db file:x.db?mode=ro` had been read as a URI (another file, an access mode).
        let p = |s: &str| plain_path(Path::new(s));
        assert_eq!(p("file:x.db?mode=ro"), Path::new("./file:x.db?mode=ro"));
        assert_eq!(p("/tmp/file:x.db"), Path::new("/tmp/file:x.db"));
        assert_eq!(p("sub/file:x.db"), Path::new("sub/file:x.db"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("file:y.db?mode=ro");
        TuningDb::open(&path).unwrap();
        assert!(path.is_file(), "the file of that name");
    }

    #[test]
    fn sqlite_errors_classify() {
        let e = sqlite_err(
            Path::new("x.db"),
            "reading",
            rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_NOTADB),
                None,
            ),
        );
        assert!(matches!(e, DbError::NotSqlite { .. }), "{e}");
        assert!(e.to_string().starts_with("x.db is not a SQLite database"));
    }

    #[test]
    fn handles_move_between_threads() {
        fn send<T: Send>() {}
        send::<TuningDb>();
    }

    #[test]
    fn in_memory_is_at_the_current_schema() {
        let db = TuningDb::in_memory().unwrap();
        assert_eq!(db.schema_version().unwrap(), SCHEMA_VERSION);
        assert_eq!(db.meta("created_by").unwrap().as_deref(), Some(CREATED_BY));
        assert_eq!(db.path(), Path::new(":memory:"));
        db.verify().unwrap();
    }
}
