//! Opening files: fresh, migrated, foreign, damaged, newer, read-only. A refused file is
//! never modified.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use kernels::Status;
use tuning_db::{DbError, TuningDb, APPLICATION_ID, SCHEMA_VERSION};

fn raw(path: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open(path).unwrap()
}

fn pragma_i64(conn: &rusqlite::Connection, name: &str) -> i64 {
    conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
        .unwrap()
}

/// Opens `path` both ways, expects `check` to accept both errors, and the file's bytes to be
/// exactly what they were.
fn refused(path: &Path, check: impl Fn(&DbError) -> bool) {
    let before = bytes(path);
    for (how, result) in [
        ("open", TuningDb::open(path)),
        ("open_read_only", TuningDb::open_read_only(path)),
    ] {
        let err = result.expect_err(how);
        assert!(check(&err), "{how}: unexpected error {err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains(path.to_str().unwrap()),
            "{how}: message names the file: {msg}"
        );
        assert!(!msg.contains('\n'), "{how}: one line: {msg}");
    }
    assert!(bytes(path) == before, "the refused file was modified");
}

#[test]
fn a_fresh_file_gets_the_schema_version_application_id_and_wal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.db");
    let db = TuningDb::open(&path).unwrap();
    assert_eq!(db.path(), path);
    assert_eq!(db.schema_version().unwrap(), SCHEMA_VERSION);
    assert!(db
        .meta("created_by")
        .unwrap()
        .unwrap()
        .starts_with("autokernel"));
    assert!(db.meta("created_at").unwrap().unwrap().ends_with('Z'));
    drop(db);

    let conn = raw(&path);
    assert_eq!(pragma_i64(&conn, "user_version"), SCHEMA_VERSION);
    assert_eq!(
        pragma_i64(&conn, "application_id"),
        i64::from(APPLICATION_ID)
    );
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    drop(conn);
    // The application id is in the header, big-endian at offset 68.
    assert_eq!(&bytes(&path)[68..72], b"AKTD");

    // Reopening is a no-op and keeps the data.
    make_db(&path, 3);
    let db = TuningDb::open(&path).unwrap();
    assert_eq!(db.stats().unwrap().records, 3);
}

#[test]
fn an_empty_sqlite_file_made_elsewhere_is_initialised() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blank.db");
    let conn = raw(&path);
    conn.execute_batch("PRAGMA page_size = 4096; VACUUM;")
        .unwrap();
    drop(conn);
    let db = TuningDb::open(&path).unwrap();
    assert_eq!(db.schema_version().unwrap(), SCHEMA_VERSION);
}

#[test]
fn an_empty_file_is_refused_by_readers_and_writers_alike() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.db");
    std::fs::write(&path, b"").unwrap();
    for err in [
        TuningDb::open_read_only(&path).unwrap_err(),
        TuningDb::open(&path).unwrap_err(),
    ] {
        assert!(matches!(err, DbError::Empty { .. }), "{err}");
        assert!(err.to_string().contains("empty file"), "{err}");
    }
    assert!(bytes(&path).is_empty(), "nothing was written");
    // A new database appears complete: no process ever sees it empty (so an empty file
    // is always someone else's).
    let new = dir.path().join("new.db");
    let db = TuningDb::open(&new).unwrap();
    assert_eq!(db.schema_version().unwrap(), SCHEMA_VERSION);
    drop(db);
    TuningDb::open_read_only(&new).unwrap();
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(names.iter().all(|n| !n.contains(".init-")), "{names:?}");
}

#[test]
fn a_missing_parent_directory_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no/such/dir/t.db");
    let err = TuningDb::open(&path).unwrap_err();
    assert!(matches!(err, DbError::NoParentDir { .. }), "{err}");
    assert!(err.to_string().contains("no/such/dir"), "{err}");
    assert!(!dir.path().join("no").exists());
}

#[test]
fn a_truncated_database_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.db");
    make_db(&path, 400);
    let full = bytes(&path);
    assert!(full.len() >= 8 * 4096, "several pages: {}", full.len());
    std::fs::write(&path, &full[..full.len() / 2]).unwrap();
    refused(&path, |e| matches!(e, DbError::NotSqlite { .. }));
    let msg = TuningDb::open(&path).unwrap_err().to_string();
    assert!(
        msg.contains("is not a SQLite database (or is corrupt)"),
        "{msg}"
    );
    assert!(msg.contains("truncated"), "{msg}");
}

/// A file whose header and schema read well but whose pages do not (the last page
/// overwritten): a writer checks the pages before it writes, so the file is refused
/// untouched, and a dry run's check says the same.
#[test]
fn a_damaged_page_is_refused_by_writers_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("damaged.db");
    make_db(&path, 400);
    let mut data = bytes(&path);
    let n = data.len();
    data[n - 3000..n - 2000].fill(0x55);
    std::fs::write(&path, &data).unwrap();
    for err in [
        TuningDb::open(&path).unwrap_err(),
        TuningDb::check_writer(&path).unwrap_err(),
    ] {
        assert!(matches!(err, DbError::NotSqlite { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("quick_check"), "{msg}");
        assert!(!msg.contains('\n'), "one line: {msg}");
    }
    assert!(bytes(&path) == data, "the refused file was modified");
}

#[test]
fn random_bytes_and_text_are_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("noise.db");
    let mut rng = kernels::Rng::new(42);
    let noise: Vec<u8> = (0..8192).map(|_| rng.below(256) as u8).collect();
    std::fs::write(&path, &noise).unwrap();
    refused(&path, |e| matches!(e, DbError::NotSqlite { .. }));

    std::fs::write(&path, b"hello, I am a text file\n").unwrap();
    refused(&path, |e| matches!(e, DbError::NotSqlite { .. }));

    // A valid header followed by garbage pages.
    let path = dir.path().join("garbled.db");
    make_db(&path, 10);
    let mut b = bytes(&path);
    for x in &mut b[100..] {
        *x = rng.below(256) as u8;
    }
    std::fs::write(&path, &b).unwrap();
    refused(&path, |e| matches!(e, DbError::NotSqlite { .. }));
}

