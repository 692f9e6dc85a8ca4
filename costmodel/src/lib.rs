//! # costmodel — features that explain a candidate's speed
//!
//! ```
//! use costmodel::{features, FEATURE_NAMES};
//! use kernels::{default_for, HardwareFingerprint, Workload};
//!
//! let w: Workload = "gemm:128x768x768".parse()?;
//! let hw = HardwareFingerprint::current();
//! let (kernel, config) = default_for(&w, hw);
//! let x = features(&w, kernel.name(), &config, hw);
//! assert_eq!(x.len(), FEATURE_NAMES.len());
//! assert!(x.iter().all(|v| v.is_finite()));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Why it exists: measuring is the expensive part of tuning. A model trained on measured
//! records predicts which unmeasured configs are worth measuring; it can only be as good as
//! the quantities it sees, so this crate turns a (workload, kernel, config, hardware) tuple
//! into numbers that explain speed: problem size, register-tile shape, cache footprints
//! relative to this machine's caches, edge waste, parallel balance, arithmetic intensity.

use kernels::{Config, HardwareFingerprint, Workload};

/// Names of the entries of [`features`], in order.
pub const FEATURE_NAMES: [&str; 16] = [
    "log2_m",
    "log2_n",
    "log2_k",
    "is_direct",
    "simd_lanes",
    "tile_rows",
    "tile_cols",
    "log2_kc",
    "a_panel_over_l1",
    "b_panel_over_l1",
    "a_block_over_l2",
    "b_block_over_l3",
    "edge_waste",
    "threads",
    "tasks_per_thread",
    "arithmetic_intensity",
];

/// SIMD lanes of f32 for a ukernel name prefix (`avx2_6x16` → 8).
fn lanes(isa: &str) -> f64 {
    match isa {
        "avx512" => 16.0,
        "avx2" => 8.0,
        _ => 4.0,
    }
}

/// The feature vector of one candidate (see [`FEATURE_NAMES`]). Unknown or missing knobs
/// contribute neutral values, so records of older kernel versions still featurise.
pub fn features(w: &Workload, kernel: &str, c: &Config, hw: &HardwareFingerprint) -> Vec<f64> {
    // Attention has no single GEMM shape: featurise it as its Q·Kᵀ product (B·H·S × S × D).
    let (m, n, k) = match *w {
        Workload::Attention { b, h, s, d, .. } => (b * h * s, s, d),
        _ => w.gemm_dims().unwrap_or((1, 1, 1)),
    };
    let (mf, nf, kf) = (m as f64, n as f64, k as f64);
    let direct = kernel.contains("direct");
    let ukernel = c.str("ukernel").unwrap_or("portable_1x1");
    let (isa, shape) = ukernel.split_once('_').unwrap_or(("portable", "1x1"));
    let (r, cc) = shape.split_once('x').unwrap_or(("1", "1"));
    let rows: f64 = r.parse().unwrap_or(1.0);
    let mut cols: f64 = cc.parse().unwrap_or(1.0);
    if direct {
        // Direct ukernels are named rows × vectors.
        cols *= lanes(isa);
    }
    let dim = |name: &str, full: f64| -> f64 {
        match c.int(name) {
            Some(v) if v > 0 => (v as f64).min(full),
            _ => full,
        }
    };
    let kc = dim("kc", kf);
    let mc = if direct { rows } else { dim("mc", mf) };
    let nc = if direct { nf } else { dim("nc", nf) };
    let (l1, l2, l3) = (
        hw.l1d_bytes.max(1) as f64,
        hw.l2_bytes.max(1) as f64,
        hw.l3_bytes.max(1) as f64,
    );
    let threads = c.int("threads").unwrap_or(1).max(1) as f64;
    let padded = (mf / rows).ceil() * rows * (nf / cols).ceil() * cols;
    let tasks = match c.str("par") {
        Some("m") => (mf / mc.max(1.0)).ceil(),
        Some("n") => (nf / cols).ceil(),
        _ => 1.0,
    };
    vec![
        mf.log2(),
        nf.log2(),
        kf.log2(),
        direct as u8 as f64,
        lanes(isa),
        rows,
        cols,
        kc.log2(),
        rows * kc * 4.0 / l1,
        cols * kc * 4.0 / l1,
        mc * kc * 4.0 / l2,
        kc * nc * 4.0 / l3,
        padded / (mf * nf),
        threads,
        tasks / threads,
        2.0 * mf * nf * kf / (4.0 * (mf * kf + kf * nf + mf * nf)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels::Value;

    fn hw() -> HardwareFingerprint {
        HardwareFingerprint::new(
            "x86_64",
            "v",
            (1, 2, 3),
            "b",
            vec![],
            2,
            (32 << 10, 512 << 10, 32 << 20),
        )
    }

    #[test]
    fn features_reflect_the_config() {
        let w: Workload = "gemm:100x64x256".parse().unwrap();
        let c = Config::from_pairs([
            ("ukernel", Value::from("avx2_6x16")),
            ("mc", 96usize.into()),
            ("kc", 128usize.into()),
            ("nc", 1024usize.into()),
            ("par", "m".into()),
            ("threads", 2usize.into()),
        ]);
        let x = features(&w, "gemm_packed", &c, &hw());
        let get = |name: &str| x[FEATURE_NAMES.iter().position(|n| *n == name).unwrap()];
        assert_eq!(get("tile_rows"), 6.0);
        assert_eq!(get("tile_cols"), 16.0);
        assert_eq!(get("log2_kc"), 7.0);
        assert_eq!(get("a_panel_over_l1"), 6.0 * 128.0 * 4.0 / 32768.0);
        // 100 rows pad to 102, 64 columns divide 16: waste 1.02.
        assert!((get("edge_waste") - 1.02).abs() < 1e-12);
        assert_eq!(
            get("tasks_per_thread"),
            1.0,
            "ceil(100/96) = 2 blocks over 2 threads"
        );
        assert_eq!(get("is_direct"), 0.0);
    }

    #[test]
    fn direct_tiles_count_vectors_and_missing_knobs_are_neutral() {
        let w: Workload = "gemm:1x3072x768".parse().unwrap();
        let c = Config::from_pairs([("ukernel", Value::from("avx2_1x4"))]);
        let x = features(&w, "gemm_direct", &c, &hw());
        assert_eq!(
            x[FEATURE_NAMES
                .iter()
                .position(|n| *n == "tile_cols")
                .unwrap()],
            32.0
        );
        assert_eq!(x[3], 1.0);
        let empty = features(&w, "gemm_packed", &Config::default(), &hw());
        assert!(empty.iter().all(|v| v.is_finite()));
    }
}
