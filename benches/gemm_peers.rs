//! Tuned GEMM, dispatched through the runtime, against the default config and the Rust peers
//! `matrixmultiply`, `gemm` and `faer`, single thread and two threads, side by side in one run.
//!
//! ```text
//! cargo bench --bench gemm_peers                      # all shapes (~4 minutes on 2 cores, +3 to tune them first)
//! AUTOKERNEL_BENCH_SHAPES=gemm:1024x1024x1024 cargo bench --bench gemm_peers
//! ```
//! Environment: `AUTOKERNEL_BENCH_DB` (tuning database, default `target/bench-tuning.db`; shapes
//! not tuned there yet are tuned first, resumably, with the default (cost-model) strategy, as
//! `autokernel tune` does), `AUTOKERNEL_BENCH_BUDGET` (trials per shape and thread count,
//! default 64), `AUTOKERNEL_BENCH_SHAPES` (comma-separated workloads),
//! `AUTOKERNEL_BENCH_ROUNDS` (default 21), `AUTOKERNEL_BENCH_THREADS` (e.g. `1`; default 1 and 2).
//!
//! On a shared, noisy machine the speed of a core drifts by tens of percent within minutes,
//! so the implementations are interleaved finely: every shape is measured in `ROUNDS`
//! rounds, and each round times one sample (about 30 ms of back-to-back calls, after 5 ms of
//! untimed ones) of every implementation at every thread count, in a new order each round.
//! Each implementation's time is the median of its samples, and the ratio of the tuned
//! kernel to the fastest peer is the median of the per-round ratios — samples taken within
//! a fraction of a second of each other, which a drift does not separate. (Longer blocks
//! per implementation, as criterion runs them, put 0.89× where alternating calls in one
//! process measured parity.)
//! Writes `bench_results/<fingerprint>/gemm_peers.{json,md}`: those medians as GFLOP/s and
//! the ratio of the tuned kernel to the fastest peer, plus the measured FMA peak and the load
//! average before and after the run.
//!
//! Peers at their fastest: `gemm` with its `x86-v4` feature, `faer` with `nightly` (AVX-512
//! paths where the CPU has them), both with rayon at 2 threads; `matrixmultiply` runs single
//! threaded (its thread count is fixed per process by an environment variable).

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

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
        .unwrap_or(21usize)
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

/// Seconds of back-to-back calls in one sample.
const SAMPLE_SECS: f64 = 0.03;
/// Untimed calls before each sample, seconds.
const WARM_SECS: f64 = 0.005;

/// One implementation at one thread count, as the rounds call it.
struct Entrant<'a> {
    imp: &'static str,
    threads: usize,
    call: Box<dyn Fn() + 'a>,
    /// Calls per sample.
    reps: usize,
}

impl Entrant<'_> {
    /// Nanoseconds per call over one sample, after [`WARM_SECS`] of untimed calls: a sample on
    /// two threads that follows one on a single thread would otherwise time the idle core's
    /// wake-up (identical configs, tuned and default, came out 4–8% apart at 2 threads when
    /// the tuned one always followed a single-thread peer after one untimed call, and 14–16%
    /// apart at 256³ and 512³ in another run).
    fn sample(&self) -> f64 {
        let warm = Instant::now();
        while warm.elapsed().as_secs_f64() < WARM_SECS {
            (self.call)();
        }
        let t = Instant::now();
        for _ in 0..self.reps {
            (self.call)();
        }
        t.elapsed().as_nanos() as f64 / self.reps as f64
    }
}

