//! Helpers shared by the command-line integration tests: run the `autokernel` binary and read
//! what it printed. Each test crate uses a subset.
#![allow(dead_code)]

use std::process::{Command, Output};

use serde_json::Value;

/// Runs `autokernel ARGS` and waits for it.
pub fn autokernel(args: &[&str]) -> Output {
    autokernel_env(args, &[], &[])
}

/// Runs `autokernel ARGS` with `set` added to and `unset` removed from its environment.
pub fn autokernel_env(args: &[&str], set: &[(&str, &str)], unset: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_autokernel"));
    for v in unset {
        cmd.env_remove(v);
    }
    cmd.args(args).envs(set.iter().copied());
    cmd.output().expect("the autokernel binary runs")
}

/// Its standard error, as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Every line of its standard output as JSON (panics on a line that is not).
pub fn json_lines(o: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect()
}

/// [`json_lines`] of a run that must have succeeded (panics with its output otherwise).
pub fn ok_json_lines(o: &Output) -> Vec<Value> {
    assert!(
        o.status.success(),
        "autokernel failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        stderr(o)
    );
    json_lines(o)
}
