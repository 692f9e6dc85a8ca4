//! Lookup latency of the runtime (criterion): a cached exact hit, a nearest-shape miss (first
//! resolution, through `resolve` and through `lookup`, and repeated), the default level, the
//! owned-copy `choose`, and the dispatch overhead of `run` on a 1×1×1 GEMM.
//!
//! ```sh
//! cargo bench -p runtime --bench lookup
//! ```
//!
//! Writes the criterion medians at the top of `bench_results/<fingerprint>/runtime_lookup.md`
//! (everything from a `## Earlier runs` line on is kept).
//! Targets (issue 5): ≤ 50 ns for a cached workload, ≤ 2 µs for a nearest-shape miss.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::measurement::{Measurement as CriterionMeasurement, ValueFormatter, WallTime};
use criterion::Criterion;
use kernels::{default_for, HardwareFingerprint, Measurement, Workload};
use runtime::{Level, Runtime, MISS_CACHE_CAPACITY};
use tuning_db::{Record, TuningDb};

const GROUP: &str = "runtime_lookup";

/// The same cases timed in this thread's CPU time: what the lookup costs, without the time
/// the thread spends descheduled on a loaded machine.
const CPU_GROUP: &str = "runtime_lookup_cpu";

/// The heading above which the report is rewritten by each run.
const EARLIER: &str = "## Earlier runs";

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
            let (k, c) = default_for(&w, hw).unwrap();
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

/// CPU time of the calling thread.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID is supported on
    // every Linux this crate targets (on failure `ts` stays zero, which only spoils timings).
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Criterion measurement: CPU time of the benchmarking thread.
struct ThreadCpu(WallTime);

impl CriterionMeasurement for ThreadCpu {
    type Intermediate = Duration;
    type Value = Duration;

    fn start(&self) -> Duration {
        thread_cpu_time()
    }
    fn end(&self, start: Duration) -> Duration {
        thread_cpu_time().saturating_sub(start)
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, v: &Duration) -> f64 {
        v.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        self.0.formatter()
    }
}

/// Times `n` first lookups of distinct untuned shapes with `clock`, each resolved and
/// cached: a fresh runtime (not timed) whenever the miss cache is full. The fresh runtime's
/// first lookup (not timed either) refreshes this thread's handle, which drops the previous
/// runtime's index.
fn first_lookups(
    path: &Path,
    fresh: &[Workload],
    n: u64,
    clock: impl Fn() -> Duration,
) -> Duration {
    let warm = Workload::gemm(128, 768, 768).unwrap();
    let mut total = Duration::ZERO;
    let mut left = n as usize;
    while left > 0 {
        let r = Runtime::open(path).unwrap();
        r.set_fallback_check(false); // the resolution itself (see `main`)
        r.lookup(&warm).unwrap();
        let k = left.min(fresh.len());
        let t = clock();
        for w in &fresh[..k] {
            black_box(r.lookup(black_box(w)).unwrap());
        }
        total += clock().saturating_sub(t);
        left -= k;
    }
    total
}

