//! Status codes, the thread-local error message, and the guard every exported function runs
//! its body in (so no panic crosses the boundary).

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use runtime::RuntimeError;

/// Success.
pub const AUTOKERNEL_OK: c_int = 0;
/// A null pointer where one is required, a misaligned or overlapping buffer, a string that
/// is not UTF-8, an unknown name or flag value.
pub const AUTOKERNEL_INVALID_ARGUMENT: c_int = 1;
/// A shape that is not valid (a zero dimension, a size that overflows) or a buffer whose
/// length does not match the shape.
pub const AUTOKERNEL_SHAPE: c_int = 2;
/// The tuning database could not be read (missing, damaged, foreign, newer schema), or the
/// runtime has no database to reload.
pub const AUTOKERNEL_DATABASE: c_int = 3;
/// Valid, but not served by this build or machine (for instance a workload only a CUDA
/// family runs, or a precision policy this build does not have).
pub const AUTOKERNEL_UNSUPPORTED: c_int = 4;
/// A bug inside the library: a caught panic or an unexpected error. The message says more.
pub const AUTOKERNEL_INTERNAL: c_int = 5;
/// The memory left cannot hold what the call needs (a packed weight): nothing was made, and
/// the process goes on.
pub const AUTOKERNEL_OUT_OF_MEMORY: c_int = 6;

/// An error on its way to C: a status code and a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct CapiError {
    /// One of the `AUTOKERNEL_*` status codes (never [`AUTOKERNEL_OK`]).
    pub code: c_int,
    /// What went wrong, for [`autokernel_last_error`].
    pub message: String,
}

impl CapiError {
    /// An [`AUTOKERNEL_INVALID_ARGUMENT`] error.
    pub fn invalid(message: impl Into<String>) -> CapiError {
        CapiError {
            code: AUTOKERNEL_INVALID_ARGUMENT,
            message: message.into(),
        }
    }

    /// An [`AUTOKERNEL_SHAPE`] error.
    pub fn shape(message: impl Into<String>) -> CapiError {
        CapiError {
            code: AUTOKERNEL_SHAPE,
            message: message.into(),
        }
    }

    /// An [`AUTOKERNEL_UNSUPPORTED`] error.
    pub fn unsupported(message: impl Into<String>) -> CapiError {
        CapiError {
            code: AUTOKERNEL_UNSUPPORTED,
            message: message.into(),
        }
    }
}

impl From<RuntimeError> for CapiError {
    fn from(e: RuntimeError) -> CapiError {
        let code = match &e {
            RuntimeError::Db(_) | RuntimeError::NoDatabase => AUTOKERNEL_DATABASE,
            RuntimeError::BufferSize { .. } | RuntimeError::Layer { .. } => AUTOKERNEL_SHAPE,
            RuntimeError::Kernel(k) => kernel_code(k),
            RuntimeError::FallbackLog { .. }
            | RuntimeError::FallbackLogAlreadySet { .. }
            | RuntimeError::Argument { .. }
            | RuntimeError::Env { .. } => AUTOKERNEL_INVALID_ARGUMENT,
        };
        CapiError {
            code,
            message: e.to_string(),
        }
    }
}

impl From<kernels::Error> for CapiError {
    fn from(e: kernels::Error) -> CapiError {
        CapiError {
            code: kernel_code(&e),
            message: e.to_string(),
        }
    }
}

fn kernel_code(e: &kernels::Error) -> c_int {
    use kernels::Error as K;
    match e {
        K::BadWorkload { .. } | K::Operand { .. } => AUTOKERNEL_SHAPE,
        K::Unsupported { .. }
        | K::UnsupportedDtype { .. }
        | K::NoFamily { .. }
        | K::DeviceOnly { .. } => AUTOKERNEL_UNSUPPORTED,
        K::UnknownDtype { .. } | K::IsaCap { .. } | K::Linger { .. } => AUTOKERNEL_INVALID_ARGUMENT,
        K::InvalidConfig { .. } | K::UnknownKernel(_) => AUTOKERNEL_INTERNAL,
        K::OutOfMemory { .. } => AUTOKERNEL_OUT_OF_MEMORY,
    }
}

thread_local! {
    /// The message of the calling thread's last call; empty after a success.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    // A message with a NUL byte in it would be cut there by C anyway.
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|slot| {
        if let Ok(mut slot) = slot.try_borrow_mut() {
            *slot = text;
        }
    });
}

