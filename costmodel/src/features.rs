//! The feature vector of one candidate: knobs plus derived quantities that explain speed.

use kernels::cpu::gemm::params::{knob, ALayout, BLayout, Par, UkernelId};
use kernels::cpu::Isa;
use kernels::{Config, HardwareFingerprint, Workload};

/// Names of the entries of [`features`], in order.
pub const FEATURE_NAMES: [&str; 31] = [
    "log2_m",
    "log2_n",
    "log2_k",
    "is_direct",
    "simd_lanes",
    "tile_rows",
    "tile_cols",
    "tile_vectors",
    "log2_kc",
    "log2_mc",
    "log2_nc",
    "a_panel_over_l1",
    "b_panel_over_l1",
    "a_block_over_l2",
    "b_block_over_l2",
    "b_block_over_l3",
    "edge_waste",
    "k_blocks",
    "n_blocks",
    "pack_bytes_per_flop",
    "log2_b_streams",
    "threads",
    "par_m",
    "par_n",
    "tasks",
    "tasks_per_thread",
    "load_imbalance",
    "log2_flops_per_thread",
    "sync_regions",
    "arithmetic_intensity",
    "log2_flops",
];

/// Number of features.
pub const N_FEATURES: usize = FEATURE_NAMES.len();

/// The micro-kernel of a config without one (or with an unknown one): a neutral 1×1 tile.
const NEUTRAL_UKERNEL: UkernelId = UkernelId {
    isa: Isa::Portable,
    rows: 1,
    cols: 1,
};

/// The register tile of a config's `ukernel` knob: an f32 [`UkernelId`], or the
/// reduced-precision families' names, `{isa}_{rows}x{cols}` with any ISA prefix
/// (`avx512vnni_8x32`, `amx_bf16_32x32`, `avx512bf16_12x32`), their tile in elements;
/// AVX-512 and AMX names have 16 f32 lanes.
fn tile_of(c: &Config) -> UkernelId {
    if let Ok(uk) = UkernelId::try_from(c) {
        return uk;
    }
    let parsed = c.str(knob::UKERNEL).and_then(|name| {
        let (prefix, shape) = name.rsplit_once('_')?;
        let (rows, cols) = shape.split_once('x')?;
        let wide = prefix.starts_with("avx512") || prefix.starts_with("amx");
        Some(UkernelId {
            isa: if wide { Isa::Avx512 } else { Isa::Avx2 },
            rows: rows.parse().ok()?,
            cols: cols.parse().ok()?,
        })
    });
    parsed.unwrap_or(NEUTRAL_UKERNEL)
}

fn log2(x: f64) -> f64 {
    x.max(1.0).log2()
}

fn round(x: f64, to: f64) -> f64 {
    (x.max(1.0) / to).ceil() * to
}

/// The register tile and block sizes a config runs with, as floats.
#[derive(Clone, Copy)]
struct Tiling {
    /// A direct (unpacked) family.
    direct: bool,
    /// Rows of the register tile.
    rows: f64,
    /// Columns of the register tile, in floats.
    cols: f64,
    /// f32 lanes of a vector.
    lanes: f64,
    /// Effective block sizes (see [`features`]).
    kc: f64,
    mc: f64,
    nc: f64,
}

impl Tiling {
    /// The tiling of `kernel`'s config `c` for an `m × n × k` product.
    fn of(kernel: &str, c: &Config, (mf, nf, kf): (f64, f64, f64)) -> Tiling {
        let direct = kernel.contains("direct");
        let uk = tile_of(c);
        let rows = uk.rows.max(1) as f64;
        let lanes = uk.lanes() as f64;
        // Packed kernels are named MR × NR (floats); direct ones R × V (vectors).
        let cols: f64 = match uk.cols.max(1) as f64 {
            v if direct => v * lanes,
            nr => nr,
        };
        let block = |name: &str| c.int(name).filter(|&v| v > 0).map(|v| v as f64);
        let kc = match block(knob::KC) {
            Some(v) => v.min(kf),
            None => kf, // direct kc = 0 means the whole of K
        };
        let (mc, nc) = if direct {
            (rows.min(mf), nf)
        } else {
            (
                round(block(knob::MC).unwrap_or(mf), rows).min(round(mf, rows)),
                round(block(knob::NC).unwrap_or(nf), cols).min(round(nf, cols)),
            )
        };
        Tiling {
            direct,
            rows,
            cols,
            lanes,
            kc,
            mc,
            nc,
        }
    }

