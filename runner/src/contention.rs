//! Whether other work holds this machine's cores: the FMA peak of `threads` threads against
//! `threads` times one thread's, measured side by side. On a quiet machine the ratio is near
//! 1 (0.98–0.99 on the Zen 3 and Zen 4 VMs, 0.83 on a Sapphire Rapids VM whose AVX-512
//! clock drops with both cores busy); with one other busy process on a 2-core machine about
//! 2/3 or less. A multi-threaded config timed then stands for a slower machine than the one
//! it will serve on, and a tie between thread counts says little.

use kernels::cpu::peak::fma_peak_gflops;

/// Below this [`parallel_efficiency`], the cores are taken to be shared with other work.
pub const CONTENDED: f64 = 0.75;

/// Seconds of each FMA-peak sample.
const SAMPLE_S: f64 = 0.01;

/// `threads` threads' FMA throughput over `threads` × one thread's, each the best of 3
/// alternating samples of 10 ms (other work only ever slows a sample down); 1 for one
/// thread. About 60 ms.
pub fn parallel_efficiency(threads: usize) -> f64 {
    if threads <= 1 {
        return 1.0;
    }
    let (mut one, mut all) = (0.0f64, 0.0f64);
    for _ in 0..3 {
        one = one.max(fma_peak_gflops(1, SAMPLE_S));
        all = all.max(fma_peak_gflops(threads, SAMPLE_S));
    }
    all / (threads as f64 * one)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_thread_is_fully_efficient_and_more_give_a_positive_ratio() {
        assert_eq!(parallel_efficiency(1), 1.0);
        // The value depends on the machine's load: only its range is a fact.
        let e = parallel_efficiency(2);
        assert!(e > 0.0 && e < 1.5, "{e}");
    }
}
