//! Tuned GEMM, dispatched through the runtime, against the default config and the Rust peers
//! `matrixmultiply`, `gemm` and `faer`, single thread and two threads, side by side in one run.
//!
//! ```text
//! cargo bench --bench gemm_peers                      # all shapes (~10 minutes on 2 cores)
//! AUTOKERNEL_BENCH_SHAPES=gemm:1024x1024x1024 cargo bench --bench gemm_peers
//! ```
//! Environment: `AUTOKERNEL_BENCH_DB` (tuning database, default `target/bench-tuning.db`; shapes
//! not tuned there yet are tuned first, resumably, with the default (cost-model) strategy, as
//! `autokernel tune` does), `AUTOKERNEL_BENCH_BUDGET` (trials per shape and thread count,
//! default 64), `AUTOKERNEL_BENCH_SHAPES` (comma-separated workloads),
//! `AUTOKERNEL_BENCH_ROUNDS` (default 3), `AUTOKERNEL_BENCH_THREADS` (e.g. `1`; default 1 and 2).
//!
//! On a shared, noisy machine one long measurement per implementation lets a burst of load
//! land on one of them; so every shape is measured in `ROUNDS` rounds, each a short criterion
//! run of every implementation in turn (flat sampling, 10 samples), and the report takes the
//! median over the rounds of criterion's medians: the implementations are interleaved.
//! Writes `bench_results/<fingerprint>/gemm_peers.{json,md}`: those medians as GFLOP/s and
//! the ratio of the tuned kernel to the fastest peer, plus the measured FMA peak and the load
//! average before and after the run.
//!
//! Peers at their fastest: `gemm` with its `x86-v4` feature, `faer` with `nightly` (AVX-512
//! paths where the CPU has them), both with rayon at 2 threads; `matrixmultiply` runs single
//! threaded (its thread count is fixed per process by an environment variable).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use kernels::{default_for, HardwareFingerprint, Problem, Workload};
use runtime::Runtime;
use search::{tune, StrategyKind, TuneOptions};
use serde_json::json;
use tuning_db::TuningDb;

const SHAPES: [&str; 13] = [
    "gemm:64x64x64",
    "gemm:100x100x100",
    "gemm:256x256x256",
    "gemm:512x512x512",
    "gemm:1024x1024x1024",
    "gemm:2048x2048x2048",
    "gemm:128x768x768",
    "gemm:128x3072x768",
    "gemm:128x768x3072",
    "gemm:128x2304x768",
    "gemm:1x3072x768",
    "gemm:8x3072x768",
    "gemm:32x3072x768",
];

const IMPLS: [&str; 5] = ["tuned", "default", "matrixmultiply", "gemm", "faer"];

fn shapes() -> Vec<Workload> {
    let list = std::env::var("AUTOKERNEL_BENCH_SHAPES").unwrap_or_else(|_| SHAPES.join(","));
    list.split(',')
        .map(|s| {
            s.parse()
                .unwrap_or_else(|e| panic!("AUTOKERNEL_BENCH_SHAPES: {e}"))
        })
        .collect()
}

fn thread_counts() -> Vec<usize> {
    let cores = HardwareFingerprint::current().cores;
    let all = if cores >= 2 { vec![1, 2] } else { vec![1] };
    match std::env::var("AUTOKERNEL_BENCH_THREADS") {
        Ok(list) => list
            .split(',')
            .map(|t| {
                t.trim()
                    .parse()
                    .unwrap_or_else(|e| panic!("AUTOKERNEL_BENCH_THREADS: {e}"))
            })
            .filter(|t| all.contains(t))
            .collect(),
        Err(_) => all,
    }
}

fn rounds() -> usize {
    std::env::var("AUTOKERNEL_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3usize)
        .max(1)
}

/// The 1-, 5- and 15-minute load averages (Linux), or an empty string.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn gemm_mm(m: usize, n: usize, k: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    // SAFETY: a is m×k, b is k×n, c is m×n, all row-major and of exactly those lengths.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            k as isize,
            1,
            b.as_ptr(),
            n as isize,
            1,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        )
    }
}

fn gemm_gemm(m: usize, n: usize, k: usize, a: &[f32], b: &[f32], c: &mut [f32], threads: usize) {
    let par = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: row-major views (column stride 1, row stride = row length) of buffers of
    // exactly m×k, k×n and m×n elements; read_dst is false so c's contents are not read.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            1,
            n as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        )
    }
}

fn gemm_faer(m: usize, n: usize, k: usize, a: &[f32], b: &[f32], c: &mut [f32], threads: usize) {
    let par = if threads > 1 {
        faer::Par::rayon(threads)
    } else {
        faer::Par::Seq
    };
    let lhs = faer::MatRef::from_row_major_slice(a, m, k);
    let rhs = faer::MatRef::from_row_major_slice(b, k, n);
    let dst = faer::MatMut::from_row_major_slice_mut(c, m, n);
    faer::linalg::matmul::matmul(dst, faer::Accum::Replace, lhs, rhs, 1.0f32, par);
}

