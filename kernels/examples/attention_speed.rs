//! Times one kernel variant on one workload, after verifying it against the f64 reference:
//! the measuring half of `scripts/bench-attention-peers.sh` (which tunes the configs it
//! passes), and a quick tool while working on the kernels.
//!
//! ```sh
//! cargo run --release -p kernels --example attention_speed -- \
//!     --workload attention:1x12x512x64:causal --threads 2 \
//!     [--kernel attention_fused --config '{"br":64,...}'] [--unfused-gemms QK_JSON PV_JSON] \
//!     [--unfused-head-tasks T] [--secs 2] [--sample-ms 20] [--label fused] [--no-verify]
//! ```
//!
//! Without `--kernel`, the family default is timed. `--unfused-gemms` times the unfused
//! attention built on two given `gemm_packed` configs (for `gemm:SxSxD` and `gemm:SxDxS`,
//! e.g. tuned ones), `--unfused-head-tasks` heads at a time; `--separate-gemm JSON` times
//! `gemm_packed` with that config followed by a separate bias + activation pass (for
//! `gemm_bias_*` workloads). The output is checked against the f64 reference before timing
//! (`--no-verify` skips that, for repeated runs of a variant already checked).
//!
//! Prints one JSON line: `{"label", "workload", "threads", "kernel", "config", "median_ms",
//! "gflops", "samples", "cpu_ms", "cpu_gflops", "best_gflops"}` (`cpu_*` from this thread's
//! CPU time, 1 thread only; `best_gflops` from the fastest sample: the least disturbed
//! figures on a loaded machine, for development — reports quote the wall-clock median).
//! `--sample-ms` sets the minimum sample length.

use std::time::{Duration, Instant};

use kernels::cpu::attention::unfused::UnfusedAttention;
use kernels::cpu::gemm::ukernel::bias_act_row;
use kernels::{
    default_for, kernel, Config, Executable, HardwareFingerprint, Operand, OperandMut, Problem,
    Workload,
};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn fail(msg: String) -> ! {
    eprintln!("attention_speed: {msg}");
    std::process::exit(2)
}

/// `gemm_packed` with `config`, then a separate bias + activation pass.
struct SeparatePass {
    gemm: Box<dyn Executable>,
    n: usize,
    act: kernels::Act,
}

impl Executable for SeparatePass {
    fn run(&self, inputs: &[Operand<'_>], out: OperandMut<'_>) -> kernels::Result<()> {
        let Some(Operand::F32(bias)) = inputs.get(2).copied() else {
            return Err(kernels::Error::Operand {
                workload: "gemm_bias_*".into(),
                operand: "bias".into(),
                reason: "expected f32 values on cpu".into(),
            });
        };
        match out {
            OperandMut::F32(c) => {
                self.gemm.run(&inputs[..2], OperandMut::F32(&mut *c))?;
                for row in c.chunks_exact_mut(self.n) {
                    bias_act_row(row, bias, self.act);
                }
                Ok(())
            }
            other => self.gemm.run(&inputs[..2], other),
        }
    }
}

/// This thread's CPU time in seconds (Linux), to compare variants on a loaded machine.
fn thread_cpu() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: f64 = s.split_whitespace().next()?.parse().ok()?;
    Some(ns * 1e-9)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let w: Workload = arg(&args, "--workload")
        .unwrap_or_else(|| fail("--workload is required".into()))
        .parse()
        .unwrap_or_else(|e| fail(format!("{e}")));
    let threads: usize = arg(&args, "--threads")
        .map(|t| t.parse().unwrap_or_else(|_| fail("bad --threads".into())))
        .unwrap_or(1);
    let secs: f64 = arg(&args, "--secs")
        .map(|t| t.parse().unwrap_or_else(|_| fail("bad --secs".into())))
        .unwrap_or(2.0);
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .unwrap_or_else(|e| fail(format!("thread pool: {e}")));
    let hw = HardwareFingerprint::current();
    let parse = |s: &str| Config::from_json(s).unwrap_or_else(|e| fail(format!("config: {e}")));
    let gemm_packed = kernel("gemm_packed").expect("registered");
    let (name, config, exe): (String, String, Box<dyn Executable>) = if let Some(qk) =
        arg(&args, "--unfused-gemms")
    {
        let pv = args
            .iter()
            .position(|a| a == "--unfused-gemms")
            .and_then(|i| args.get(i + 2))
            .unwrap_or_else(|| fail("--unfused-gemms takes two configs".into()));
        let Workload::Attention {
            b, h, s, d, causal, ..
        } = w
        else {
            fail("--unfused-gemms needs an attention workload".into())
        };
        let build = |m, n, k, c: &str| {
            gemm_packed
                .prepare(
                    &Workload::Gemm {
                        m,
                        n,
                        k,
                        dtype: kernels::DType::F32,
                    },
                    &parse(c),
                )
                .unwrap_or_else(|e| fail(format!("{e}")))
        };
        let qk_exe = build(s, s, d, &qk);
        let pv_exe = build(s, d, s, pv);
        let head_tasks: usize = arg(&args, "--unfused-head-tasks")
            .map(|t| {
                t.parse()
                    .unwrap_or_else(|_| fail("bad --unfused-head-tasks".into()))
            })
            .unwrap_or(1);
        let exe = UnfusedAttention::with_gemms((b, h, s, d, causal), qk_exe, pv_exe, head_tasks);
        (
            "attention_unfused(tuned gemm)".into(),
            format!("{{\"qk\":{qk},\"pv\":{pv}}}"),
            Box::new(exe),
        )
    } else if let Some(gc) = arg(&args, "--separate-gemm") {
        let Workload::GemmBiasAct { m, n, k, act, .. } = w else {
            fail("--separate-gemm needs a gemm_bias_* workload".into())
        };
        let gemm = gemm_packed
            .prepare(
                &Workload::Gemm {
                    m,
                    n,
                    k,
                    dtype: kernels::DType::F32,
                },
                &parse(&gc),
            )
            .unwrap_or_else(|e| fail(format!("{e}")));
        (
            "gemm_packed+separate_pass".into(),
            gc,
            Box::new(SeparatePass { gemm, n, act }),
        )
    } else {
        let (k, c) = match arg(&args, "--kernel") {
            Some(name) => {
                let k = kernel(&name).unwrap_or_else(|e| fail(format!("{e}")));
                let c = match arg(&args, "--config") {
                    Some(c) => parse(&c),
                    None => k.default_config(&w, hw),
                };
                (k, c)
            }
            None => default_for(&w, hw).unwrap_or_else(|e| fail(format!("{e}"))),
        };
        let exe = k.prepare(&w, &c).unwrap_or_else(|e| fail(format!("{e}")));
        (k.name().to_string(), c.to_json(), exe)
    };

