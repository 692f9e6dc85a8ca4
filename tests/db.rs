//! `autokernel db ...`: export / import / merge / verify / diff / stats, end to end, and the
//! bad inputs each must refuse with a one-line error, exit code 2 and no change to any file.

use std::path::{Path, PathBuf};
use std::process::Output;

use kernels::{default_for, Config, HardwareFingerprint, Measurement, Workload};
use serde_json::Value;
use tuning_db::{Record, TuningDb};

mod common;
use common::autokernel as ak;

fn ok_json(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let out = String::from_utf8_lossy(&o.stdout);
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not JSON: {out}: {e}"))
}

/// Exit code 2 and exactly one line on stderr, `error: ...` naming `file` (and `needle`).
fn one_line_error(o: &Output, file: &Path, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(2),
        "exit code for {}; stdout: {}; stderr: {err}",
        file.display(),
        String::from_utf8_lossy(&o.stdout)
    );
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(
        err.contains(file.to_str().unwrap()),
        "names {}: {err}",
        file.display()
    );
    assert!(err.contains(needle), "says '{needle}': {err}");
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn gemm(m: usize, n: usize, k: usize) -> Workload {
    Workload::gemm(m, n, k).unwrap()
}

/// The i-th valid single-thread config of the default family of `w` on this machine.
fn config(w: &Workload, i: usize) -> Config {
    let hw = HardwareFingerprint::current();
    let (k, _) = default_for(w, hw).unwrap();
    k.space(w, hw)
        .iter_valid()
        .filter(|c| c.int("threads") == Some(1))
        .nth(i)
        .expect("enough configs")
}

/// An ok record on this machine: 11 samples within ±0.5% of `median`.
fn rec(w: Workload, c: Config, median: f64) -> Record {
    let hw = HardwareFingerprint::current();
    let (k, _) = default_for(&w, hw).unwrap();
    let samples = (0..11)
        .map(|i| median * (1.0 + (i as f64 - 5.0) * 0.001))
        .collect();
    Record::ok(
        &hw.id,
        w,
        k.name(),
        k.version(),
        c,
        Measurement::from_samples(samples),
        "test",
    )
}

fn make_db(path: &Path, recs: &[Record]) {
    let db = TuningDb::open(path).unwrap();
    db.upsert_fingerprint(HardwareFingerprint::current())
        .unwrap();
    db.insert_many(recs).unwrap();
}

fn bytes(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap()
}

fn raw(p: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open(p).unwrap()
}

/// A tuned database with three workloads (`a.db`) and its bundle (`a.bundle`).
fn fixture(dir: &Path) -> (PathBuf, PathBuf) {
    let a = dir.join("a.db");
    let (w1, w2, w3) = (gemm(64, 64, 64), gemm(96, 64, 64), gemm(128, 64, 64));
    make_db(
        &a,
        &[
            rec(w1, config(&w1, 0), 1.0e-4),
            rec(w1, config(&w1, 1), 1.5e-4),
            rec(w2, config(&w2, 0), 2.0e-4),
            rec(w3, config(&w3, 0), 3.0e-4),
        ],
    );
    let bundle = dir.join("a.bundle");
    ok_json(&ak(&[
        "db",
        "export",
        "--db",
        s(&a),
        "--out",
        s(&bundle),
        "--json",
    ]));
    (a, bundle)
}