fn ensure_tuned(db_path: &PathBuf, shapes: &[Workload], threads: &[usize]) {
    let budget = std::env::var("AUTOKERNEL_BENCH_BUDGET")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    let db = TuningDb::open(db_path).expect("bench tuning database");
    for &t in threads {
        let hw = HardwareFingerprint::current().with_cores(t);
        for w in shapes {
            let opts = TuneOptions {
                budget,
                strategy: StrategyKind::DEFAULT,
                seed: 1,
                ..TuneOptions::default()
            };
            let s = tune(&db, w, &hw, &opts, &mut |_| {}).expect("tuning");
            if s.measured > 0 {
                eprintln!("tuned {w} at {t} thread(s): {} new trials", s.measured);
            }
        }
    }
}

fn criterion_dir() -> PathBuf {
    if let Ok(h) = std::env::var("CRITERION_HOME") {
        return h.into();
    }
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    PathBuf::from(target).join("criterion")
}

fn median_ns(group: &str, id: &str) -> Option<f64> {
    let p = criterion_dir()
        .join(group)
        .join(id)
        .join("new/estimates.json");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok()?;
    v["median"]["point_estimate"].as_f64()
}

fn group_name(w: &Workload) -> String {
    w.key().replace(':', "_")
}

fn main() {
    // matrixmultiply's `threading` feature sizes its pool once, from MATMUL_NUM_THREADS or
    // else the physical core count: pin it to the single thread its column claims.
    if std::env::var_os("MATMUL_NUM_THREADS").is_none() {
        std::env::set_var("MATMUL_NUM_THREADS", "1");
    }
    let shapes = shapes();
    let threads = thread_counts();
    let db_path: PathBuf = std::env::var("AUTOKERNEL_BENCH_DB")
        .map(PathBuf::from)
        .unwrap_or_else(|_| "target/bench-tuning.db".into());
    ensure_tuned(&db_path, &shapes, &threads);
    let runtimes: Vec<Runtime> = threads
        .iter()
        .map(|&t| {
            Runtime::open_for(&db_path, HardwareFingerprint::current().with_cores(t))
                .expect("runtime")
        })
        .collect();

    let load_before = load_average();
    let rounds = rounds();
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(800))
        // Only the median's point estimate is used; the default 100 000 bootstrap
        // resamples take seconds per benchmark on a loaded 2-core machine.
        .nresamples(1000)
        .configure_from_args();
    let mut chosen = Vec::new();
    // (group, id) -> criterion's median of every round, in ns.
    let mut medians: HashMap<(String, String), Vec<f64>> = HashMap::new();
    for w in &shapes {
        let Workload::Gemm { m, n, k, .. } = *w else {
            unreachable!("this bench only lists gemm shapes")
        };
        let p = Problem::random(w, 11);
        let (a, b) = (&p.inputs[0], &p.inputs[1]);
        let mut out = p.output();
        let defaults: Vec<_> = threads
            .iter()
            .map(|&t| {
                let (dk, dc) =
                    default_for(w, &HardwareFingerprint::current().with_cores(t)).unwrap();
                dk.prepare(w, &dc).expect("default config builds")
            })
            .collect();
        for (ti, &t) in threads.iter().enumerate() {
            let tuned = runtimes[ti].choose(w).expect("tuned choice");
            chosen.push(
                json!({"workload": w.key(), "threads": t, "level": tuned.level.as_str(),
                               "kernel": tuned.kernel.name(), "config": tuned.config}),
            );
        }
        for round in 0..rounds {
            let mut g = c.benchmark_group(group_name(w));
            g.throughput(Throughput::Elements(w.flops() as u64));
            g.sampling_mode(SamplingMode::Flat);
            let mut ids = Vec::new();
            for (ti, &t) in threads.iter().enumerate() {
                let (rt, default) = (&runtimes[ti], &defaults[ti]);
                // Odd rounds run the implementations in reverse: none is always first after
                // a pause (frequency ramp, the other vCPU's state) or always last.
                let mut order = IMPLS.to_vec();
                order.retain(|&imp| imp != "matrixmultiply" || t == 1);
                if round % 2 == 1 {
                    order.reverse();
                }
                for imp in order {
                    let id = BenchmarkId::new(imp, format!("{t}t"));
                    match imp {
                        "tuned" => g.bench_function(id, |bch| {
                            bch.iter(|| rt.gemm(m, n, k, a, b, &mut out).unwrap())
                        }),
                        "default" => g.bench_function(id, |bch| {
                            bch.iter(|| default.run_f32(&[a, b], &mut out).unwrap())
                        }),
                        "matrixmultiply" => g.bench_function(id, |bch| {
                            bch.iter(|| gemm_mm(m, n, k, a, b, &mut out))
                        }),
                        "gemm" => g.bench_function(id, |bch| {
                            bch.iter(|| gemm_gemm(m, n, k, a, b, &mut out, t))
                        }),
                        _ => g.bench_function(id, |bch| {
                            bch.iter(|| gemm_faer(m, n, k, a, b, &mut out, t))
                        }),
                    };
                    ids.push(format!("{imp}/{t}t"));
                }
            }
            g.finish();
            for id in ids {
                // Criterion files the n-th run of one id in a process under `<id>_<n>`.
                let dir = if round == 0 {
                    id.clone()
                } else {
                    format!("{id}_{}", round + 1)
                };
                if let Some(ns) = median_ns(&group_name(w), &dir) {
                    medians.entry((group_name(w), id)).or_default().push(ns);
                }
            }
        }
    }
    c.final_summary();
    let load = format!("{load_before} before, {} after", load_average());
    write_report(&shapes, &threads, chosen, &medians, rounds, &load);
}

