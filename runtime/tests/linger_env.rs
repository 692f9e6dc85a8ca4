//! An invalid `AUTOKERNEL_LINGER_US` fails `Runtime::open` (the kernels alone would only warn
//! and ignore it), and `open_or_defaults` reports it while applying the other settings. Its
//! own test binary: the setting is read once per process.

use runtime::Runtime;
use tuning_db::TuningDb;

#[test]
fn an_invalid_linger_fails_open_and_is_reported_by_open_or_defaults() {
    std::env::set_var(kernels::cpu::LINGER_ENV, "300us");
    let dir = tempfile::tempdir().unwrap();
    // The other settings still apply beside it.
    let log = dir.path().join("untuned.txt");
    std::env::set_var(runtime::UNTUNED_LOG_ENV, &log);
    let path = dir.path().join("t.db");
    drop(TuningDb::open(&path).unwrap());
    let e = Runtime::open(&path)
        .err()
        .expect("open refuses it")
        .to_string();
    assert!(e.contains("AUTOKERNEL_LINGER_US=300us"), "{e}");
    let rt = Runtime::open_or_defaults(&path);
    let reported = rt.load_error().expect("reported");
    assert!(
        reported.contains("AUTOKERNEL_LINGER_US=300us"),
        "{reported}"
    );
    rt.lookup(&"gemm:3x4x5".parse().unwrap()).unwrap();
    let logged = std::fs::read_to_string(&log).expect("the untuned log is written");
    assert_eq!(logged, "gemm:3x4x5  # default\n");
}