#[test]
fn export_verify_import_and_reimport_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (a, bundle) = fixture(dir.path());

    let v = ok_json(&ak(&["db", "verify", s(&bundle), "--json"]));
    assert_eq!(v["ok"], true);
    assert_eq!(v["checksum_ok"], true);
    assert_eq!(v["records"], 4);
    assert_eq!(v["manifest"]["record_count"], 4);
    assert_eq!(v["manifest"]["schema_version"], tuning_db::SCHEMA_VERSION);
    assert_eq!(
        v["manifest"]["fingerprint"],
        HardwareFingerprint::current().id.as_str()
    );
    assert_eq!(v["manifest"]["tool_version"], env!("CARGO_PKG_VERSION"));
    assert!(v["checksum"].as_str().unwrap().starts_with("sha256:"));
    // The bundle is one self-contained file.
    assert!(!dir.path().join("a.bundle-wal").exists());

    let target = dir.path().join("fleet.db");
    let r = ok_json(&ak(&[
        "db",
        "import",
        s(&bundle),
        "--db",
        s(&target),
        "--json",
    ]));
    assert_eq!(
        (r["inserted"].as_u64(), r["duplicates"].as_u64()),
        (Some(4), Some(0))
    );
    assert_eq!(r["changed"], true);
    assert_eq!(r["workloads"].as_array().unwrap().len(), 3);
    assert!(r["conflicts"].as_array().unwrap().is_empty());

    // Same content, same checksum, and the runtime serves the same winners.
    let st = ok_json(&ak(&["db", "stats", "--db", s(&target), "--json"]));
    assert_eq!(st["records"], 4);
    assert_eq!(st["imported_records"], 4);
    assert_eq!(st["sources"], 1);
    let va = ok_json(&ak(&["db", "verify", s(&a), "--json"]));
    let vt = ok_json(&ak(&["db", "verify", "--db", s(&target), "--json"]));
    assert_eq!(va["checksum"], vt["checksum"]);
    let la = ok_json(&ak(&[
        "lookup",
        "--workload",
        "gemm:64x64x64",
        "--db",
        s(&a),
        "--json",
    ]));
    let lt = ok_json(&ak(&[
        "lookup",
        "--workload",
        "gemm:64x64x64",
        "--db",
        s(&target),
        "--json",
    ]));
    assert_eq!(la["config"], lt["config"]);
    assert_eq!(lt["level"], "exact");

    // Importing the same bundle again changes nothing, to the byte.
    let before = bytes(&target);
    let r = ok_json(&ak(&[
        "db",
        "import",
        s(&bundle),
        "--db",
        s(&target),
        "--json",
    ]));
    assert_eq!(
        (r["inserted"].as_u64(), r["duplicates"].as_u64()),
        (Some(0), Some(4))
    );
    assert_eq!(r["changed"], false);
    assert!(bytes(&target) == before, "a second import changed the file");

    // The bundle back into the database it came from: its own records, nothing imported.
    let before = bytes(&a);
    let r = ok_json(&ak(&["db", "import", s(&bundle), "--db", s(&a), "--json"]));
    assert_eq!((&r["inserted"], &r["changed"]), (&0.into(), &false.into()));
    assert!(
        bytes(&a) == before,
        "re-importing its own bundle changed the file"
    );
    let st = ok_json(&ak(&["db", "stats", "--db", s(&a), "--json"]));
    assert_eq!(st["imported_records"], 0);
    // ... and back through another database, whose copies carry provenance rows.
    let round = dir.path().join("round.bundle");
    ok_json(&ak(&[
        "db",
        "export",
        "--db",
        s(&target),
        "--out",
        s(&round),
        "--json",
    ]));
    ok_json(&ak(&["db", "import", s(&round), "--db", s(&a), "--json"]));
    let st = ok_json(&ak(&["db", "stats", "--db", s(&a), "--json"]));
    assert_eq!(st["imported_records"], 0, "{st}");

    // Human summaries exist.
    let o = ak(&["db", "stats", "--db", s(&target)]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("4 records"));
    let o = ak(&["db", "verify", s(&bundle)]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("matches the manifest"));
}

