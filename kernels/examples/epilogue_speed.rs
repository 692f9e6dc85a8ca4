//! Throughput of the fused GEMM epilogues (`act(x + bias)` over rows in L1), the part of a
//! GEMM's time that is not multiply-adds: ns per element for each activation.
//!
//! ```text
//! cargo run --release -p kernels --example epilogue_speed [-- columns]
//! ```

use std::time::Instant;

use kernels::cpu::gemm::ukernel::bias_act_row;
use kernels::workload::Act;

fn main() {
    let cols: usize = std::env::args()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(64);
    let rows = 4096 / cols.max(1) + 1;
    let bias: Vec<f32> = (0..cols).map(|j| (j as f32 * 0.37).sin()).collect();
    let fresh: Vec<f32> = (0..rows * cols)
        .map(|i| (i as f32 * 0.011).sin() * 3.0)
        .collect();
    let mut data = fresh.clone();
    for round in 0..3 {
        let mut line = format!("round {round}, {cols} columns:");
        for act in [Act::Identity, Act::Relu, Act::Gelu, Act::GeluErf] {
            let reps = 2000;
            let t = Instant::now();
            for _ in 0..reps {
                data.copy_from_slice(&fresh);
                for row in data.chunks_exact_mut(cols) {
                    bias_act_row(row, &bias, act);
                }
            }
            let ns = t.elapsed().as_secs_f64() * 1e9 / (reps * rows * cols) as f64;
            line += &format!("  {act:?} {ns:.3} ns/elem");
        }
        println!("{line}");
    }
}
