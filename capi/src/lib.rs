//! # autokernel_capi — the C ABI of the autokernel runtime
//!
//! Built as `libautokernel.so` and `libautokernel.a` (plus an rlib for Rust tests), with the
//! header `include/autokernel.h` generated from this crate by cbindgen (`tests/header.rs`
//! fails when the checked-in header is stale).
//!
//! ```c
//! AutokernelRuntime *rt = NULL;
//! if (autokernel_runtime_open("tuning.db", 0, NULL, &rt) != AUTOKERNEL_OK) {
//!     fprintf(stderr, "%s\n", autokernel_last_error());
//!     return 1;
//! }
//! int level;
//! autokernel_runtime_gemm(rt, m, n, k, a, m * k, b, k * n, c, m * n, &level);
//! autokernel_runtime_free(rt);
//! ```
//!
//! **Errors.** Every fallible function returns an `int` status (`AUTOKERNEL_OK` = 0, or one
//! of `AUTOKERNEL_INVALID_ARGUMENT`, `_SHAPE`, `_DATABASE`, `_UNSUPPORTED`, `_INTERNAL`) and
//! leaves a message for the calling thread in [`autokernel_last_error`] (empty after a
//! success). Each body runs under `catch_unwind` ([`error`]), so a panic becomes
//! `AUTOKERNEL_INTERNAL`, never an unwind into C.
//!
//! **Arguments.** Handles, strings and buffers are checked ([`args`]): NULL, misaligned
//! buffers, outputs overlapping inputs, non-UTF-8 strings and unknown codes are
//! `AUTOKERNEL_INVALID_ARGUMENT`; a buffer length that does not match the shape is
//! `AUTOKERNEL_SHAPE`. That a pointer really holds the stated number of elements is the
//! caller's promise.
//!
//! **Threads.** A runtime ([`handle`]) and a packed weight ([`weight`]) are `Send + Sync`:
//! any number of threads may call them at once, and `autokernel_runtime_reload` swaps the
//! index while they serve.
#![warn(missing_docs)]

pub mod args;
pub mod error;
pub mod handle;
pub mod ops;
pub mod weight;

use std::ffi::c_char;

pub use error::{
    autokernel_last_error, autokernel_status_name, CapiError, AUTOKERNEL_DATABASE,
    AUTOKERNEL_INTERNAL, AUTOKERNEL_INVALID_ARGUMENT, AUTOKERNEL_OK, AUTOKERNEL_OUT_OF_MEMORY,
    AUTOKERNEL_SHAPE, AUTOKERNEL_UNSUPPORTED,
};
pub use handle::{
    autokernel_runtime_free, autokernel_runtime_load_error, autokernel_runtime_lookup,
    autokernel_runtime_lookups, autokernel_runtime_open, autokernel_runtime_reload,
    autokernel_runtime_set_precision, autokernel_runtime_settings_error, autokernel_string_free,
    AutokernelLookupCounts, AutokernelRuntime,
};
pub use ops::{
    autokernel_add_layer_norm, autokernel_runtime_attention, autokernel_runtime_attention_masked,
    autokernel_runtime_attention_qkv, autokernel_runtime_gemm, AUTOKERNEL_LEVEL_DEFAULT,
    AUTOKERNEL_LEVEL_EXACT, AUTOKERNEL_LEVEL_NEAREST_SHAPE, AUTOKERNEL_LEVEL_SAME_ARCH,
};
pub use weight::{
    autokernel_runtime_linear, autokernel_weight_free, autokernel_weight_info,
    autokernel_weight_pack, AutokernelWeight, AUTOKERNEL_ACT_GELU, AUTOKERNEL_ACT_GELU_ERF,
    AUTOKERNEL_ACT_NONE, AUTOKERNEL_ACT_RELU,
};

/// The major version of the library this header belongs to: compare it with
/// `autokernel_version()` at run time to catch a header and a library that do not match.
pub const AUTOKERNEL_VERSION_MAJOR: u32 = 0;
/// The minor version of the library this header belongs to.
pub const AUTOKERNEL_VERSION_MINOR: u32 = 1;
/// The patch version of the library this header belongs to.
pub const AUTOKERNEL_VERSION_PATCH: u32 = 0;

/// The library's version, e.g. `"0.1.0"`. A static string: never freed.
#[no_mangle]
pub extern "C" fn autokernel_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_version_is_the_library_version() {
        let header = format!(
            "{AUTOKERNEL_VERSION_MAJOR}.{AUTOKERNEL_VERSION_MINOR}.{AUTOKERNEL_VERSION_PATCH}"
        );
        // SAFETY: autokernel_version returns a static NUL-terminated string.
        let lib = unsafe { std::ffi::CStr::from_ptr(autokernel_version()) };
        assert_eq!(lib.to_str().unwrap(), header);
        assert_eq!(header, env!("CARGO_PKG_VERSION"));
    }
}
