//! Fleet workflows end to end: crash-safe resumable tuning (SIGKILL at random moments),
//! concurrent tuning jobs on one database, the runtime's untuned-workload log feeding
//! `tune --workloads-from`, and the `same_arch` level.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;
use common::{autokernel as ak, ok_json_lines as lines};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_autokernel"))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn count(db: &Path, sql: &str) -> i64 {
    if !db.exists() {
        return 0;
    }
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn.query_row(sql, [], |r| r.get(0)).unwrap_or(0)
}

fn trials(db: &Path, w: &str) -> i64 {
    count(
        db,
        &format!("SELECT count(*) FROM trials WHERE workload = '{w}'"),
    )
}

/// Configs measured more than once for a workload.
fn duplicates(db: &Path, w: &str) -> i64 {
    count(
        db,
        &format!(
            "SELECT count(*) FROM (SELECT 1 FROM trials WHERE workload = '{w}' \
             GROUP BY fingerprint_id, kernel, kernel_version, config HAVING count(*) > 1)"
        ),
    )
}

fn verify_ok(db: &Path) {
    let o = ak(&["db", "verify", s(db), "--json"]);
    let v = &lines(&o)[0];
    assert_eq!(v["ok"], true, "{v}");
}

/// Kill-and-resume: SIGKILL a tuning job at pseudo-random moments, check after every kill
/// that no committed trial was lost and the database verifies, then let the same command
/// finish: exactly `budget` distinct configs, none measured twice. `AUTOKERNEL_KILLS=20`
/// runs the long version (the measurement reported in the issue); CI runs 3.
#[test]
fn sigkill_at_random_moments_loses_nothing_and_resumes() {
    let kills: usize = std::env::var("AUTOKERNEL_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kill.db");
    let w = "gemm:128x96x80";
    // Enough work that most runs are killed mid-job rather than finishing first.
    let budget = (kills * 3).max(14);
    let args = [
        "tune",
        "--workload",
        w,
        "--budget",
        &budget.to_string(),
        "--strategy",
        "random",
        "--seed",
        "5",
        "--db",
        s(&db),
        "--json",
    ]
    .map(String::from);
    let mut rng: u64 = 0x2545_F491_4F6C_DD1D;
    let mut committed = 0;
    let mut finished_early = 0;
    for i in 0..kills {
        let mut child = bin()
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // 20 ms .. 1 s: start-up, the default's measurement, trials, the finalists.
        let wait = Duration::from_millis(20 + rng % 980);
        std::thread::sleep(wait);
        let done = child.try_wait().unwrap().is_some();
        if done {
            finished_early += 1;
        } else {
            child.kill().unwrap(); // SIGKILL
        }
        child.wait().unwrap();
        let now = trials(&db, w);
        assert!(
            now >= committed,
            "kill {i} after {wait:?}: {now} trials, {committed} were committed before"
        );
        committed = now;
        if db.exists() {
            verify_ok(&db);
        }
        assert_eq!(
            duplicates(&db, w),
            0,
            "kill {i}: a config was measured twice"
        );
    }
    let o = bin().args(&args).output().unwrap();
    let v = &lines(&o)[0];
    assert_eq!(trials(&db, w), budget as i64, "{v}");
    assert_eq!(v["trials"], budget);
    assert_eq!(duplicates(&db, w), 0);
    verify_ok(&db);
    // And once more: nothing left to do.
    let o = bin().args(&args).output().unwrap();
    assert_eq!(lines(&o)[0]["measured_now"], 0);
    eprintln!(
        "{} SIGKILLs ({finished_early} of {kills} runs finished before their kill), {budget} trials, no loss",
        kills - finished_early
    );
}