    let p = Problem::random(&w, 1);
    let inputs = p.input_slices();
    let mut out = vec![f32::NAN; w.output_len()];
    exe.run_f32(&inputs, &mut out).unwrap();
    if !args.iter().any(|a| a == "--no-verify") {
        if let Err(e) = p.check(&out, &p.reference()) {
            fail(format!("{name} {config} on {w}: {e}"));
        }
    }

    // Warm-up, then samples of ≥ 20 ms each until `secs` have passed (at least 7).
    let start = Instant::now();
    let mut calls = 0usize;
    while start.elapsed() < Duration::from_millis(200) || calls < 2 {
        exe.run_f32(&inputs, &mut out).unwrap();
        calls += 1;
    }
    let per_call = start.elapsed().as_secs_f64() / calls as f64;
    let sample_s: f64 = arg(&args, "--sample-ms")
        .map(|t| {
            t.parse::<f64>()
                .unwrap_or_else(|_| fail("bad --sample-ms".into()))
                / 1e3
        })
        .unwrap_or(0.02);
    let reps = ((sample_s / per_call).ceil() as usize).max(1);
    let mut samples = Vec::new();
    let mut cpu_samples = Vec::new();
    let t0 = Instant::now();
    while samples.len() < 7 || (t0.elapsed().as_secs_f64() < secs && samples.len() < 2000) {
        let c = thread_cpu();
        let s = Instant::now();
        for _ in 0..reps {
            exe.run_f32(&inputs, &mut out).unwrap();
        }
        samples.push(s.elapsed().as_secs_f64() / reps as f64);
        if let (Some(c0), Some(c1)) = (c, thread_cpu()) {
            cpu_samples.push((c1 - c0) / reps as f64);
        }
    }
    let median_of = |v: &[f64]| {
        let mut sorted = v.to_vec();
        sorted.sort_by(f64::total_cmp);
        sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let median = median_of(&samples);
    // Single-threaded runs do all their work on this thread: CPU time per call is the
    // figure least disturbed by other processes.
    let cpu_ms = (threads == 1).then(|| median_of(&cpu_samples) * 1e3);
    let best_ms = samples.iter().copied().fold(f64::INFINITY, f64::min) * 1e3;
    let label = arg(&args, "--label").unwrap_or_else(|| name.clone());
    println!(
        "{}",
        serde_json::json!({
            "label": label,
            "workload": w.key(),
            "threads": threads,
            "kernel": name,
            "config": config,
            "median_ms": median * 1e3,
            "gflops": w.flops() / median / 1e9,
            "samples": samples.len(),
            "cpu_ms": cpu_ms,
            "cpu_gflops": cpu_ms.map(|c| w.flops() / c / 1e6),
            "best_gflops": w.flops() / best_ms / 1e6,
        })
    );
}