#[test]
fn merge_keeps_every_record_chooses_by_measurement_and_reports_conflicts() {
    let dir = tempfile::tempdir().unwrap();
    let (w1, w2, w3) = (gemm(64, 64, 64), gemm(96, 64, 64), gemm(40, 64, 64));
    let (a, b, c) = (
        dir.path().join("a.db"),
        dir.path().join("b.db"),
        dir.path().join("c.db"),
    );
    make_db(
        &a,
        &[
            rec(w1, config(&w1, 0), 1.000e-4),
            rec(w2, config(&w2, 0), 2e-4),
        ],
    );
    make_db(
        &b,
        &[
            // Within noise of A's (0.2% apart, intervals overlap), another config: a conflict.
            rec(w1, config(&w1, 1), 0.998e-4),
            // Twice as fast as A's: B's wins.
            rec(w2, config(&w2, 1), 1e-4),
            rec(w3, config(&w3, 0), 1e-4),
        ],
    );
    let m = ok_json(&ak(&[
        "db",
        "merge",
        s(&a),
        s(&b),
        "--out",
        s(&c),
        "--json",
    ]));
    assert_eq!(m["records"], 5);
    // The text summary counts the result's workloads, A's alone included (it had counted
    // B's only).
    let text = ak(&[
        "db",
        "merge",
        s(&b),
        s(&a),
        "--out",
        s(&dir.path().join("d.db")),
    ]);
    assert!(text.status.success());
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("3 workload(s): 1 only in A, 0 only in B, "),
        "{text}"
    );
    let conflicts = m["conflicts"].as_array().unwrap();
    assert_eq!(conflicts.len(), 1, "{m}");
    assert_eq!(conflicts[0]["workload"], "gemm:64x64x64");
    assert_eq!(
        conflicts[0]["kept"]["config"],
        serde_json::to_value(config(&w1, 0)).unwrap()
    );
    assert_eq!(conflicts[0]["other"]["source"], s(&b));

    let look = |w: &str| ok_json(&ak(&["lookup", "--workload", w, "--db", s(&c), "--json"]));
    // The conflict keeps A's (the incumbent), though B's median is a hair lower.
    assert_eq!(
        look("gemm:64x64x64")["config"],
        serde_json::to_value(config(&w1, 0)).unwrap()
    );
    assert_eq!(
        look("gemm:96x64x64")["config"],
        serde_json::to_value(config(&w2, 1)).unwrap()
    );
    assert_eq!(look("gemm:40x64x64")["level"], "exact");
    ok_json(&ak(&["db", "verify", s(&c), "--json"]));

    // Provenance: every record names where it came from.
    let conn = raw(&c);
    let n: i64 = conn
        .query_row("SELECT count(DISTINCT trial_id) FROM provenance", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(n, 5);
    let sources: Vec<String> = conn
        .prepare("SELECT DISTINCT source FROM provenance ORDER BY source")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(sources, vec![s(&a).to_string(), s(&b).to_string()]);
    drop(conn);

    // diff A C: 64 same (conflict kept A's), 96 changed (2x), 40 only in C.
    let d = ok_json(&ak(&["db", "diff", s(&a), s(&c), "--json"]));
    let rows = d["rows"].as_array().unwrap();
    let row = |w: &str| rows.iter().find(|r| r["workload"] == w).unwrap().clone();
    assert_eq!(row("gemm:64x64x64")["status"], "same");
    assert_eq!(row("gemm:96x64x64")["status"], "changed");
    assert!((row("gemm:96x64x64")["ratio"].as_f64().unwrap() - 2.0).abs() < 1e-9);
    assert_eq!(row("gemm:40x64x64")["status"], "only_b");
    assert_eq!(
        (d["same"].as_u64(), d["changed"].as_u64()),
        (Some(1), Some(1))
    );
    let o = ak(&["db", "diff", s(&a), s(&c)]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("changed"), "{text}");
    // One machine in both: named once, above the rows.
    let fp = rows[0]["fingerprint_id"].as_str().unwrap();
    assert!(text.contains(&format!("  fingerprint {fp}\n")), "{text}");

    // The output must not exist; nothing is overwritten.
    let before = bytes(&c);
    one_line_error(
        &ak(&["db", "merge", s(&a), s(&b), "--out", s(&c)]),
        &c,
        "already exists",
    );
    assert!(bytes(&c) == before);
}

