//! The Python package's tests (`python/tests/`, pytest), run by `cargo test --workspace`.
//!
//! Builds the extension module with maturin (debug profile, this workspace's target folder),
//! installs the wheel into a folder of its own under the target folder (never into the
//! interpreter's site-packages) and runs pytest on it. The interpreter is `$AUTOKERNEL_PYTHON`
//! (`.ci/run` points it at a virtual environment with maturin, pytest, numpy, torch and
//! transformers), else `python3`. Without maturin, pytest or numpy the test fails in CI (`CI`
//! set) and is skipped loudly elsewhere; the PyTorch tests skip themselves without torch
//! outside CI.

use std::path::{Path, PathBuf};
use std::process::Command;

fn python() -> String {
    std::env::var("AUTOKERNEL_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// What the interpreter lacks of maturin, pytest and numpy (empty: nothing).
fn missing(py: &str) -> Vec<&'static str> {
    ["maturin", "pytest", "numpy"]
        .into_iter()
        .filter(|m| {
            !Command::new(py)
                .args(["-c", &format!("import {m}")])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .collect()
}

fn run(cmd: &mut Command, what: &str) {
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    assert!(status.success(), "{what} failed: {status}");
}

/// Builds the wheel and installs it into `site`; returns `site`.
fn install(py: &str, root: &Path, scratch: &Path) -> PathBuf {
    let wheels = scratch.join("wheels");
    let site = scratch.join("site");
    let _ = std::fs::remove_dir_all(&wheels);
    run(
        Command::new(py)
            .args([
                "-m",
                "maturin",
                "build",
                "--profile",
                "dev",
                "--quiet",
                "-i",
                py,
            ])
            .arg("-m")
            .arg(root.join("python/Cargo.toml"))
            .arg("--out")
            .arg(&wheels)
            .env("CARGO_TARGET_DIR", root.join("target")),
        "maturin build",
    );
    let wheel = std::fs::read_dir(&wheels)
        .expect("maturin's output folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .expect("maturin built no wheel");
    let _ = std::fs::remove_dir_all(&site);
    run(
        Command::new(py)
            .args(["-m", "pip", "install", "--quiet", "--no-deps", "--no-index"])
            .arg("--target")
            .arg(&site)
            .arg(&wheel),
        "pip install of the wheel",
    );
    site
}

#[test]
fn python_package_tests() {
    let py = python();
    let lacks = missing(&py);
    if !lacks.is_empty() {
        let msg = format!(
            "{py} lacks {} (set AUTOKERNEL_PYTHON to an interpreter with maturin, pytest, numpy; \
             torch and transformers for the PyTorch tests)",
            lacks.join(", ")
        );
        assert!(std::env::var_os("CI").is_none(), "in CI: {msg}");
        eprintln!("SKIPPING the Python tests: {msg}");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let scratch = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pyext");
    let site = install(&py, root, &scratch);
    run(
        Command::new(&py)
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
            .arg(root.join("python/tests"))
            .env("PYTHONPATH", &site)
            .current_dir(&scratch),
        "pytest python/tests",
    );
}