#[test]
fn two_tuning_jobs_on_one_database_both_finish_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shared.db");
    let job = |w: &str, seed: &str| {
        bin()
            .args([
                "tune",
                "--workload",
                w,
                "--budget",
                "5",
                "--strategy",
                "random",
                "--seed",
                seed,
                "--isolation",
                "none",
                "--finalists",
                "0",
                "--db",
                s(&db),
                "--json",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // Different workloads, started together on a database that does not exist yet.
    let (a, b) = (job("gemm:24x40x32", "1"), job("gemm:40x24x32", "2"));
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    lines(&a);
    lines(&b);
    assert_eq!(trials(&db, "gemm:24x40x32"), 5);
    assert_eq!(trials(&db, "gemm:40x24x32"), 5);

    // The same workload from two jobs: every trial either job measured is in the file.
    let w = "gemm:32x32x40";
    let (a, b) = (job(w, "3"), job(w, "4"));
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let (la, lb) = (&lines(&a)[0], &lines(&b)[0]);
    // measured_now counts a job's new candidates; each job may also have measured the
    // default config (both do when they start together).
    let measured = la["measured_now"].as_i64().unwrap() + lb["measured_now"].as_i64().unwrap();
    let total = trials(&db, w);
    assert!(
        (measured + 1..=measured + 2).contains(&total),
        "{total} trials in the file, the jobs measured {measured} + their defaults"
    );
    assert!(la["trials"].as_i64().unwrap() <= total && lb["trials"].as_i64().unwrap() <= total);
    assert!(total >= 5);
    verify_ok(&db);
}

#[test]
fn the_untuned_log_feeds_the_next_tuning_job() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let log = dir.path().join("untuned.txt");
    lines(&ak(&[
        "tune",
        "--workload",
        "gemm:32x32x32",
        "--budget",
        "3",
        "--strategy",
        "random",
        "--isolation",
        "none",
        "--db",
        s(&db),
        "--json",
    ]));
    let o = bin()
        .args([
            "lookup",
            "--workload",
            "gemm:32x32x32",
            "--workload",
            "gemm:24x32x32",
            "--workload",
            "gemm:200x64x64",
            "--workload",
            "gemm:24x32x32",
            "--db",
            s(&db),
            "--json",
        ])
        .env(runtime::UNTUNED_LOG_ENV, &log)
        .output()
        .unwrap();
    let l = lines(&o);
    assert_eq!(l[0]["level"], "exact");
    assert_ne!(l[1]["level"], "exact");
    let text = std::fs::read_to_string(&log).unwrap();
    let keys: Vec<&str> = text
        .lines()
        .map(|l| l.split('#').next().unwrap().trim())
        .collect();
    assert_eq!(keys, ["gemm:24x32x32", "gemm:200x64x64"], "{text}");

    let o = ak(&[
        "tune",
        "--workloads-from",
        s(&log),
        "--budget",
        "2",
        "--strategy",
        "random",
        "--isolation",
        "none",
        "--db",
        s(&db),
        "--json",
    ]);
    let tuned: Vec<String> = lines(&o)
        .iter()
        .map(|v| v["workload"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(tuned, ["gemm:24x32x32", "gemm:200x64x64"]);
    let o = ak(&[
        "lookup",
        "--workload",
        "gemm:24x32x32",
        "--workload",
        "gemm:200x64x64",
        "--db",
        s(&db),
        "--json",
    ]);
    assert!(lines(&o).iter().all(|v| v["level"] == "exact"));

    // A bad line fails the job before anything runs, naming the file and the line.
    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, "# from the fleet\ngemm:8x8x8\n\ngemm:8x8\n").unwrap();
    let o = ak(&["tune", "--workloads-from", s(&bad), "--db", s(&db)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(&format!("{}:4:", bad.display())), "{err}");
}

#[test]
fn another_thread_count_of_this_machine_is_served_as_same_arch() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let t = lines(&ak(&[
        "tune",
        "--workload",
        "gemm:16x16x16",
        "--budget",
        "2",
        "--threads",
        "1",
        "--strategy",
        "random",
        "--isolation",
        "none",
        "--db",
        s(&db),
        "--json",
    ]));
    let l = lines(&ak(&[
        "lookup",
        "--workload",
        "gemm:16x16x16",
        "--threads",
        "1",
        "--db",
        s(&db),
        "--json",
    ]));
    assert_eq!(l[0]["level"], "exact");
    let l = lines(&ak(&[
        "lookup",
        "--workload",
        "gemm:16x16x16",
        "--threads",
        "2",
        "--db",
        s(&db),
        "--json",
    ]));
    assert_eq!(l[0]["level"], "same_arch");
    assert_eq!(l[0]["config"], t[0]["config"]);
    assert_eq!(l[0]["source"]["fingerprint"], t[0]["fingerprint"]);
}
