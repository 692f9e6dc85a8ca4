//! The nearest-shape experiment (a measurement, not a CI test; about 10 minutes):
//!
//! ```sh
//! cargo test --release --test nearest_shape -- --ignored --nocapture
//! ```
//!
//! Tunes a training set of GEMM shapes (M ∈ {16, 32, 64, 128, 256, 512} × the BERT-base N/K
//! pairs) into one database and a held-out set (M ∈ {24, 48, 96, 200, 384} × the same N/K)
//! into another, with the same command and budget. For each held-out shape it then times,
//! interleaved on the same inputs, the runtime's `nearest_shape` pick from the training
//! database, the held-out shape's own tuned winner, and the default, and writes
//! `bench_results/<fingerprint>/nearest_shape.md` (method, table, median ratio).
//! `AUTOKERNEL_NS_BUDGET` sets the per-shape budget (default 12).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use kernels::{default_for, Executable, HardwareFingerprint, Problem, Workload};
use runtime::{Level, Runtime};

const NK: [(usize, usize); 3] = [(768, 768), (3072, 768), (768, 3072)];
const TRAIN_M: [usize; 6] = [16, 32, 64, 128, 256, 512];
const HELD_OUT_M: [usize; 5] = [24, 48, 96, 200, 384];

fn shapes(ms: &[usize]) -> Vec<Workload> {
    let mut v = Vec::new();
    for &(n, k) in &NK {
        for &m in ms {
            v.push(Workload::gemm(m, n, k).unwrap());
        }
    }
    v
}

fn tune(db: &Path, ws: &[Workload], budget: usize) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_autokernel"));
    cmd.args(["tune", "--db", db.to_str().unwrap(), "--budget"])
        .arg(budget.to_string())
        .args(["--seed", "1", "--json"]);
    for w in ws {
        cmd.args(["--workload", &w.key()]);
    }
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Seconds per call of each executable: `rounds` rounds, each timing every executable once
/// (≥ 5 ms of back-to-back calls), the starting one rotating; medians.
fn interleaved(exes: &[&dyn Executable], p: &Problem, rounds: usize) -> Vec<f64> {
    let inputs = p.input_slices();
    let mut out = p.output();
    let reps: Vec<usize> = exes
        .iter()
        .map(|e| {
            let t = Instant::now();
            let mut n = 0;
            while t.elapsed().as_secs_f64() < 0.02 || n < 2 {
                e.run(&inputs, &mut out);
                n += 1;
            }
            let per = t.elapsed().as_secs_f64() / n as f64;
            ((0.005 / per).ceil() as usize).max(1)
        })
        .collect();
    let mut samples = vec![Vec::new(); exes.len()];
    for r in 0..rounds {
        for j in 0..exes.len() {
            let i = (r + j) % exes.len();
            let t = Instant::now();
            for _ in 0..reps[i] {
                exes[i].run(&inputs, &mut out);
            }
            samples[i].push(t.elapsed().as_secs_f64() / reps[i] as f64);
        }
    }
    samples
        .iter()
        .map(|s| kernels::measurement::median(s))
        .collect()
}

struct ChoiceExe(std::sync::Arc<runtime::Choice>);

impl Executable for ChoiceExe {
    fn run(&self, inputs: &[&[f32]], output: &mut [f32]) {
        self.0.run(inputs, output)
    }
}

