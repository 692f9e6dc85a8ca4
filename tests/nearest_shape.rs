//! The nearest-shape experiment (a measurement, not a CI test; about 15 minutes):
//!
//! ```sh
//! cargo test --release --test nearest_shape -- --ignored --nocapture
//! ```
//!
//! The regret of serving untuned shapes. A training database holds what the README's main
//! job tunes (the BERT-base shapes and two skinny ones) plus a single-threaded-scale square
//! (`gemm:256x256x256`); a set of untuned shapes spanning tiny to large and skinny to square
//! is served from it. For each untuned shape it times, interleaved on the same inputs: what
//! the runtime serves (the structural rules of `runtime::NEAREST_MAX_DISTANCE` and the thread
//! count, then the first-use check against the default), what the rules alone would serve
//! (`set_fallback_check(false)`), what the unguarded nearest tuned shape would lend (the policy
//! before both), the kernel default, and the shape's own tuned winner (tuned into a second
//! database with the same command). Writes
//! `bench_results/<fingerprint>/nearest_shape.md`. `AUTOKERNEL_NS_BUDGET` sets the per-shape
//! budget (default 12).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use kernels::{default_for, Executable, HardwareFingerprint, Problem, Workload};
use runtime::{distance, Level, Runtime, NEAREST_MAX_DISTANCE};
use tuning_db::TuningDb;

const TRAIN: [&str; 6] = [
    "gemm:128x768x768",
    "gemm:128x3072x768",
    "gemm:128x768x3072",
    "gemm:1x3072x768",
    "gemm:8x3072x768",
    "gemm:256x256x256",
];

/// Untuned shapes: tiny, skinny (decoding batch sizes), BERT-like M between the tuned ones,
/// squares up to 2048.
const HELD_OUT: [&str; 16] = [
    "gemm:4x96x96",
    "gemm:16x256x64",
    "gemm:24x24x24",
    "gemm:100x100x100",
    "gemm:2x768x768",
    "gemm:4x3072x768",
    "gemm:16x768x768",
    "gemm:64x768x768",
    "gemm:96x3072x768",
    "gemm:200x768x3072",
    "gemm:256x3072x768",
    "gemm:384x768x768",
    "gemm:512x512x512",
    "gemm:64x2304x768",
    "gemm:1024x1024x1024",
    "gemm:2048x2048x2048",
];

