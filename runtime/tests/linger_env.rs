//! An invalid `AUTOKERNEL_LINGER_US` fails `Runtime::open` (the kernels alone would only warn
//! and ignore it); `open_or_defaults` and `with_env_settings` report it as a settings error
//! (not a load error: the database serves) while applying the other settings. Its own test
//! binary: the setting is read once per process.

use runtime::Runtime;
use tuning_db::TuningDb;

#[test]
fn an_invalid_linger_fails_open_and_is_reported_as_a_settings_error() {
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
    assert_eq!(rt.load_error(), None, "the database loaded");
    let reported = rt.settings_error().expect("reported");
    assert!(
        reported.contains("AUTOKERNEL_LINGER_US=300us"),
        "{reported}"
    );
    rt.lookup(&"gemm:3x4x5".parse().unwrap()).unwrap();
    // A reload keeps it: the environment is read once.
    rt.reload().unwrap();
    assert_eq!(rt.settings_error(), Some(reported));
    let logged = std::fs::read_to_string(&log).expect("the untuned log is written");
    assert_eq!(logged, "gemm:3x4x5  # default\n");

    // With no database: the same settings, the same report; a plain defaults_only runtime
    // reads no environment (infer's untuned comparison must not write the log).
    let hw = kernels::HardwareFingerprint::current().clone();
    let rt = Runtime::defaults_only_for(hw.clone()).with_env_settings();
    assert!(rt
        .settings_error()
        .unwrap()
        .contains("AUTOKERNEL_LINGER_US=300us"));
    rt.lookup(&"gemm:6x4x5".parse().unwrap()).unwrap();
    let plain = Runtime::defaults_only_for(hw);
    assert_eq!(plain.settings_error(), None);
    plain.lookup(&"gemm:7x4x5".parse().unwrap()).unwrap();
    let logged = std::fs::read_to_string(&log).unwrap();
    assert_eq!(logged, "gemm:3x4x5  # default\ngemm:6x4x5  # default\n");
}
