//! The on-disk schema and its migrations.
//!
//! A database's schema version lives in `PRAGMA user_version`; [`MIGRATIONS`]`[i]` takes a
//! file from version `i` to `i + 1`, each in its own `BEGIN IMMEDIATE` transaction. For the
//! next schema version, append one SQL step to [`MIGRATIONS`] (never edit a released step),
//! its tables to `TABLES_ADDED`, and describe it in `SCHEMA.md`; [`SCHEMA_VERSION`] follows.
//! Every step lives in this file.

/// `PRAGMA application_id` of every autokernel tuning database: the bytes `"AKTD"`
/// (0x414B5444), so `file(1)` and this crate can tell our files from other SQLite files.
pub const APPLICATION_ID: i32 = i32::from_be_bytes(*b"AKTD");

/// The schema version this build reads and writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// The tables every database has (v1; later versions add theirs, [`tables_of`]).
pub(crate) const TABLES: &[&str] = &["meta", "fingerprints", "trials"];

/// The tables each schema version adds (index 0: version 1), checked up front when a file
/// is opened, so a damaged schema is refused before anything is measured or written.
const TABLES_ADDED: &[&[&str]] = &[
    TABLES,
    &["winners", "remeasurements"],
    &["provenance"],
    &[],
    &["side_by_side"],
];

/// Every table a database of schema `version` must hold.
pub(crate) fn tables_of(version: i64) -> impl Iterator<Item = &'static str> {
    let n = usize::try_from(version).unwrap_or(0);
    TABLES_ADDED.iter().take(n).flat_map(|t| t.iter().copied())
}

/// The oldest schema version a read-only open serves (without migrating it): what is
/// missing from it reads as absent (for v3: no stored accuracy).
pub const OLDEST_READ_ONLY: i64 = 3;

/// Columns of `trials` added after v1 that may be NULL: a row read from an older file (where
/// they do not exist) and a row holding NULL there are the same row (bundle checksums,
/// trial matching on import).
pub(crate) const OPTIONAL_TRIAL_COLUMNS: &[&str] = &["max_rel_err", "fro_rel_err"];

/// Migration steps; step `i` goes from schema version `i` to `i + 1`.
pub const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5];

/// Schema v1. The status list must hold every [`kernels::Status`] string (a unit test checks).
const V1: &str = r#"
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE fingerprints (
    id         TEXT PRIMARY KEY,
    arch       TEXT NOT NULL,
    vendor     TEXT NOT NULL,
    family     INTEGER NOT NULL,
    model      INTEGER NOT NULL,
    stepping   INTEGER NOT NULL,
    brand      TEXT NOT NULL,
    isa        TEXT NOT NULL,
    cores      INTEGER NOT NULL,
    l1d_bytes  INTEGER NOT NULL,
    l2_bytes   INTEGER NOT NULL,
    l3_bytes   INTEGER NOT NULL,
    canonical  TEXT NOT NULL,
    first_seen TEXT NOT NULL
);

CREATE TABLE trials (
    id             INTEGER PRIMARY KEY,
    fingerprint_id TEXT NOT NULL REFERENCES fingerprints(id),
    workload       TEXT NOT NULL,
    op             TEXT NOT NULL,
    kernel         TEXT NOT NULL,
    kernel_version INTEGER NOT NULL,
    config         TEXT NOT NULL,
    status         TEXT NOT NULL CHECK (status IN
                       ('ok', 'wrong_result', 'build_failed', 'run_failed',
                        'crashed', 'timeout', 'oom')),
    message        TEXT,
    median_s       REAL,
    spread         REAL,
    samples        TEXT,
    gflops         REAL,
    created_at     TEXT NOT NULL,
    tool_version   TEXT NOT NULL,
    CHECK ((status = 'ok') = (median_s IS NOT NULL))
);

CREATE INDEX trials_best ON trials (fingerprint_id, workload, status, median_s);
CREATE INDEX trials_tried ON trials (fingerprint_id, workload, kernel, kernel_version, config);
"#;

