//! `autokernel tune --shard I/N` and the batch systems' shard variables, end to end: the
//! shards of a job partition its workload list for every N, each shard writes its own
//! database and resumes from it, and shards merged with `db merge` tried exactly the configs
//! an unsharded run tries.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Output;

use serde_json::Value;

mod common;
use common::ok_json_lines as json_lines;

/// Every variable a batch system could set to name a shard: cleared so that a test run
/// inside a Slurm array or a Kubernetes pod is not sharded by accident.
const SHARD_VARS: [&str; 7] = [
    "SLURM_ARRAY_TASK_ID",
    "SLURM_ARRAY_TASK_COUNT",
    "SLURM_ARRAY_TASK_MIN",
    "SLURM_ARRAY_TASK_MAX",
    "SLURM_ARRAY_TASK_STEP",
    "JOB_COMPLETION_INDEX",
    "AUTOKERNEL_SHARD_COUNT",
];

/// `autokernel ARGS` with `env` and none of the scheduler's shard variables of this process.
fn autokernel(args: &[&str], env: &[(&str, &str)]) -> Output {
    common::autokernel_env(args, env, &SHARD_VARS)
}

fn keys(v: &Value) -> Vec<String> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|x| x.as_str().expect("a string").to_string())
        .collect()
}

const LIST: [&str; 7] = [
    "gemm:512x512x512",
    "gemm:1x768x768",
    "gemm:128x3072x768",
    "gemm:64x64x64",
    "gemm:128x768x768",
    "gemm:8x3072x768",
    "gemm:256x1024x64",
];

fn list_args() -> Vec<&'static str> {
    LIST.iter().flat_map(|w| ["--workload", *w]).collect()
}

/// `tune --dry-run --json` for `shard` (None: from `env` only).
fn plan(shard: Option<&str>, extra: &[&str], env: &[(&str, &str)]) -> Value {
    let mut args = vec!["tune", "--dry-run", "--json", "--budget", "16"];
    args.extend(list_args());
    if let Some(s) = shard {
        args.extend(["--shard", s]);
    }
    args.extend(extra);
    json_lines(&autokernel(&args, env)).remove(0)
}

#[test]
fn shards_partition_the_list_for_every_count() {
    let whole = plan(Some("0/1"), &[], &[]);
    let all: BTreeSet<String> = keys(&whole["workloads"]).into_iter().collect();
    assert_eq!(all.len(), LIST.len());
    for n in 1..=LIST.len() + 1 {
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        let mut costs = Vec::new();
        for i in 0..n {
            let p = plan(Some(&format!("{i}/{n}")), &[], &[]);
            assert_eq!(p["shard"], format!("{i}/{n}"));
            assert_eq!(p["shard_source"], "flag");
            assert_eq!(p["db"], format!("tuning.shard-{i}-of-{n}.db"));
            for w in keys(&p["workloads"]) {
                if let Some(other) = seen.insert(w.clone(), i) {
                    panic!("{w} in shard {other}/{n} and {i}/{n}");
                }
            }
            costs.push(p["shard_estimated_cost_s"].as_f64().unwrap());
        }
        let got: BTreeSet<String> = seen.keys().cloned().collect();
        assert_eq!(got, all, "N = {n}: a workload is missing");
        // Balanced: no shard above the mean plus the largest single workload.
        let total = whole["job_estimated_cost_s"].as_f64().unwrap();
        let largest = whole["estimated_cost_s"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_f64().unwrap())
            .fold(0.0, f64::max);
        let makespan = costs.iter().cloned().fold(0.0, f64::max);
        assert!(
            makespan <= total / n as f64 + largest + 1e-6,
            "N = {n}: {costs:?}"
        );
    }
}

