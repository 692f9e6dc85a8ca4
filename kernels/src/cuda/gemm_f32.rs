//! `cuda_gemm_f32`: f32 GEMM from `templates/gemm_f32.cu`.
//!
//! Knobs: block tile `bm × bn × bk`, warp tile `wm × wn`, thread tile `tm × tn`, pipeline
//! depth `stages` (1 = load then compute; ≥ 2 = `cp.async` prefetch of the next tiles while
//! the current one is multiplied), global load width `vec` (floats), and `split_k` (K slices
//! summed with `atomicAdd`, for skinny shapes whose M×N tiles cannot fill the GPU).

use crate::space::{Config, Space};

use super::arch::Arch;
use super::compile::CompileError;
use super::gemm::{GemmArgs, GemmTemplate};
use super::shape::GemmShape;
use super::template::{cdiv, knob, render, LaunchDims, Template};

/// The template source.
pub const SOURCE: &str = include_str!("templates/gemm_f32.cu");

/// The f32 GEMM family.
#[derive(Debug, Clone, Copy, Default)]
pub struct GemmF32;

/// A config, typed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// Rows of C per block (`BM`).
    pub bm: u32,
    /// Columns of C per block (`BN`).
    pub bn: u32,
    /// Depth of the A and B tiles staged in shared memory per step (`BK`).
    pub bk: u32,
    /// Rows of C per warp (`WM`); divides `bm`.
    pub wm: u32,
    /// Columns of C per warp (`WN`); divides `bn`.
    pub wn: u32,
    /// Rows of a thread tile (`TM`); a lane owns `wm / (4·tm)` × `wn / (8·tn)` thread tiles.
    pub tm: u32,
    /// Columns of a thread tile (`TN`), a multiple of 4.
    pub tn: u32,
    /// Shared-memory pipeline depth: 1 loads then computes, 2 or more prefetch the next tiles
    /// with `cp.async`.
    pub stages: u32,
    /// Floats per global load (1, 2 or 4).
    pub vec: u32,
    /// K slices, summed into a zeroed C with `atomicAdd`; 1 does not split.
    pub split_k: u32,
}

impl TryFrom<&Config> for Params {
    type Error = String;

    fn try_from(c: &Config) -> Result<Self, String> {
        Ok(Params {
            bm: knob(c, "bm")?,
            bn: knob(c, "bn")?,
            bk: knob(c, "bk")?,
            wm: knob(c, "wm")?,
            wn: knob(c, "wn")?,
            tm: knob(c, "tm")?,
            tn: knob(c, "tn")?,
            stages: knob(c, "stages")?,
            vec: knob(c, "vec")?,
            split_k: knob(c, "split_k")?,
        })
    }
}

impl Params {
    /// Threads per block: one warp per warp tile.
    pub fn threads(&self) -> u32 {
        (self.bm / self.wm) * (self.bn / self.wn) * 32
    }

    /// Dynamic shared memory: `stages` copies of the padded A and B tiles.
    pub fn smem_bytes(&self) -> usize {
        let (bm, bn, bk) = (self.bm as usize, self.bn as usize, self.bk as usize);
        self.stages as usize * (bm * (bk + 4) + bk * (bn + 4)) * 4
    }

    /// f32 accumulators each thread keeps in registers.
    pub fn accumulators(&self) -> u32 {
        self.wm * self.wn / 32
    }

    /// Whether the tiles nest: warp tiles divide the block, thread tiles the warp tile.
    pub fn tiles_nest(&self) -> bool {
        self.bm.is_multiple_of(self.wm)
            && self.bn.is_multiple_of(self.wn)
            && self.wm.is_multiple_of(4 * self.tm)
            && self.wn.is_multiple_of(8 * self.tn)
            && self.bk.is_multiple_of(4)
            && self.tn.is_multiple_of(4)
            && self.bk.is_multiple_of(self.vec)
            && self.bn.is_multiple_of(self.vec)
    }

