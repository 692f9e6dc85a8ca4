//! Hostile and careless inputs found by an adversarial probe of the CLI: each is refused up
//! front with one line naming what is wrong, and changes nothing.

use std::path::{Path, PathBuf};
use std::process::Output;

mod common;
use common::{autokernel, ok_json_lines, stderr};

const W: &str = "gemm:8x8x8";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A refusal: exit 2, one line on stderr containing `needle`.
fn refused(o: &Output, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains(needle), "expected '{needle}' in: {err}");
}

/// A small tuned database in a fresh directory.
fn tuned(dir: &Path) -> PathBuf {
    let db = dir.join("t.db");
    ok_json_lines(&autokernel(&[
        "tune",
        "--workload",
        W,
        "--db",
        s(&db),
        "--budget",
        "2",
        "--json",
    ]));
    db
}

#[test]
fn a_bundle_is_never_a_tuning_target() {
    let dir = tempfile::tempdir().unwrap();
    let db = tuned(dir.path());
    let bundle = dir.path().join("t.bundle");
    let o = autokernel(&["db", "export", "--db", s(&db), "--out", s(&bundle)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let before = std::fs::read(&bundle).unwrap();
    let o = autokernel(&["tune", "--workload", W, "--db", s(&bundle), "--budget", "3"]);
    refused(&o, "is a bundle made by `autokernel db export`");
    let o = autokernel(&["db", "import", s(&db), "--db", s(&bundle)]);
    refused(&o, "is a bundle");
    assert_eq!(
        std::fs::read(&bundle).unwrap(),
        before,
        "the bundle changed"
    );
    let o = autokernel(&["db", "verify", s(&bundle), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn a_damaged_schema_is_refused_before_anything_is_measured() {
    let dir = tempfile::tempdir().unwrap();
    let db = tuned(dir.path());
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch("PRAGMA foreign_keys = OFF; DROP TABLE winners")
        .unwrap();
    let trials = |c: &rusqlite::Connection| -> i64 {
        c.query_row("SELECT count(*) FROM trials", [], |r| r.get(0))
            .unwrap()
    };
    let before = trials(&conn);
    drop(conn);
    let o = autokernel(&[
        "tune",
        "--workload",
        "gemm:9x9x9",
        "--db",
        s(&db),
        "--budget",
        "2",
    ]);
    refused(&o, "table 'winners' of schema v5 is missing");
    let o = autokernel(&["lookup", "--workload", W, "--db", s(&db)]);
    refused(&o, "table 'winners' of schema v5 is missing");
    let conn = rusqlite::Connection::open(&db).unwrap();
    assert_eq!(trials(&conn), before, "a trial was committed");
}

#[test]
fn an_empty_file_is_refused_by_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    let e = s(&empty);
    let commands: [&[&str]; 7] = [
        &["tune", "--workload", W, "--db", e, "--budget", "1"],
        &["lookup", "--workload", W, "--db", e],
        &["run", "--workload", W, "--db", e],
        &["bench", "--db", e, "--quick"],
        &["infer", "--model", "bert-tiny", "--db", e],
        &["db", "stats", "--db", e],
        &["db", "verify", e],
    ];
    for args in commands {
        let o = autokernel(args);
        refused(&o, &format!("{e}: empty file, not a tuning database"));
    }
    assert_eq!(
        std::fs::metadata(&empty).unwrap().len(),
        0,
        "tune initialised it"
    );
}

#[test]
fn an_import_of_a_hard_link_to_the_target_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = tuned(dir.path());
    let link = dir.path().join("link.db");
    std::fs::hard_link(&db, &link).unwrap();
    let before = std::fs::read(&db).unwrap();
    let o = autokernel(&["db", "import", s(&link), "--db", s(&db)]);
    refused(&o, "cannot import a database into itself");
    assert_eq!(std::fs::read(&db).unwrap(), before);
}

#[test]
fn an_empty_workload_list_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("list.txt");
    std::fs::write(&list, "# nothing yet\n\n").unwrap();
    let db = dir.path().join("new.db");
    let o = autokernel(&["tune", "--workloads-from", s(&list), "--db", s(&db)]);
    refused(&o, "lists no workloads");
    assert!(!db.exists(), "a database was created");
    // A byte-order mark is not part of the first workload.
    std::fs::write(&list, "\u{feff}gemm:4x4x4\n").unwrap();
    let o = autokernel(&[
        "tune",
        "--workloads-from",
        s(&list),
        "--db",
        s(&db),
        "--budget",
        "1",
        "--json",
    ]);
    assert_eq!(ok_json_lines(&o)[0]["workload"], "gemm:4x4x4");
}

#[test]
fn bench_refuses_to_overwrite_before_measuring() {
    let dir = tempfile::tempdir().unwrap();
    let db = tuned(dir.path());
    let existing = dir.path().join("base.json");
    std::fs::write(&existing, "keep me").unwrap();
    let o = autokernel(&[
        "bench",
        "--db",
        s(&db),
        "--quick",
        "--save-baseline",
        s(&existing),
    ]);
    refused(&o, "refusing to overwrite it");
    let o = autokernel(&["bench", "--db", s(&db), "--quick", "--report", s(&existing)]);
    refused(&o, "exists and is not a directory");
    assert_eq!(std::fs::read_to_string(&existing).unwrap(), "keep me");
    // A directory holding a report.md autokernel did not write keeps it.
    let theirs = dir.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::write(theirs.join("report.md"), "# my notes\n").unwrap();
    let o = autokernel(&["bench", "--db", s(&db), "--quick", "--report", s(&theirs)]);
    refused(&o, "refusing to overwrite it");
    assert_eq!(
        std::fs::read_to_string(theirs.join("report.md")).unwrap(),
        "# my notes\n"
    );
}

#[test]
fn impossible_sizes_are_clean_errors() {
    let dir = tempfile::tempdir().unwrap();
    let db = tuned(dir.path());
    // More threads than this process may use names a machine that does not exist.
    let cpus = std::thread::available_parallelism().unwrap().get();
    let too_many = (cpus + 1).to_string();
    let o = autokernel(&["hw", "--threads", &too_many]);
    refused(&o, &format!("this process may use {cpus} CPU(s)"));
    let o = autokernel(&[
        "lookup",
        "--workload",
        "gemm:99999999999999999999x2x2",
        "--db",
        s(&db),
    ]);
    refused(&o, "exceeds the maximum of");
    let o = autokernel(&[
        "infer",
        "--model",
        "bert-tiny",
        "--db",
        s(&db),
        "--seq",
        "100000",
    ]);
    refused(&o, "model takes at most 512 tokens");
    // Under a memory limit (8 GB of address space), what cannot be allocated is an error,
    // not an abort: a workload's operands (29 GB), a BERT batch's activations.
    let limited = |args: &str| {
        let script = format!(
            "ulimit -v 8000000 && exec {} {args} --db {}",
            env!("CARGO_BIN_EXE_autokernel"),
            s(&db)
        );
        std::process::Command::new("sh")
            .args(["-c", &script])
            .output()
            .unwrap()
    };
    let o = limited("run --workload gemm:30000x30000x30000");
    refused(&o, "more than this process can allocate");
    let o = limited("infer --model bert-tiny --batch 4000 --seq 512 --iters 1 --check none");
    refused(&o, "batch 4000 seq 512: its activations need");
}