/// Runs `body` with panics caught: stores its error (or clears the message) for
/// [`autokernel_last_error`] and returns its status code.
pub(crate) fn guard(body: impl FnOnce() -> Result<(), CapiError>) -> c_int {
    // A child forked after the workers started would hang on its first parallel step.
    let entered = kernels::cpu::pool::enter().map_err(|e| CapiError {
        code: AUTOKERNEL_UNSUPPORTED,
        message: e.to_string(),
    });
    let result = entered.and_then(|()| {
        catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            Err(CapiError {
                code: AUTOKERNEL_INTERNAL,
                message: format!("internal error (caught panic): {what}"),
            })
        })
    });
    match result {
        Ok(()) => {
            set_last_error("");
            AUTOKERNEL_OK
        }
        Err(e) => {
            set_last_error(&e.message);
            e.code
        }
    }
}

/// The message of the last call on the calling thread that returned a status: empty (`""`)
/// if it succeeded. Calls that return nothing (`autokernel_*_free`, `autokernel_version`)
/// leave it as it was. Never NULL. The pointer stays valid until the next `autokernel_*`
/// call that returns a status on this thread.
#[no_mangle]
pub extern "C" fn autokernel_last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|slot| match slot.try_borrow() {
            Ok(s) => s.as_ptr(),
            Err(_) => c"".as_ptr(),
        })
        .unwrap_or(c"".as_ptr())
}

/// The name of a status code (`"AUTOKERNEL_SHAPE"`, ...); `"AUTOKERNEL_UNKNOWN"` for a value
/// that is not one. A static string: never freed.
#[no_mangle]
pub extern "C" fn autokernel_status_name(status: c_int) -> *const c_char {
    let name = match status {
        AUTOKERNEL_OK => c"AUTOKERNEL_OK",
        AUTOKERNEL_INVALID_ARGUMENT => c"AUTOKERNEL_INVALID_ARGUMENT",
        AUTOKERNEL_SHAPE => c"AUTOKERNEL_SHAPE",
        AUTOKERNEL_DATABASE => c"AUTOKERNEL_DATABASE",
        AUTOKERNEL_UNSUPPORTED => c"AUTOKERNEL_UNSUPPORTED",
        AUTOKERNEL_INTERNAL => c"AUTOKERNEL_INTERNAL",
        AUTOKERNEL_OUT_OF_MEMORY => c"AUTOKERNEL_OUT_OF_MEMORY",
        _ => c"AUTOKERNEL_UNKNOWN",
    };
    name.as_ptr()
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use super::*;

    fn last() -> String {
        // SAFETY: autokernel_last_error never returns NULL and its string is NUL-terminated.
        unsafe { CStr::from_ptr(autokernel_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_panic_is_caught_and_reported_then_a_success_clears_the_message() {
        let code = guard(|| panic!("boom {}", 7));
        assert_eq!(code, AUTOKERNEL_INTERNAL);
        assert_eq!(last(), "internal error (caught panic): boom 7");
        assert_eq!(guard(|| Ok(())), AUTOKERNEL_OK);
        assert_eq!(last(), "");
        assert_eq!(
            guard(|| Err(CapiError::shape("bad\0shape"))),
            AUTOKERNEL_SHAPE
        );
        assert_eq!(last(), "bad shape");
    }

    #[test]
    fn messages_are_per_thread() {
        guard(|| Err(CapiError::invalid("here")));
        std::thread::spawn(|| {
            assert_eq!(last(), "");
            guard(|| Err(CapiError::unsupported("there")));
            assert_eq!(last(), "there");
        })
        .join()
        .unwrap();
        assert_eq!(last(), "here");
    }

    #[test]
    fn every_status_has_a_name() {
        for (code, name) in [
            (AUTOKERNEL_OK, "AUTOKERNEL_OK"),
            (AUTOKERNEL_INTERNAL, "AUTOKERNEL_INTERNAL"),
            (42, "AUTOKERNEL_UNKNOWN"),
        ] {
            // SAFETY: a static NUL-terminated string.
            let got = unsafe { CStr::from_ptr(autokernel_status_name(code)) };
            assert_eq!(got.to_str().unwrap(), name);
        }
    }
}