    fn defines(&self) -> [(&'static str, i64); 10] {
        [
            ("BM", self.bm as i64),
            ("BN", self.bn as i64),
            ("BK", self.bk as i64),
            ("WM", self.wm as i64),
            ("WN", self.wn as i64),
            ("TM", self.tm as i64),
            ("TN", self.tn as i64),
            ("STAGES", self.stages as i64),
            ("VEC", self.vec as i64),
            ("SPLIT_K", self.split_k as i64),
        ]
    }
}

/// K per split slice: whole `bk` tiles, spread as evenly as possible.
pub(crate) fn k_per_split(k: usize, bk: usize, split_k: usize) -> usize {
    cdiv(cdiv(k, bk), split_k) * bk
}

/// The largest power-of-two split (≤ 16) that keeps ≥ 8 K tiles per slice, used only while
/// the M×N tiles alone leave the GPU mostly idle (fewer than 64 blocks).
pub(crate) fn default_split(tiles_mn: usize, k_tiles: usize) -> usize {
    let mut s = 1;
    while s < 16 && tiles_mn * s < 64 && k_tiles >= 16 * s {
        s *= 2;
    }
    s
}

impl Template for GemmF32 {
    type Shape = GemmShape;

    fn name(&self) -> &'static str {
        "cuda_gemm_f32"
    }

    fn version(&self) -> u32 {
        1
    }

    fn entry(&self) -> &'static str {
        "gemm_f32"
    }

    fn supports(&self, _shape: &GemmShape, _arch: Arch) -> bool {
        true
    }

    fn space(&self, shape: &GemmShape, arch: Arch) -> Space {
        let k = shape.k;
        let smem_limit = arch.max_smem_per_block();
        let p = |c: &Config| Params::try_from(c).ok();
        Space::new()
            .knob("bm", [32usize, 64, 128, 256])
            .knob("bn", [32usize, 64, 128, 256])
            .knob("bk", [8usize, 16, 32])
            .knob("wm", [16usize, 32, 64, 128])
            .knob("wn", [32usize, 64, 128])
            .knob("tm", [4usize, 8])
            .knob("tn", [4usize, 8])
            .knob("stages", [1usize, 2, 3, 4])
            .knob("vec", [1usize, 2, 4])
            .knob("split_k", [1usize, 2, 4, 8, 16])
            .rule("tiles_nest", move |c| p(c).is_some_and(|p| p.tiles_nest()))
            .rule("threads_per_block", move |c| {
                p(c).is_some_and(|p| p.tiles_nest() && (32..=1024).contains(&p.threads()))
            })
            .rule("registers", move |c| {
                p(c).is_some_and(|p| p.accumulators() <= 128)
            })
            .rule("shared_memory", move |c| {
                p(c).is_some_and(|p| p.smem_bytes() <= smem_limit)
            })
            .rule("split_k_has_work", move |c| {
                p(c).is_some_and(|p| p.split_k == 1 || cdiv(k, p.bk as usize) >= p.split_k as usize)
            })
    }

    fn default_config(&self, shape: &GemmShape, arch: Arch) -> Config {
        let (bm, wm) = if shape.m <= 32 { (32, 16) } else { (64, 32) };
        let (bn, wn, bk) = (64, 32, 16);
        let tiles = cdiv(shape.m, bm) * cdiv(shape.n, bn);
        let split = default_split(tiles, cdiv(shape.k, bk));
        let stages = if arch.has_cp_async() { 3 } else { 2 };
        Config::from_pairs([
            ("bm", bm),
            ("bn", bn),
            ("bk", bk),
            ("wm", wm),
            ("wn", wn),
            ("tm", 4),
            ("tn", 4),
            ("stages", stages),
            ("vec", 4),
            ("split_k", split),
        ])
    }

    fn source(&self, _shape: &GemmShape, config: &Config) -> Result<String, CompileError> {
        let p = self.params(config)?;
        Ok(render(self.name(), config, &p.defines(), SOURCE))
    }

    fn launch_dims(&self, shape: &GemmShape, config: &Config) -> Result<LaunchDims, CompileError> {
        let p = self.params(config)?;
        Ok(LaunchDims {
            grid: (
                cdiv(shape.n, p.bn as usize) as u32,
                cdiv(shape.m, p.bm as usize) as u32,
                p.split_k,
            ),
            block: (p.threads(), 1, 1),
            smem_bytes: p.smem_bytes() as u32,
        })
    }
}

impl GemmF32 {
    /// The typed params of `config` (knob presence and tile nesting; not the space's limits).
    pub fn params(&self, config: &Config) -> Result<Params, CompileError> {
        let invalid = |reason: String| CompileError::BadConfig {
            kernel: self.name().into(),
            config: config.to_json(),
            reason,
        };
        let p = Params::try_from(config).map_err(invalid)?;
        if !p.tiles_nest() || p.stages == 0 || ![1, 2, 4].contains(&p.vec) {
            return Err(invalid("tiles do not nest".into()));
        }
        Ok(p)
    }
}