#[test]
fn slurm_and_kubernetes_variables_name_the_shard() {
    // sbatch --array=4-6: task 5 is the second of three.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bert.db");
    let p = plan(
        None,
        &["--db", out.to_str().unwrap()],
        &[
            ("SLURM_ARRAY_TASK_ID", "5"),
            ("SLURM_ARRAY_TASK_COUNT", "3"),
            ("SLURM_ARRAY_TASK_MIN", "4"),
            ("SLURM_ARRAY_TASK_MAX", "6"),
        ],
    );
    assert_eq!(p["shard"], "1/3");
    assert_eq!(p["shard_source"], "slurm");
    let shard_db = dir.path().join("bert.shard-1-of-3.db");
    assert_eq!(p["db"], shard_db.to_str().unwrap());
    assert_eq!(p["workloads"], plan(Some("1/3"), &[], &[])["workloads"]);

    let p = plan(
        None,
        &[],
        &[
            ("JOB_COMPLETION_INDEX", "2"),
            ("AUTOKERNEL_SHARD_COUNT", "3"),
        ],
    );
    assert_eq!(p["shard"], "2/3");
    assert_eq!(p["shard_source"], "kubernetes");

    // --shard wins over the environment; 0/1 is the whole list.
    let env = [
        ("JOB_COMPLETION_INDEX", "2"),
        ("AUTOKERNEL_SHARD_COUNT", "3"),
    ];
    let p = plan(Some("0/1"), &[], &env);
    assert_eq!(p["shard"], "0/1");
    assert_eq!(keys(&p["workloads"]).len(), LIST.len());

    // No shard anywhere: the whole list, into --db itself.
    let p = plan(None, &[], &[]);
    assert_eq!(p["shard_source"], "none");
    assert_eq!(p["db"], "tuning.db");
    assert_eq!(keys(&p["workloads"]).len(), LIST.len());
}

#[test]
fn inconsistent_shards_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let db = db.to_str().unwrap();
    /// (extra arguments, environment, what the error must say)
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 5] = [
        (&["--shard", "2/2"], &[], "0 to 1"),
        (&["--shard", "1of2"], &[], "expected I/N"),
        (
            &[],
            &[("JOB_COMPLETION_INDEX", "0")],
            "AUTOKERNEL_SHARD_COUNT",
        ),
        (
            &[],
            &[
                ("JOB_COMPLETION_INDEX", "3"),
                ("AUTOKERNEL_SHARD_COUNT", "3"),
            ],
            "not below",
        ),
        (
            &[],
            &[
                ("SLURM_ARRAY_TASK_ID", "5"),
                ("SLURM_ARRAY_TASK_COUNT", "3"),
                ("SLURM_ARRAY_TASK_MIN", "1"),
                ("SLURM_ARRAY_TASK_MAX", "9"),
            ],
            "not one range",
        ),
    ];
    for (args, env, needle) in cases {
        let mut all = vec!["tune", "--workload", "gemm:8x8x8", "--db", db];
        all.extend(args);
        let o = autokernel(&all, env);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?} {env:?}: {err}");
        assert!(err.contains(needle), "{args:?} {env:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing written"
    );
}

const SMALL: [&str; 4] = [
    "gemm:16x16x16",
    "gemm:32x24x16",
    "gemm:1x64x32",
    "gemm:24x8x40",
];

/// Tunes SMALL (or shard `shard` of it) into `db`; one JSON object per tuned workload.
fn tune_small(db: &Path, shard: Option<&str>, env: &[(&str, &str)]) -> Vec<Value> {
    let db = db.to_str().unwrap();
    let mut args = vec![
        "tune",
        "--db",
        db,
        "--budget",
        "4",
        "--strategy",
        "random",
        "--seed",
        "3",
        "--isolation",
        "none",
        "--finalists",
        "0",
        "--json",
    ];
    args.extend(SMALL.iter().flat_map(|w| ["--workload", *w]));
    if let Some(s) = shard {
        args.extend(["--shard", s]);
    }
    json_lines(&autokernel(&args, env))
}

fn fingerprint() -> String {
    let v = json_lines(&autokernel(&["hw", "--json"], &[])).remove(0);
    v["id"].as_str().unwrap().to_string()
}

/// Every (kernel, config) tried per workload, from the database.
fn tried(db: &Path, fp: &str) -> BTreeMap<String, BTreeSet<String>> {
    let tdb = tuning_db::TuningDb::open_read_only(db).unwrap();
    SMALL
        .iter()
        .map(|w| {
            let wl: kernels::Workload = w.parse().unwrap();
            let set = tdb
                .trials(fp, &wl)
                .unwrap()
                .into_iter()
                .map(|r| format!("{} {}", r.kernel, r.config))
                .collect();
            (w.to_string(), set)
        })
        .collect()
}

