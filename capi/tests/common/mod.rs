//! What the example tests share: small tuned databases made with the library APIs, the
//! system C and C++ compilers, and the built library.

#![allow(dead_code)] // each test binary uses its own part

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kernels::{default_for, Config, HardwareFingerprint, Measurement, Workload};
use tuning_db::{Record, TuningDb};

/// The `pick`-th valid single-thread config of `w`'s default family on this machine that is
/// not its default (so a database of pick 0 and one of pick 1 serve different configs).
pub fn tuned_config(w: &Workload, pick: usize) -> (&'static str, Config) {
    let hw = HardwareFingerprint::current();
    let (k, default) = default_for(w, hw).expect("a family serves the workload");
    let config = k
        .space(w, hw)
        .iter_valid()
        .filter(|c| *c != default && c.int("threads").is_none_or(|t| t == 1))
        .nth(pick)
        .unwrap_or_else(|| panic!("{w}: fewer than {} tuned configs", pick + 1));
    (k.name(), config)
}

/// Writes a database at `path` with one verified record per workload on this machine (the
/// fingerprint a runtime opened with `threads = 0` serves): config `tuned_config(w, pick)`.
/// Returns the configs by workload key.
pub fn tuned_db(path: &Path, workloads: &[&str], pick: usize) -> Vec<(String, Config)> {
    let hw = HardwareFingerprint::current();
    let mut configs = Vec::new();
    let records: Vec<Record> = workloads
        .iter()
        .map(|text| {
            let w: Workload = text.parse().expect("a workload");
            let (name, config) = tuned_config(&w, pick);
            let k = kernels::kernel(name).expect("a registered kernel");
            configs.push((w.key(), config.clone()));
            let median = 1e-5;
            Record::ok(
                &hw.id,
                w,
                k.name(),
                k.version(),
                config,
                Measurement::from_samples(vec![median * 1.01, median, median * 0.99]),
                "capi test",
            )
        })
        .collect();
    let db = TuningDb::open(path).expect("creating the test database");
    db.upsert_fingerprint(hw).expect("storing the fingerprint");
    db.insert_many(&records).expect("storing the records");
    configs
}

/// The directory holding libautokernel.so and libautokernel.a: where `cargo test` writes
/// them, beside this test binary (`target/<profile>/deps`), or the profile directory that
/// `cargo build` copies them to; so it follows `CARGO_TARGET_DIR` and the profile.
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("target/<profile>/deps").to_path_buf();
    let has_both = |d: &Path| {
        ["libautokernel.so", "libautokernel.a"]
            .iter()
            .all(|l| d.join(l).is_file())
    };
    let candidates = [
        deps.clone(),
        deps.parent().map(Path::to_path_buf).unwrap_or_default(),
    ];
    candidates
        .into_iter()
        .find(|d| has_both(d))
        .unwrap_or_else(|| {
            panic!(
                "libautokernel.so / .a are missing from {} and its parent: build the crate \
                 (cargo build -p autokernel_capi)",
                deps.display()
            )
        })
}

/// The capi crate's directory (examples/, include/).
pub fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A system compiler: `$CC`/`$CXX` or `cc`/`c++`, if it runs. Without one the test fails
/// under CI (`CI` set) and is skipped with a loud message otherwise.
pub fn compiler(cxx: bool) -> Option<String> {
    let (var, default) = if cxx { ("CXX", "c++") } else { ("CC", "cc") };
    let name = std::env::var(var).unwrap_or_else(|_| default.into());
    let works = Command::new(&name)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if works {
        return Some(name);
    }
    let msg = format!("no working {var} compiler ('{name}'): the C/C++ example tests cannot run");
    if std::env::var_os("CI").is_some() {
        panic!("{msg} (CI has one: install gcc/g++)");
    }
    eprintln!("\n!!!!!!!! SKIPPED: {msg} !!!!!!!!\n");
    None
}

/// How an example is linked against the library.
#[derive(Clone, Copy, Debug)]
pub enum Link {
    /// libautokernel.so, found at run time through an rpath.
    Shared,
    /// libautokernel.a and the system libraries Rust's std needs.
    Static,
}

/// Compiles `capi/examples/<source>` into `out` with warnings as errors.
pub fn build_example(compiler: &str, source: &str, out: &Path, link: Link) {
    let cxx = source.ends_with(".cpp");
    let lib = lib_dir();
    let mut cmd = Command::new(compiler);
    cmd.args(if cxx { ["-std=c++17"] } else { ["-std=c11"] })
        .args(["-Wall", "-Wextra", "-Werror", "-O2", "-pthread", "-I"])
        .arg(crate_dir().join("include"))
        .arg(crate_dir().join("examples").join(source))
        .arg("-o")
        .arg(out);
    match link {
        Link::Shared => {
            cmd.arg("-L")
                .arg(&lib)
                .arg("-lautokernel")
                .arg(format!("-Wl,-rpath,{}", lib.display()));
        }
        Link::Static => {
            cmd.arg(lib.join("libautokernel.a")).args([
                "-lpthread",
                "-ldl",
                "-lrt",
                "-lgcc_s",
                "-lc",
            ]);
        }
    }
    cmd.arg("-lm");
    let o = cmd.output().expect("running the compiler");
    assert!(
        o.status.success(),
        "{cmd:?} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Runs a built example; panics with its output unless it exits 0. Returns its stdout.
pub fn run_example<S: AsRef<OsStr>>(exe: &Path, args: impl IntoIterator<Item = S>) -> String {
    // `cargo test` puts the profile directory on LD_LIBRARY_PATH, which outranks the rpath:
    // a libautokernel.so an earlier `cargo build` left there would be loaded instead of the
    // one the example was linked against.
    let mut path = std::env::split_paths(&std::env::var_os("LD_LIBRARY_PATH").unwrap_or_default())
        .collect::<Vec<_>>();
    path.insert(0, lib_dir());
    let o: Output = Command::new(exe)
        .args(args)
        .env(
            "LD_LIBRARY_PATH",
            std::env::join_paths(path).expect("paths without ':'"),
        )
        .env_remove("AUTOKERNEL_UNTUNED_LOG")
        .output()
        .expect("running the example");
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{} exited with {}\nstdout:\n{stdout}\nstderr:\n{}",
        exe.display(),
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}