/// Schema v2: the `winners` and `remeasurements` tables.
const V2: &str = r#"
CREATE TABLE winners (
    id             INTEGER PRIMARY KEY,
    fingerprint_id TEXT NOT NULL REFERENCES fingerprints(id),
    workload       TEXT NOT NULL,
    trial_id       INTEGER NOT NULL REFERENCES trials(id),
    reason         TEXT NOT NULL,
    tie            INTEGER NOT NULL CHECK (tie IN (0, 1)),
    decided_at     TEXT NOT NULL,
    tool_version   TEXT NOT NULL
);

CREATE INDEX winners_latest ON winners (fingerprint_id, workload, id);

CREATE TABLE remeasurements (
    id        INTEGER PRIMARY KEY,
    winner_id INTEGER NOT NULL REFERENCES winners(id),
    trial_id  INTEGER NOT NULL REFERENCES trials(id),
    median_s  REAL NOT NULL CHECK (median_s > 0),
    spread    REAL NOT NULL,
    ci_low_s  REAL NOT NULL,
    ci_high_s REAL,
    samples   TEXT NOT NULL
);

CREATE INDEX remeasurements_winner ON remeasurements (winner_id);
"#;

/// Schema v3: where imported trials came from.
const V3: &str = r#"
CREATE TABLE IF NOT EXISTS provenance (
    id              INTEGER PRIMARY KEY,
    trial_id        INTEGER NOT NULL REFERENCES trials(id),
    source          TEXT NOT NULL,
    source_checksum TEXT NOT NULL,
    imported_at     TEXT NOT NULL,
    UNIQUE (trial_id, source_checksum)
);
"#;

/// Schema v4: the accuracy of a trial's output against the exact result of the f32 problem
/// (`kernels::Accuracy`), measured when it was verified: what its precision costs.
const V4: &str = r#"
ALTER TABLE trials ADD COLUMN max_rel_err REAL CHECK (max_rel_err IS NULL OR max_rel_err >= 0);
ALTER TABLE trials ADD COLUMN fro_rel_err REAL CHECK (fro_rel_err IS NULL OR fro_rel_err >= 0);
"#;

/// Schema v5: the winners of one shape's precisions re-measured side by side, in the same
/// interleaved rounds (`crate::side_by_side`): the medians the runtime's `auto` policy
/// compares.
const V5: &str = r#"
CREATE TABLE side_by_side (
    id           INTEGER PRIMARY KEY,
    set_id       INTEGER NOT NULL,
    winner_id    INTEGER NOT NULL REFERENCES winners(id),
    median_s     REAL NOT NULL CHECK (median_s > 0),
    spread       REAL NOT NULL,
    samples      TEXT NOT NULL,
    measured_at  TEXT NOT NULL,
    tool_version TEXT NOT NULL
);

CREATE INDEX side_by_side_winner ON side_by_side (winner_id);
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn application_id_spells_aktd() {
        assert_eq!(APPLICATION_ID, 0x414B_5444);
        assert_eq!(APPLICATION_ID.to_be_bytes(), *b"AKTD");
    }

    #[test]
    fn v1_status_check_lists_every_status() {
        // A new Status variant needs a migration that widens the CHECK constraint.
        for s in kernels::Status::ALL {
            assert!(
                V1.contains(&format!("'{}'", s.as_str())),
                "status {s} missing from the schema's CHECK list; add a migration"
            );
        }
    }

    #[test]
    fn migrations_apply_in_order_on_a_blank_connection() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        for step in MIGRATIONS {
            conn.execute_batch(step).unwrap();
        }
        for t in TABLES {
            let n: i64 = conn
                .query_row(
                    "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
                    [t],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(n, 1, "table {t}");
        }
    }

    #[test]
    fn v2_adds_the_winner_tables() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        for step in MIGRATIONS {
            conn.execute_batch(step).unwrap();
        }
        for t in ["winners", "remeasurements"] {
            let n: i64 = conn
                .query_row(
                    "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
                    [t],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(n, 1, "table {t}");
        }
    }
}
