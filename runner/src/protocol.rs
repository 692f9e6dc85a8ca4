//! The timing protocol, written down once and used for tuning, `run` and benchmarks.
//!
//! 1. **Warm-up**: call the kernel until `warmup` has passed (at least once). This faults in
//!    pages, fills caches and lets the clock settle, and estimates the time of one call.
//! 2. **Samples**: each sample times a batch of back-to-back calls long enough to last at least
//!    `min_sample` (so timer resolution and call overhead vanish) and records seconds per call.
//! 3. **Stopping**: take at least `min_samples`; stop when the 95% confidence interval of the
//!    median (order statistics, ranks n/2 ± 0.98√n) is within ±`target_ci` of the median, or at
//!    `max_samples`, or once `max_time` has been spent.
//! 4. **Statistic**: the median (robust to the outliers a shared machine produces); every sample
//!    is kept, and the spread (MAD ÷ median) is reported with it.
//!
//! **Caches**: the same input and output buffers are reused for every call, so operands that
//! fit in cache stay there — the situation of a layer called repeatedly during inference with
//! resident weights. Inputs are not re-randomised between calls.

use std::time::{Duration, Instant};

pub use kernels::measurement::median_ci_halfwidth;
use kernels::{Executable, Measurement, Problem};

/// Parameters of the timing protocol (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Protocol {
    /// How long to call the kernel before sampling (at least once); the warm-up also
    /// estimates the time of one call.
    pub warmup: Duration,
    /// Shortest duration of one sample: each sample times as many back-to-back calls as the
    /// warm-up's estimate says fill it.
    pub min_sample: Duration,
    /// Fewest samples taken, whatever the confidence interval or the time spent.
    pub min_samples: usize,
    /// Most samples taken; this cap wins over `min_samples` if it is lower.
    pub max_samples: usize,
    /// Time after which sampling stops once `min_samples` are taken, counted from the first
    /// warm-up call.
    pub max_time: Duration,
    /// Target half-width of the median's 95% confidence interval, relative (0.02 = ±2%).
    pub target_ci: f64,
}

impl Protocol {
    /// For tuning: enough to rank candidates, cheap enough to try many.
    pub fn quick() -> Self {
        Protocol {
            warmup: Duration::from_millis(5),
            min_sample: Duration::from_millis(2),
            min_samples: 5,
            max_samples: 25,
            max_time: Duration::from_millis(400),
            target_ci: 0.03,
        }
    }

    /// For reporting (`run`, benchmarks, re-measuring winners): tighter and longer.
    pub fn thorough() -> Self {
        Protocol {
            warmup: Duration::from_millis(50),
            min_sample: Duration::from_millis(5),
            min_samples: 11,
            max_samples: 101,
            max_time: Duration::from_secs(3),
            target_ci: 0.01,
        }
    }
}

/// One timed call. The operands were verified against the same problem before any timing,
/// so a refusal here is a broken kernel: a panic, which the evaluators catch and record.
#[inline]
pub(crate) fn call(exe: &dyn Executable, inputs: &[&[f32]], out: &mut [f32]) {
    if let Err(e) = exe.run_f32(inputs, out) {
        panic!("a verified candidate refused its operands: {e}");
    }
}

/// Times `exe` on `problem` by `protocol`. The output buffer is reused across calls.
pub fn measure(exe: &dyn Executable, problem: &Problem, protocol: &Protocol) -> Measurement {
    let inputs = problem.input_slices();
    let mut out = problem.output();
    let start = Instant::now();

    let mut calls = 0u64;
    while calls == 0 || start.elapsed() < protocol.warmup {
        call(exe, &inputs, &mut out);
        calls += 1;
    }
    let per_call = start.elapsed().as_secs_f64() / calls as f64;
    let reps = ((protocol.min_sample.as_secs_f64() / per_call.max(1e-9)).ceil() as u64).max(1);

    let mut samples = Vec::with_capacity(protocol.min_samples);
    loop {
        let t = Instant::now();
        for _ in 0..reps {
            call(exe, &inputs, &mut out);
        }
        samples.push(t.elapsed().as_secs_f64() / reps as f64);
        let n = samples.len();
        if n >= protocol.max_samples {
            break;
        }
        if n >= protocol.min_samples
            && (start.elapsed() >= protocol.max_time
                || median_ci_halfwidth(&samples) <= protocol.target_ci)
        {
            break;
        }
    }
    std::hint::black_box(&out);
    Measurement::from_samples(samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Sleep(Duration);
    impl Executable for Sleep {
        fn run(
            &self,
            _: &[kernels::Operand<'_>],
            out: kernels::OperandMut<'_>,
        ) -> kernels::Result<()> {
            std::thread::sleep(self.0);
            if let kernels::OperandMut::F32(out) = out {
                out[0] = 1.0;
            }
            Ok(())
        }
    }

    #[test]
    fn measures_a_known_duration() {
        let w: kernels::Workload = "gemm:1x1x1".parse().unwrap();
        let p = Problem::random(&w, 0);
        let m = measure(&Sleep(Duration::from_millis(3)), &p, &Protocol::quick());
        assert!(m.samples.len() >= 5 && m.samples.len() <= 25);
        assert!(m.median_s >= 0.003 && m.median_s < 0.05, "{}", m.median_s);
    }

    #[test]
    fn ci_of_identical_samples_is_zero_and_of_few_is_infinite() {
        assert_eq!(median_ci_halfwidth(&[1.0; 10]), 0.0);
        assert!(median_ci_halfwidth(&[1.0, 2.0]).is_infinite());
        let wide = median_ci_halfwidth(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
        assert!(wide > 0.3, "{wide}");
    }
}
