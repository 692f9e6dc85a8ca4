//! The runtime handle: open, free, reload, the load error, lookups as JSON, counters.

use std::ffi::{c_char, c_int, CString};
use std::path::Path;

use kernels::Workload;
use runtime::{Runtime, Threads, ThreadsError};

use crate::args;
use crate::error::{guard, CapiError};

/// A runtime: a tuning database indexed for this machine, and the threads its kernels run
/// on. Opaque; made by `autokernel_runtime_open`, freed by `autokernel_runtime_free`.
/// Shareable between threads.
pub struct AutokernelRuntime {
    rt: Runtime,
    /// The process-wide pool when opened with `threads = 0` (or this machine's count), the
    /// caller's thread for 1, a pool of its own otherwise.
    threads: Threads,
}

impl AutokernelRuntime {
    /// Runs `f` with the runtime on its threads (so the kernels' tasks run there too).
    pub(crate) fn serve<R: Send>(&self, f: impl FnOnce(&Runtime) -> R + Send) -> R {
        self.threads.run(|| f(&self.rt))
    }

    fn open(path: Option<&str>, threads: u32) -> Result<AutokernelRuntime, CapiError> {
        let asked = (threads > 0).then_some(threads as usize);
        let (threads, hw) = Threads::new(asked).map_err(|e| match e {
            ThreadsError::OutOfRange { asked, cpus } => CapiError::invalid(format!(
                "threads = {asked}: this process may use {cpus} CPU(s); use at most {cpus}, or 0 \
                 for all"
            )),
            e => CapiError::unsupported(e.to_string()),
        })?;
        let rt =
            match path {
                Some("") => return Err(CapiError::invalid(
                    "db_path is empty: it names no file (give a path, or NULL for kernel defaults)",
                )),
                Some(p) => Runtime::open_or_defaults_for(Path::new(p), hw),
                None => Runtime::defaults_only_for(hw).with_env_settings(),
            };
        Ok(AutokernelRuntime { rt, threads })
    }
}

/// Sets the precision policy named by `text` (NULL or `""`: the default, f32), with the
/// error budget `max_rel_err` (negative: none; NaN or +∞ refused).
fn set_precision(rt: &Runtime, text: Option<&str>, max_rel_err: f64) -> Result<(), CapiError> {
    let text = match text.unwrap_or("").trim() {
        "" => "f32",
        t => t,
    };
    let mut policy: runtime::PrecisionPolicy = text
        .parse()
        .map_err(|e: runtime::UnknownPrecision| CapiError::invalid(e.to_string()))?;
    if max_rel_err.is_nan() || max_rel_err == f64::INFINITY {
        return Err(CapiError::invalid(format!(
            "max_rel_err {max_rel_err} is not a number ≥ 0 (or negative for no budget)"
        )));
    }
    if max_rel_err >= 0.0 && policy.is_exact() {
        return Err(CapiError::invalid(format!(
            "max_rel_err {max_rel_err}: an error budget applies to a reduced precision (\"bf16\", \
             \"int8\" or \"auto\"); \"{text}\" serves f32 only (give a negative max_rel_err)"
        )));
    }
    if max_rel_err >= 0.0 {
        policy = policy.with_max_rel_err(max_rel_err);
    }
    rt.set_precision(policy);
    Ok(())
}

/// Sets the precision policy of later calls: which element type an f32 call may be served
/// in. `precision`: NULL, `""` or `"f32"` (f32 only, the default), `"bf16"`, `"int8"` (that
/// type wherever a kernel family serves it), or `"auto"` (per workload, the fastest record
/// measured on its shape); names are case-insensitive, surrounding spaces ignored.
/// `max_rel_err` ≥ 0: a reduced-precision record is served only if its stored max relative
/// error against the f32 problem is at most this (`auto` uses 1e-2 when it is negative);
/// negative: no budget; NaN or +∞, or ≥ 0 with `"f32"` (which it would not change):
/// `AUTOKERNEL_INVALID_ARGUMENT`. A weight packed before keeps its plans.
///
/// # Safety
/// `rt` is NULL or a live runtime; `precision` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn autokernel_runtime_set_precision(
    rt: *const AutokernelRuntime,
    precision: *const c_char,
    max_rel_err: f64,
) -> c_int {
    guard(|| {
        // SAFETY (this block): the caller's contract.
        let h = unsafe { args::handle("rt", rt)? };
        let text = unsafe { args::optional_string("precision", precision)? };
        set_precision(&h.rt, text, max_rel_err)
    })
}

