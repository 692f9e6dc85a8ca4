//! `AUTOKERNEL_*` environment settings from C: an invalid one does not fail
//! `autokernel_runtime_open` (with or without a database) and is named by
//! `autokernel_runtime_settings_error`; the valid ones beside it apply. Its own test binary:
//! the kernels read `AUTOKERNEL_LINGER_US` once per process.

mod common;

use std::ffi::{c_char, CStr, CString};
use std::ptr::{null, null_mut};

use autokernel::*;

/// Opens a runtime on `db` (None: no database) and returns its settings error.
fn open_and_report(db: Option<&CStr>) -> (*mut AutokernelRuntime, Option<String>) {
    let mut rt = null_mut();
    let mut err: *mut c_char = null_mut();
    // SAFETY: a C string or NULL, writable out-pointers; the string is the library's,
    // freed once.
    unsafe {
        let st = autokernel_runtime_open(db.map_or(null(), CStr::as_ptr), 0, null(), &mut rt);
        assert_eq!(st, AUTOKERNEL_OK);
        assert_eq!(
            autokernel_runtime_settings_error(rt, &mut err),
            AUTOKERNEL_OK
        );
        let text = (!err.is_null()).then(|| CStr::from_ptr(err).to_string_lossy().into_owned());
        autokernel_string_free(err);
        (rt, text)
    }
}

#[test]
fn an_invalid_setting_is_reported_and_the_others_apply() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("untuned.txt");
    std::env::set_var("AUTOKERNEL_LINGER_US", "-5");
    std::env::set_var("AUTOKERNEL_UNTUNED_LOG", &log);
    let db = dir.path().join("t.db");
    common::tuned_db(&db, &["gemm:24x24x24"], 0);
    let db = CString::new(db.to_str().unwrap()).unwrap();
    for path in [None, Some(db.as_c_str())] {
        let (rt, err) = open_and_report(path);
        let err = err.expect("reported");
        assert!(err.contains("AUTOKERNEL_LINGER_US=-5"), "{err}");
        let mut json = null_mut();
        // SAFETY: a live runtime, a C string, a writable out-pointer; freed once.
        unsafe {
            let st = autokernel_runtime_lookup(rt, c"gemm:3x4x5".as_ptr(), &mut json);
            assert_eq!(st, AUTOKERNEL_OK);
            autokernel_string_free(json);
            autokernel_runtime_free(rt);
        }
    }
    // Logged once (the log keeps each workload once), whichever runtime served it first.
    let logged = std::fs::read_to_string(&log).expect("the untuned log applies");
    assert_eq!(logged, "gemm:3x4x5  # default\n");
    // NULL arguments are status codes.
    let mut out = null_mut();
    // SAFETY: NULL runtime and out-pointer are refused, not read.
    unsafe {
        let st = autokernel_runtime_settings_error(null(), &mut out);
        assert_eq!(st, AUTOKERNEL_INVALID_ARGUMENT);
        let (rt, _) = open_and_report(None);
        let st = autokernel_runtime_settings_error(rt, null_mut());
        assert_eq!(st, AUTOKERNEL_INVALID_ARGUMENT);
        autokernel_runtime_free(rt);
    }
}
