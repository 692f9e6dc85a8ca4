//! Calls from a thread outside the pool with that thread busy between them, as in a model
//! whose other ops run between its GEMMs: the median time of a packed `A·B + bias` call per
//! gap, next to the same calls back to back. A benchmark, not a test:
//!
//! ```text
//! cargo run --release -p runtime --example call_gaps -- \
//!     [--db tuning.db] [--precision f32|bf16|int8] [--threads N] [MxNxK ...]
//! ```
//!
//! The workloads default to GPT-2's decoding GEMVs (`1x2304x768 1x768x768 1x3072x768
//! 1x768x3072`); the gaps are 0, 10, 20, 40, 80 and 160 µs.

use std::time::{Duration, Instant};

use kernels::Act;
use runtime::{PrecisionPolicy, Runtime, Threads};

const GAPS_US: [u64; 6] = [0, 10, 20, 40, 80, 160];
const CALLS: usize = 400;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut db, mut precision, mut threads, mut shapes) = (None, "f32".to_string(), None, vec![]);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--db" => db = args.next(),
            "--precision" => precision = args.next().ok_or("--precision needs a value")?,
            "--threads" => threads = Some(args.next().ok_or("--threads needs a value")?.parse()?),
            _ => shapes.push(a),
        }
    }
    if shapes.is_empty() {
        shapes = ["1x2304x768", "1x768x768", "1x3072x768", "1x768x3072"]
            .map(String::from)
            .into();
    }
    let (threads, hw) = Threads::new(threads)?;
    let rt = match &db {
        Some(path) => Runtime::open_for(path, hw.clone())?,
        None => Runtime::defaults_only_for(hw.clone()),
    };
    rt.set_precision(precision.parse::<PrecisionPolicy>()?);
    println!(
        "fingerprint {} ({} threads), precision {precision}, db {}; median µs per call after \
         the caller was busy for each gap",
        hw.id,
        threads.count(),
        db.as_deref().unwrap_or("(defaults)")
    );
    println!(
        "| shape | {} |",
        GAPS_US.map(|g| format!("gap {g} µs")).join(" | ")
    );
    println!("|---|{}", "---:|".repeat(GAPS_US.len()));
    for shape in &shapes {
        let dims: Vec<usize> = shape.split('x').map(str::parse).collect::<Result<_, _>>()?;
        let [m, n, k] = dims[..] else {
            return Err(format!("{shape}: not MxNxK").into());
        };
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 7919) % 113) as f32 / 113.0 - 0.5)
            .collect();
        let weight = rt.pack_weight(m, n, k, Act::Identity, &b)?;
        let (a, bias, mut c) = (vec![0.25f32; m * k], vec![0.5f32; n], vec![0.0f32; m * n]);
        let mut cells = Vec::new();
        for gap in GAPS_US.map(Duration::from_micros) {
            let mut times = Vec::with_capacity(CALLS);
            for _ in 0..CALLS + 20 {
                let until = Instant::now() + gap;
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
                let start = Instant::now();
                threads.run(|| rt.gemm_bias_act_packed(&weight, &a, &bias, &mut c))?;
                times.push(start.elapsed());
            }
            times.drain(..20);
            times.sort();
            cells.push(format!("{:.1}", times[CALLS / 2].as_secs_f64() * 1e6));
        }
        println!("| {shape} | {} |", cells.join(" | "));
    }
    Ok(())
}
