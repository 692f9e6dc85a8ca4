//! `--device cpu|cuda:N` on `tune`, `lookup`, `run` and `bench`.
//!
//! Without a CUDA driver or device (CI, most laptops) every `cuda:N` command must stop with an
//! error naming the cause and leave the database as it was. With a GPU, the same commands run
//! a small real job on it instead.

use std::path::Path;

mod common;
use common::{autokernel, json_lines, stderr};

/// A small CPU-tuned database to point the commands at.
fn cpu_db(dir: &Path) -> String {
    let db = dir.join("t.db").display().to_string();
    let o = autokernel(&[
        "tune",
        "--workload",
        "gemm:24x20x16",
        "--budget",
        "3",
        "--isolation",
        "none",
        "--finalists",
        "0",
        "--db",
        &db,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    db
}

#[test]
fn a_bad_device_string_is_refused_by_every_command() {
    for cmd in ["tune", "lookup", "run", "bench"] {
        let o = autokernel(&[cmd, "--device", "gpu0", "--workload", "gemm:8x8x8"]);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(
            e.contains("bad device 'gpu0'") && e.contains("cuda:N"),
            "{cmd}: {e}"
        );
    }
}

#[test]
fn cpu_is_the_default_device() {
    let dir = tempfile::tempdir().unwrap();
    let db = cpu_db(dir.path());
    let plain = autokernel(&[
        "lookup",
        "--workload",
        "gemm:24x20x16",
        "--json",
        "--db",
        &db,
    ]);
    let cpu = autokernel(&[
        "lookup",
        "--workload",
        "gemm:24x20x16",
        "--json",
        "--db",
        &db,
        "--device",
        "cpu",
    ]);
    assert!(plain.status.success() && cpu.status.success());
    assert_eq!(json_lines(&plain), json_lines(&cpu));
    assert_eq!(json_lines(&cpu)[0]["level"], "exact");
}

#[test]
fn cuda_without_a_gpu_is_a_clear_error_that_changes_nothing() {
    if let Ok(gpu) = kernels::cuda::Gpu::open(0) {
        println!(
            "skipping: this machine has a GPU ({}); gpu_commands_run_a_real_job covers it",
            gpu.fingerprint().summary()
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = cpu_db(dir.path());
    let before = std::fs::read(&db).unwrap();
    for args in [
        vec!["tune", "--workload", "gemm:64x64x64", "--budget", "2"],
        vec!["lookup", "--workload", "gemm:24x20x16"],
        vec!["run", "--workload", "gemm:24x20x16"],
        vec!["bench", "--workload", "gemm:24x20x16", "--quick"],
    ] {
        let mut args = args.clone();
        args.extend(["--device", "cuda:0", "--db", &db]);
        let o = autokernel(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(
            e.contains("--device cuda:0 cannot be used"),
            "{args:?}: {e}"
        );
        assert!(
            e.contains("no CUDA driver") || e.contains("no CUDA device"),
            "{args:?}: the cause is named: {e}"
        );
        assert!(!e.contains("panicked"), "{e}");
    }
    assert_eq!(
        std::fs::read(&db).unwrap(),
        before,
        "the database is untouched"
    );
    let fresh = dir.path().join("fresh.db");
    let o = autokernel(&[
        "tune",
        "--workload",
        "attention:1x1x64x32",
        "--device",
        "cuda:3",
        "--db",
        fresh.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        !fresh.exists(),
        "no database is created for a job that cannot run"
    );
}

#[test]
fn ops_without_a_cuda_family_are_named() {
    let o = autokernel(&[
        "tune",
        "--workload",
        "gemm_bias_gelu:64x64x64",
        "--device",
        "cuda:0",
        "--db",
        "/nonexistent/never.db",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("gemm_bias_gelu") && e.contains("--device cpu"),
        "{e}"
    );
}

#[test]
fn gpu_commands_run_a_real_job() {
    let gpu = match kernels::cuda::Gpu::open(0) {
        Ok(gpu) => gpu,
        Err(e) => {
            println!("skipping: no CUDA device ({e})");
            return;
        }
    };
    if let Err(e) = kernels::cuda::nvrtc_version() {
        println!("skipping: a GPU but no NVRTC ({e})");
        return;
    }
    let hw = gpu.fingerprint().hardware();
    drop(gpu);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("g.db").display().to_string();
    let w = "gemm:256x192x128";
    let o = autokernel(&[
        "tune",
        "--device",
        "cuda:0",
        "--workload",
        w,
        "--budget",
        "4",
        "--json",
        "--db",
        &db,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let t = &json_lines(&o)[0];
    assert_eq!(t["fingerprint"], hw.id.as_str());
    assert_eq!(t["kernel"], "cuda_gemm_f32");
    let o = autokernel(&[
        "lookup",
        "--device",
        "cuda:0",
        "--workload",
        w,
        "--json",
        "--db",
        &db,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(json_lines(&o)[0]["level"], "exact");
    let o = autokernel(&[
        "run",
        "--device",
        "cuda:0",
        "--workload",
        w,
        "--json",
        "--db",
        &db,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(json_lines(&o)[0]["gflops"].as_f64().unwrap() > 0.0);
    let o = autokernel(&[
        "bench",
        "--device",
        "cuda:0",
        "--workload",
        w,
        "--quick",
        "--rounds",
        "2",
        "--db",
        &db,
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
}
