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
//! assert_eq!(rt.lookups().levels.default, 1);
//! # Ok::<(), runtime::RuntimeError>(())
//! ```
//!
//! With a database: `Runtime::open("tuning.db")?` reads it read-only, once, and keeps an
//! in-memory index for *this* machine. Every lookup says which level answered ([`Level`]):
//!
//! 1. `exact` — the best verified record of this workload on this exact hardware fingerprint;
//! 2. `same_arch` — a record of another fingerprint with the same micro-architecture and ISA
//!    ([`kernels::HardwareFingerprint::arch_key`]: same vendor, family, model and ISA flags;
//!    any core count or cache size), the closest core count first;
//! 3. `nearest_shape` — the workload was never tuned: the tuned shape of the same op nearest
//!    in log space ([`distance`]: Euclidean over log2 of the dimensions) whose config is valid
//!    for the new shape and expected to beat the default there: within
//!    [`NEAREST_MAX_DISTANCE`], with the default's thread count, and — the first-use check,
//!    on unless [`FALLBACK_CHECK_ENV`]`=0` or [`Runtime::set_fallback_check`] turns it off —
//!    timed at least as fast as the default on the new shape (up to
//!    [`probe::CHECK_MAX_FLOPS`]; larger untuned shapes get the default). A borrowed config
//!    is never slower than not having tuned at all;
//! 4. `default` — the kernel family's default config, valid for every shape.
//!
//! Records of another micro-architecture are never served, and a record is only served if
//! its config passes this machine's space check and builds; those that do not are listed by
//! [`Runtime::skipped`] and their workloads fall through to the next level.
//!
//! A lookup of a workload seen before is one probe of a hash table keyed by the workload
//! packed into 128 bits, through this thread's handle on the index in service: no SQL, no
//! lock, no allocation, no read-modify-write (counters are per-thread shards). The first
//! lookup of an untuned shape resolves it once (nearest tuned shape of the same op whose
//! config passes [`kernels::Kernel::config_fits`], without building a `Space`) and caches
//! the result in the same table, so a repeated miss costs what a hit costs.
//! [`Runtime::reload`] swaps in a newer database atomically while other threads
//! keep serving. [`Runtime::lookups`] counts lookups by level, and
//! [`Runtime::log_fallbacks_to`] (or the `AUTOKERNEL_UNTUNED_LOG` environment variable)
//! appends every distinct workload served by a fallback level to a file, the input of
//! `autokernel tune --workloads-from FILE`.
//!
//! Besides [`Runtime::gemm`] and the generic [`Runtime::run`]: [`Runtime::attention`],
//! [`Runtime::gemm_bias_act`], and constant weights packed once with
//! [`Runtime::pack_weight`] for [`Runtime::gemm_bias_act_packed`] (see the `ops` module);
//! a transformer layer's glue in the GEMMs' row layout: [`Runtime::attention_qkv`]
//! (attention straight from a fused QKV projection's rows) and [`add_layer_norm`], and a
//! whole BERT encoder layer in one call ([`EncoderLayer`]).
//! [`Runtime::lookup_json`] describes a lookup as `autokernel lookup --json` prints it.
//!
//! Why it exists: inference programs link this crate, not the tuner. Its dependency tree is
//! `kernels` + `tuning_db` (rusqlite) + `arc-swap` + `serde_json` + `rayon`: no clap, indicatif, linfa or smartcore.
#![warn(missing_docs)]

mod counters;
mod encoder;
mod fallback_log;
mod hash;
mod index;
mod json;
mod layer;
mod ops;
mod precision;
pub mod probe;
mod threads;

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use arc_swap::ArcSwap;
use kernels::cpu::attention::layout::run_via_heads;
use kernels::{Config, DType, Executable, HardwareFingerprint, Kernel, Workload};
use tuning_db::DbError;

pub use counters::{LevelCounts, LookupCounts};
pub use encoder::{EncoderLayer, LayerScratch, Projection, Stage};
pub use fallback_log::{parse_lines as parse_workload_list, BadLine};
pub use index::{distance, IndexInfo, MISS_CACHE_CAPACITY, NEAREST_MAX_DISTANCE};
pub use layer::{add_layer_norm, AttentionRows};
pub use ops::{row_blocks, sequence_blocks, PackedWeight};
pub use precision::{BadBudget, PrecisionPolicy, UnknownPrecision, DEFAULT_AUTO_MAX_REL_ERR};
pub use threads::{Threads, ThreadsError};

use counters::Counters;
use fallback_log::FallbackLog;
use hash::Key;
use index::Index;

/// The environment variable that turns on the untuned-workload log for every
/// [`Runtime::open`]: the path of the file to append to.
pub const UNTUNED_LOG_ENV: &str = "AUTOKERNEL_UNTUNED_LOG";

