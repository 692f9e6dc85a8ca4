//! Lookup latency of the runtime (criterion): a cached exact hit, a nearest-shape miss (first
//! resolution and repeated), the default level, and the owned-copy `choose`.
//!
//! ```sh
//! cargo bench -p runtime --bench lookup
//! ```
//!
//! Writes `bench_results/<fingerprint>/runtime_lookup.md` with the criterion medians.
//! Targets (issue 5): ≤ 50 ns for a cached workload, ≤ 2 µs for a nearest-shape miss.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Duration;

use criterion::Criterion;
use kernels::{default_for, HardwareFingerprint, Measurement, Workload};
use runtime::{Level, Runtime};
use tuning_db::{Record, TuningDb};

const GROUP: &str = "runtime_lookup";

/// The tuned shapes: M ∈ {1, 8, 16, ..., 512} × the BERT-base N/K pairs (30 workloads).
fn tuned_shapes() -> Vec<Workload> {
    let mut v = Vec::new();
    for m in [1, 8, 16, 32, 64, 128, 256, 384, 512, 1024] {
        for (n, k) in [(768, 768), (3072, 768), (768, 3072)] {
            v.push(Workload::gemm(m, n, k).unwrap());
        }
    }
    v
}

/// A database with one record per tuned shape (the default config; timings made up: only
/// the lookup is measured here).
fn make_db(path: &Path) {
    let db = TuningDb::open(path).unwrap();
    let hw = HardwareFingerprint::current();
    db.upsert_fingerprint(hw).unwrap();
    let recs: Vec<Record> = tuned_shapes()
        .into_iter()
        .map(|w| {
            let (k, c) = default_for(&w, hw);
            let m = Measurement::from_samples(vec![1e-4, 1.01e-4, 0.99e-4]);
            Record::ok(&hw.id, w, k.name(), k.version(), c, m, "bench")
        })
        .collect();
    db.insert_many(&recs).unwrap();
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn criterion_dir() -> PathBuf {
    std::env::var_os("CRITERION_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/criterion"))
}

fn median_ns(id: &str) -> Option<f64> {
    let p = criterion_dir()
        .join(GROUP)
        .join(id)
        .join("new/estimates.json");
    let text = std::fs::read_to_string(p).ok()?;
    let key = "\"median\":{\"confidence_interval\":";
    // estimates.json: {"mean":{...},"median":{"confidence_interval":{...},"point_estimate":X,...
    let at = text.find(key)?;
    let rest = &text[at..];
    let pe = rest.find("\"point_estimate\":")? + "\"point_estimate\":".len();
    let num: String = rest[pe..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '-' | '+'))
        .collect();
    num.parse().ok()
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.db");
    make_db(&path);
    let rt = Runtime::open(&path).unwrap();
    let none = Runtime::defaults_only();

    let exact = Workload::gemm(128, 768, 768).unwrap();
    let miss = Workload::gemm(200, 768, 768).unwrap();
    let untuned = Workload::gemm(200, 1000, 900).unwrap();
    assert_eq!(rt.lookup(&exact).unwrap().level, Level::Exact);
    assert_eq!(rt.resolve(&miss).unwrap().level, Level::NearestShape);
    assert_eq!(none.lookup(&untuned).unwrap().level, Level::Default);

    let mut c = Criterion::default()
        .output_directory(&criterion_dir())
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    {
        let mut g = c.benchmark_group(GROUP);
        g.bench_function("exact_hit", |b| {
            b.iter(|| rt.lookup(black_box(&exact)).unwrap())
        });
        g.bench_function("nearest_shape_first", |b| {
            b.iter(|| rt.resolve(black_box(&miss)).unwrap())
        });
        rt.lookup(&miss).unwrap();
        g.bench_function("nearest_shape_repeated", |b| {
            b.iter(|| rt.lookup(black_box(&miss)).unwrap())
        });
        g.bench_function("default_first", |b| {
            b.iter(|| none.resolve(black_box(&untuned)).unwrap())
        });
        none.lookup(&untuned).unwrap();
        g.bench_function("default_repeated", |b| {
            b.iter(|| none.lookup(black_box(&untuned)).unwrap())
        });
        g.bench_function("choose_owned_copy", |b| {
            b.iter(|| rt.choose(black_box(&exact)).unwrap())
        });
        g.finish();
    }
    c.final_summary();
    write_report(&rt);
}

fn write_report(rt: &Runtime) {
    let hw = HardwareFingerprint::current();
    let rows = [
        (
            "exact_hit",
            "cached exact hit: `lookup` (hash probe + Arc clone)",
            Some(50.0),
        ),
        (
            "nearest_shape_first",
            "nearest-shape miss, first time: `resolve` (rank 30 tuned shapes, check + build)",
            Some(2000.0),
        ),
        (
            "nearest_shape_repeated",
            "nearest-shape miss, repeated: `lookup` (cached)",
            Some(50.0),
        ),
        (
            "default_first",
            "default level, first time: `resolve` (build the default)",
            None,
        ),
        (
            "default_repeated",
            "default level, repeated: `lookup` (cached)",
            Some(50.0),
        ),
        (
            "choose_owned_copy",
            "`choose` (owned copy: clones the config map)",
            None,
        ),
    ];
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|l| {
            let l: Vec<&str> = l.split_whitespace().take(3).collect();
            format!(
                " Load average when written (1, 5, 15 min): {}.",
                l.join(", ")
            )
        })
        .unwrap_or_default();
    let mut md = format!(
        "# Runtime lookup latency — {}\n\nMachine: {}\n\nFingerprint `{}`. Criterion medians \
         (`cargo bench -p runtime --bench lookup`), {} tuned workloads in the index. The machine \
         is shared (2 cores, other jobs running): treat as indicative.{load}\n\n\
         | case | median | target |\n|---|---|---|\n",
        tuning_db::now_rfc3339(),
        hw.summary(),
        hw.id,
        rt.tuned_workloads()
    );
    for (id, what, target) in rows {
        let m = median_ns(id);
        md += &format!(
            "| {what} | {} | {} |\n",
            m.map_or("—".into(), |ns| if ns < 1000.0 {
                format!("{ns:.1} ns")
            } else {
                format!("{:.2} µs", ns / 1000.0)
            }),
            target.map_or("—".to_string(), |t| {
                let ok = m.is_some_and(|ns| ns <= t);
                format!("≤ {} ns {}", t, if ok { "✓" } else { "✗" })
            })
        );
    }
    let dir = root().join("bench_results").join(&hw.id);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("runtime_lookup.md"), &md).unwrap();
    println!("{md}");
    eprintln!("wrote {}", dir.join("runtime_lookup.md").display());
}