/// Opens a runtime on the tuning database at `db_path` (read-only) and stores it in `*out`.
///
/// `db_path` NULL: no database, every call runs its kernel default (`""`, which names no
/// file, is `AUTOKERNEL_INVALID_ARGUMENT`). A database that cannot
/// be read (missing, damaged, of a newer schema) does not fail the open: the runtime serves
/// kernel defaults, `autokernel_runtime_load_error` says why, and
/// `autokernel_runtime_reload` picks the file up once it is good. Nor does an invalid
/// `AUTOKERNEL_*` environment setting: `autokernel_runtime_settings_error` names it.
///
/// `threads`: 0 runs kernels on the process-wide pool (all CPUs this process may use, or
/// `RAYON_NUM_THREADS` of them where that environment variable is set when the library
/// first runs); T > 0 serves the records tuned at T threads (`autokernel tune --threads T`)
/// on a pool of T threads of this runtime's own — except 1, which runs each call on its
/// caller's thread (no hand-over to a pool: concurrent callers each compute on their own
/// thread), and the process-wide pool's count, that pool. More than that count is refused.
/// The first open starts the process-wide pool's threads, whatever `threads` says (its size
/// is part of the hardware fingerprint); they sleep while unused.
///
/// `precision`: NULL, `""` or `"f32"` (the default), `"bf16"`, `"int8"` or `"auto"`, with
/// no error budget (see `autokernel_runtime_set_precision` to give one).
///
/// On failure `*out` is NULL.
///
/// # Safety
/// `db_path` and `precision` are NULL or NUL-terminated strings; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn autokernel_runtime_open(
    db_path: *const c_char,
    threads: u32,
    precision: *const c_char,
    out: *mut *mut AutokernelRuntime,
) -> c_int {
    guard(|| {
        // SAFETY (this block): the caller's contract above.
        let out = unsafe { args::out_slot("out", out, std::ptr::null_mut())? };
        let path = unsafe { args::optional_string("db_path", db_path)? };
        let precision = unsafe { args::optional_string("precision", precision)? };
        let handle = AutokernelRuntime::open(path, threads)?;
        set_precision(&handle.rt, precision, -1.0)?;
        *out = Box::into_raw(Box::new(handle));
        Ok(())
    })
}

/// Frees a runtime (NULL: nothing). No other thread may be using it.
///
/// # Safety
/// `rt` is NULL or a runtime from `autokernel_runtime_open` not freed before.
#[no_mangle]
pub unsafe extern "C" fn autokernel_runtime_free(rt: *mut AutokernelRuntime) {
    if !rt.is_null() {
        // SAFETY: made by Box::into_raw in autokernel_runtime_open, freed once (contract).
        let handle = unsafe { Box::from_raw(rt) };
        // Dropping joins nothing that can panic into C; catch anyway.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(handle)));
    }
}

/// Re-reads the database the runtime was opened on and swaps the new index in atomically:
/// calls in flight on other threads finish on the old one, later calls see the new one.
/// On error (AUTOKERNEL_DATABASE) the old index stays in service.
///
/// # Safety
/// `rt` is NULL or a live runtime.
#[no_mangle]
pub unsafe extern "C" fn autokernel_runtime_reload(rt: *const AutokernelRuntime) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let h = unsafe { args::handle("rt", rt)? };
        h.rt.reload()?;
        Ok(())
    })
}

/// Why the index in service could not be loaded from the database, or NULL in `*out` if it
/// was (or the runtime has no database): the open's reason, until a successful
/// `autokernel_runtime_reload` replaces the index (a failed reload keeps the index, and this,
/// and returns its own status). A string to free with `autokernel_string_free`.
///
/// # Safety
/// `rt` is NULL or a live runtime; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn autokernel_runtime_load_error(
    rt: *const AutokernelRuntime,
    out: *mut *mut c_char,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { optional_text(rt, out, Runtime::load_error) }
}

/// The first `AUTOKERNEL_*` environment setting the open could not apply (an invalid
/// `AUTOKERNEL_LINGER_US` or `AUTOKERNEL_FALLBACK_CHECK`, an `AUTOKERNEL_UNTUNED_LOG` path
/// that cannot be opened), and why, or NULL in `*out` if every one applied. The other
/// settings apply and the database is served either way; fixed for the runtime's life. A
/// string to free with `autokernel_string_free`.
///
/// # Safety
/// `rt` is NULL or a live runtime; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn autokernel_runtime_settings_error(
    rt: *const AutokernelRuntime,
    out: *mut *mut c_char,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { optional_text(rt, out, |rt| rt.settings_error().map(str::to_string)) }
}

