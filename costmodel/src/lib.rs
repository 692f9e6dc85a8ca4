//! # costmodel — predict which configs are fast before measuring them
//!
//! ```
//! use costmodel::{features, target, CostModel, ModelKind, TrainingSet};
//! use kernels::{kernel, HardwareFingerprint, Rng, Workload};
//!
//! let hw = HardwareFingerprint::current();
//! let w: Workload = "gemm:64x256x128".parse()?;
//! let packed = kernel("gemm_packed")?;
//! let space = packed.space(&w, hw);
//! // Pretend-measure 30 configs (a made-up timing rule stands in for the runner here).
//! let mut data = TrainingSet::new();
//! let mut rng = Rng::new(1);
//! for _ in 0..30 {
//!     let c = space.sample(&mut rng).expect("the space is not empty");
//!     let secs = 1e-4 * (1.0 + c.int("kc").unwrap() as f64 / 512.0);
//!     data.push(features(&w, packed.name(), &c, hw), target(secs, &w), 1.0);
//! }
//! let mut model = ModelKind::DEFAULT.build(7);
//! model.fit(&data)?;
//! let c = space.sample(&mut rng).unwrap();
//! let predicted = model.predict(&[features(&w, packed.name(), &c, hw)])?[0];
//! assert!(predicted.is_finite());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Why it exists: measuring is the expensive part of tuning. A model trained on measured
//! records ranks the configs not yet measured, so a search ([`search`'s model-guided
//! strategy](../search/index.html)) spends its measurements on the promising ones. It can
//! only be as good as the quantities it sees, so this crate turns a (workload, kernel,
//! config, hardware) tuple into numbers that explain speed ([`features`]: problem size,
//! register-tile shape, cache footprints relative to this machine's caches, edge waste,
//! packing traffic, parallel balance, arithmetic intensity), offers two models — a random
//! forest (smartcore) and an elastic net (linfa) — trained on [`target`] (log seconds per
//! flop), and measures them the way search uses them ([`Metrics`]: Spearman rank correlation,
//! top-k recall, regret). The default model ([`ModelKind::DEFAULT`]) was picked by those
//! metrics on held-out recorded spaces, not by taste: see
//! `bench_results/<fingerprint>/costmodel.md` (`autokernel replay --models`).
//!
//! With fewer than [`MIN_POINTS`] usable points a model declines to fit
//! ([`ModelError::TooFewPoints`]); callers then sample randomly.
//!
//! **Transfer.** Features include the workload's dimensions and are relative to the
//! machine's caches, so records of *other* workloads (and, weighted down by
//! [`transfer_weight`], of similar machines) train the same model: a tuning job for a new
//! shape starts with a model instead of random guesses.

#![warn(missing_docs)]

mod features;
mod metrics;
mod model;

pub use features::{features, FEATURE_NAMES, N_FEATURES};
pub use metrics::{ranks, regret, spearman, top_k_recall, Metrics};
pub use model::{
    CostModel, ForestModel, LinearModel, ModelError, ModelKind, TrainingSet, UnknownModel,
    MIN_POINTS,
};

use kernels::{HardwareFingerprint, Workload};

/// The regression target of a measured time: `ln(seconds / flop)`. Within one workload it
/// orders configs exactly as time does; across workloads it removes the problem size, so
/// records of different shapes share one scale.
pub fn target(seconds: f64, w: &Workload) -> f64 {
    (seconds / w.flops().max(1.0)).ln()
}

/// How much a record measured on `source` should count when tuning on `target`, in
/// `[0, 1]`: 1 for the same fingerprint, 0.5 for the same CPU (vendor, family, model, ISA,
/// caches) with a different thread count, 0.25 for the same vendor and ISA flags with other
/// caches or model, 0 otherwise (not used).
pub fn transfer_weight(target: &HardwareFingerprint, source: &HardwareFingerprint) -> f64 {
    if target.id == source.id {
        return 1.0;
    }
    let same_isa =
        target.arch == source.arch && target.vendor == source.vendor && target.isa == source.isa;
    if !same_isa {
        return 0.0;
    }
    let same_cpu = target.family == source.family
        && target.model == source.model
        && (target.l1d_bytes, target.l2_bytes, target.l3_bytes)
            == (source.l1d_bytes, source.l2_bytes, source.l3_bytes);
    if same_cpu {
        0.5
    } else {
        0.25
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(model: u32, cores: usize, isa: &[&str]) -> HardwareFingerprint {
        HardwareFingerprint::new(
            "x86_64",
            "AuthenticAMD",
            (25, model, 1),
            "EPYC",
            isa.iter().map(|s| s.to_string()).collect(),
            cores,
            (32 << 10, 512 << 10, 32 << 20),
        )
    }

    #[test]
    fn transfer_weights_fall_with_distance() {
        let here = fp(1, 2, &["avx2", "fma"]);
        assert_eq!(transfer_weight(&here, &here), 1.0);
        assert_eq!(transfer_weight(&here, &fp(1, 4, &["avx2", "fma"])), 0.5);
        assert_eq!(transfer_weight(&here, &fp(17, 2, &["avx2", "fma"])), 0.25);
        assert_eq!(transfer_weight(&here, &fp(1, 2, &["avx2"])), 0.0);
    }

    #[test]
    fn target_orders_like_time_and_removes_size() {
        let small: Workload = "gemm:10x10x10".parse().unwrap();
        let big: Workload = "gemm:20x20x20".parse().unwrap();
        assert!(target(1.0, &small) < target(2.0, &small));
        // Same speed (flop/s) on both shapes: same target.
        assert!((target(1.0, &small) - target(8.0, &big)).abs() < 1e-12);
    }
}
