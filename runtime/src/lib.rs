//! # runtime — dispatch each call to the best tuned variant for this machine
//!
//! ```
//! use runtime::{Level, Runtime};
//!
//! // No database yet: every call is served by the kernel defaults.
//! let rt = Runtime::defaults_only();
//! let (m, n, k) = (3, 5, 4);
//! let a = vec![1.0f32; m * k];
//! let b = vec![0.5f32; k * n];
//! let mut c = vec![0.0f32; m * n];
//! let level = rt.gemm(m, n, k, &a, &b, &mut c)?;
//! assert_eq!(level, Level::Default);
//! assert!(c.iter().all(|&x| x == 2.0));
//! # Ok::<(), runtime::RuntimeError>(())
//! ```
//!
//! With a database: `Runtime::open("tuning.db")?` reads it read-only, once, and keeps an
//! in-memory index of the best verified config per workload for *this* machine's fingerprint.
//! A call is a hash probe plus a cached executable: no SQL on the hot path.
//!
//! Why it exists: inference programs link this crate, not the tuner. Its dependency tree is
//! `kernels` + `tuning_db` (rusqlite): no clap, indicatif, linfa or smartcore.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, RwLock};

use kernels::{default_for, Config, Executable, HardwareFingerprint, Kernel, Workload};
use tuning_db::{DbError, TuningDb};

/// Which source answered a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Level {
    /// A verified record for this exact workload on this exact hardware fingerprint.
    Exact,
    /// Nothing tuned: the kernel family's default config.
    Default,
}

impl Level {
    /// The name used in `--json` output.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Exact => "exact",
            Level::Default => "default",
        }
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The variant chosen for a workload.
#[derive(Clone)]
pub struct Choice {
    pub kernel: &'static dyn Kernel,
    pub config: Config,
    pub level: Level,
    exe: Arc<dyn Executable>,
}

impl std::fmt::Debug for Choice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Choice")
            .field("kernel", &self.kernel.name())
            .field("config", &self.config)
            .field("level", &self.level)
            .finish()
    }
}

impl Choice {
    /// Runs the chosen variant.
    pub fn run(&self, inputs: &[&[f32]], output: &mut [f32]) {
        self.exe.run(inputs, output)
    }
}

/// Errors of the runtime.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Kernel(#[from] kernels::Error),
    #[error("buffer '{name}' has {got} elements, {workload} needs {expected}")]
    BufferSize {
        name: &'static str,
        workload: String,
        got: usize,
        expected: usize,
    },
}

/// A skipped database record, with the reason (reported, then served by the default).
#[derive(Debug, Clone)]
pub struct Skipped {
    pub workload: String,
    pub reason: String,
}

/// The inference-side dispatcher. `Send + Sync`: share one across threads.
pub struct Runtime {
    hw: HardwareFingerprint,
    tuned: HashMap<Workload, (&'static dyn Kernel, Config)>,
    cache: RwLock<HashMap<Workload, Choice>>,
    skipped: Vec<Skipped>,
}

impl Runtime {
    /// Opens `path` read-only and indexes the best verified record of every workload tuned
    /// on this machine's fingerprint. Records whose config no longer builds are skipped (see
    /// [`Runtime::skipped`]) and those workloads fall back to defaults.
    pub fn open(path: impl AsRef<Path>) -> Result<Runtime, RuntimeError> {
        Runtime::open_for(path, HardwareFingerprint::current().clone())
    }

    /// Like [`Runtime::open`], but serves the records of fingerprint `hw` (for instance this
    /// machine at another thread count, [`HardwareFingerprint::with_cores`]).
    pub fn open_for(
        path: impl AsRef<Path>,
        hw: HardwareFingerprint,
    ) -> Result<Runtime, RuntimeError> {
        let db = TuningDb::open_read_only(path.as_ref())?;
        let mut rt = Runtime::with_fingerprint(hw);
        for rec in db.best_all(&rt.hw.id)? {
            let kernel = match kernels::kernel(&rec.kernel) {
                Ok(k) => k,
                Err(e) => {
                    rt.skipped.push(Skipped {
                        workload: rec.workload.key(),
                        reason: e.to_string(),
                    });
                    continue;
                }
            };
            match kernel.prepare(&rec.workload, &rec.config) {
                Ok(exe) => {
                    let choice = Choice {
                        kernel,
                        config: rec.config.clone(),
                        level: Level::Exact,
                        exe: exe.into(),
                    };
                    rt.cache
                        .get_mut()
                        .expect("not shared yet")
                        .insert(rec.workload, choice);
                    rt.tuned.insert(rec.workload, (kernel, rec.config));
                }
                Err(e) => rt.skipped.push(Skipped {
                    workload: rec.workload.key(),
                    reason: e.to_string(),
                }),
            }
        }
        Ok(rt)
    }

