//! # tuning_db — every trial autokernel made, in one SQLite file
//!
//! ```
//! use kernels::{default_for, HardwareFingerprint, Measurement, Workload};
//! use tuning_db::{Record, TuningDb};
//!
//! let db = TuningDb::in_memory()?; // or TuningDb::open("tuning.db")?
//! let hw = HardwareFingerprint::current();
//! db.upsert_fingerprint(hw)?;
//!
//! let w: Workload = "gemm:128x768x768".parse()?;
//! let (kernel, config) = default_for(&w, hw)?;
//! let timing = Measurement::from_samples(vec![1.2e-3, 1.1e-3, 1.3e-3]);
//! let id = db.insert(&Record::ok(
//!     &hw.id, w, kernel.name(), kernel.version(), config.clone(), timing, "0.1.0",
//! ))?;
//!
//! let best = db.best(&hw.id, &w)?.expect("one ok record");
//! assert_eq!((best.id, best.config), (Some(id), config));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Why it exists: tuning is expensive and its results are only valid for one machine and one
//! version of each kernel. This crate keeps every trial — failures included — keyed by
//! hardware fingerprint, exact workload, kernel name *and* version, so that a resumed tuning
//! job never re-measures ([`TuningDb::trials`]), the cost model learns from the whole
//! history ([`TuningDb::trials`]), and the inference runtime gets the winner per workload
//! ([`TuningDb::best`], [`TuningDb::best_all`]) through a read-only handle that never waits
//! for a writer ([`TuningDb::open_read_only`]).
//!
//! A record only counts while its (kernel, version) is registered in [`kernels::registry()`]
//! and its config still fits that family's space for the fingerprint. Bumping a kernel's
//! version therefore invalidates its old records without touching the file. Among usable
//! records, the winner a tuning job recorded ([`TuningDb::record_winner`], schema v2: decided
//! on interleaved re-measurements, ties kept stable) comes first; without one, the fastest.
//!
//! ## The file
//!
//! One SQLite database in WAL mode (`synchronous=NORMAL`, 5 s busy timeout, foreign keys on),
//! so several writer processes can share it and readers never block. Our files carry
//! `PRAGMA application_id = 0x414B5444` (`"AKTD"`, [`APPLICATION_ID`]) and their schema version
//! in `PRAGMA user_version` ([`SCHEMA_VERSION`]); [`TuningDb::open`] migrates older files and
//! refuses newer ones, other applications' databases and damaged files — without writing a
//! byte to a file it refuses.
//!
//! ## Schema v1 (see also `SCHEMA.md`, with example `sqlite3` queries)
//!
//! ```sql
//! CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);   -- created_by, created_at
//! CREATE TABLE fingerprints (
//!     id TEXT PRIMARY KEY,                  -- HardwareFingerprint::id (16 hex digits)
//!     arch TEXT, vendor TEXT, family INTEGER, model INTEGER, stepping INTEGER, brand TEXT,
//!     isa TEXT,                             -- space-separated, sorted: "avx2 fma ..."
//!     cores INTEGER, l1d_bytes INTEGER, l2_bytes INTEGER, l3_bytes INTEGER,
//!     canonical TEXT,                       -- canonical JSON the id hashes
//!     first_seen TEXT);                     -- RFC 3339 UTC
//! CREATE TABLE trials (
//!     id INTEGER PRIMARY KEY,               -- grows with insertion order
//!     fingerprint_id TEXT NOT NULL REFERENCES fingerprints(id),
//!     workload TEXT NOT NULL,               -- gemm:128x768x768
//!     op TEXT NOT NULL,                     -- gemm
//!     kernel TEXT NOT NULL, kernel_version INTEGER NOT NULL,
//!     config TEXT NOT NULL,                 -- compact JSON, keys sorted: {"kc":256,"par":"m"}
//!     status TEXT NOT NULL CHECK (status IN ('ok','wrong_result','build_failed',
//!                                 'run_failed','crashed','timeout','oom')),
//!     message TEXT,                         -- why it failed; NULL when ok
//!     median_s REAL,                        -- NOT NULL exactly when status = 'ok'
//!     spread REAL,                          -- MAD / median
//!     samples TEXT,                         -- JSON array of seconds
//!     gflops REAL,
//!     created_at TEXT NOT NULL,             -- RFC 3339 UTC
//!     tool_version TEXT NOT NULL);
//! CREATE INDEX trials_best  ON trials (fingerprint_id, workload, status, median_s);
//! CREATE INDEX trials_tried ON trials (fingerprint_id, workload, kernel, kernel_version, config);
//! ```

#![warn(missing_docs)]

mod bundle;
mod db;
mod diff;
mod error;
mod history;
mod merge;
mod record;
mod schema;
mod side_by_side;
mod temp;
mod winners;

pub use bundle::{
    check_file, open_existing, BundleError, CheckReport, FingerprintStats, Manifest, Summary,
    BUNDLE_FORMAT,
};
pub use db::{is_busy, TuningDb, Unreadable, BUSY_TIMEOUT};
pub use diff::{diff_files, DiffReport, DiffRow, DiffStatus};
pub use error::{DbError, Result};
pub use merge::{
    median_ci, merge_files, BestSummary, Conflict, ImportReport, MergeReport, Outcome,
    WorkloadOutcome,
};
pub use record::{now_rfc3339, rfc3339, Record, Stats};
pub use schema::{APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION};
pub use side_by_side::SideBySide;
pub use temp::probe_dir;
pub use winners::{Remeasurement, WinnerDecision, WinnerMedian};