/// Every kind of bad file, refused by every command that reads one.
#[test]
fn bad_inputs_get_one_line_errors_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_a, bundle) = fixture(d);
    let good = d.join("good.db");
    make_db(
        &good,
        &[rec(gemm(8, 8, 8), config(&gemm(8, 8, 8), 0), 1e-6)],
    );

    let mut bad: Vec<(PathBuf, &str)> = Vec::new();
    let p = d.join("empty.db");
    std::fs::write(&p, b"").unwrap();
    bad.push((p, "empty file"));
    let p = d.join("random.db");
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let noise: Vec<u8> = (0..8192)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(&p, noise).unwrap();
    bad.push((p, "not a SQLite database"));
    let p = d.join("truncated.db");
    let full = bytes(&bundle);
    assert!(full.len() > 8192, "the bundle spans several pages");
    std::fs::write(&p, &full[..full.len() / 2]).unwrap();
    bad.push((p, "truncated"));
    let p = d.join("other_app.db");
    raw(&p)
        .execute_batch("CREATE TABLE photos (id INTEGER PRIMARY KEY, path TEXT);")
        .unwrap();
    bad.push((p, "another application"));
    // A copy of the bundle with `sql` run on it.
    let edited = |name: &str, sql: &str| {
        let p = d.join(name);
        std::fs::copy(&bundle, &p).unwrap();
        raw(&p).execute_batch(sql).unwrap();
        p
    };
    bad.push((edited("newer.db", "PRAGMA user_version = 99;"), "newer"));
    let halve = "UPDATE trials SET median_s = median_s / 2 WHERE id = 1;";
    bad.push((edited("tampered.bundle", halve), "checksum mismatch"));
    // The same edit with the row that marks a bundle deleted: still a (damaged) bundle.
    let unmark = "DELETE FROM meta WHERE key = 'bundle.format';";
    let both = format!("{halve} {unmark}");
    bad.push((edited("unmarked.bundle", &both), "checksum mismatch"));
    bad.push((
        edited("unmarked_only.bundle", unmark),
        "the manifest has no bundle.format",
    ));
    let future = "UPDATE meta SET value = '99' WHERE key = 'bundle.schema_version';";
    bad.push((
        edited("future_manifest.bundle", future),
        "the manifest says schema v99",
    ));
    let p = d.join("stale_config.bundle");
    std::fs::copy(&bundle, &p).unwrap();
    {
        let conn = raw(&p);
        conn.execute_batch(
            "UPDATE trials SET config = json_set(config, '$.mc', 1000) \
             WHERE workload = 'gemm:96x64x64';",
        )
        .unwrap();
        drop(conn);
        // Re-stamp the checksum so that only the config is wrong.
        // (Read-only: a writer refuses bundles.)
        let sum = TuningDb::open_read_only(&p)
            .unwrap()
            .content_checksum()
            .unwrap();
        raw(&p)
            .execute(
                "UPDATE meta SET value = ?1 WHERE key = 'bundle.checksum'",
                [sum],
            )
            .unwrap();
    }
    bad.push((p, "no longer fits"));

    let target = d.join("target.db");
    make_db(
        &target,
        &[rec(gemm(16, 16, 16), config(&gemm(16, 16, 16), 0), 1e-6)],
    );
    let target_before = bytes(&target);
    let good_before = bytes(&good);
    for (file, needle) in &bad {
        let before = bytes(file);
        one_line_error(&ak(&["db", "verify", s(file)]), file, needle);
        one_line_error(&ak(&["db", "verify", s(file), "--json"]), file, needle);
        one_line_error(
            &ak(&["db", "import", s(file), "--db", s(&target)]),
            file,
            needle,
        );
        let out = d.join("merged.db");
        one_line_error(
            &ak(&["db", "merge", s(&good), s(file), "--out", s(&out)]),
            file,
            needle,
        );
        assert!(!out.exists(), "a failed merge left {}", out.display());
        assert!(bytes(file) == before, "{} was modified", file.display());
        let fresh = d.join("fresh.db");
        one_line_error(
            &ak(&["db", "import", s(file), "--db", s(&fresh)]),
            file,
            needle,
        );
        assert!(!fresh.exists(), "a refused import created its target");
        if !needle.contains("checksum") && !needle.contains("fits") && !needle.contains("manifest")
        {
            // Files that do not open at all.
            one_line_error(&ak(&["db", "stats", "--db", s(file)]), file, needle);
            one_line_error(&ak(&["db", "diff", s(&good), s(file)]), file, needle);
            one_line_error(
                &ak(&["db", "export", "--db", s(file), "--out", s(&d.join("x"))]),
                file,
                needle,
            );
            // As an import target: refused untouched (an empty file is a new database).
            if !needle.contains("empty") {
                one_line_error(
                    &ak(&["db", "import", s(&bundle), "--db", s(file)]),
                    file,
                    needle,
                );
                assert!(bytes(file) == before, "{} was modified", file.display());
            }
        }
    }
    assert!(bytes(&target) == target_before, "the import target changed");
    assert!(bytes(&good) == good_before);

    // The runtime logs the record it cannot serve and falls back.
    let stale = &bad.last().unwrap().0;
    let o = ak(&[
        "lookup",
        "--workload",
        "gemm:96x64x64",
        "--db",
        s(stale),
        "--json",
    ]);
    let v = ok_json(&o);
    assert_ne!(v["level"], "exact");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("warning") && err.contains("gemm:96x64x64") && err.contains("'mc' = 1000"),
        "{err}"
    );
}

