//! Interleaved re-measurement of a few finalists, and the confidence interval used to decide
//! whether one is really faster than another.
//!
//! Timing candidates one after the other lets slow drifts of a shared machine (another
//! build starting, the clock ramping, a neighbour's benchmark) land on one candidate and not
//! on the next, which is how two runs of the same job end up with different winners.
//! [`measure_interleaved`] instead takes one sample of each finalist per round — A B C, then
//! B C A, then C A B, ... (the starting candidate rotates, so none is always measured right
//! after the same neighbour) — so a drift hits all of them alike, and each finalist's median
//! comes with a 95% confidence interval ([`median_ci`]) that says how far it can be trusted.

use std::time::{Duration, Instant};

use kernels::{Executable, Measurement, Problem};

use crate::protocol::Protocol;

/// Times `exes` on `problem` in interleaved rounds and returns one [`Measurement`] per
/// executable, in order.
///
/// Each executable is first warmed up on its own for `protocol.warmup` (at least one call),
/// which also fixes how many back-to-back calls one of its samples times (enough to last
/// `protocol.min_sample`). Then `rounds` rounds each take one sample of every executable,
/// the starting one rotating from round to round. The rounds stop early, after at least
/// `protocol.min_samples` of them, once `2 × protocol.max_time` per executable has been spent.
/// The inputs and the output buffer are shared and reused across calls, as in
/// [`measure`](crate::measure).
pub fn measure_interleaved(
    exes: &[&dyn Executable],
    problem: &Problem,
    protocol: &Protocol,
    rounds: usize,
) -> Vec<Measurement> {
    let n = exes.len();
    if n == 0 {
        return Vec::new();
    }
    let inputs = problem.input_slices();
    let mut out = problem.output();
    let start = Instant::now();

    let reps: Vec<u64> = exes
        .iter()
        .map(|exe| {
            let t = Instant::now();
            let mut calls = 0u64;
            while calls == 0 || t.elapsed() < protocol.warmup {
                crate::protocol::call(*exe, &inputs, &mut out);
                calls += 1;
            }
            let per_call = t.elapsed().as_secs_f64() / calls as f64;
            ((protocol.min_sample.as_secs_f64() / per_call.max(1e-9)).ceil() as u64).max(1)
        })
        .collect();

    let rounds = rounds.max(1);
    let min_rounds = protocol.min_samples.clamp(1, rounds);
    let cap = time_cap(protocol, n).as_secs_f64();
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(rounds); n];
    for round in 0..rounds {
        for j in 0..n {
            let i = (round + j) % n;
            let t = Instant::now();
            for _ in 0..reps[i] {
                crate::protocol::call(exes[i], &inputs, &mut out);
            }
            samples[i].push(t.elapsed().as_secs_f64() / reps[i] as f64);
        }
        if round + 1 >= min_rounds && start.elapsed().as_secs_f64() >= cap {
            break;
        }
    }
    std::hint::black_box(&out);
    samples.into_iter().map(Measurement::from_samples).collect()
}

/// The time after which [`measure_interleaved`]'s rounds stop (once `protocol.min_samples`
/// are in): `2 × protocol.max_time` per executable, for `n` executables.
pub fn time_cap(protocol: &Protocol, n: usize) -> Duration {
    protocol.max_time.saturating_mul(2 * n as u32)
}

/// How long re-measuring `n` finalists may take in a worker before it is killed, when one
/// evaluation of a candidate may take `timeout`: each finalist is built and verified again
/// and warmed up (at most one evaluation's time each, and one more for the worker's own
/// share), then the rounds run until [`time_cap`] once `protocol.min_samples` are in — at
/// least that many rounds of `n` samples, each sample as long as `protocol.min_sample` or one
/// call, and a call at most `timeout / protocol.min_samples` (an evaluation made that many) —
/// plus the round that crosses the cap. With finalists whose evaluations came close to `timeout`, a bound of
/// `(n + 1) × timeout` had killed the re-measurement of 3 finalists of 1024³ on one thread
/// under `--timeout-s 0.5` (2.0 s; the rounds need ~2.4).
pub fn remeasure_limit(timeout: Duration, protocol: &Protocol, n: usize) -> Duration {
    let n32 = n as u32;
    let min_samples = protocol.min_samples.max(1) as u32;
    let sample = protocol.min_sample.max(timeout / min_samples);
    let rebuilds = timeout.saturating_mul(n32 + 1);
    let least_rounds = sample.saturating_mul(n32 * (min_samples + 1));
    rebuilds
        .saturating_add(time_cap(protocol, n))
        .saturating_add(least_rounds)
}