#[test]
#[ignore = "a ~10 minute measurement: cargo test --release --test nearest_shape -- --ignored"]
fn nearest_shape_versus_tuning_each_shape() {
    let budget: usize = std::env::var("AUTOKERNEL_NS_BUDGET")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let work = root.join("target/nearest_shape");
    std::fs::create_dir_all(&work).unwrap();
    let (train_db, held_db) = (work.join("train.db"), work.join("held_out.db"));
    let started = Instant::now();
    tune(&train_db, &shapes(&TRAIN_M), budget);
    tune(&held_db, &shapes(&HELD_OUT_M), budget);
    let tuning_s = started.elapsed().as_secs_f64();

    let hw = HardwareFingerprint::current();
    let train = Runtime::open(&train_db).unwrap();
    let held = Runtime::open(&held_db).unwrap();
    let mut rows = Vec::new();
    let mut ratios = Vec::new();
    for w in shapes(&HELD_OUT_M) {
        let near = train.lookup(&w).unwrap();
        let own = held.lookup(&w).unwrap();
        assert_eq!(near.level, Level::NearestShape, "{w}");
        assert_eq!(own.level, Level::Exact, "{w}");
        let (dk, dc) = default_for(&w, hw);
        let default = dk.prepare(&w, &dc).unwrap();
        let p = Problem::random(&w, 9);
        let reference = p.reference();
        for c in [&near, &own] {
            let mut out = p.output();
            c.run(&p.input_slices(), &mut out);
            p.check(&out, &reference).unwrap();
        }
        let (a, b) = (ChoiceExe(near.clone()), ChoiceExe(own.clone()));
        let t = interleaved(&[&a, &b, default.as_ref()], &p, 21);
        let ratio = t[0] / t[1];
        ratios.push(ratio);
        let src = near.source.as_ref().unwrap();
        rows.push(format!(
            "| {} | {} (d = {:.2}) | `{} {}` | `{} {}` | {:.1} | {:.1} | {:.1} | {:.3} |",
            w.key(),
            src.workload.key(),
            src.distance,
            near.kernel.name(),
            near.config,
            own.kernel.name(),
            own.config,
            w.flops() / t[0] / 1e9,
            w.flops() / t[1] / 1e9,
            w.flops() / t[2] / 1e9,
            ratio
        ));
        eprintln!("{}", rows.last().unwrap());
    }
    let mut sorted = ratios.clone();
    sorted.sort_by(f64::total_cmp);
    let median = kernels::measurement::median(&sorted);
    let within = ratios.iter().filter(|&&r| r <= 1.10).count();
    let md = format!(
        "# Nearest-shape dispatch vs per-shape tuning — {date}\n\n\
         Machine: {summary}\n\nFingerprint `{id}`.\n\n\
         ## Method\n\n\
         - Training set: M ∈ {train:?} × (N, K) ∈ {nk:?} ({nt} shapes), tuned with \
         `autokernel tune --budget {budget} --seed 1` (default strategy, process isolation) \
         into one database.\n\
         - Held-out set: M ∈ {held:?} × the same (N, K) ({nh} shapes), tuned the same way, same \
         budget, into a second database.\n\
         - For each held-out shape: the runtime opened on the training database serves it at \
         level `nearest_shape` (the tuned shape nearest in log2 space, Euclidean over (M, N, \
         K), whose config is valid for the new shape); the runtime on the held-out database \
         serves its own tuned winner (`exact`). Both outputs are checked against the f64 \
         reference, then the pick, the own winner and the default are timed interleaved \
         (21 rounds, each ≥ 5 ms of back-to-back calls per variant, starting variant \
         rotating), medians.\n\
         - ratio = time(nearest-shape pick) ÷ time(own tuned winner): 1.00 is as good as \
         tuning the shape; above 1 is slower.\n\n\
         Tuning both sets took {tuning_s:.0} s. The machine has 2 cores shared with other \
         jobs: single rows are noisy, the median is the figure.\n\n\
         | held-out shape | nearest tuned shape | nearest-shape pick | own tuned winner | \
         pick GFLOP/s | own GFLOP/s | default GFLOP/s | ratio |\n|---|---|---|---|---|---|---|---|\n\
         {rows}\n\n\
         **Median ratio {median:.3}** over {nh} held-out shapes ({within} of {nh} within 10% \
         of tuning the shape itself; target: median within 10%).\n",
        date = tuning_db::now_rfc3339(),
        summary = hw.summary(),
        id = hw.id,
        train = TRAIN_M,
        held = HELD_OUT_M,
        nk = NK,
        nt = TRAIN_M.len() * NK.len(),
        nh = HELD_OUT_M.len() * NK.len(),
        rows = rows.join("\n"),
    );
    let dir = root.join("bench_results").join(&hw.id);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("nearest_shape.md"), &md).unwrap();
    println!("{md}");
}
