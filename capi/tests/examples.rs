//! The C and C++ examples, compiled with the system compilers against the built library
//! and run: `gemm.c` (shared and static library), `linear.cpp`, and the load test
//! `serve_load.c` (8 threads serving while the database is replaced and reloaded).

mod common;

use common::{build_example, compiler, run_example, tuned_db, Link};
use serde_json::Value;

/// The lines of `stdout` after `prefix`, parsed as JSON.
fn json_lines(stdout: &str, prefix: &str) -> Vec<Value> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .map(|j| serde_json::from_str(j).unwrap_or_else(|e| panic!("{e}: {j}")))
        .collect()
}

#[test]
fn gemm_c_runs_with_the_shared_and_the_static_library() {
    let Some(cc) = compiler(false) else { return };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tuned.db");
    let configs = tuned_db(&db, &["gemm:64x48x80"], 0);
    for link in [Link::Shared, Link::Static] {
        let exe = dir.path().join(format!("gemm-{link:?}"));
        build_example(&cc, "gemm.c", &exe, link);

        let out = run_example(&exe, [&db]);
        assert!(out.contains("gemm 64x48x80 ok (level 0)"), "{out}");
        let lookup = &json_lines(&out, "lookup: ")[0];
        assert_eq!(lookup["level"], "exact", "{out}");
        assert_eq!(
            lookup["config"],
            serde_json::to_value(&configs[0].1).unwrap()
        );
        assert!(
            out.contains("short output: AUTOKERNEL_SHAPE: buffer 'c' has 3071 elements"),
            "{out}"
        );
        assert!(
            out.contains("bad workload: AUTOKERNEL_INVALID_ARGUMENT: bad workload 'gemm:0x1x1'"),
            "{out}"
        );
        assert!(
            out.contains("lookups: exact 2, same_arch 0, nearest_shape 0, default 0"),
            "{out}"
        );

        // No database: kernel defaults.
        let out = run_example(&exe, Vec::<&str>::new());
        assert!(out.contains("gemm 64x48x80 ok (level 3)"), "{out}");
        assert_eq!(json_lines(&out, "lookup: ")[0]["level"], "default");
    }
}

#[test]
fn linear_cpp_wraps_the_abi_in_raii_and_exceptions() {
    let Some(cxx) = compiler(true) else { return };
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("linear");
    build_example(&cxx, "linear.cpp", &exe, Link::Shared);
    let out = run_example(&exe, Vec::<&str>::new());
    for m in [1, 16, 5, 40] {
        assert!(
            out.contains(&format!("linear m={m} n=96 k=72 gelu ok")),
            "{out}"
        );
    }
    assert!(
        json_lines(&out, "lookup: ")[0]["kernel"].is_string(),
        "{out}"
    );
    let weight = &json_lines(&out, "weight: ")[0];
    assert_eq!(weight["workload"], "gemm_bias_gelu:1x96x72", "{out}");
    assert!(weight["bytes"].as_u64().unwrap() >= 4 * 96 * 72, "{out}");
    assert!(
        out.contains("caught: AUTOKERNEL_SHAPE: 'a' has 217 elements"),
        "{out}"
    );
}

/// The workloads serve_load.c runs (both databases tune them), then the one only the
/// second database has.
const SERVED: [&str; 9] = [
    "gemm:16x24x32",
    "gemm:33x17x29",
    "gemm:64x64x64",
    "gemm_bias_relu:4x48x40",
    "gemm_bias_relu:16x48x40",
    "gemm_bias_gelu:4x64x32",
    "gemm_bias_gelu:16x64x32",
    "attention:1x2x16x8",
    "attention:2x1x12x16:causal",
];
const ONLY_IN_B: &str = "gemm:40x40x40";

#[test]
fn serving_under_load_while_the_database_is_replaced_and_reloaded() {
    let Some(cc) = compiler(false) else { return };
    let dir = tempfile::tempdir().unwrap();
    let (db_a, db_b, live) = (
        dir.path().join("a.db"),
        dir.path().join("b.db"),
        dir.path().join("live.db"),
    );
    let configs_a = tuned_db(&db_a, &SERVED, 0);
    let mut in_b = SERVED.to_vec();
    in_b.push(ONLY_IN_B);
    let configs_b = tuned_db(&db_b, &in_b, 1);
    for ((w, a), (_, b)) in configs_a.iter().zip(&configs_b) {
        assert_ne!(a, b, "{w}: the two databases must serve different configs");
    }
    let exe = dir.path().join("serve_load");
    build_example(&cc, "serve_load.c", &exe, Link::Shared);

    let (seconds, reloads) = ("3", "6");
    let args = [live.as_os_str(), db_a.as_os_str(), db_b.as_os_str()];
    let out = run_example(
        &exe,
        args.iter()
            .copied()
            .chain([seconds.as_ref(), reloads.as_ref()]),
    );

    let summary = out.lines().find(|l| l.starts_with("served ")).expect(&out);
    let counts: Vec<u64> = summary
        .split_whitespace()
        .filter_map(|t| t.parse().ok())
        .collect();
    assert!(
        counts[..3].iter().all(|&n| n > 0),
        "every op ran: {summary}"
    );
    assert!(
        summary.ends_with("on 8 threads with 6 reloads, all verified"),
        "{summary}"
    );
    let finals = json_lines(&out, "final lookup: ");
    assert_eq!(finals.len(), in_b.len(), "{out}");
    for (got, (w, config)) in finals.iter().zip(&configs_b) {
        assert_eq!(got["workload"], w.as_str());
        assert_eq!(got["level"], "exact", "{w}");
        assert_eq!(
            got["config"],
            serde_json::to_value(config).unwrap(),
            "{w}: the new file's record"
        );
    }
}