/// Stores what `text` says of runtime `rt` in `*out`: a string to free with
/// `autokernel_string_free`, or NULL for nothing.
///
/// # Safety
/// `rt` is NULL or a live runtime; `out` is NULL or writable.
unsafe fn optional_text(
    rt: *const AutokernelRuntime,
    out: *mut *mut c_char,
    text: impl FnOnce(&Runtime) -> Option<String>,
) -> c_int {
    guard(|| {
        // SAFETY (this block): the caller's contract.
        let out = unsafe { args::out_slot("out", out, std::ptr::null_mut())? };
        let h = unsafe { args::handle("rt", rt)? };
        if let Some(t) = text(&h.rt) {
            *out = owned_string(t);
        }
        Ok(())
    })
}

/// Which variant serves `workload` (e.g. `"gemm:128x768x768"`,
/// `"gemm_bias_gelu:8x3072x768"`, `"attention:1x12x128x64:causal"`) as a JSON object with
/// the fields of `autokernel lookup --json`: workload (as asked), dtype (the element type the
/// call is served in under the precision policy), device, level, kernel, kernel_version,
/// config, fingerprint, source, rel_err, precisions, precision, served_as, not_served (why a
/// record of this machine was set aside, e.g. one to re-tune; null if none). Counted like a
/// call. `*json_out` is a string
/// to free with `autokernel_string_free` (NULL on failure).
///
/// # Safety
/// `rt` is NULL or a live runtime; `workload` is NULL or a NUL-terminated string;
/// `json_out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn autokernel_runtime_lookup(
    rt: *const AutokernelRuntime,
    workload: *const c_char,
    json_out: *mut *mut c_char,
) -> c_int {
    guard(|| {
        // SAFETY (this block): the caller's contract.
        let out = unsafe { args::out_slot("json_out", json_out, std::ptr::null_mut())? };
        let h = unsafe { args::handle("rt", rt)? };
        let text = unsafe { args::string("workload", workload)? };
        let w: Workload = text
            .parse()
            .map_err(|e: kernels::Error| CapiError::invalid(e.to_string()))?;
        let json = h.serve(|rt| Ok::<_, CapiError>(rt.lookup_json(&w, "cpu")?.to_string()))?;
        *out = owned_string(json);
        Ok(())
    })
}

/// Lookups served so far by a runtime, by level and by the element type served in (each
/// lookup counts once in each breakdown: an f32 call the precision policy serves in int8
/// counts under `int8`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AutokernelLookupCounts {
    /// Served by a record of this workload on this machine.
    pub exact: u64,
    /// Served by a record from a machine of the same micro-architecture.
    pub same_arch: u64,
    /// Served by the config of the nearest tuned shape.
    pub nearest_shape: u64,
    /// Served by the kernel default.
    pub defaults: u64,
    /// Served in f32.
    pub f32: u64,
    /// Served in bf16.
    pub bf16: u64,
    /// Served in int8.
    pub int8: u64,
}

/// Writes the runtime's lookup counters to `*out`.
///
/// # Safety
/// `rt` is NULL or a live runtime; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn autokernel_runtime_lookups(
    rt: *const AutokernelRuntime,
    out: *mut AutokernelLookupCounts,
) -> c_int {
    guard(|| {
        // SAFETY (this block): the caller's contract.
        let out = unsafe { args::out_slot("out", out, AutokernelLookupCounts::default())? };
        let h = unsafe { args::handle("rt", rt)? };
        let n = h.rt.lookups();
        *out = AutokernelLookupCounts {
            exact: n.levels.exact,
            same_arch: n.levels.same_arch,
            nearest_shape: n.levels.nearest_shape,
            defaults: n.levels.default,
            f32: n.f32,
            bf16: n.bf16,
            int8: n.int8,
        };
        Ok(())
    })
}

/// Frees a string this library returned (NULL: nothing).
///
/// # Safety
/// `s` is NULL or a string from this library not freed before.
#[no_mangle]
pub unsafe extern "C" fn autokernel_string_free(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: made by CString::into_raw in owned_string, freed once (contract).
        drop(unsafe { CString::from_raw(s) });
    }
}

/// A string for C, freed by [`autokernel_string_free`].
pub(crate) fn owned_string(s: String) -> *mut c_char {
    CString::new(s.replace('\0', " "))
        .unwrap_or_default()
        .into_raw()
}
