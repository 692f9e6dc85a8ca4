//! NVRTC compilation: source + arch → PTX, cached per (source, arch), in parallel with rayon.
//!
//! The rendered source already holds the config (as `#define`s), so keying the cache by the
//! source text is keying it by (template, config, arch) — and it can never serve a stale entry.
//! Failures are cached too: NVRTC is deterministic, and a config that failed once fails again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use rayon::prelude::*;

use super::arch::Arch;

/// Compiled PTX, ready for `CudaContext::load_module`.
pub type Ptx = cudarc::nvrtc::Ptx;

/// Why a template did not turn into PTX. Stored as the message of a `build_failed` trial, so
/// the NVRTC log travels with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    /// `libnvrtc` cannot be loaded (see the module docs of `kernels::cuda` for how it is found).
    #[error("NVRTC is not available (libnvrtc not loadable): {reason}")]
    NvrtcUnavailable {
        /// Why: the library is not on the loader's path, or it does not answer.
        reason: String,
    },
    /// The config is not in the template's space for this shape and arch.
    #[error("config {config} is not valid for '{kernel}' on {arch}: {reason}")]
    InvalidConfig {
        /// The template's name, e.g. `cuda_gemm_f32`.
        kernel: String,
        /// The config, as JSON.
        config: String,
        /// The arch it was asked for.
        arch: Arch,
        /// Why: the shape is not supported on this arch, or the space's check failed.
        reason: String,
    },
    /// The config lacks a knob, or its tiles do not nest (whatever the arch).
    #[error("config {config} is not valid for '{kernel}': {reason}")]
    BadConfig {
        /// The template's name.
        kernel: String,
        /// The config, as JSON.
        config: String,
        /// Which knob is missing or malformed, or which tiles do not nest.
        reason: String,
    },
    /// NVRTC (or the ptxas it runs) rejected the source.
    #[error(
        "NVRTC failed to compile '{kernel}' for {arch} ({status}), options {options:?}:\n{log}"
    )]
    Nvrtc {
        /// The template's name.
        kernel: String,
        /// The arch it was compiled for.
        arch: Arch,
        /// NVRTC's result code, or the step that failed.
        status: String,
        /// The options NVRTC was given ([`OPTIONS`] and the arch).
        options: Vec<String>,
        /// NVRTC's compile log (empty where it gave none).
        log: String,
    },
}

type CacheKey = (Arch, String);
type Compiled = Result<Arc<Ptx>, CompileError>;

fn cache() -> &'static Mutex<HashMap<CacheKey, Compiled>> {
    static CACHE: OnceLock<Mutex<HashMap<CacheKey, Compiled>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// The NVRTC options every template is compiled with (besides the arch).
pub const OPTIONS: &[&str] = &["-std=c++17", "--fmad=true"];

/// Compiles `source` for `arch`, or returns the cached result. `kernel` names the template in
/// errors. Never panics, also when NVRTC is missing.
pub fn compile_source(kernel: &str, source: &str, arch: Arch) -> Compiled {
    let key = (arch, source.to_string());
    if let Some(hit) = cache().lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return hit.clone();
    }
    // Compile outside the lock, so different sources compile in parallel. Two threads asking
    // for the same source at once both compile it; the results are identical.
    let result = compile_uncached(kernel, source, arch);
    cache()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, result.clone());
    result
}

/// Compiles many `(kernel, source, arch)` jobs in parallel on rayon's pool; results in order.
pub fn compile_many(jobs: &[(&str, String, Arch)]) -> Vec<Compiled> {
    jobs.par_iter()
        .map(|(kernel, source, arch)| compile_source(kernel, source, *arch))
        .collect()
}

/// Number of cached compilations (successes and failures).
pub fn cache_len() -> usize {
    cache().lock().unwrap_or_else(|p| p.into_inner()).len()
}

fn compile_uncached(kernel: &str, source: &str, arch: Arch) -> Compiled {
    super::nvrtc_version()?;
    if source.contains('\0') {
        return Err(CompileError::Nvrtc {
            kernel: kernel.into(),
            arch,
            status: "invalid source".into(),
            options: Vec::new(),
            log: "the source contains a NUL byte".into(),
        });
    }
    let mut options: Vec<String> = OPTIONS.iter().map(|s| s.to_string()).collect();
    options.push(arch.nvrtc_option());
    let opts = cudarc::nvrtc::CompileOptions {
        options: options.clone(),
        name: Some(format!("{kernel}.cu")),
        ..Default::default()
    };
    use cudarc::nvrtc::CompileError as E;
    cudarc::nvrtc::compile_ptx_with_opts(source, opts)
        .map(Arc::new)
        .map_err(|e| {
            let (status, log) = match e {
                E::CompileError { nvrtc, log, .. } => {
                    (format!("{:?}", nvrtc.0), log.to_string_lossy().into_owned())
                }
                E::CreationError(n) => (format!("creating the program: {:?}", n.0), String::new()),
                E::GetLogError(n) => (format!("reading the log: {:?}", n.0), String::new()),
                E::GetPtxError(n) => (format!("reading the PTX: {:?}", n.0), String::new()),
                E::DestroyError(n) => (format!("destroying the program: {:?}", n.0), String::new()),
            };
            CompileError::Nvrtc {
                kernel: kernel.into(),
                arch,
                status,
                options,
                log,
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compiles_and_caches_or_says_nvrtc_is_missing() {
        let src = "extern \"C\" __global__ void ak_probe(float* x) { x[threadIdx.x] *= 2.0f; }";
        match compile_source("probe", src, Arch::SM80) {
            Ok(ptx) => {
                assert!(ptx.to_src().contains("ak_probe"));
                let again = compile_source("probe", src, Arch::SM80).unwrap();
                assert!(
                    Arc::ptr_eq(&ptx, &again),
                    "second call is served from the cache"
                );
                let bad = compile_source("probe", "__global__ void f( {", Arch::SM80).unwrap_err();
                match bad {
                    CompileError::Nvrtc { log, options, .. } => {
                        assert!(log.contains("error"), "{log}");
                        assert!(options.contains(&"--gpu-architecture=sm_80".to_string()));
                    }
                    other => panic!("{other}"),
                }
            }
            Err(CompileError::NvrtcUnavailable { reason }) => {
                println!("skipping: NVRTC not loadable ({reason})");
            }
            Err(e) => panic!("{e}"),
        }
    }
}
