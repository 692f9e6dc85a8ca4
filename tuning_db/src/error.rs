//! Errors of the tuning database: each names the file and says what to do about it.

use std::path::{Path, PathBuf};

use rusqlite::ErrorCode;

/// Everything that can go wrong opening, reading or writing a tuning database.
///
/// Every variant carries the database path and renders as one line a user can act on.
/// Nothing in a file's contents makes this crate panic: bad files end up here.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// A read-only open of a file that does not exist.
    #[error("{}: no such tuning database (check the path, or create it by running a tuning job)", .path.display())]
    NotFound {
        /// The path that was opened.
        path: PathBuf,
    },

    /// A writer open whose parent directory does not exist (SQLite only creates the file).
    #[error("cannot create {}: directory {} does not exist (create it first)", .path.display(), .dir.display())]
    NoParentDir {
        /// The database that was to be created.
        path: PathBuf,
        /// Its parent directory, which does not exist (`.` for a bare file name).
        dir: PathBuf,
    },

    /// A file to be made (a merge's or an export's output) in a directory that takes no new
    /// files (read-only, not ours).
    #[error("cannot create {}: directory {} takes no new files ({why})", .path.display(), .dir.display())]
    DirNotWritable {
        /// The file that was to be made.
        path: PathBuf,
        /// The directory it was to be made in.
        dir: PathBuf,
        /// Why a probe file could not be made there (the operating system's error).
        why: String,
    },

    /// Not a SQLite file at all, or a damaged one (truncated, garbage, missing pages).
    #[error("{} is not a SQLite database (or is corrupt): {detail}", .path.display())]
    NotSqlite {
        /// The file that was opened.
        path: PathBuf,
        /// What gave it away (a directory, a bad or truncated header, a missing table,
        /// `quick_check`'s finding) or SQLite's error.
        detail: String,
    },

    /// A 0-byte file: not a database (a new one is created at a path that does not exist).
    #[error("{}: empty file, not a tuning database (a tuning job creates its database at a path that does not exist yet)", .path.display())]
    Empty {
        /// The empty file.
        path: PathBuf,
    },

    /// A bundle (`autokernel db export`) opened for writing: bundles are shipped, verified
    /// by their checksum and imported, never written to.
    #[error("{} is a bundle made by `autokernel db export`, not a database to write to: import it into one (`autokernel db import {} --db FILE`)", .path.display(), .path.display())]
    Bundle {
        /// The bundle file.
        path: PathBuf,
    },

    /// A valid SQLite file that belongs to some other program; it is left untouched.
    #[error("{} is a SQLite database of another application ({detail}); refusing to touch it", .path.display())]
    ForeignApplication {
        /// The file that was opened.
        path: PathBuf,
        /// Why it is not ours: another `application_id`, or tables (or a `user_version`)
        /// without ours.
        detail: String,
    },

    /// Written by a newer autokernel; this one will not guess at its meaning.
    #[error("{}: database schema version {found} is newer than this autokernel understands ({supported}); upgrade autokernel", .path.display())]
    NewerSchema {
        /// The file that was opened.
        path: PathBuf,
        /// The file's schema version (`PRAGMA user_version`).
        found: i64,
        /// The newest version this build understands, [`SCHEMA_VERSION`](crate::SCHEMA_VERSION).
        supported: i64,
    },

    /// A read-only open of a database that needs a migration (or was never initialised).
    #[error("{}: database schema version {found} is older than a read-only open serves (version {supported} or later), and a read-only open cannot migrate it; open it once with a writer (any `autokernel` command that writes, e.g. a tuning job) first", .path.display())]
    OlderSchemaReadOnly {
        /// The file that was opened.
        path: PathBuf,
        /// The file's schema version (`PRAGMA user_version`; 0 for a SQLite file without
        /// tables).
        found: i64,
        /// The oldest schema version a read-only open serves as it is (currently 3), not
        /// [`SCHEMA_VERSION`](crate::SCHEMA_VERSION).
        supported: i64,
    },

    /// A database a writer was asked to open that this process cannot write.
    #[error("{}: this process cannot write it ({detail}); tuning writes its database, while lookup, run and infer read it as it is", .path.display())]
    NotWritable {
        /// The database that was to be opened for writing.
        path: PathBuf,
        /// What failed: opening the file for writing, or making a file in its directory.
        detail: String,
    },
    /// A write through a handle from [`TuningDb::open_read_only`](crate::TuningDb::open_read_only).
    #[error("{}: opened read-only, cannot {action}", .path.display())]
    ReadOnly {
        /// The database, opened read-only.
        path: PathBuf,
        /// The write that was attempted (`import`, `insert records`, ...).
        action: String,
    },

    /// A record names a fingerprint that was never stored.
    #[error("{}: unknown hardware fingerprint '{id}'; call upsert_fingerprint before inserting records for it", .path.display())]
    UnknownFingerprint {
        /// The database written to.
        path: PathBuf,
        /// The fingerprint id the record names.
        id: String,
    },

    /// A record that would break the schema's invariants (e.g. `ok` without a timing).
    #[error("{}: invalid record: {reason}", .path.display())]
    InvalidRecord {
        /// The database written to.
        path: PathBuf,
        /// What is wrong, naming the record (kernel, config, workload) or trial.
        reason: String,
    },

    /// [`TuningDb::verify`](crate::TuningDb::verify) found problems (the first few are listed).
    #[error("{}: verification found {} problem(s): {}", .path.display(), .problems.len(), summarize(.problems))]
    Verify {
        /// The database verified.
        path: PathBuf,
        /// Every problem found, one sentence each; the message shows the first five.
        problems: Vec<String>,
    },

    /// A file-system error around the database file.
    #[error("{}: {context}: {cause}", .path.display())]
    Io {
        /// The file concerned: the database, or the output being made.
        path: PathBuf,
        /// What was being done (`reading file metadata`, `creating the database`, ...).
        context: String,
        /// The operating system's error.
        cause: std::io::Error,
    },

    /// Any other SQLite error, with what we were doing when it happened.
    #[error("{}: {context}: {cause}", .path.display())]
    Sqlite {
        /// The database concerned.
        path: PathBuf,
        /// What was being done (`reading trials`, `inserting a record`, ...).
        context: String,
        /// SQLite's error; [`is_busy`](crate::is_busy) tells a locked database.
        cause: rusqlite::Error,
    },
}