/// The environment variable that, set to `0` (or `false`/`off`/`no`), turns the first-use
/// check of borrowed configs off for every runtime the process opens
/// ([`Runtime::set_fallback_check`]); `1`/`true`/`on`/`yes` keeps it on, anything else makes
/// [`Runtime::open`] fail.
pub const FALLBACK_CHECK_ENV: &str = "AUTOKERNEL_FALLBACK_CHECK";

/// Which level answered a lookup (see the crate documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    /// A verified record for this exact workload on this exact hardware fingerprint.
    Exact = 0,
    /// A verified record for this workload from a machine of the same micro-architecture and
    /// ISA (another core count or cache size).
    SameArch = 1,
    /// The config of the nearest tuned shape of the same op that is valid for this one.
    NearestShape = 2,
    /// Nothing usable tuned: the kernel family's default config.
    Default = 3,
}

impl Level {
    /// Every level, in fallback order.
    pub const ALL: [Level; 4] = [
        Level::Exact,
        Level::SameArch,
        Level::NearestShape,
        Level::Default,
    ];

    /// The name used in `--json` output: `exact`, `same_arch`, `nearest_shape`, `default`.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Exact => "exact",
            Level::SameArch => "same_arch",
            Level::NearestShape => "nearest_shape",
            Level::Default => "default",
        }
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a tuned choice comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct Source {
    /// The workload the record was measured on (another shape for `nearest_shape`).
    pub workload: Workload,
    /// The fingerprint it was measured on.
    pub fingerprint_id: String,
    /// Its row id in the database.
    pub trial_id: Option<i64>,
    /// Its measured median, seconds (for its own workload): for its workload's winner, the
    /// median in its shape's latest side-by-side set of precisions, or else the re-measured
    /// median of the decision that made it the winner
    /// ([`tuning_db::TuningDb::remeasured_medians`]); otherwise its search median.
    pub median_s: Option<f64>,
    /// Which of those [`median_s`](Self::median_s) is (`None` without a median).
    pub median_from: Option<MedianFrom>,
    /// Its error against the exact f32 problem, as stored (schema v4; `None` before).
    pub accuracy: Option<kernels::Accuracy>,
    /// Nearest-shape distance to the served workload ([`distance`]); 0 otherwise.
    pub distance: f64,
}

/// Where a [`Source::median_s`] was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MedianFrom {
    /// The shape's precisions' winners re-measured together, in the same rounds (on the
    /// record's own fingerprint: a same-arch record's set was timed on that machine).
    SideBySide,
    /// The interleaved re-measurement of the decision that made it the winner.
    Decision,
    /// The search's own timing of the trial.
    Search,
}

impl MedianFrom {
    /// Its name in `lookup --json`: `side_by_side`, `decision`, `search`.
    pub fn as_str(self) -> &'static str {
        match self {
            MedianFrom::SideBySide => "side_by_side",
            MedianFrom::Decision => "decision",
            MedianFrom::Search => "search",
        }
    }
}

/// The variant chosen for a workload.
///
/// Its public fields describe the choice; the variant itself was built when the choice was
/// made, so changing them changes what is reported, not what runs.
pub struct Choice {
    /// The kernel family that serves the workload.
    pub kernel: &'static dyn Kernel,
    /// The family's config (knob values) it was built with.
    pub config: Config,
    /// The lookup level that answered.
    pub level: Level,
    /// The record behind it; `None` for `default`.
    pub source: Option<Source>,
    /// `None` for a device family (served by lookup; run through a device session).
    exe: Option<Arc<dyn Executable>>,
    /// The workload it was prepared for.
    workload: Workload,
    /// Buffer lengths of the workload it was prepared for (checked by `Runtime::run`).
    input_lens: Box<[usize]>,
    output_len: usize,
    /// Whether the fallback log has this choice already.
    logged: AtomicBool,
}

impl Clone for Choice {
    fn clone(&self) -> Self {
        Choice {
            kernel: self.kernel,
            config: self.config.clone(),
            level: self.level,
            source: self.source.clone(),
            exe: self.exe.clone(),
            workload: self.workload,
            input_lens: self.input_lens.clone(),
            output_len: self.output_len,
            logged: AtomicBool::new(self.logged.load(Ordering::Relaxed)),
        }
    }
}

impl std::fmt::Debug for Choice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Choice")
            .field("kernel", &self.kernel.name())
            .field("config", &self.config)
            .field("level", &self.level)
            .field("source", &self.source)
            .finish()
    }
}

impl Choice {
    pub(crate) fn new(
        w: &Workload,
        kernel: &'static dyn Kernel,
        config: Config,
        level: Level,
        source: Option<Source>,
        exe: Option<Arc<dyn Executable>>,
    ) -> Choice {
        Choice {
            kernel,
            config,
            level,
            source,
            exe,
            workload: *w,
            input_lens: w.input_lens().into(),
            output_len: w.output_len(),
            logged: AtomicBool::new(false),
        }
    }