/// The 95% confidence interval `(low, high)` of the median of `samples`, in the samples' unit,
/// from order statistics ([`kernels::measurement::median_ci`], [`Protocol`]'s stopping rule
/// too). Fewer than 3 samples give `(0, ∞)`: no confidence at all.
pub fn median_ci(samples: &[f64]) -> (f64, f64) {
    kernels::measurement::median_ci(samples).unwrap_or((0.0, f64::INFINITY))
}

/// Whether `a` is statistically no slower than `b`, from samples taken in the same
/// interleaved rounds (`a[r]` and `b[r]` in round `r`, as [`measure_interleaved`] returns
/// them): the 95% confidence interval of the median of the per-round ratios `a[r] / b[r]`
/// reaches down to 1. Pairing cancels what drifts from round to round (the machine's load,
/// its clock), so this sees a few-percent difference that two unpaired intervals, each as
/// wide as the drift, would call a tie. Unpaired inputs (different lengths, fewer than 3
/// rounds) fall back to [`overlaps`] of the two medians' intervals.
pub fn not_slower(a: &[f64], b: &[f64]) -> bool {
    if a.len() != b.len() || a.len() < 3 {
        return overlaps(median_ci(a), median_ci(b));
    }
    let ratios: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
    median_ci(&ratios).0 <= 1.0
}

