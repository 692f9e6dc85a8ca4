//! The Kubernetes Indexed Job example (scripts/k8s-indexed-job.yaml) keeps the shard
//! contract: it is an Indexed Job whose completions, parallelism and AUTOKERNEL_SHARD_COUNT
//! agree, and its pods' command, run for every JOB_COMPLETION_INDEX as Kubernetes would run
//! it (with `--dry-run` added, and the volume path moved into a temporary directory), tunes
//! every workload of its list exactly once, each pod into its own database.
//!
//! The manifest is read with a few lines of parsing, enough for its shape: `key: value`
//! scalars, the `env` list, and `command` / `args` as flow sequences of double-quoted strings
//! (which are JSON arrays).

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;

const MANIFEST: &str = include_str!("../scripts/k8s-indexed-job.yaml");

/// Lines without comments, with their indentation.
fn lines() -> Vec<(usize, String)> {
    MANIFEST
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .map(|l| (l.len() - l.trim_start().len(), l.trim().to_string()))
        .collect()
}

/// The value of the first `key: value` line (the key may follow a list dash).
fn scalar(key: &str) -> String {
    let prefix = format!("{key}:");
    lines()
        .iter()
        .map(|(_, l)| l.trim_start_matches("- ").to_string())
        .find_map(|l| {
            l.strip_prefix(&prefix)
                .map(|v| v.trim().trim_matches('"').to_string())
        })
        .unwrap_or_else(|| panic!("{key} not in the manifest"))
}

/// A flow sequence `key: ["a", "b", ...]`, possibly over several lines, as JSON.
fn flow_sequence(key: &str) -> Vec<String> {
    let prefix = format!("{key}:");
    let all = lines();
    let start = all
        .iter()
        .position(|(_, l)| l.trim_start_matches("- ").starts_with(&prefix))
        .unwrap_or_else(|| panic!("{key} not in the manifest"));
    let mut text = all[start].1.trim_start_matches("- ")[prefix.len()..].to_string();
    let mut i = start + 1;
    while !text.trim_end().ends_with(']') {
        text.push(' ');
        text.push_str(&all[i].1);
        i += 1;
    }
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{key}: {e}: {text}"))
}

/// `env:` entries `- name: X` followed by `value: "Y"`.
fn env() -> BTreeMap<String, String> {
    let all = lines();
    let mut out = BTreeMap::new();
    for (i, (_, l)) in all.iter().enumerate() {
        if let Some(name) = l.strip_prefix("- name: ") {
            if let Some(v) = all.get(i + 1).and_then(|(_, n)| n.strip_prefix("value: ")) {
                out.insert(
                    name.trim().to_string(),
                    v.trim().trim_matches('"').to_string(),
                );
            }
        }
    }
    out
}

#[test]
fn the_manifest_is_an_indexed_job_with_a_consistent_shard_count() {
    assert_eq!(scalar("apiVersion"), "batch/v1");
    assert_eq!(scalar("kind"), "Job");
    assert_eq!(scalar("completionMode"), "Indexed");
    let completions: usize = scalar("completions").parse().unwrap();
    assert!(completions >= 2);
    assert_eq!(scalar("parallelism"), completions.to_string());
    assert_eq!(
        env().get("AUTOKERNEL_SHARD_COUNT"),
        Some(&completions.to_string()),
        "AUTOKERNEL_SHARD_COUNT must equal completions"
    );
    assert_eq!(flow_sequence("command"), ["autokernel"]);
    let args = flow_sequence("args");
    assert_eq!(args[0], "tune");
    assert!(
        !args.iter().any(|a| a == "--shard"),
        "the pods take their shard from JOB_COMPLETION_INDEX"
    );
    // Exclusive cores: requests = limits, whole CPUs.
    let cpus: Vec<String> = lines()
        .iter()
        .filter_map(|(_, l)| {
            l.strip_prefix("cpu: ")
                .map(|v| v.trim_matches('"').to_string())
        })
        .collect();
    assert_eq!(cpus.len(), 2, "cpu requests and limits");
    assert_eq!(cpus[0], cpus[1]);
    assert!(cpus[0].parse::<u32>().is_ok(), "whole CPUs, not millicores");
}

#[test]
fn every_pod_tunes_its_own_share_as_kubernetes_runs_it() {
    let completions: usize = scalar("completions").parse().unwrap();
    let vars = env();
    let dir = tempfile::tempdir().unwrap();
    let mut args = flow_sequence("args");
    // The volume: the pod's /results is a temporary directory here.
    let db_at = args.iter().position(|a| a == "--db").expect("--db in args") + 1;
    let base = std::path::Path::new(&args[db_at]).to_path_buf();
    assert!(
        base.is_absolute(),
        "the database lives on the mounted volume"
    );
    let local_base = dir.path().join(base.file_name().unwrap());
    args[db_at] = local_base.to_str().unwrap().to_string();
    args.push("--dry-run".into());
    if !args.iter().any(|a| a == "--json") {
        args.push("--json".into());
    }

    let run = |index: Option<usize>| -> Value {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_autokernel"));
        for v in [
            "SLURM_ARRAY_TASK_ID",
            "SLURM_ARRAY_TASK_COUNT",
            "JOB_COMPLETION_INDEX",
        ] {
            cmd.env_remove(v);
        }
        cmd.args(&args).envs(&vars);
        match index {
            Some(i) => cmd.env("JOB_COMPLETION_INDEX", i.to_string()),
            None => cmd.args(["--shard", "0/1"]),
        };
        let o = cmd.output().expect("binary runs");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).expect("one JSON object")
    };
    let names = |v: &Value| -> Vec<String> {
        v["workloads"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w.as_str().unwrap().to_string())
            .collect()
    };

    let everything: BTreeSet<String> = names(&run(None)).into_iter().collect();
    assert!(everything.len() >= completions, "every pod has work");
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut dbs = BTreeSet::new();
    for i in 0..completions {
        let p = run(Some(i));
        assert_eq!(p["shard"], format!("{i}/{completions}"));
        assert_eq!(p["shard_source"], "kubernetes");
        let db = p["db"].as_str().unwrap().to_string();
        assert_eq!(
            std::path::Path::new(&db),
            dir.path()
                .join(format!("tuning.shard-{i}-of-{completions}.db"))
        );
        dbs.insert(db);
        let mine = names(&p);
        assert!(!mine.is_empty(), "pod {i} has nothing to do");
        for w in mine {
            assert!(everything.contains(&w));
            if let Some(j) = seen.insert(w.clone(), i) {
                panic!("{w} tuned by pods {j} and {i}");
            }
        }
    }
    assert_eq!(seen.len(), everything.len(), "a workload no pod tunes");
    assert_eq!(dbs.len(), completions, "one database per pod");
}
