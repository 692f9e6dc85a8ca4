//! Whether other work holds this machine's cores: `threads` spinning threads for a moment,
//! and the share of their wall time the OS gave them (each thread's CPU time over the wall
//! time). On a quiet machine the share is ~1 whatever the hardware (SMT siblings, clocks
//! that drop with more busy cores, none of that changes CPU *time*); with one other busy
//! process beside two threads on two cores, about 2/3. A multi-threaded config timed at a
//! low share stands for a slower machine than the one it will serve on.

use std::time::Instant;

/// Below this [`cpu_share`], the cores are taken to be shared with other work.
pub const CONTENDED: f64 = 0.8;

/// Seconds each thread spins per sample.
const SAMPLE_S: f64 = 0.02;

/// The share of `threads` CPUs that `threads` spinning threads got: the best of 3 samples of
/// 20 ms (other work only ever takes time away), each the mean over the threads of CPU time
/// ÷ wall time. Pinned to `cpus` when it is not empty (the CPUs a pinned worker measures
/// on). `None` where this platform does not report a thread's CPU time, or a thread could
/// not be pinned or started.
pub fn cpu_share(threads: usize, cpus: &[usize]) -> Option<f64> {
    let threads = threads.max(1);
    (0..3)
        .map(|_| sample(threads, cpus))
        .try_fold(0.0f64, |best, s| s.map(|s| best.max(s)))
}

/// One sample: the mean CPU share of `threads` threads spinning for [`SAMPLE_S`].
fn sample(threads: usize, cpus: &[usize]) -> Option<f64> {
    let shares: Vec<Option<f64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| s.spawn(move || spin_share(cpus)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().ok().flatten())
            .collect()
    });
    let sum = shares.iter().copied().sum::<Option<f64>>()?;
    Some(sum / threads as f64)
}

/// This thread's CPU time over the wall time of a [`SAMPLE_S`] spin.
fn spin_share(cpus: &[usize]) -> Option<f64> {
    #[cfg(target_os = "linux")]
    if !cpus.is_empty() {
        crate::pin::pin_current_thread(cpus).ok()?;
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cpus;
    let (wall, cpu) = (Instant::now(), thread_cpu_s()?);
    let mut x = 0u64;
    while wall.elapsed().as_secs_f64() < SAMPLE_S {
        for _ in 0..1000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    Some((thread_cpu_s()? - cpu) / wall.elapsed().as_secs_f64())
}

/// The calling thread's CPU time, seconds.
#[cfg(unix)]
fn thread_cpu_s() -> Option<f64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`, a valid, exclusive location.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then_some(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9)
}

#[cfg(not(unix))]
fn thread_cpu_s() -> Option<f64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_is_a_fraction_of_the_wall_time() {
        // Its value depends on the machine's load: only its range is a fact.
        for threads in [1, 2] {
            let s = cpu_share(threads, &[]).expect("Linux reports thread CPU time");
            assert!(s > 0.0 && s < 1.05, "{threads} thread(s): {s}");
        }
    }
}
