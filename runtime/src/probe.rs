//! The first-use check of a borrowed config: before a `nearest_shape` choice is served (and
//! cached), it is timed against the kernel default on the new shape, and served only if it
//! is at least as fast. Structural rules (`index::suits`) discard the hopeless
//! borrowings without running anything; this check makes the promise the rules cannot: a
//! fallback is never slower than not having tuned at all (measured:
//! `bench_results/<fingerprint>/nearest_shape.md`).

use std::time::{Duration, Instant};

use kernels::{Executable, Problem, Workload};

/// Shapes above this many flops are not timed on first use: a check would stall the first
/// call for longer than it is worth (≈ 25 ms a call at 160 GFLOP/s), so they get the default.
pub const CHECK_MAX_FLOPS: f64 = 4e9;

/// Rounds of the check; each times both variants, the order alternating.
const ROUNDS: usize = 5;

/// Each timing runs back-to-back calls for at least this long.
const MIN_SAMPLE: Duration = Duration::from_micros(300);

/// Whether `borrowed` runs `w` at least as fast as `default`: both warmed up on the same
/// random operands, then timed in [`ROUNDS`] alternating rounds; the best time of each
/// decides (the minimum is the least disturbed by other load). Too large a shape, or one
/// whose operands cannot be allocated, keeps the default.
pub(crate) fn borrowed_is_faster(
    w: &Workload,
    borrowed: &dyn Executable,
    default: &dyn Executable,
) -> bool {
    if w.flops() > CHECK_MAX_FLOPS {
        return false;
    }
    let Ok(p) = Problem::try_random(w, 0x5EED) else {
        return false;
    };
    let inputs = p.input_slices();
    let mut out = p.output();
    let mut time = |exe: &dyn Executable, calls: usize| {
        let start = Instant::now();
        for _ in 0..calls {
            exe.run_f32(&inputs, &mut out)
                .expect("both executables were built for this workload");
        }
        start.elapsed()
    };
    // Warm-up (caches, page faults, thread-local buffers), then calls per timing.
    time(borrowed, 1);
    let one = time(default, 1).max(Duration::from_nanos(100));
    let calls = (MIN_SAMPLE.as_secs_f64() / one.as_secs_f64())
        .ceil()
        .clamp(1.0, 10_000.0) as usize;
    let (mut b, mut d) = (Duration::MAX, Duration::MAX);
    for round in 0..ROUNDS {
        if round % 2 == 0 {
            b = b.min(time(borrowed, calls));
            d = d.min(time(default, calls));
        } else {
            d = d.min(time(default, calls));
            b = b.min(time(borrowed, calls));
        }
    }
    b <= d
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels::{default_for, HardwareFingerprint};

    /// The default plus a fixed delay per call: a borrowed config that is clearly slower.
    struct Delayed(Box<dyn Executable>, Duration);

    impl Executable for Delayed {
        fn run(
            &self,
            inputs: &[kernels::Operand<'_>],
            output: kernels::OperandMut<'_>,
        ) -> kernels::Result<()> {
            std::thread::sleep(self.1);
            self.0.run(inputs, output)
        }
    }

    #[test]
    fn a_slower_borrowing_keeps_the_default_and_a_faster_one_is_served() {
        let w: Workload = "gemm:24x24x24".parse().unwrap();
        let (k, c) = default_for(&w, HardwareFingerprint::current()).unwrap();
        let fast = k.prepare(&w, &c).unwrap();
        let slow = Delayed(k.prepare(&w, &c).unwrap(), Duration::from_millis(1));
        assert!(!borrowed_is_faster(&w, &slow, fast.as_ref()));
        assert!(borrowed_is_faster(&w, fast.as_ref(), &slow));
    }

    #[test]
    fn shapes_too_large_to_check_keep_the_default() {
        let w: Workload = "gemm:2048x2048x2048".parse().unwrap();
        assert!(w.flops() > CHECK_MAX_FLOPS);
        let (k, c) = default_for(&w, HardwareFingerprint::current()).unwrap();
        let exe = k.build(&w, &c).unwrap();
        assert!(!borrowed_is_faster(&w, exe.as_ref(), exe.as_ref()));
    }
}