/// Whether two intervals `(low, high)` share at least one point.
pub fn overlaps(a: (f64, f64), b: (f64, f64)) -> bool {
    a.0 <= b.1 && b.0 <= a.1
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    use std::time::Duration;

    #[test]
    fn paired_rounds_see_a_steady_gap_that_unpaired_intervals_call_a_tie() {
        // Each round's load multiplies both candidates alike (1.0 .. 1.3); `b` is always 4%
        // slower than `a` in the same round.
        let load: Vec<f64> = (0..15)
            .map(|r| 1.0 + 0.3 * ((r * 7) % 15) as f64 / 15.0)
            .collect();
        let a: Vec<f64> = load.iter().map(|l| 10.0 * l).collect();
        let b: Vec<f64> = load.iter().map(|l| 10.4 * l).collect();
        assert!(overlaps(median_ci(&a), median_ci(&b)), "unpaired: a tie");
        assert!(!not_slower(&b, &a), "paired: b is slower");
        assert!(not_slower(&a, &b));
        // The same numbers, the gap alternating in sign: a real tie.
        let c: Vec<f64> = a
            .iter()
            .enumerate()
            .map(|(r, x)| if r % 2 == 0 { x * 1.04 } else { x / 1.04 })
            .collect();
        assert!(not_slower(&c, &a) && not_slower(&a, &c));
        // Unpaired lengths fall back to the intervals.
        assert!(not_slower(&b, &a[..10]));
    }

    /// Sleeps for its duration and logs its id, to see the interleaving order.
    struct Sleeper<'a> {
        id: usize,
        dur: Duration,
        log: &'a Mutex<Vec<usize>>,
        calls: AtomicUsize,
    }
    impl Executable for Sleeper<'_> {
        fn run(
            &self,
            _: &[kernels::Operand<'_>],
            out: kernels::OperandMut<'_>,
        ) -> kernels::Result<()> {
            std::thread::sleep(self.dur);
            self.calls.fetch_add(1, Ordering::Relaxed);
            self.log.lock().unwrap().push(self.id);
            if let kernels::OperandMut::F32(out) = out {
                out[0] = self.id as f32;
            }
            Ok(())
        }
    }

    #[test]
    fn interleaves_rotating_rounds_and_ranks_by_duration() {
        let w: kernels::Workload = "gemm:1x1x1".parse().unwrap();
        let p = Problem::random(&w, 0);
        let log = Mutex::new(Vec::new());
        let mk = |id, ms| Sleeper {
            id,
            dur: Duration::from_millis(ms),
            log: &log,
            calls: AtomicUsize::new(0),
        };
        let (a, b, c) = (mk(0, 1), mk(1, 4), mk(2, 2));
        let protocol = Protocol {
            warmup: Duration::ZERO,
            min_sample: Duration::ZERO,
            min_samples: 3,
            max_samples: 3,
            max_time: Duration::from_secs(10),
            target_ci: 0.0,
        };
        let ms = measure_interleaved(&[&a, &b, &c], &p, &protocol, 3);
        assert_eq!(ms.len(), 3);
        assert!(ms.iter().all(|m| m.samples.len() == 3));
        assert!(ms[0].median_s < ms[2].median_s && ms[2].median_s < ms[1].median_s);
        // One warm-up call each, then rounds A B C, B C A, C A B.
        assert_eq!(
            *log.lock().unwrap(),
            vec![0, 1, 2, 0, 1, 2, 1, 2, 0, 2, 0, 1]
        );
    }

    #[test]
    fn re_measuring_fits_the_limit_its_finalists_evaluations_give() {
        // Three finalists of 30 ms a call under the quick protocol: one evaluation stops near
        // its time cap; re-measuring them interleaved takes 31 rounds of ~90 ms or the
        // 2.4 s cap — more than (3 + 1) evaluations, the limit before.
        let w: kernels::Workload = "gemm:1x1x1".parse().unwrap();
        let p = Problem::random(&w, 0);
        let log = Mutex::new(Vec::new());
        let mk = |id| Sleeper {
            id,
            dur: Duration::from_millis(30),
            log: &log,
            calls: AtomicUsize::new(0),
        };
        let protocol = Protocol::quick();
        let (a, b, c) = (mk(0), mk(1), mk(2));
        let t = Instant::now();
        crate::measure(&a, &p, &protocol);
        let evaluation = t.elapsed();
        let t = Instant::now();
        measure_interleaved(&[&a, &b, &c], &p, &protocol, 31);
        let took = t.elapsed();
        let limit = remeasure_limit(evaluation, &protocol, 3);
        assert!(
            took < limit,
            "{took:?} over the limit {limit:?} (one evaluation {evaluation:?})"
        );
    }

    #[test]
    fn median_ci_brackets_the_median_and_narrows_with_more_samples() {
        assert_eq!(median_ci(&[1.0, 2.0]), (0.0, f64::INFINITY));
        let few: Vec<f64> = (1..=9).map(f64::from).collect();
        let (lo, hi) = median_ci(&few);
        assert!(lo < 5.0 && hi > 5.0, "{lo} {hi}");
        let many: Vec<f64> = (1..=99).map(|i| 4.0 + f64::from(i) / 99.0 * 2.0).collect();
        let (lo2, hi2) = median_ci(&many);
        assert!(lo2 <= 5.0 && hi2 >= 5.0);
        assert!(hi2 - lo2 < 0.5 * (hi - lo) / 4.0, "{lo2} {hi2}");
        assert_eq!(median_ci(&[3.0; 7]), (3.0, 3.0));
    }

    #[test]
    fn overlap_is_symmetric_and_touching_counts() {
        assert!(overlaps((1.0, 2.0), (2.0, 3.0)));
        assert!(overlaps((2.0, 3.0), (1.0, 2.5)));
        assert!(!overlaps((1.0, 2.0), (2.1, 3.0)));
        assert!(!overlaps((2.1, 3.0), (1.0, 2.0)));
    }
}
