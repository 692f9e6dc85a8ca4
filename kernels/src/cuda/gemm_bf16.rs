//! `cuda_gemm_bf16`: bf16 × bf16 → f32 GEMM on tensor cores, from `templates/gemm_bf16.cu`.
//!
//! Knobs as for [`gemm_f32`](super::gemm_f32) where they apply: block tile `bm × bn × bk`, warp
//! tile `wm × wn` (a grid of 16×8 `mma.sync.m16n8k16` tiles, so no thread-tile knobs),
//! `stages`, `vec` (bf16 elements per `cp.async`: 2, 4, 8 = 4, 8, 16 bytes), `split_k`.
//! Needs sm_80 or newer.

use crate::space::{Config, Space};

use super::arch::Arch;
use super::compile::CompileError;
use super::gemm::{GemmArgs, GemmTemplate};
use super::gemm_f32::{default_split, k_per_split};
use super::shape::GemmShape;
use super::template::{cdiv, knob, render, LaunchDims, Template};

/// The template source.
pub const SOURCE: &str = include_str!("templates/gemm_bf16.cu");

/// The bf16 tensor-core GEMM family.
#[derive(Debug, Clone, Copy, Default)]
pub struct GemmBf16;

/// A config, typed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// Rows of C per block (`BM`).
    pub bm: u32,
    /// Columns of C per block (`BN`).
    pub bn: u32,
    /// Depth of the A and B tiles staged in shared memory per step (`BK`), a multiple of 16.
    pub bk: u32,
    /// Rows of C per warp (`WM`), a multiple of 16 (the `mma` tile's rows); divides `bm`.
    pub wm: u32,
    /// Columns of C per warp (`WN`), a multiple of 8 (the `mma` tile's columns); divides `bn`.
    pub wn: u32,
    /// Shared-memory pipeline depth: 1 loads then computes, 2 or more prefetch the next tiles
    /// with `cp.async`.
    pub stages: u32,
    /// bf16 elements per `cp.async` (2, 4 or 8: 4, 8 or 16 bytes).
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

    /// Dynamic shared memory: `stages` copies of the padded bf16 A and B tiles.
    pub fn smem_bytes(&self) -> usize {
        let (bm, bn, bk) = (self.bm as usize, self.bn as usize, self.bk as usize);
        self.stages as usize * (bm * (bk + 8) + bk * (bn + 8)) * 2
    }

    /// f32 accumulators each thread keeps in registers (4 per 16×8 mma tile).
    pub fn accumulators(&self) -> u32 {
        (self.wm / 16) * (self.wn / 8) * 4
    }

    /// Whether the tiles nest: warp tiles divide the block, mma tiles the warp tile.
    pub fn tiles_nest(&self) -> bool {
        self.bm.is_multiple_of(self.wm)
            && self.bn.is_multiple_of(self.wn)
            && self.wm.is_multiple_of(16)
            && self.wn.is_multiple_of(8)
            && self.bk.is_multiple_of(16)
            && [2, 4, 8].contains(&self.vec)
            && self.bk.is_multiple_of(self.vec)
            && self.bn.is_multiple_of(self.vec)
    }

    fn defines(&self) -> [(&'static str, i64); 8] {
        [
            ("BM", self.bm as i64),
            ("BN", self.bn as i64),
            ("BK", self.bk as i64),
            ("WM", self.wm as i64),
            ("WN", self.wn as i64),
            ("STAGES", self.stages as i64),
            ("VEC", self.vec as i64),
            ("SPLIT_K", self.split_k as i64),
        ]
    }
}

impl Template for GemmBf16 {
    type Shape = GemmShape;