fn shapes(list: &[&str]) -> Vec<Workload> {
    list.iter().map(|s| s.parse().unwrap()).collect()
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
                e.run_f32(&inputs, &mut out).unwrap();
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
                exes[i].run_f32(&inputs, &mut out).unwrap();
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
    fn run(
        &self,
        inputs: &[kernels::Operand<'_>],
        output: kernels::OperandMut<'_>,
    ) -> kernels::Result<()> {
        let exe = self
            .0
            .executable()
            .expect("a CPU choice has a host executable");
        exe.run(inputs, output)
    }
}

fn log2(w: &Workload) -> Vec<f64> {
    let (m, n, k) = w.gemm_dims().unwrap();
    [m, n, k].iter().map(|&d| (d as f64).log2()).collect()
}

/// What the runtime served before the guard: the nearest tuned shape's config that fits
/// and builds, at any distance and thread count (kernel, config, source, distance); the
/// default when none fits.
fn unguarded(
    db: &TuningDb,
    hw: &HardwareFingerprint,
    w: &Workload,
) -> (String, kernels::Config, String, f64) {
    let mut recs: Vec<(f64, tuning_db::Record)> = db
        .best_all(&hw.id)
        .unwrap()
        .into_iter()
        .map(|r| (distance(&log2(&r.workload), &log2(w)), r))
        .collect();
    recs.sort_by(|a, b| a.0.total_cmp(&b.0));
    for (d, r) in recs {
        let k = kernels::kernel(&r.kernel).unwrap();
        if k.supports(w) && k.config_fits(w, hw, &r.config) {
            return (r.kernel.clone(), r.config.clone(), r.workload.key(), d);
        }
    }
    let (k, c) = default_for(w, hw).unwrap();
    (k.name().to_string(), c, "none fits: default".into(), 0.0)
}

#[test]
#[ignore = "a ~15 minute measurement: cargo test --release --test nearest_shape -- --ignored"]
fn nearest_shape_regret_against_the_default() {
    let budget: usize = std::env::var("AUTOKERNEL_NS_BUDGET")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let work = root.join("target/nearest_shape");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let (train_db, held_db) = (work.join("train.db"), work.join("held_out.db"));
    let started = Instant::now();
    tune(&train_db, &shapes(&TRAIN), budget);
    tune(&held_db, &shapes(&HELD_OUT), budget);
    let tuning_s = started.elapsed().as_secs_f64();

    let hw = HardwareFingerprint::current();
    let train = Runtime::open(&train_db).unwrap();
    let rules_only = Runtime::open(&train_db).unwrap();
    rules_only.set_fallback_check(false);
    let held = Runtime::open(&held_db).unwrap();
    let train_records = TuningDb::open_read_only(&train_db).unwrap();
    let mut rows = Vec::new();
    let (mut served_ratios, mut rule_ratios, mut old_ratios) = (Vec::new(), Vec::new(), Vec::new());
    for w in shapes(&HELD_OUT) {
        let served = train.lookup(&w).unwrap();
        let rule = rules_only.lookup(&w).unwrap();
        let own = held.lookup(&w).unwrap();
        assert_eq!(own.level, Level::Exact, "{w}");
        let (dk, dc) = default_for(&w, hw).unwrap();
        let default = dk.prepare(&w, &dc).unwrap();
        let (ok, oc, osrc, od) = unguarded(&train_records, hw, &w);
        let old = kernels::kernel(&ok).unwrap().prepare(&w, &oc).unwrap();
        let p = Problem::random(&w, 9);
        let reference = p.reference();
        let (a, r, b) = (
            ChoiceExe(served.clone()),
            ChoiceExe(rule.clone()),
            ChoiceExe(own.clone()),
        );
        let exes: [&dyn Executable; 5] = [&a, &r, old.as_ref(), default.as_ref(), &b];
        for e in exes {
            let mut out = p.output();
            e.run_f32(&p.input_slices(), &mut out).unwrap();
            p.check(&out, &reference).unwrap();
        }
        let rounds = if w.flops() > 4e9 { 9 } else { 21 };
        let t = interleaved(&exes, &p, rounds);
        // Serving the default itself is the default: ratio 1 by construction.
        let vs_default = |c: &runtime::Choice, t_c: f64| {
            if c.level == Level::Default {
                1.0
            } else {
                t[3] / t_c
            }
        };
        let served_vs_default = vs_default(&served, t[0]);
        let rule_vs_default = vs_default(&rule, t[1]);
        let old_vs_default = t[3] / t[2];
        served_ratios.push(served_vs_default);
        rule_ratios.push(rule_vs_default);
        old_ratios.push(old_vs_default);
        let gf = |s: f64| w.flops() / s / 1e9;
        let served_text = match &served.source {
            Some(src) => format!(
                "`{}` from {} (d = {:.2})",
                served.config,
                src.workload.key(),
                src.distance
            ),
            None => format!("default `{}`", served.config),
        };
        rows.push(format!(
            "| {} | {} | {osrc} (d = {od:.2}) `{oc}` | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | **{:.2}** | {:.2} | {:.2} | {:.2} |",
            w.key(),
            served_text,
            gf(t[0]),
            gf(t[1]),
            gf(t[2]),
            gf(t[3]),
            gf(t[4]),
            served_vs_default,
            rule_vs_default,
            old_vs_default,
            t[3] / t[4],
        ));
        eprintln!("{}", rows.last().unwrap());
    }
    let stats = |v: &[f64]| {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        (kernels::measurement::median(&s), s[0])
    };
    let (served_median, served_worst) = stats(&served_ratios);
    let (old_median, old_worst) = stats(&old_ratios);
    let (rule_median, rule_worst) = stats(&rule_ratios);
    let slower = served_ratios.iter().filter(|&&r| r < 1.0 / 1.10).count();
    let md = format!(
        "# Nearest-shape regret: served fallback vs the default — {date}\n\n\
         Machine: {summary}\n\nFingerprint `{id}`.\n\n\
         ## Method\n\n\
         - Training database: {train:?}, tuned with `autokernel tune --budget {budget} --seed 1` \
         (default strategy, process isolation): the README's main job plus a square.\n\
         - Untuned shapes: {nh} from tiny to large, skinny to square (below). Each is also \
         tuned the same way into a second database, for its own winner.\n\
         - Served: what the runtime on the training database serves: the nearest tuned \
         shape's config only within log2 distance {maxd} and with the default's thread count \
         (`runtime::index::suits`), and only if the first-use check (`runtime::probe`: 5 \
         alternating rounds on the new shape, best of each) timed it at least as fast as the \
         default; else the default. Rules only: the same without the first-use check. \
         Unguarded: the nearest tuned config that fits, at any distance and thread count (the \
         policy before this change).\n\
         - All five checked against the f64 reference, then timed interleaved (21 rounds, 9 \
         above 4 GFLOP; each ≥ 5 ms of back-to-back calls per variant, starting variant \
         rotating), medians. Ratios are speed ÷ the default's speed (above 1 is faster than \
         the default); a shape served the default is 1 by construction.\n\n\
         Tuning both sets took {tuning_s:.0} s.\n\n\
         | untuned shape | served | unguarded nearest | served GFLOP/s | rules-only GFLOP/s | \
         unguarded GFLOP/s | default GFLOP/s | own tuned GFLOP/s | served ÷ default | \
         rules only ÷ default | unguarded ÷ default | own ÷ default |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n{rows}\n\n\
         **Served vs default: median {served_median:.2}×, worst {served_worst:.2}×** \
         ({slower} of {nh} shapes more than 10% slower than the default; target: none, \
         median ≥ 1.0). Rules only: median {rule_median:.2}×, worst {rule_worst:.2}×. Unguarded, as \
         before: median {old_median:.2}×, worst {old_worst:.2}×.\n",
        date = tuning_db::now_rfc3339(),
        summary = hw.summary(),
        id = hw.id,
        train = TRAIN,
        nh = HELD_OUT.len(),
        maxd = NEAREST_MAX_DISTANCE,
        rows = rows.join("\n"),
    );
    let dir = root.join("bench_results").join(&hw.id);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("nearest_shape.md"), &md).unwrap();
    println!("{md}");
}