#[test]
fn sharded_tuning_writes_per_shard_databases_resumes_and_merges_like_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("tuning.db");
    let fp = fingerprint();

    // Shard 1 from a Slurm array task (ids 1-2), shard 0 from the flag.
    let slurm = [
        ("SLURM_ARRAY_TASK_ID", "2"),
        ("SLURM_ARRAY_TASK_COUNT", "2"),
        ("SLURM_ARRAY_TASK_MIN", "1"),
    ];
    let s1 = tune_small(&base, None, &slurm);
    let s0 = tune_small(&base, Some("0/2"), &[]);
    let db0 = dir.path().join("tuning.shard-0-of-2.db");
    let db1 = dir.path().join("tuning.shard-1-of-2.db");
    assert!(db0.exists() && db1.exists());
    assert!(!base.exists(), "a shard never writes the job's own --db");
    let names = |v: &[Value]| -> BTreeSet<String> {
        v.iter()
            .map(|x| x["workload"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(names(&s0).is_disjoint(&names(&s1)));
    assert_eq!(names(&s0).len() + names(&s1).len(), SMALL.len());
    for v in s0.iter().chain(&s1) {
        assert!(v["kernel"].is_string(), "a verified best: {v}");
        assert_eq!(v["fingerprint"], fp.as_str());
    }

    // A requeued task runs the same command again: it resumes, measuring nothing new.
    let again = tune_small(&base, None, &slurm);
    assert_eq!(names(&again), names(&s1));
    for v in &again {
        assert_eq!(v["measured_now"], 0, "{v}");
    }

    // Merged shards hold exactly the trials of an unsharded run with the same seed/budget.
    let merged = dir.path().join("merged.db");
    let o = autokernel(
        &[
            "db",
            "merge",
            db0.to_str().unwrap(),
            db1.to_str().unwrap(),
            "--out",
            merged.to_str().unwrap(),
        ],
        &[],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let single = dir.path().join("single.db");
    let whole = tune_small(&single, None, &[]);
    assert_eq!(names(&whole).len(), SMALL.len());
    let (a, b) = (tried(&merged, &fp), tried(&single, &fp));
    for w in SMALL {
        assert_eq!(a[w].len(), 4, "{w}: the budget");
        assert_eq!(
            a[w], b[w],
            "{w}: sharded and unsharded runs tried different configs"
        );
    }
    let o = autokernel(&["db", "verify", merged.to_str().unwrap()], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
}

#[test]
fn more_shards_than_workloads_leaves_empty_shards_that_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("t.db");
    let mut total = 0;
    for i in 0..6 {
        let out = tune_small(&base, Some(&format!("{i}/6")), &[]);
        total += out.len();
        assert!(dir.path().join(format!("t.shard-{i}-of-6.db")).exists());
    }
    assert_eq!(total, SMALL.len());
}

#[test]
fn a_dry_run_refuses_a_database_the_real_run_would() {
    // It had said yes to a --db in a directory that does not exist (the real run: exit 2).
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("missing").join("t.db");
    let o = autokernel(
        &[
            "tune",
            "--dry-run",
            "--workload",
            "gemm:8x8x8",
            "--db",
            db.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("does not exist"));
    assert!(!dir.path().join("missing").exists(), "nothing made");
}

/// A dry run checks the kernel families asked for, and prints its plan only once its checks
/// pass (with --json, a refused run had printed the plan's object on stdout and exited 2).
#[test]
fn a_dry_run_refuses_what_the_real_run_would_before_printing_its_plan() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let db = db.to_str().unwrap();
    let base = ["tune", "--dry-run", "--workload", "gemm:8x8x8", "--db", db];
    let o = autokernel(&[&base[..], &["--kernel", "nope"]].concat(), &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown kernel family 'nope'"));
    let foreign = dir.path().join("foreign.db");
    let conn = rusqlite::Connection::open(&foreign).unwrap();
    conn.execute_batch("CREATE TABLE users (name TEXT)")
        .unwrap();
    drop(conn);
    let mut args = base.to_vec();
    let f = foreign.to_str().unwrap();
    args[5] = f;
    args.push("--json");
    let o = autokernel(&args, &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let o = autokernel(&[&base[..], &["--json"]].concat(), &[]);
    assert!(o.status.success());
    assert_eq!(json_lines(&o)[0]["workloads"][0], "gemm:8x8x8");
}