    /// Runs the chosen variant (buffer sizes as for [`Executable::run`]). A CUDA family's
    /// choice has no host executable (it runs through a device session): an error.
    pub fn run(&self, inputs: &[&[f32]], output: &mut [f32]) -> Result<(), RuntimeError> {
        Ok(self.host()?.run_f32(inputs, output)?)
    }

    /// Runs the chosen variant on typed operands ([`Executable::run`]: e.g. attention's
    /// optional key lengths). A CUDA family's choice has no host executable: an error.
    pub fn run_operands(
        &self,
        inputs: &[kernels::Operand<'_>],
        output: kernels::OperandMut<'_>,
    ) -> Result<(), RuntimeError> {
        Ok(self.host()?.run(inputs, output)?)
    }

    /// Runs the chosen attention variant over a fused QKV projection's rows
    /// ([`Executable::run_qkv_rows`]), read in place where the variant can, else through
    /// `[B, H, S, D]` copies ([`run_via_heads`]).
    pub fn run_qkv_rows(
        &self,
        (qkv, key_lens): (&[f32], Option<&[i32]>),
        out: &mut [f32],
    ) -> Result<(), RuntimeError> {
        let exe = self.host()?;
        match exe.run_qkv_rows(qkv, key_lens, out) {
            Some(done) => Ok(done?),
            None => Ok(run_via_heads(exe, &self.workload, (qkv, key_lens), out)?),
        }
    }

    /// The host executable, or the error a device (CUDA) family's choice gives on the host.
    fn host(&self) -> Result<&dyn Executable, RuntimeError> {
        self.exe.as_deref().ok_or_else(|| {
            RuntimeError::Kernel(kernels::Error::DeviceOnly {
                kernel: self.kernel.name().into(),
                workload: self.workload.key(),
            })
        })
    }

    /// The host executable of the choice; `None` for a device (CUDA) family.
    pub fn executable(&self) -> Option<&dyn Executable> {
        self.exe.as_deref()
    }
}

/// Errors of the runtime.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The tuning database could not be opened, read or reloaded (a missing, corrupt or
    /// foreign file, a newer schema).
    #[error(transparent)]
    Db(#[from] DbError),
    /// The kernel refused the call or could not be built: a malformed workload, a wrong
    /// operand, a config that does not fit, memory that could not be allocated.
    #[error(transparent)]
    Kernel(#[from] kernels::Error),
    /// A buffer's length does not match the workload's.
    #[error("buffer '{name}' has {got} elements, {workload} needs {expected}")]
    BufferSize {
        /// The buffer, as the workload names its operands (`a`, `b`, `bias`, `c`, `q`,
        /// ...); `inputs` when the number of input buffers is wrong (then `got` and
        /// `expected` count buffers).
        name: &'static str,
        /// The workload's key, or what else describes the call.
        workload: String,
        /// Elements given.
        got: usize,
        /// Elements the call needs.
        expected: usize,
    },
    /// The untuned-workload log could not be opened or written.
    #[error("untuned-workload log {}: {context}: {cause}", .path.display())]
    FallbackLog {
        /// The log file.
        path: PathBuf,
        /// What was being done (`opening for appending`, `reading its size`, ...).
        context: String,
        /// The I/O error.
        cause: std::io::Error,
    },
    /// A runtime logs untuned workloads to one file, set once.
    #[error("the untuned-workload log is already {}", .path.display())]
    FallbackLogAlreadySet {
        /// The log already in use.
        path: PathBuf,
    },
    /// [`Runtime::reload`] on a runtime made with [`Runtime::defaults_only`].
    #[error("this runtime has no database to reload (it was made with defaults_only)")]
    NoDatabase,
    /// An encoder layer's weights or buffers do not fit together (a projection of the wrong
    /// shape, a bias or LayerNorm of the wrong length, heads that do not split the width).
    #[error("encoder layer: {reason}")]
    Layer {
        /// What does not fit, naming the tensor.
        reason: String,
    },
    /// A scalar argument outside its domain (a LayerNorm epsilon that is not a positive
    /// finite number).
    #[error("argument '{name}': {reason}")]
    Argument {
        /// The argument.
        name: &'static str,
        /// Why its value is refused.
        reason: String,
    },
    /// An environment variable the runtime reads holds a value it does not understand.
    #[error("environment variable {name}={value:?}: {reason}")]
    Env {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What it should hold.
        reason: &'static str,
    },
}

/// An on/off environment switch: `1`/`true`/`on`/`yes` or `0`/`false`/`off`/`no` (any case,
/// surrounding blanks ignored); anything else is an error rather than a silent guess.
fn parse_switch(name: &'static str, value: &std::ffi::OsStr) -> Result<bool, RuntimeError> {
    let text = value.to_string_lossy();
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Ok(true),
        "0" | "false" | "off" | "no" => Ok(false),
        _ => Err(RuntimeError::Env {
            name,
            value: text.into_owned(),
            reason: "expected 1/true/on/yes or 0/false/off/no",
        }),
    }
}

/// A skipped database record, with the reason (reported, then served by the next level).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The record's workload key.
    pub workload: String,
    /// Why it is not served (a kernel version no longer built, a config that no longer
    /// fits, records gone stale, ...).
    pub reason: String,
}