fn write_report(
    shapes: &[Workload],
    threads: &[usize],
    chosen: Vec<serde_json::Value>,
    medians: &HashMap<(String, String), Vec<f64>>,
    rounds: usize,
    load: &str,
) {
    let median_of = |group: &str, id: &str| {
        let mut v = medians.get(&(group.to_string(), id.to_string()))?.clone();
        v.sort_by(f64::total_cmp);
        Some(v[v.len() / 2])
    };
    let hw = HardwareFingerprint::current();
    let peak: Vec<f64> = threads
        .iter()
        .map(|&t| {
            let mut runs: Vec<f64> = (0..3)
                .map(|_| kernels::cpu::peak::fma_peak_gflops(t, 0.5))
                .collect();
            runs.sort_by(f64::total_cmp);
            runs[1]
        })
        .collect();
    let mut rows = Vec::new();
    let mut md = format!(
        "# GEMM vs peers — {}\n\nMachine: {}\n\nFingerprint `{}`. GFLOP/s (2·M·N·K / time), time = median over {} interleaved \
         rounds of criterion's median (10 flat samples per round); \
         `ratio` = tuned ÷ fastest peer (matrixmultiply, gemm, faer) in the same run. \
         Load average (1/5/15 min): {}. FMA peak (median of 3): {}.\n",
        tuning_db::now_rfc3339(),
        hw.summary(),
        hw.id,
        rounds,
        load,
        threads.iter().zip(&peak).map(|(t, p)| format!("{t} thread(s) {p:.1} GFLOP/s")).collect::<Vec<_>>().join(", ")
    );
    for (ti, &t) in threads.iter().enumerate() {
        md += &format!("\n## {t} thread(s)\n\n| workload (M×N×K) | tuned | default | matrixmultiply | gemm | faer | ratio vs best peer | tuned % of peak |\n|---|---|---|---|---|---|---|---|\n");
        for w in shapes {
            let gf = |imp: &str| {
                let id = format!("{imp}/{t}t");
                median_of(&group_name(w), &id).map(|ns| w.flops() / ns)
            };
            let vals: Vec<Option<f64>> = IMPLS.iter().map(|i| gf(i)).collect();
            let best_peer = vals[2..].iter().flatten().copied().fold(f64::NAN, f64::max);
            let ratio = vals[0].map(|x| x / best_peer);
            let cell = |v: Option<f64>| v.map_or("—".to_string(), |x| format!("{x:.1}"));
            md += &format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
                w.key(),
                cell(vals[0]),
                cell(vals[1]),
                cell(vals[2]),
                cell(vals[3]),
                cell(vals[4]),
                ratio.map_or("—".into(), |r| format!("{r:.2}×")),
                vals[0].map_or("—".into(), |x| format!("{:.0}%", 100.0 * x / peak[ti]))
            );
            rows.push(json!({"workload": w.key(), "threads": t,
                "gflops": IMPLS.iter().zip(&vals).map(|(i, v)| (i.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
                "ratio_vs_best_peer": ratio}));
        }
    }
    md += "\nConfigs chosen by the runtime:\n\n";
    for c in &chosen {
        md += &format!(
            "- {} @ {}t: {} {} `{}`\n",
            c["workload"], c["threads"], c["level"], c["kernel"], c["config"]
        );
    }
    let dir = PathBuf::from("bench_results").join(&hw.id);
    std::fs::create_dir_all(&dir).expect("bench_results directory");
    let doc = json!({"date": tuning_db::now_rfc3339(), "fingerprint": hw, "rounds": rounds, "load_average": load, "fma_peak_gflops": threads.iter().zip(&peak).map(|(t, p)| json!({"threads": t, "gflops": p})).collect::<Vec<_>>(), "rows": rows, "chosen": chosen});
    std::fs::write(
        dir.join("gemm_peers.json"),
        serde_json::to_string_pretty(&doc).unwrap(),
    )
    .unwrap();
    std::fs::write(dir.join("gemm_peers.md"), &md).unwrap();
    println!("{md}");
    eprintln!("wrote {}", dir.join("gemm_peers.md").display());
}