/// Times `entrants` in `rounds` interleaved rounds (see the module documentation): every
/// entrant's nanoseconds per call, one value per round, keyed by `(impl, threads)`.
fn measure(
    entrants: &mut [Entrant<'_>],
    rounds: usize,
) -> HashMap<(&'static str, usize), Vec<f64>> {
    for e in entrants.iter_mut() {
        (e.call)(); // first touch of its buffers and thread pools
        let t = Instant::now();
        (e.call)();
        e.reps = ((SAMPLE_SECS / t.elapsed().as_secs_f64().max(1e-9)) as usize).max(1);
        e.sample(); // warm-up
    }
    let mut ns: HashMap<_, Vec<f64>> = HashMap::new();
    let mut order: Vec<usize> = (0..entrants.len()).collect();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..rounds {
        // A new order each round (Fisher–Yates, a fixed xorshift sequence): no entrant always
        // follows the same one.
        for i in (1..order.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            order.swap(i, (state % (i as u64 + 1)) as usize);
        }
        for &i in &order {
            let e = &entrants[i];
            ns.entry((e.imp, e.threads)).or_default().push(e.sample());
        }
    }
    ns
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
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
    let mut chosen = Vec::new();
    // Per shape, `(impl, threads)` -> nanoseconds per call, one value per round.
    let mut times = Vec::new();
    for w in &shapes {
        let Workload::Gemm { m, n, k, .. } = *w else {
            unreachable!("this bench only lists gemm shapes")
        };
        eprintln!("measuring {w} ({rounds} rounds)");
        let p = Problem::random(w, 11);
        let (a, b) = (&p.inputs[0][..], &p.inputs[1][..]);
        let out = RefCell::new(p.output());
        let defaults: Vec<_> = threads
            .iter()
            .map(|&t| {
                let (dk, dc) =
                    default_for(w, &HardwareFingerprint::current().with_cores(t)).unwrap();
                dk.prepare(w, &dc).expect("default config builds")
            })
            .collect();
        let mut entrants = Vec::new();
        for (ti, &t) in threads.iter().enumerate() {
            let tuned = runtimes[ti].choose(w).expect("tuned choice");
            chosen.push(
                json!({"workload": w.key(), "threads": t, "level": tuned.level.as_str(),
                               "kernel": tuned.kernel.name(), "config": tuned.config}),
            );
            let (rt, default, out) = (&runtimes[ti], &defaults[ti], &out);
            for imp in IMPLS {
                let call: Box<dyn Fn() + '_> = match imp {
                    "tuned" => Box::new(move || {
                        rt.gemm(m, n, k, a, b, &mut out.borrow_mut()).unwrap();
                    }),
                    "default" => {
                        Box::new(move || default.run_f32(&[a, b], &mut out.borrow_mut()).unwrap())
                    }
                    "matrixmultiply" if t == 1 => {
                        Box::new(move || gemm_mm(m, n, k, a, b, &mut out.borrow_mut()))
                    }
                    "matrixmultiply" => continue,
                    "gemm" => Box::new(move || gemm_gemm(m, n, k, a, b, &mut out.borrow_mut(), t)),
                    _ => Box::new(move || gemm_faer(m, n, k, a, b, &mut out.borrow_mut(), t)),
                };
                entrants.push(Entrant {
                    imp,
                    threads: t,
                    call,
                    reps: 1,
                });
            }
        }
        times.push(measure(&mut entrants, rounds));
    }
    let load = format!("{load_before} before, {} after", load_average());
    write_report(&shapes, &threads, chosen, &times, rounds, &load);
}

fn write_report(
    shapes: &[Workload],
    threads: &[usize],
    chosen: Vec<serde_json::Value>,
    times: &[HashMap<(&'static str, usize), Vec<f64>>],
    rounds: usize,
    load: &str,
) {
    let hw = HardwareFingerprint::current();
    let peak: Vec<f64> = threads.iter().map(|&t| fma_peak(t)).collect();
    let mut rows = Vec::new();
    let mut md = format!(
        "# GEMM vs peers — {}\n\nMachine: {}\n\nFingerprint `{}`. GFLOP/s (2·M·N·K / time), time = median over {} interleaved \
         rounds of one ~30 ms sample (after 5 ms untimed) of every implementation and thread count, in a new order each round; \
         `ratio` = tuned ÷ fastest peer (matrixmultiply, gemm, faer), the median of the \
         rounds' ratios. \
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
        for (w, ns) in shapes.iter().zip(times) {
            let of = |imp: &str| {
                ns.iter()
                    .find(|((i, th), _)| *i == imp && *th == t)
                    .map(|(_, v)| v)
            };
            let vals: Vec<Option<f64>> = IMPLS
                .iter()
                .map(|i| of(i).map(|v| w.flops() / median(v)))
                .collect();
            let peers: Vec<&Vec<f64>> = IMPLS[2..].iter().filter_map(|i| of(i)).collect();
            let ratio = of("tuned").and_then(|tuned| ratio_vs_best_peer(tuned, &peers));
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

/// The FMA peak of `t` threads in GFLOP/s, the median of three measurements.
fn fma_peak(t: usize) -> f64 {
    let mut runs: Vec<f64> = (0..3)
        .map(|_| kernels::cpu::peak::fma_peak_gflops(t, 0.5))
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[1]
}

/// The median over rounds of the fastest peer's time over the tuned kernel's (`None`
/// without peers); `tuned` and each of `peers` hold one time per round.
fn ratio_vs_best_peer(tuned: &[f64], peers: &[&Vec<f64>]) -> Option<f64> {
    if peers.is_empty() {
        return None;
    }
    let per_round: Vec<f64> = (0..tuned.len())
        .map(|r| peers.iter().map(|p| p[r]).fold(f64::INFINITY, f64::min) / tuned[r])
        .collect();
    Some(median(&per_round))
}