/// The inference-side dispatcher. `Send + Sync`: share one across threads.
pub struct Runtime {
    hw: HardwareFingerprint,
    path: Option<PathBuf>,
    index: ArcSwap<Index>,
    /// `uid` of the index in `index`, stored after it (see [`Runtime::hit`]).
    uid: AtomicU64,
    /// This runtime's slot in each thread's [`Local::indexes`].
    slot: usize,
    counters: Counters,
    log: OnceLock<FallbackLog>,
    load_error: Mutex<Option<String>>,
    /// Why an environment setting was not applied (see [`Runtime::settings_error`]).
    settings_error: Option<String>,
    reload_lock: Mutex<()>,
    generation: AtomicU64,
    /// Whether a borrowed config is timed against the default before it is served.
    fallback_check: AtomicBool,
    /// Which element types f32 calls may be served in.
    precision: ArcSwap<PrecisionPolicy>,
}

impl Runtime {
    /// Opens `path` read-only and indexes it for this machine's fingerprint (see the crate
    /// documentation for the levels). Honours [`UNTUNED_LOG_ENV`].
    pub fn open(path: impl AsRef<Path>) -> Result<Runtime, RuntimeError> {
        Runtime::open_for(path, HardwareFingerprint::current().clone())
    }

    /// Like [`Runtime::open`], but serves fingerprint `hw` (for instance this machine at
    /// another thread count, [`HardwareFingerprint::with_cores`]).
    pub fn open_for(
        path: impl AsRef<Path>,
        hw: HardwareFingerprint,
    ) -> Result<Runtime, RuntimeError> {
        let path = path.as_ref();
        let idx = Index::load(path, &hw, 1)?;
        let rt = Runtime::with_index(hw, Some(path.to_path_buf()), idx);
        rt.settings_from_env()?;
        Ok(rt)
    }

    /// Like [`Runtime::open`], but never fails on the database: a missing, damaged, foreign
    /// or newer file leaves a runtime serving kernel defaults, with the reason in
    /// [`Runtime::load_error`]; a later [`Runtime::reload`] picks the file up once it is good.
    /// Nor does it fail on an invalid environment setting: see [`Runtime::with_env_settings`].
    pub fn open_or_defaults(path: impl AsRef<Path>) -> Runtime {
        Runtime::open_or_defaults_for(path, HardwareFingerprint::current().clone())
    }

    /// Like [`Runtime::open_or_defaults`], but serves fingerprint `hw` (as
    /// [`Runtime::open_for`] does).
    pub fn open_or_defaults_for(path: impl AsRef<Path>, hw: HardwareFingerprint) -> Runtime {
        let path = path.as_ref();
        let (idx, err) = match Index::load(path, &hw, 1) {
            Ok(idx) => (idx, None),
            Err(e) => (Index::empty(1), Some(e.to_string())),
        };
        let rt = Runtime::with_index(hw, Some(path.to_path_buf()), idx);
        *rt.load_error.lock().unwrap_or_else(|p| p.into_inner()) = err;
        rt.with_env_settings()
    }

    /// A runtime with no database: every workload runs its kernel default.
    pub fn defaults_only() -> Runtime {
        Runtime::defaults_only_for(HardwareFingerprint::current().clone())
    }

    /// Like [`Runtime::defaults_only`], for fingerprint `hw` (its thread count sizes the
    /// defaults).
    pub fn defaults_only_for(hw: HardwareFingerprint) -> Runtime {
        Runtime::with_index(hw, None, Index::empty(1))
    }

    /// This runtime with the environment's settings applied, as [`Runtime::open`] applies
    /// them, but never failing: a setting that is invalid is left at its default and
    /// reported by [`Runtime::settings_error`]. What the Python package and the C ABI make
    /// of a runtime with no database (`Runtime::defaults_only_for(hw).with_env_settings()`);
    /// [`Runtime::open_or_defaults`] does it too.
    pub fn with_env_settings(mut self) -> Runtime {
        self.settings_error = self.settings_from_env().err().map(|e| e.to_string());
        self
    }