/// A damaged page that the counts never read is still an error for `db stats` (SQLite's
/// `quick_check`), not a summary that looks whole.
#[test]
fn stats_reports_a_damaged_page() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("damaged.db");
    let recs: Vec<Record> = (0..400)
        .map(|i| rec(gemm(8 + i, 8, 8), config(&gemm(8 + i, 8, 8), 0), 1e-6))
        .collect();
    make_db(&p, &recs);
    let mut b = bytes(&p);
    let page = 4096;
    assert!(b.len() >= 8 * page, "{} bytes", b.len());
    let mid = b.len() / page / 2 * page;
    b[mid..mid + page].fill(7);
    std::fs::write(&p, &b).unwrap();
    one_line_error(&ak(&["db", "stats", "--db", s(&p)]), &p, "quick_check");
    one_line_error(
        &ak(&["db", "stats", "--db", s(&p), "--json"]),
        &p,
        "quick_check",
    );
    assert!(bytes(&p) == b, "stats changed the file");
}

#[test]
fn a_failed_import_leaves_the_target_byte_identical() {
    let dir = tempfile::tempdir().unwrap();
    let (_a, bundle) = fixture(dir.path());
    let target = dir.path().join("target.db");
    make_db(
        &target,
        &[rec(gemm(16, 16, 16), config(&gemm(16, 16, 16), 0), 1e-6)],
    );
    // Make the last step of the import fail: trials and fingerprints are written by then.
    raw(&target)
        .execute_batch(
            "CREATE TRIGGER fail_import BEFORE INSERT ON provenance \
             BEGIN SELECT RAISE(ABORT, 'injected failure'); END;",
        )
        .unwrap();
    let before = bytes(&target);
    let o = ak(&["db", "import", s(&bundle), "--db", s(&target)]);
    one_line_error(&o, &target, "injected failure");
    assert!(
        bytes(&target) == before,
        "the failed import changed the target"
    );
    let n: i64 = raw(&target)
        .query_row("SELECT count(*) FROM trials", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
}

#[test]
fn export_names_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let (a, bundle) = fixture(dir.path());
    let before = bytes(&bundle);
    one_line_error(
        &ak(&["db", "export", "--db", s(&a), "--out", s(&bundle)]),
        &bundle,
        "already exists",
    );
    assert!(bytes(&bundle) == before);
    let out = dir.path().join("x.bundle");
    let o = ak(&[
        "db",
        "export",
        "--db",
        s(&a),
        "--out",
        s(&out),
        "--fingerprint",
        "deadbeef00",
    ]);
    one_line_error(&o, &a, "no fingerprint 'deadbeef00'");
    assert!(!out.exists());
    // A database the receiver's check would refuse is not exported.
    let broken = dir.path().join("broken.db");
    std::fs::copy(&a, &broken).unwrap();
    raw(&broken)
        .execute_batch("UPDATE trials SET config = '{\"bogus\":1}' WHERE id = 1;")
        .unwrap();
    let out = dir.path().join("y.bundle");
    one_line_error(
        &ak(&["db", "export", "--db", s(&broken), "--out", s(&out)]),
        &broken,
        "no longer fits",
    );
    assert!(!out.exists(), "a refused export left its output");
    let missing = dir.path().join("missing.db");
    one_line_error(
        &ak(&["db", "verify", s(&missing)]),
        &missing,
        "no such file",
    );
}