    /// Parallel work items per parallel region of a split on `threads` threads, as the
    /// kernels make them.
    fn tasks(&self, par: Par, threads: f64, mf: f64, nf: f64) -> f64 {
        if threads <= 1.0 {
            return 1.0;
        }
        let Tiling {
            rows,
            cols,
            lanes,
            mc,
            nc,
            ..
        } = *self;
        match (self.direct, par) {
            (false, Par::M(_)) => {
                let rows_per = mc.min(round((mf / threads).ceil(), rows));
                (mf / rows_per).ceil()
            }
            (false, Par::N(_)) => {
                let panels = (nc.min(nf) / cols).ceil();
                let per = (panels / threads).ceil();
                (panels / per).ceil()
            }
            (true, Par::M(_)) => (mf / (mf / threads).ceil()).ceil(),
            (true, Par::N(_)) => {
                let per = round((nf / threads).ceil(), lanes);
                (nf / per).ceil()
            }
            _ => 1.0,
        }
    }
}

/// The feature vector of one candidate (see [`FEATURE_NAMES`]).
///
/// Block sizes are the *effective* ones the kernels use (`kc` clamped to K, `mc`/`nc`
/// rounded up to the register tile and clamped to the matrix), so two configs that run the
/// same code get the same features. Footprints are relative to `hw`'s caches. Unknown or
/// missing knobs contribute neutral values, so records of older kernel versions still
/// featurise.
pub fn features(w: &Workload, kernel: &str, c: &Config, hw: &HardwareFingerprint) -> Vec<f64> {
    // Attention has no single GEMM shape: featurise it as its Q·Kᵀ product (B·H·S × S × D).
    let (m, n, k) = match *w {
        Workload::Attention { b, h, s, d, .. } => (b * h * s, s, d),
        _ => w.gemm_dims().unwrap_or((1, 1, 1)),
    };
    let (mf, nf, kf) = (m as f64, n as f64, k as f64);
    // Bytes per operand element: what the panels and blocks hold (an int8 GEMM's A is
    // quantised before packing, a bf16 GEMM's converted).
    let eb = w.dtype().size() as f64;
    let t = Tiling::of(kernel, c, (mf, nf, kf));
    let (direct, rows, cols, lanes) = (t.direct, t.rows, t.cols, t.lanes);
    let (kc, mc, nc) = (t.kc, t.mc, t.nc);
    let (l1, l2, l3) = (
        hw.l1d_bytes.max(1) as f64,
        hw.l2_bytes.max(1) as f64,
        hw.l3_bytes.max(1) as f64,
    );
    // An unknown split (another family's, or none) splits nothing the GEMM way.
    let par = Par::try_from(c).unwrap_or(Par::None);
    let threads = c.threads() as f64;
    let padded = (mf / rows).ceil() * rows * (nf / cols).ceil() * cols;
    let k_blocks = (kf / kc).ceil();
    let n_blocks = if direct { 1.0 } else { (nf / nc).ceil() };
    // Bytes packed per call per flop: A once per column block unless read in place, B once
    // unless read in place or packed ahead (none for direct). A missing layout knob (older
    // records, other families) counts as packed.
    let a_packed = ALayout::of(c) != Some(ALayout::InPlace);
    let b_packed = !matches!(BLayout::of(c), Some(BLayout::InPlace | BLayout::Prepacked));
    let pack_bytes = if direct {
        0.0
    } else {
        eb * (f64::from(u8::from(a_packed)) * mf * kf * n_blocks
            + f64::from(u8::from(b_packed)) * kf * nf)
    };
    let flops = 2.0 * mf * nf * kf;
    // Times B is streamed from its row-major home: once per row tile for direct kernels,
    // once (into packed panels, re-read from cache after) for packed ones.
    let b_streams = if direct { (mf / rows).ceil() } else { 1.0 };
    let tasks = t.tasks(par, threads, mf, nf);
    let imbalance = (tasks / threads).ceil() * threads / tasks.max(1.0);
    let regions = if threads <= 1.0 {
        0.0
    } else if direct {
        1.0
    } else {
        n_blocks * k_blocks
    };
    vec![
        log2(mf),
        log2(nf),
        log2(kf),
        direct as u8 as f64,
        lanes,
        rows,
        cols,
        rows * cols / lanes,
        log2(kc),
        log2(mc),
        log2(nc),
        rows * kc * eb / l1,
        cols * kc * eb / l1,
        mc * kc * eb / l2,
        kc * nc * eb / l2,
        kc * nc * eb / l3,
        padded / (mf * nf),
        k_blocks,
        n_blocks,
        pack_bytes / flops,
        log2(b_streams),
        threads,
        matches!(par, Par::M(_)) as u8 as f64,
        matches!(par, Par::N(_)) as u8 as f64,
        tasks,
        tasks / threads,
        imbalance,
        log2(flops / threads),
        log2(regions + 1.0),
        flops / (eb * (mf * kf + kf * nf + mf * nf)),
        log2(flops),
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

    fn get(x: &[f64], name: &str) -> f64 {
        x[FEATURE_NAMES.iter().position(|n| *n == name).unwrap()]
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
        assert_eq!(x.len(), N_FEATURES);
        assert_eq!(get(&x, "tile_rows"), 6.0);
        assert_eq!(get(&x, "tile_cols"), 16.0);
        assert_eq!(get(&x, "tile_vectors"), 12.0);
        assert_eq!(get(&x, "log2_kc"), 7.0);
        assert_eq!(get(&x, "log2_nc"), 6.0, "nc clamps to N = 64");
        assert_eq!(get(&x, "a_panel_over_l1"), 6.0 * 128.0 * 4.0 / 32768.0);
        // 100 rows pad to 102, 64 columns divide 16: waste 1.02.
        assert!((get(&x, "edge_waste") - 1.02).abs() < 1e-12);
        assert_eq!(get(&x, "k_blocks"), 2.0);
        // Row blocks of min(96, ceil(50/6)*6 = 54) rows: 2 tasks on 2 threads.
        assert_eq!(get(&x, "tasks"), 2.0);
        assert_eq!(get(&x, "load_imbalance"), 1.0);
        assert_eq!(get(&x, "par_m"), 1.0);
        assert_eq!(get(&x, "is_direct"), 0.0);
        assert_eq!(get(&x, "log2_b_streams"), 0.0, "B is packed once");
        let flops = 2.0 * 100.0 * 64.0 * 256.0;
        let both = 4.0 * (100.0 * 256.0 + 256.0 * 64.0) / flops;
        assert!((get(&x, "pack_bytes_per_flop") - both).abs() < 1e-12);
        // Read in place, an operand is not packed.
        let mut inplace = c.clone();
        inplace.set("b_layout", "inplace");
        let x = features(&w, "gemm_packed", &inplace, &hw());
        let a_only = 4.0 * 100.0 * 256.0 / flops;
        assert!((get(&x, "pack_bytes_per_flop") - a_only).abs() < 1e-12);
        inplace.set("a_layout", "inplace");
        let x = features(&w, "gemm_packed", &inplace, &hw());
        assert_eq!(get(&x, "pack_bytes_per_flop"), 0.0);
    }

    #[test]
    fn direct_tiles_count_vectors_and_missing_knobs_are_neutral() {
        let w: Workload = "gemm:1x3072x768".parse().unwrap();
        let c = Config::from_pairs([
            ("ukernel", Value::from("avx2_1x4")),
            ("kc", 0usize.into()),
            ("par", "n".into()),
            ("threads", 2usize.into()),
        ]);
        let x = features(&w, "gemm_direct", &c, &hw());
        assert_eq!(get(&x, "tile_cols"), 32.0);
        assert_eq!(get(&x, "is_direct"), 1.0);
        assert_eq!(get(&x, "log2_kc"), 768f64.log2(), "kc 0 is the whole of K");
        assert_eq!(get(&x, "tasks"), 2.0);
        assert_eq!(get(&x, "pack_bytes_per_flop"), 0.0);
        assert_eq!(get(&x, "log2_b_streams"), 0.0, "one row: B streams once");
        // 32 rows in tiles of 6: B streams from memory once per tile, 6 times.
        let six = Config::from_pairs([
            ("ukernel", Value::from("avx2_6x2")),
            ("kc", 0usize.into()),
            ("par", "n".into()),
            ("threads", 2usize.into()),
        ]);
        let w32: Workload = "gemm:32x768x768".parse().unwrap();
        let x = features(&w32, "gemm_direct", &six, &hw());
        assert_eq!(get(&x, "log2_b_streams"), 6f64.log2());
        let empty = features(&w, "gemm_packed", &Config::default(), &hw());
        assert!(empty.iter().all(|v| v.is_finite()));
        assert_eq!(get(&empty, "threads"), 1.0);
    }

    #[test]
    fn reduced_precision_tiles_and_element_sizes_are_featurised() {
        let cfg = |uk: &str| {
            Config::from_pairs([
                ("ukernel", Value::from(uk)),
                ("mc", 128usize.into()),
                ("kc", 256usize.into()),
                ("nc", 768usize.into()),
            ])
        };
        for (key, uk, lanes, rows, cols, bytes) in [
            (
                "gemm:128x768x768:i8",
                "avx512vnni_8x32",
                16.0,
                8.0,
                32.0,
                1.0,
            ),
            ("gemm:128x768x768:i8", "amx_16x64", 16.0, 16.0, 64.0, 1.0),
            ("gemm:128x768x768:i8", "avx2_6x16", 8.0, 6.0, 16.0, 1.0),
            (
                "gemm:128x768x768:bf16",
                "amx_bf16_32x32",
                16.0,
                32.0,
                32.0,
                2.0,
            ),
            (
                "gemm:128x768x768:bf16",
                "avx512bf16_12x32",
                16.0,
                12.0,
                32.0,
                2.0,
            ),
            ("gemm:128x768x768", "avx2_6x16", 8.0, 6.0, 16.0, 4.0),
        ] {
            let w: Workload = key.parse().unwrap();
            let x = features(&w, "gemm_i8", &cfg(uk), &hw());
            assert_eq!(get(&x, "simd_lanes"), lanes, "{uk}");
            assert_eq!(
                (get(&x, "tile_rows"), get(&x, "tile_cols")),
                (rows, cols),
                "{uk}"
            );
            assert_eq!(
                get(&x, "b_panel_over_l1"),
                cols * 256.0 * bytes / 32768.0,
                "{key}"
            );
        }
        // A name with no tile in it stays neutral.
        let x = features(&"gemm:8x8x8".parse().unwrap(), "k", &cfg("bogus"), &hw());
        assert_eq!((get(&x, "tile_rows"), get(&x, "tile_cols")), (1.0, 1.0));
    }

    #[test]
    fn equivalent_configs_share_features() {
        // mc 144 and 192 both clamp to the 128 rows of M (rounded to MR = 4).
        let w: Workload = "gemm:128x768x768".parse().unwrap();
        let cfg = |mc: usize| {
            Config::from_pairs([
                ("ukernel", Value::from("avx2_4x16")),
                ("mc", mc.into()),
                ("kc", 256usize.into()),
                ("nc", 1024usize.into()),
                ("par", "none".into()),
                ("threads", 1usize.into()),
            ])
        };
        assert_eq!(
            features(&w, "gemm_packed", &cfg(144), &hw()),
            features(&w, "gemm_packed", &cfg(192), &hw())
        );
        assert_ne!(
            features(&w, "gemm_packed", &cfg(48), &hw()),
            features(&w, "gemm_packed", &cfg(144), &hw())
        );
    }
}
