//! Times the winners of several tuning databases side by side, interleaved in one process, so
//! that "do these runs' winners run equally fast?" is answered under the same machine noise
//! for all of them (the stability check of `tune`, see bench_results/*/stability.md).
//!
//! ```sh
//! cargo run --release -p runner --example interleave_winners -- gemm:256x256x256 run1.db run2.db ...
//! ```
//!
//! Prints, per database, its winner, the interleaved median with its 95% CI and the 10th
//! percentile (robust to a loaded machine's additive noise), then the spread (max ÷ min − 1)
//! of the winners' medians and 10th percentiles. Databases with the same winner share one
//! timing.

use std::process::ExitCode;

use kernels::{HardwareFingerprint, Kernel, Problem, Workload};
use runner::{measure_interleaved, median_ci, verify, Protocol};
use tuning_db::TuningDb;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((w, dbs)) = args.split_first() else {
        return Err("usage: interleave_winners WORKLOAD DB...".into());
    };
    if dbs.is_empty() {
        return Err("usage: interleave_winners WORKLOAD DB...".into());
    }
    let w: Workload = w.parse()?;
    let hw = HardwareFingerprint::current();
    let mut distinct: Vec<(&'static dyn Kernel, kernels::Config)> = Vec::new();
    let mut which = Vec::new();
    for path in dbs {
        let db = TuningDb::open_read_only(path)?;
        let best = db
            .best(&hw.id, &w)?
            .ok_or_else(|| format!("{path}: no winner for {w} on fingerprint {}", hw.id))?;
        let kernel = kernels::kernel(&best.kernel)?;
        let i = match distinct
            .iter()
            .position(|(k, c)| k.name() == kernel.name() && *c == best.config)
        {
            Some(i) => i,
            None => {
                distinct.push((kernel, best.config.clone()));
                distinct.len() - 1
            }
        };
        which.push(i);
    }
    let problem = Problem::random(&w, 99);
    let reference = problem.reference();
    let mut exes = Vec::new();
    for (k, c) in &distinct {
        let exe = k.prepare(&w, c)?;
        verify(exe.as_ref(), &problem, &reference)
            .map_err(|o| format!("{} {c}: {}", k.name(), o.message.unwrap_or_default()))?;
        exes.push(exe);
    }
    let refs: Vec<&dyn kernels::Executable> = exes.iter().map(|e| e.as_ref()).collect();
    let ms = measure_interleaved(&refs, &problem, &Protocol::thorough(), 31);
    let (mut medians, mut p10s) = (Vec::new(), Vec::new());
    for (path, &i) in dbs.iter().zip(&which) {
        let (lo, hi) = median_ci(&ms[i].samples);
        let (k, c) = &distinct[i];
        let p10 = quantile(&ms[i].samples, 0.1);
        println!(
            "{path}\t{} {c}\tmedian {:.1} µs\t95% CI [{:.1}, {:.1}] µs\tp10 {:.1} µs\t{} samples",
            k.name(),
            ms[i].median_s * 1e6,
            lo * 1e6,
            hi * 1e6,
            p10 * 1e6,
            ms[i].samples.len()
        );
        medians.push(ms[i].median_s);
        p10s.push(p10);
    }
    println!(
        "distinct winners {} of {}; spread (max/min - 1) of the winners' medians {:.1}%, of their 10th percentiles {:.1}%",
        distinct.len(),
        dbs.len(),
        100.0 * spread(&medians),
        100.0 * spread(&p10s)
    );
    Ok(())
}

/// max ÷ min − 1.
fn spread(xs: &[f64]) -> f64 {
    let max = xs.iter().copied().fold(f64::MIN, f64::max);
    let min = xs.iter().copied().fold(f64::MAX, f64::min);
    max / min - 1.0
}

/// The `q` quantile (nearest rank) of non-empty `xs`.
fn quantile(xs: &[f64], q: f64) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1]
}