fn median_ns(group: &str, id: &str) -> Option<f64> {
    let p = criterion_dir()
        .join(group)
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
    // The cost of resolving a miss, without the first-use check of a borrowed config (whose
    // cost is the timing it does: a few ms, once per shape, `runtime::probe`).
    rt.set_fallback_check(false);
    let none = Runtime::defaults_only();

    let exact = Workload::gemm(128, 768, 768).unwrap();
    let miss = Workload::gemm(200, 768, 768).unwrap();
    let untuned = Workload::gemm(200, 1000, 900).unwrap();
    assert_eq!(rt.lookup(&exact).unwrap().level, Level::Exact);
    assert_eq!(rt.resolve(&miss).unwrap().level, Level::NearestShape);
    assert_eq!(none.lookup(&untuned).unwrap().level, Level::Default);

    // Untuned shapes for the first-lookup cases (nearest tuned shape: 1024x768x768).
    let fresh: Vec<Workload> = (0..MISS_CACHE_CAPACITY)
        .map(|i| Workload::gemm(2000 + i, 768, 768).unwrap())
        .collect();

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
        let start = Instant::now();
        let wall = move || start.elapsed();
        g.bench_function("nearest_shape_first_lookup", |b| {
            b.iter_custom(|iters| first_lookups(&path, &fresh, iters, wall))
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
        // `run` on a 1×1×1 GEMM against the prepared executable itself: the dispatch cost.
        let one = Workload::gemm(1, 1, 1).unwrap();
        let (a, bm, mut out) = ([1.5f32], [2.0f32], [0.0f32]);
        g.bench_function("run_1x1x1", |b| {
            b.iter(|| rt.run(black_box(&one), &[&a, &bm], &mut out).unwrap())
        });
        let exe = rt.lookup(&one).unwrap();
        g.bench_function("exe_run_1x1x1", |b| {
            b.iter(|| exe.run(black_box(&[&a, &bm]), &mut out))
        });
        g.finish();
    }
    c.final_summary();
    let mut c = Criterion::default()
        .with_measurement(ThreadCpu(WallTime))
        .output_directory(&criterion_dir())
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    {
        let mut g = c.benchmark_group(CPU_GROUP);
        g.bench_function("exact_hit", |b| {
            b.iter(|| rt.lookup(black_box(&exact)).unwrap())
        });
        g.bench_function("nearest_shape_first", |b| {
            b.iter(|| rt.resolve(black_box(&miss)).unwrap())
        });
        g.bench_function("nearest_shape_first_lookup", |b| {
            b.iter_custom(|iters| first_lookups(&path, &fresh, iters, thread_cpu_time))
        });
        g.bench_function("nearest_shape_repeated", |b| {
            b.iter(|| rt.lookup(black_box(&miss)).unwrap())
        });
        g.bench_function("default_first", |b| {
            b.iter(|| none.resolve(black_box(&untuned)).unwrap())
        });
        g.bench_function("default_repeated", |b| {
            b.iter(|| none.lookup(black_box(&untuned)).unwrap())
        });
        g.finish();
    }
    c.final_summary();
    write_report(&rt);
}

/// The cases of the report: criterion id, what it measures, the target median in ns.
const CASES: [(&str, &str, Option<f64>); 9] = [
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
        "nearest_shape_first_lookup",
        "nearest-shape miss, first time: `lookup` (resolve + insert into the cache; \
         distinct shapes)",
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
    (
        "run_1x1x1",
        "`run` of a cached gemm:1x1x1: probe, buffer checks, count, kernel",
        None,
    ),
    (
        "exe_run_1x1x1",
        "the same kernel called directly (`Choice::run`), for comparison",
        None,
    ),
];

fn write_report(rt: &Runtime) {
    let hw = HardwareFingerprint::current();
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
         Two medians per case: wall-clock (criterion's default) and this thread's CPU time \
         (the same loop, without the time spent descheduled).\n\n\
         | case | median, wall | median, thread CPU | target |\n|---|---|---|---|\n",
        tuning_db::now_rfc3339(),
        hw.summary(),
        hw.id,
        rt.tuned_workloads()
    );
    for (id, what, target) in CASES {
        md += &table_row(what, median_ns(GROUP, id), median_ns(CPU_GROUP, id), target);
    }
    let dir = root().join("bench_results").join(&hw.id);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("runtime_lookup.md");
    // Keep the history below the latest run.
    if let Some(at) = std::fs::read_to_string(&file)
        .ok()
        .and_then(|old| old.find(EARLIER).map(|at| old[at..].to_string()))
    {
        md = format!("{md}\n{at}");
    }
    std::fs::write(&file, &md).unwrap();
    println!("{md}");
    eprintln!("wrote {}", dir.join("runtime_lookup.md").display());
}

/// One line of the report's table: the wall and CPU medians and how they meet `target`.
fn table_row(what: &str, wall: Option<f64>, cpu: Option<f64>, target: Option<f64>) -> String {
    let fmt = |m: Option<f64>| {
        m.map_or("—".into(), |ns| {
            if ns < 1000.0 {
                format!("{ns:.1} ns")
            } else {
                format!("{:.2} µs", ns / 1000.0)
            }
        })
    };
    let mark = |m: Option<f64>, t: f64| match m {
        Some(ns) if ns <= t => "✓",
        Some(_) => "✗",
        None => "—",
    };
    let target = target.map_or("—".to_string(), |t| {
        format!("≤ {t} ns (wall {}, CPU {})", mark(wall, t), mark(cpu, t))
    });
    format!("| {what} | {} | {} | {target} |\n", fmt(wall), fmt(cpu))
}