    fn name(&self) -> &'static str {
        "cuda_gemm_bf16"
    }

    fn version(&self) -> u32 {
        1
    }

    fn entry(&self) -> &'static str {
        "gemm_bf16"
    }

    fn supports(&self, _shape: &GemmShape, arch: Arch) -> bool {
        arch.has_bf16_mma()
    }

    fn space(&self, shape: &GemmShape, arch: Arch) -> Space {
        let k = shape.k;
        let smem_limit = arch.max_smem_per_block();
        let p = |c: &Config| Params::try_from(c).ok();
        Space::new()
            .knob("bm", [32usize, 64, 128, 256])
            .knob("bn", [32usize, 64, 128, 256])
            .knob("bk", [16usize, 32, 64])
            .knob("wm", [16usize, 32, 64])
            .knob("wn", [16usize, 32, 64])
            .knob("stages", [1usize, 2, 3, 4])
            .knob("vec", [2usize, 4, 8])
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
        // 8 warps in a 2 × 4 grid; the block's M extent follows M for skinny shapes.
        let (bm, wm) = match shape.m {
            0..=32 => (32, 16),
            33..=64 => (64, 32),
            _ => (128, 64),
        };
        let (bn, wn, bk) = (128, 32, 32);
        let tiles = cdiv(shape.m, bm) * cdiv(shape.n, bn);
        let split = default_split(tiles, cdiv(shape.k, bk));
        let mut stages = 3;
        let smem = |s: usize| s * (bm * (bk + 8) + bk * (bn + 8)) * 2;
        while stages > 1 && smem(stages) > arch.max_smem_per_block() {
            stages -= 1;
        }
        Config::from_pairs([
            ("bm", bm),
            ("bn", bn),
            ("bk", bk),
            ("wm", wm),
            ("wn", wn),
            ("stages", stages),
            ("vec", 8),
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

impl GemmBf16 {
    /// The typed params of `config` (knob presence and tile nesting; not the space's limits).
    pub fn params(&self, config: &Config) -> Result<Params, CompileError> {
        let invalid = |reason: String| CompileError::BadConfig {
            kernel: self.name().into(),
            config: config.to_json(),
            reason,
        };
        let p = Params::try_from(config).map_err(invalid)?;
        if !p.tiles_nest() || p.stages == 0 {
            return Err(invalid("tiles do not nest".into()));
        }
        Ok(p)
    }
}

impl GemmTemplate for GemmBf16 {
    fn gemm_args(&self, shape: &GemmShape, config: &Config) -> Result<GemmArgs, CompileError> {
        let p = self.params(config)?;
        let vec = p.vec as usize;
        Ok(GemmArgs {
            k_per_split: k_per_split(shape.k, p.bk as usize, p.split_k as usize),
            split_k: p.split_k as usize,
            a_vec: shape.k.is_multiple_of(vec),
            b_vec: shape.n.is_multiple_of(vec),
            c_vec: shape.n.is_multiple_of(2),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_for_every_shape_on_sm80_and_newer() {
        for (m, n, k) in [
            (1, 1, 1),
            (1, 4096, 4096),
            (33, 65, 67),
            (128, 3072, 768),
            (8192, 8192, 8192),
        ] {
            let s = GemmShape::new(m, n, k).unwrap();
            for arch in [Arch::SM80, Arch::new(8, 6), Arch::new(8, 9), Arch::SM90] {
                assert!(GemmBf16.supports(&s, arch));
                let c = GemmBf16.default_config(&s, arch);
                assert_eq!(
                    GemmBf16.space(&s, arch).check(&c),
                    Ok(()),
                    "{s:?} {arch} {c}"
                );
                let p = GemmBf16.params(&c).unwrap();
                assert_eq!(p.threads(), 256);
            }
            assert!(!GemmBf16.supports(&s, Arch::new(7, 5)));
        }
    }

    #[test]
    fn compile_refuses_unsupported_archs_and_bad_configs_without_nvrtc() {
        let s = GemmShape::new(64, 64, 64).unwrap();
        let c = GemmBf16.default_config(&s, Arch::SM80);
        let e = GemmBf16.compile(&s, &c, Arch::new(7, 5)).unwrap_err();
        assert!(e.to_string().contains("not supported on sm_75"), "{e}");
        let mut big = c.clone();
        big.set("bm", 256usize);
        big.set("bn", 256usize);
        big.set("bk", 64usize);
        big.set("stages", 4usize);
        let e = GemmBf16.compile(&s, &big, Arch::SM80).unwrap_err();
        assert!(matches!(e, CompileError::InvalidConfig { .. }), "{e}");
    }

    #[test]
    fn space_is_rich() {
        let s = GemmShape::new(1024, 1024, 1024).unwrap();
        let space = GemmBf16.space(&s, Arch::SM90);
        let mut rng = crate::Rng::new(2);
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
            assert!(p.smem_bytes() <= Arch::SM90.max_smem_per_block());
        }
    }
}