/// Result alias of this crate.
pub type Result<T, E = DbError> = std::result::Result<T, E>;

fn summarize(problems: &[String]) -> String {
    const SHOWN: usize = 5;
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

/// Wraps a rusqlite error with the path and a context; "not a database" and "corrupt" become
/// [`DbError::NotSqlite`], since that is what the user needs to hear.
pub(crate) fn sqlite_err(path: &Path, context: &str, e: rusqlite::Error) -> DbError {
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) | Some(ErrorCode::DatabaseCorrupt) => DbError::NotSqlite {
            path: path.to_path_buf(),
            detail: format!("{context}: {e}"),
        },
        _ => DbError::Sqlite {
            path: path.to_path_buf(),
            context: context.to_string(),
            cause: e,
        },
    }
}

/// `.ctx(path, "what we were doing")` on rusqlite results.
pub(crate) trait Ctx<T> {
    fn ctx(self, path: &Path, context: &str) -> Result<T>;
}

impl<T> Ctx<T> for rusqlite::Result<T> {
    fn ctx(self, path: &Path, context: &str) -> Result<T> {
        self.map_err(|e| sqlite_err(path, context, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each message of `e`'s chain of sources, as chain printers (`anyhow`'s `{:#}`) list them.
    fn chain(e: &dyn std::error::Error) -> Vec<String> {
        std::iter::successors(Some(e), |e| e.source())
            .map(|e| e.to_string())
            .collect()
    }

    #[test]
    fn an_error_names_its_cause_once() {
        let io = DbError::Io {
            path: "t.db".into(),
            context: "reading file metadata".into(),
            cause: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
        };
        let sqlite = sqlite_err(
            Path::new("t.db"),
            "reading trials",
            rusqlite::Error::InvalidQuery,
        );
        for e in [io, sqlite] {
            let messages = chain(&e);
            assert_eq!(messages.len(), 1, "{messages:?}");
            assert!(messages[0].starts_with("t.db: "), "{messages:?}");
        }
    }
}
