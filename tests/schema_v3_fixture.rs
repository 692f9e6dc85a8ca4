//! A database written by the binary of before the one-interface refactor (schema v3,
//! `tests/fixtures/schema_v3.db`, made with `AUTOKERNEL_ISA=avx2` and `=portable` so its
//! configs run on every x86-64 CI machine) must open, verify and serve exactly the lookups that
//! binary served: `tests/fixtures/schema_v3.lookups.json`, recorded by it.
//!
//! The lookups are resolved for the fixture's AVX2 fingerprint (not this machine's), with the
//! nearest-shape first-use timing off, so the answer depends on the file alone.

use std::path::{Path, PathBuf};

use kernels::Workload;
use runtime::Runtime;
use serde_json::{json, Value};
use tuning_db::TuningDb;

mod common;

const FIXTURE: &str = "tests/fixtures/schema_v3.db";
const EXPECTED: &str = "tests/fixtures/schema_v3.lookups.json";

/// Tuned shapes, their neighbours, a far shape and another op's shape: every level.
const WORKLOADS: [&str; 10] = [
    "gemm:64x64x64",
    "gemm:40x40x40",
    "gemm:48x80x40",
    "gemm:60x70x50",
    "gemm:4096x4096x4096",
    "gemm_bias_gelu:32x96x64",
    "gemm_bias_gelu:33x100x64",
    "gemm_bias:32x96x64",
    "attention:1x2x32x16:causal",
    "attention:1x2x32x16",
];

/// A copy in a fresh directory: the test never touches the committed file.
fn copy_of_fixture() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("schema_v3.db");
    std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURE), &path).unwrap();
    (dir, path)
}

fn lookups(path: &Path) -> Value {
    let db = TuningDb::open_read_only(path).unwrap();
    let mut fps = db.fingerprints().unwrap();
    fps.sort_by(|a, b| a.id.cmp(&b.id));
    let mut out = serde_json::Map::new();
    // The portable row's defaults use portable micro-kernels, which an AVX2 machine's space
    // does not offer, so only the AVX2 row is served here (every CI machine has AVX2); the
    // portable row's records still take part (they must not be borrowed by the AVX2 row).
    for hw in fps
        .into_iter()
        .filter(|hw| hw.isa.iter().any(|f| f == "avx2"))
    {
        let id = hw.id.clone();
        let rt = Runtime::open_for(path, hw.clone()).unwrap();
        rt.set_fallback_check(false);
        let mut per = serde_json::Map::new();
        for w in WORKLOADS {
            let wl: Workload = w.parse().unwrap();
            let c = rt.resolve(&wl).unwrap();
            // A default is the build's, not the file's: it must be the family's default
            // config, whatever that is now.
            let config = if c.level.as_str() == "default" {
                assert_eq!(c.config, c.kernel.default_config(&wl, &hw), "{w}");
                DEFAULT.to_string()
            } else {
                c.config.to_json()
            };
            per.insert(
                w.to_string(),
                json!({
                    "level": c.level.as_str(),
                    "kernel": c.kernel.name(),
                    "config": config,
                    "source_workload": c.source.as_ref().map(|s| s.workload.key()),
                    "source_fingerprint": c.source.as_ref().map(|s| s.fingerprint_id.clone()),
                }),
            );
        }
        out.insert(id, Value::Object(per));
    }
    Value::Object(out)
}

/// What the comparison puts in place of a default-level lookup's config (checked to be the
/// family's default config of this build).
const DEFAULT: &str = "the family's default config";

/// The recorded lookups' configs in the form this build serves them: families whose version
/// moved on since the fixture was recorded read the old configs through
/// [`kernels::Kernel::upgrade`] (`gemm_packed` v2 → v3 adds `b_layout = rowmajor`, what v2
/// ran), which is what the database does with the fixture's records; a default-level
/// lookup's config is the build's default, whatever it was when the fixture was recorded.
fn upgrade_configs(expected: &mut Value) {
    const RECORDED_AT: [(&str, u32); 1] = [("gemm_packed", 2)];
    let lookups = expected
        .as_object_mut()
        .into_iter()
        .flat_map(|fps| fps.values_mut());
    for entry in lookups.flat_map(|per| per.as_object_mut().unwrap().values_mut()) {
        let kernel = entry["kernel"].as_str().unwrap_or_default().to_string();
        if entry["level"] == "default" {
            entry["config"] = Value::from(DEFAULT);
        } else if let Some(&(_, v)) = RECORDED_AT.iter().find(|(k, _)| *k == kernel) {
            let config = kernels::Config::from_json(entry["config"].as_str().unwrap()).unwrap();
            let (_, config) = kernels::registry::upgrade_record(&kernel, v, config);
            entry["config"] = Value::from(config.to_json());
        }
    }
}

#[test]
fn a_schema_v3_database_opens_verifies_and_serves_the_same_lookups() {
    let (_dir, path) = copy_of_fixture();
    let db = TuningDb::open_read_only(&path).unwrap();
    db.verify().unwrap();
    assert_eq!(db.fingerprints().unwrap().len(), 2);
    drop(db);

    let o = common::autokernel(&["db", "verify", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", common::stderr(&o));

    let got = lookups(&path);
    let expected_path = Path::new(env!("CARGO_MANIFEST_DIR")).join(EXPECTED);
    let mut expected: Value =
        serde_json::from_str(&std::fs::read_to_string(&expected_path).unwrap_or_default())
            .unwrap_or(Value::Null);
    upgrade_configs(&mut expected);
    if got != expected {
        let at = std::env::temp_dir().join("schema_v3.lookups.actual.json");
        std::fs::write(&at, serde_json::to_string_pretty(&got).unwrap()).unwrap();
        panic!(
            "lookups differ from {EXPECTED} (recorded by the binary of before the refactor); \
             this build's are in {}",
            at.display()
        );
    }
}