impl GemmTemplate for GemmF32 {
    fn gemm_args(&self, shape: &GemmShape, config: &Config) -> Result<GemmArgs, CompileError> {
        let p = self.params(config)?;
        let vec = p.vec as usize;
        Ok(GemmArgs {
            k_per_split: k_per_split(shape.k, p.bk as usize, p.split_k as usize),
            split_k: p.split_k as usize,
            a_vec: shape.k.is_multiple_of(vec),
            b_vec: shape.n.is_multiple_of(vec),
            c_vec: shape.n.is_multiple_of(4),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shapes() -> Vec<GemmShape> {
        [
            (1, 1, 1),
            (1, 4096, 4096),
            (33, 65, 67),
            (128, 3072, 768),
            (4096, 4096, 4096),
        ]
        .into_iter()
        .map(|(m, n, k)| GemmShape::new(m, n, k).unwrap())
        .collect()
    }

    #[test]
    fn default_is_valid_for_every_shape_and_arch() {
        for s in shapes() {
            for arch in [Arch::new(7, 5), Arch::SM80, Arch::new(8, 6), Arch::SM90] {
                let c = GemmF32.default_config(&s, arch);
                assert_eq!(GemmF32.space(&s, arch).check(&c), Ok(()), "{s:?} {arch}");
                let d = GemmF32.launch_dims(&s, &c).unwrap();
                assert!(d.block.0 <= 1024 && d.smem_bytes as usize <= arch.max_smem_per_block());
            }
        }
        let skinny = GemmShape::new(1, 768, 3072).unwrap();
        let c = GemmF32.default_config(&skinny, Arch::SM90);
        assert!(c.int("split_k").unwrap() > 1, "skinny shapes split K: {c}");
        let big = GemmShape::new(4096, 4096, 4096).unwrap();
        assert_eq!(
            GemmF32.default_config(&big, Arch::SM90).int("split_k"),
            Some(1)
        );
    }

    #[test]
    fn space_has_many_valid_configs_and_rules_bite() {
        let s = GemmShape::new(512, 512, 512).unwrap();
        let space = GemmF32.space(&s, Arch::SM80);
        let mut rng = crate::Rng::new(1);
        let sample: std::collections::BTreeSet<Config> =
            (0..300).filter_map(|_| space.sample(&mut rng)).collect();
        assert!(
            sample.len() > 250,
            "{} distinct valid configs",
            sample.len()
        );
        for c in &sample {
            let p = Params::try_from(c).unwrap();
            assert!(p.tiles_nest() && p.threads() <= 1024 && p.accumulators() <= 128);
            assert!(p.smem_bytes() <= Arch::SM80.max_smem_per_block());
        }
        let mut c = GemmF32.default_config(&s, Arch::SM80);
        c.set("wm", 128usize);
        assert!(GemmF32.space(&s, Arch::SM80).check(&c).is_err(), "wm > bm");
        let tiny_k = GemmShape::new(64, 64, 8).unwrap();
        let mut c = GemmF32.default_config(&tiny_k, Arch::SM80);
        c.set("split_k", 4usize);
        assert!(GemmF32.space(&tiny_k, Arch::SM80).check(&c).is_err());
    }

    #[test]
    fn source_has_the_config_as_defines() {
        let s = GemmShape::new(64, 64, 64).unwrap();
        let c = GemmF32.default_config(&s, Arch::SM80);
        let src = GemmF32.source(&s, &c).unwrap();
        assert!(src.contains("#define BM 64\n") && src.contains("#define SPLIT_K 1\n"));
        assert!(src.contains("extern \"C\" __global__") && src.contains("gemm_f32("));
        let mut bad = c.clone();
        bad.0.remove("bk");
        assert!(matches!(
            GemmF32.source(&s, &bad),
            Err(CompileError::BadConfig { .. })
        ));
    }

    #[test]
    fn split_slices_cover_k() {
        for (k, bk, s) in [(1, 16, 1), (100, 16, 4), (4096, 32, 16), (17, 8, 2)] {
            let per = k_per_split(k, bk, s);
            assert_eq!(per % bk, 0);
            assert!(per * s >= k, "{k} {bk} {s}");
            assert!(
                per * (s - 1) < k || s == 1,
                "no slice is wholly past K when tiles ≥ splits"
            );
        }
    }
}