    fn with_index(hw: HardwareFingerprint, path: Option<PathBuf>, idx: Index) -> Runtime {
        static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);
        Runtime {
            hw,
            path,
            uid: AtomicU64::new(idx.uid),
            slot: NEXT_SLOT.fetch_add(1, Ordering::Relaxed) % LOCAL_SLOTS,
            index: ArcSwap::from_pointee(idx),
            counters: Counters::default(),
            log: OnceLock::new(),
            load_error: Mutex::new(None),
            settings_error: None,
            reload_lock: Mutex::new(()),
            generation: AtomicU64::new(1),
            fallback_check: AtomicBool::new(true),
            precision: ArcSwap::from_pointee(PrecisionPolicy::exact()),
        }
    }

    /// Applies [`FALLBACK_CHECK_ENV`] and [`UNTUNED_LOG_ENV`] (what `open` honours), and
    /// refuses an invalid [`kernels::cpu::LINGER_ENV`] (which the kernels would ignore). Every
    /// valid setting is applied; the first error is returned.
    fn settings_from_env(&self) -> Result<(), RuntimeError> {
        // Empty is unset, as for the other settings.
        let check = match std::env::var_os(FALLBACK_CHECK_ENV) {
            Some(v) if !v.is_empty() => {
                parse_switch(FALLBACK_CHECK_ENV, &v).map(|on| self.set_fallback_check(on))
            }
            _ => Ok(()),
        };
        let log = match std::env::var_os(UNTUNED_LOG_ENV) {
            Some(p) if !p.is_empty() => self.log_fallbacks_to(PathBuf::from(p)),
            _ => Ok(()),
        };
        let linger = kernels::cpu::linger().map(drop).map_err(RuntimeError::from);
        linger.and(check).and(log)
    }

    /// Appends every distinct workload this runtime serves at a level other than `exact`
    /// to `path` (created if missing), once: `gemm:24x768x768  # nearest_shape`. Workloads
    /// already in the file are not written again. Set once per runtime.
    pub fn log_fallbacks_to(&self, path: impl AsRef<Path>) -> Result<(), RuntimeError> {
        if let Some(log) = self.log.get() {
            return Err(RuntimeError::FallbackLogAlreadySet {
                path: log.path().to_path_buf(),
            });
        }
        let log = FallbackLog::open(path.as_ref())?;
        self.log
            .set(log)
            .map_err(|log| RuntimeError::FallbackLogAlreadySet {
                path: log.path().to_path_buf(),
            })
    }

    /// Failed appends to the untuned-workload log, and the last error (serving goes on).
    pub fn fallback_log_errors(&self) -> (u64, Option<String>) {
        self.log.get().map_or((0, None), FallbackLog::errors)
    }

    /// Re-reads the database this runtime was opened on and swaps the new index in
    /// atomically: lookups in flight finish on the old one, later ones see the new one, and
    /// nobody waits. On error the old index stays in service.
    pub fn reload(&self) -> Result<IndexInfo, RuntimeError> {
        let path = self.path.as_ref().ok_or(RuntimeError::NoDatabase)?;
        let _one_at_a_time = self.reload_lock.lock().unwrap_or_else(|p| p.into_inner());
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let idx = Index::load(path, &self.hw, generation)?;
        let info = idx.info();
        let uid = idx.uid;
        self.index.store(Arc::new(idx));
        // After the store: a thread that sees the new uid finds the new index in `index`.
        self.uid.store(uid, Ordering::Release);
        *self.load_error.lock().unwrap_or_else(|p| p.into_inner()) = None;
        Ok(info)
    }

    /// Why the database could not be loaded by [`Runtime::open_or_defaults`], if it could not
    /// (until a [`Runtime::reload`] succeeds).
    pub fn load_error(&self) -> Option<String> {
        self.load_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The first environment setting that [`Runtime::with_env_settings`] (or
    /// [`Runtime::open_or_defaults`]) could not apply, and why: an invalid
    /// `AUTOKERNEL_FALLBACK_CHECK`, `AUTOKERNEL_LINGER_US` or `AUTOKERNEL_UNTUNED_LOG` path.
    /// The valid ones are applied; the database is served either way. Fixed for the
    /// runtime's life (a `reload` does not re-read the environment).
    pub fn settings_error(&self) -> Option<&str> {
        self.settings_error.as_deref()
    }

    /// The fingerprint this runtime serves.
    pub fn fingerprint(&self) -> &HardwareFingerprint {
        &self.hw
    }

    /// Number of workloads served at level `exact`.
    pub fn tuned_workloads(&self) -> usize {
        self.index.load().info().exact
    }

    /// Counts describing the index in service.
    pub fn index_info(&self) -> IndexInfo {
        self.index.load().info()
    }

    /// Records that were in the database but could not be served, with why: this machine's
    /// own, and a same-arch sibling's where its workload is left without a record to serve
    /// (the closest sibling's reason).
    pub fn skipped(&self) -> Vec<Skipped> {
        self.index.load().skipped.clone()
    }

    /// Lookups served so far, by level and by the element type served in.
    pub fn lookups(&self) -> LookupCounts {
        self.counters.snapshot()
    }

    /// The variant that serves `w`, as an owned copy (see [`Runtime::lookup`] for the
    /// allocation-free handle the hot path uses).
    pub fn choose(&self, w: &Workload) -> Result<Choice, RuntimeError> {
        self.lookup(w).map(|c| (*c).clone())
    }

    /// The variant that serves `w` (see the crate documentation for the levels). A workload
    /// seen before costs one probe of this thread's handle on the index and a
    /// reference-count increment: no lock, no SQL, no allocation. The handle is shared, not
    /// copied ([`Runtime::run`] skips even the increment).
    pub fn lookup(&self, w: &Workload) -> Result<Arc<Choice>, RuntimeError> {
        let key = Key::of(w);
        if let Some(c) =
            key.and_then(|k| self.hit(k, |c, shard| self.served(w, c, shard, c.clone())))
        {
            return Ok(c);
        }
        let c = self.miss(w, key)?;
        Ok(self.served(w, &c, local_shard(), c.clone()))
    }

    /// Turns the first-use check of borrowed configs on or off (on by default; see the crate
    /// documentation). Off, a borrowed config that passes the structural rules is served
    /// without being timed: deterministic, for tests and for callers that cannot afford the
    /// check's few milliseconds on the first call of a shape. Affects later misses only.
    pub fn set_fallback_check(&self, on: bool) {
        self.fallback_check.store(on, Ordering::Relaxed);
    }

    fn check(&self) -> bool {
        self.fallback_check.load(Ordering::Relaxed)
    }

    /// Sets the precision policy of later f32 calls ([`PrecisionPolicy`]; f32 only until
    /// set). A weight already packed keeps the plans it has (see [`PackedWeight`]).
    pub fn set_precision(&self, policy: PrecisionPolicy) {
        self.precision.store(Arc::new(policy));
    }

    /// The precision policy in force.
    pub fn precision(&self) -> PrecisionPolicy {
        **self.precision.load()
    }

    /// The workload an f32 call of `w` is served as under the precision policy: `w` itself,
    /// or `w` with a reduced element type whose serving record the policy admits (see
    /// [`PrecisionPolicy`]). Workloads of another element type are served as they are.
    pub fn serve_as(&self, w: &Workload) -> Workload {
        let policy = **self.precision.load();
        if policy.is_exact() || w.dtype() != DType::F32 {
            return *w;
        }
        let admitted = |d: DType| {
            let wd = w.with_dtype(d);
            let c = self.peek(&wd)?;
            let err = c
                .source
                .as_ref()
                .and_then(|s| s.accuracy)
                .map(|a| a.max_rel_err);
            policy.admits(err).then_some((wd, c))
        };
        if !policy.picks_fastest() {
            return policy
                .reduced()
                .iter()
                .find_map(|&d| admitted(d))
                .map_or(*w, |(wd, _)| wd);
        }
        // `auto`: the fastest median measured on this very shape (exact or same_arch).
        let measured = |c: &Choice| {
            matches!(c.level, Level::Exact | Level::SameArch)
                .then(|| c.source.as_ref().and_then(|s| s.median_s))
                .flatten()
        };
        let mut best = (*w, self.peek(w).as_deref().and_then(measured));
        for &d in policy.reduced() {
            if let Some((wd, c)) = admitted(d) {
                match (measured(&c), best.1) {
                    (Some(t), Some(b)) if t >= b => {}
                    (Some(t), _) => best = (wd, Some(t)),
                    (None, _) => {}
                }
            }
        }
        best.0
    }

    /// [`Runtime::lookup`] for a caller that counts its call itself (a packed weight's plan,
    /// a call that runs the choice its own way): logged as a fallback like any lookup, not
    /// counted, so each call counts once.
    pub(crate) fn lookup_uncounted(&self, w: &Workload) -> Result<Arc<Choice>, RuntimeError> {
        let c = self.find(w)?;
        self.log_fallback(w, &c);
        Ok(c)
    }

    /// The choice for `w` without counting or logging a lookup (the precision policy's
    /// look at the candidates); `None` when no family serves `w` here.
    pub(crate) fn peek(&self, w: &Workload) -> Option<Arc<Choice>> {
        self.find(w).ok()
    }

    /// The choice for `w` from this thread's handle on the index, else resolved ([`miss`]),
    /// neither counted nor logged.
    ///
    /// [`miss`]: Runtime::miss
    fn find(&self, w: &Workload) -> Result<Arc<Choice>, RuntimeError> {
        let key = Key::of(w);
        match key.and_then(|k| self.hit(k, |c, _| c.clone())) {
            Some(c) => Ok(c),
            None => self.miss(w, key),
        }
    }

    /// Like [`Runtime::choose`] but resolves `w` afresh, bypassing and not filling the cache,
    /// and without counting or logging: what the first lookup of `w` would decide.
    pub fn resolve(&self, w: &Workload) -> Result<Choice, RuntimeError> {
        let idx = self.index.load();
        match Key::of(w).and_then(|k| idx.table.get(k)) {
            Some(c) if matches!(c.level, Level::Exact | Level::SameArch) => Ok((**c).clone()),
            _ => idx.resolve_miss(w, &self.hw, self.check()),
        }
    }

    /// The hot path: `f(choice, shard)` if this thread's handle on the current index holds
    /// `key`; `None` (without calling `f`) otherwise.
    ///
    /// Each thread keeps an `Arc` of the index it last used per runtime slot, tagged with
    /// the index's process-unique `uid`. It is current if it has the uid `reload` stored
    /// (after storing the index), so a hit costs a thread-local access, one load of
    /// `self.uid` and one table probe; only a thread whose handle is stale goes through
    /// `arc-swap`. A handle on an old index keeps it alive until that thread's next lookup
    /// on this slot, or until the thread ends.
    #[inline]
    fn hit<R>(&self, key: Key, f: impl FnOnce(&Arc<Choice>, usize) -> R) -> Option<R> {
        let uid = self.uid.load(Ordering::Acquire);
        LOCAL
            .try_with(|local| {
                let indexes = local.indexes.try_borrow().ok()?;
                let idx = indexes[self.slot].as_ref().filter(|i| i.uid == uid)?;
                let c = idx.table.get(key)?;
                Some(f(c, local.shard()))
            })
            .ok()
            .flatten()
    }

    /// Counts (and if asked, logs) one lookup served by `c`; returns `out`.
    #[inline]
    fn served<R>(&self, w: &Workload, c: &Choice, shard: usize, out: R) -> R {
        self.counters.count(shard, c.level, w.dtype());
        self.log_fallback(w, c);
        out
    }

    /// Appends `w` to the fallback log if `c` is a fallback level not logged yet.
    fn log_fallback(&self, w: &Workload, c: &Choice) {
        if c.level != Level::Exact && !c.logged.load(Ordering::Relaxed) {
            if let Some(log) = self.log.get() {
                log_once(log, w, c);
            }
        }
    }

    /// The slow path: refreshes this thread's handle on the index, then serves `w` from the
    /// table, or resolves it (nearest shape, else default) and caches the result.
    #[cold]
    fn miss(&self, w: &Workload, key: Option<Key>) -> Result<Arc<Choice>, RuntimeError> {
        let idx = self.index.load_full();
        let _ = LOCAL.try_with(|local| {
            if let Ok(mut indexes) = local.indexes.try_borrow_mut() {
                indexes[self.slot] = Some(idx.clone());
            }
        });
        let Some(key) = key else {
            return Ok(Arc::new(idx.resolve_miss(w, &self.hw, self.check())?));
        };
        if let Some(c) = idx.table.get(key) {
            return Ok(c.clone());
        }
        let c = Arc::new(idx.resolve_miss(w, &self.hw, self.check())?);
        Ok(idx.cache_miss(key, c))
    }

    /// Runs `w` on `inputs` into `output` with the chosen variant (an f32 workload in the
    /// element type the precision policy picks, [`Runtime::serve_as`]); returns the level
    /// that answered. Buffer sizes are checked.
    pub fn run(
        &self,
        w: &Workload,
        inputs: &[&[f32]],
        output: &mut [f32],
    ) -> Result<Level, RuntimeError> {
        let served_as = self.serve_as(w);
        let w = &served_as;
        self.serve(w, |c| {
            check_buffers(w, c, inputs, output)?;
            c.run(inputs, output)
        })
    }

    /// Serves `w` with its chosen variant: `run` runs it (after checking its buffers), and
    /// the level that answered is counted when it succeeds.
    pub(crate) fn serve(
        &self,
        w: &Workload,
        mut run: impl FnMut(&Choice) -> Result<(), RuntimeError>,
    ) -> Result<Level, RuntimeError> {
        let mut serve = |c: &Choice, shard: usize| {
            run(c)?;
            self.served(w, c, shard, ());
            Ok(c.level)
        };
        let key = Key::of(w);
        if let Some(r) = key.and_then(|k| self.hit(k, |c, shard| serve(c, shard))) {
            return r;
        }
        let c = self.miss(w, key)?;
        serve(&c, local_shard())
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
        let what = || format!("gemm:{m}x{n}x{k}");
        if let Some(done) =
            ops::by_row_blocks(m, n, k, a, c, what, |m, a, c| self.gemm(m, n, k, a, b, c))
        {
            return done;
        }
        let w = Workload::gemm(m, n, k)?;
        self.run(&w, &[a, b], c)
    }
}

/// Runtime slots per thread ([`Local::indexes`]): runtimes beyond this many, used from one
/// thread in turn, share slots and refresh each other's handles (correct, a little slower).
const LOCAL_SLOTS: usize = 4;

/// What a thread keeps for the hot path: its handles on the indexes in service, and its
/// counter shard.
struct Local {
    indexes: RefCell<[Option<Arc<Index>>; LOCAL_SLOTS]>,
    shard: Cell<usize>,
}

impl Local {
    #[inline]
    fn shard(&self) -> usize {
        let s = self.shard.get();
        if s != counters::UNASSIGNED {
            return s;
        }
        let s = counters::acquire_shard();
        self.shard.set(s);
        s
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        counters::release_shard(self.shard.get());
    }
}

thread_local! {
    static LOCAL: Local = const {
        Local {
            indexes: RefCell::new([None, None, None, None]),
            shard: Cell::new(counters::UNASSIGNED),
        }
    };
}

/// Appends `w` to the untuned-workload log, once per choice.
#[cold]
fn log_once(log: &FallbackLog, w: &Workload, c: &Choice) {
    if !c.logged.swap(true, Ordering::Relaxed) {
        log.record(w, c.level);
    }
}

/// This thread's counter shard (the shared one while its thread-locals are being torn down).
fn local_shard() -> usize {
    LOCAL.try_with(Local::shard).unwrap_or(counters::SHARDS)
}

impl Runtime {
    /// Counts one call served at `level` in element type `dtype` without a lookup (a packed
    /// weight's plan, decided once).
    #[inline]
    pub(crate) fn count_call(&self, level: Level, dtype: DType) {
        self.counters.count(local_shard(), level, dtype);
    }
}

/// Checks buffer lengths against those `c` was prepared for (no allocation).
fn check_buffers(
    w: &Workload,
    c: &Choice,
    inputs: &[&[f32]],
    output: &[f32],
) -> Result<(), RuntimeError> {
    let bad = |name, got, expected| {
        Err(RuntimeError::BufferSize {
            name,
            workload: w.key(),
            got,
            expected,
        })
    };
    if inputs.len() != c.input_lens.len() {
        return bad("inputs", inputs.len(), c.input_lens.len());
    }
    for (i, (input, &len)) in inputs.iter().zip(c.input_lens.iter()).enumerate() {
        if input.len() != len {
            let name = w.input_names().get(i).copied().unwrap_or("input");
            return bad(name, input.len(), len);
        }
    }
    if output.len() != c.output_len {
        return bad(w.output_name(), output.len(), c.output_len);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_switches_are_parsed_strictly() {
        let parse = |v: &str| parse_switch(FALLBACK_CHECK_ENV, std::ffi::OsStr::new(v));
        for on in ["1", "true", " ON ", "Yes"] {
            assert!(parse(on).unwrap(), "{on}");
        }
        for off in ["0", "false", "Off", "no\n"] {
            assert!(!parse(off).unwrap(), "{off}");
        }
        for bad in ["", "2", "maybe", "disable"] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(
                e.contains(FALLBACK_CHECK_ENV) && e.contains("0/false"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn runtime_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Runtime>();
        assert_send_sync::<Arc<Choice>>();
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
        assert!(e.to_string().contains("'c' has 5 elements"), "{e}");
        assert!(rt.gemm(0, 3, 4, &[], &[0.0; 12], &mut c).is_err());
        let w = Workload::gemm(2, 3, 4).unwrap();
        assert!(rt.run(&w, &[&[0.0; 8]], &mut c).is_err());
    }

    #[test]
    fn levels_have_stable_names() {
        let names: Vec<&str> = Level::ALL.iter().map(|l| l.as_str()).collect();
        assert_eq!(names, ["exact", "same_arch", "nearest_shape", "default"]);
    }

    #[test]
    fn log2_distance() {
        let a = index::log2_dims(&Workload::gemm(16, 768, 768).unwrap());
        let b = index::log2_dims(&Workload::gemm(32, 768, 768).unwrap());
        let c = index::log2_dims(&Workload::gemm(1024, 768, 768).unwrap());
        let d = index::log2_dims(&Workload::gemm(2048, 768, 768).unwrap());
        assert!((distance(&a, &b) - 1.0).abs() < 1e-12);
        assert!((distance(&c, &d) - 1.0).abs() < 1e-12);
        let e = index::log2_dims(&Workload::gemm(32, 1536, 768).unwrap());
        assert!((distance(&a, &e) - 2f64.sqrt()).abs() < 1e-12);
    }

    #[test]
    fn repeated_default_lookups_share_one_choice_and_are_counted() {
        let rt = Runtime::defaults_only();
        let w = Workload::gemm(5, 6, 7).unwrap();
        let a = rt.lookup(&w).unwrap();
        let b = rt.lookup(&w).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(a.level, Level::Default);
        assert_eq!(rt.lookups().levels.default, 2);
        assert_eq!(rt.index_info().cached_misses, 1);
        assert!(matches!(rt.reload(), Err(RuntimeError::NoDatabase)));
    }
}