    /// A runtime with no database: every workload runs its kernel default.
    pub fn defaults_only() -> Runtime {
        Runtime::with_fingerprint(HardwareFingerprint::current().clone())
    }

    fn with_fingerprint(hw: HardwareFingerprint) -> Runtime {
        Runtime {
            hw,
            tuned: HashMap::new(),
            cache: RwLock::new(HashMap::new()),
            skipped: Vec::new(),
        }
    }

    /// The fingerprint this runtime serves.
    pub fn fingerprint(&self) -> &HardwareFingerprint {
        &self.hw
    }

    /// Number of tuned workloads in the index.
    pub fn tuned_workloads(&self) -> usize {
        self.tuned.len()
    }

    /// Records that were in the database but could not be served, with why.
    pub fn skipped(&self) -> &[Skipped] {
        &self.skipped
    }

    /// The variant that serves `w`: the tuned record if there is one, else the default.
    pub fn choose(&self, w: &Workload) -> Result<Choice, RuntimeError> {
        if let Some(c) = self.cache.read().unwrap_or_else(|p| p.into_inner()).get(w) {
            return Ok(c.clone());
        }
        let (kernel, config) = default_for(w, &self.hw);
        let exe: Arc<dyn Executable> = kernel.prepare(w, &config)?.into();
        let choice = Choice {
            kernel,
            config,
            level: Level::Default,
            exe,
        };
        let mut cache = self.cache.write().unwrap_or_else(|p| p.into_inner());
        Ok(cache.entry(*w).or_insert(choice).clone())
    }

    /// Runs `w` on `inputs` into `output` with the chosen variant; returns the level that
    /// answered. Buffer sizes are checked.
    pub fn run(
        &self,
        w: &Workload,
        inputs: &[&[f32]],
        output: &mut [f32],
    ) -> Result<Level, RuntimeError> {
        let names = ["a", "b", "c", "d"];
        for (i, (got, expected)) in inputs
            .iter()
            .map(|x| x.len())
            .zip(w.input_lens())
            .enumerate()
        {
            if got != expected {
                return Err(RuntimeError::BufferSize {
                    name: names[i],
                    workload: w.key(),
                    got,
                    expected,
                });
            }
        }
        if output.len() != w.output_len() {
            let (got, expected) = (output.len(), w.output_len());
            return Err(RuntimeError::BufferSize {
                name: "output",
                workload: w.key(),
                got,
                expected,
            });
        }
        let choice = self.choose(w)?;
        choice.run(inputs, output);
        Ok(choice.level)
    }

    /// `C = A·B` (row-major f32; A is m×k, B is k×n, C is m×n, overwritten).
    pub fn gemm(
        &self,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
        c: &mut [f32],
    ) -> Result<Level, RuntimeError> {
        let w = Workload::gemm(m, n, k)?;
        self.run(&w, &[a, b], c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Runtime>();
    }

    #[test]
    fn wrong_buffer_sizes_are_errors_not_panics() {
        let rt = Runtime::defaults_only();
        let mut c = vec![0.0; 6];
        let e = rt.gemm(2, 3, 4, &[0.0; 7], &[0.0; 12], &mut c).unwrap_err();
        assert!(
            e.to_string()
                .contains("'a' has 7 elements, gemm:2x3x4 needs 8"),
            "{e}"
        );
        let e = rt
            .gemm(2, 3, 4, &[0.0; 8], &[0.0; 12], &mut c[..5])
            .unwrap_err();
        assert!(e.to_string().contains("'output'"), "{e}");
        assert!(rt.gemm(0, 3, 4, &[], &[0.0; 12], &mut c).is_err());
    }
}