#[test]
fn a_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let err = TuningDb::open(dir.path()).unwrap_err();
    assert!(matches!(err, DbError::NotSqlite { .. }), "{err}");
}

/// A named pipe (whose first read would block for ever) and a device are refused by their
/// kind, before anything reads them.
#[test]
fn special_files_are_refused_without_reading_them() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.db");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo");
    for (path, kind) in [
        (fifo.as_path(), "named pipe"),
        (Path::new("/dev/null"), "character device"),
    ] {
        for result in [TuningDb::open(path), TuningDb::open_read_only(path)] {
            let err = result.unwrap_err();
            let msg = err.to_string();
            assert!(matches!(err, DbError::NotSqlite { .. }), "{msg}");
            assert!(
                msg.contains(&format!("not a regular file (a {kind})")),
                "{msg}"
            );
        }
    }
}

#[test]
fn another_applications_database_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("foreign.db");
    let conn = raw(&path);
    conn.execute_batch("CREATE TABLE foo (x INTEGER); INSERT INTO foo VALUES (1);")
        .unwrap();
    drop(conn);
    refused(&path, |e| matches!(e, DbError::ForeignApplication { .. }));
    let msg = TuningDb::open(&path).unwrap_err().to_string();
    assert!(
        msg.contains("is a SQLite database of another application"),
        "{msg}"
    );
    assert!(msg.contains("foo"), "{msg}");

    // Empty, but with another application's id.
    let path2 = dir.path().join("foreign-id.db");
    let conn = raw(&path2);
    conn.execute_batch("PRAGMA application_id = 1234567; CREATE TABLE t (x); DROP TABLE t;")
        .unwrap();
    drop(conn);
    refused(&path2, |e| matches!(e, DbError::ForeignApplication { .. }));

    // Our application id, but even our tables with somebody else's id are not ours.
    let path3 = dir.path().join("ours-relabelled.db");
    make_db(&path3, 2);
    raw(&path3)
        .execute_batch("PRAGMA application_id = 42;")
        .unwrap();
    refused(&path3, |e| matches!(e, DbError::ForeignApplication { .. }));
}

#[test]
fn a_newer_schema_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("future.db");
    make_db(&path, 5);
    raw(&path)
        .execute_batch("PRAGMA user_version = 99;")
        .unwrap();
    refused(
        &path,
        |e| matches!(e, DbError::NewerSchema { found: 99, supported, .. } if *supported == SCHEMA_VERSION),
    );
    let msg = TuningDb::open(&path).unwrap_err().to_string();
    assert!(
        msg.contains(&format!(
            "database schema version 99 is newer than this autokernel understands ({SCHEMA_VERSION}); upgrade autokernel"
        )),
        "{msg}"
    );
}

#[test]
fn our_id_without_our_tables_is_damaged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hollow.db");
    make_db(&path, 1);
    raw(&path).execute_batch("DROP TABLE trials;").unwrap();
    refused(&path, |e| matches!(e, DbError::NotSqlite { .. }));
}

#[test]
fn read_only_open_never_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ro.db");
    make_db(&path, 20);
    let before = bytes(&path);
    let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    {
        let db = TuningDb::open_read_only(&path).unwrap();
        assert!(db.is_read_only());
        let hw = hw();
        let w = gemm(64, 64, 64);
        assert!(db.best(&hw.id, &w).unwrap().is_some());
        assert_eq!(db.best_all(&hw.id).unwrap().len(), 1);
        assert_eq!(db.trials(&hw.id, &w).unwrap().len(), 20);
        assert_eq!(db.stats().unwrap().records, 20);
        db.verify().unwrap();

        let c = configs(&w, &hw, 1).remove(0);
        let err = db
            .insert(&failed(&hw.id, w, c, Status::Crashed, "x"))
            .unwrap_err();
        assert!(matches!(err, DbError::ReadOnly { .. }), "{err}");
        let err = db.upsert_fingerprint(&other_hw()).unwrap_err();
        assert!(matches!(err, DbError::ReadOnly { .. }), "{err}");
    }
    assert!(bytes(&path) == before, "bytes unchanged");
    assert_eq!(std::fs::metadata(&path).unwrap().modified().unwrap(), mtime);
}

#[test]
fn read_only_open_of_a_missing_file_fails_clearly_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.db");
    let err = TuningDb::open_read_only(&path).unwrap_err();
    assert!(matches!(err, DbError::NotFound { .. }), "{err}");
    assert!(err.to_string().contains("absent.db"), "{err}");
    assert!(!path.exists());
}

#[test]
fn a_reader_does_not_wait_for_a_writer_in_a_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("busy.db");
    make_db(&path, 5);
    let writer = TuningDb::open(&path).unwrap(); // keeps the WAL alive
    let conn = raw(&path);
    conn.execute_batch("BEGIN IMMEDIATE; DELETE FROM trials;")
        .unwrap();

    let t = Instant::now();
    let reader = TuningDb::open_read_only(&path).unwrap();
    assert_eq!(reader.stats().unwrap().records, 5, "sees the last commit");
    assert!(reader.best(&hw().id, &gemm(64, 64, 64)).unwrap().is_some());
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());

    conn.execute_batch("ROLLBACK;").unwrap();
    assert_eq!(writer.stats().unwrap().records, 5);
}
