//! `cuda_attention_f32` / `cuda_attention_bf16`: flash-style fused attention from
//! `templates/attention.cu`.
//!
//! Knobs: `br` (query rows per block), `bc` (keys per tile), `warps` (per block; each owns
//! `br / warps` rows). The head dimension and the element type are compile-time constants
//! too (they come from the shape and the family), causality is a run-time flag.
//!
//! Verification is against [`reference()`], an f64 CPU computation on the same inputs.

use cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};
use rayon::prelude::*;

use crate::problem::Mismatch;
use crate::rng::Rng;
use crate::space::{Config, Space};

use super::arch::Arch;
use super::bf16;
use super::compile::CompileError;
use super::gemm::compare;
use super::gpu::{trial, Gpu, GpuCase, GpuOutcome, GpuTiming, Loaded};
use super::shape::AttentionShape;
use super::template::{cdiv, knob, render, LaunchDims, Template};
use super::CudaError;

/// The template source.
pub const SOURCE: &str = include_str!("templates/attention.cu");

/// Element type of Q, K, V and O (arithmetic is f32 either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttnDtype {
    /// f32 Q, K, V and O.
    F32,
    /// bf16 Q, K, V and O (on the device as `u16` bit patterns); scores, softmax and
    /// accumulation in f32.
    Bf16,
}

/// The attention family for one element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attention {
    /// The element type of Q, K, V and O.
    pub dtype: AttnDtype,
}

impl Attention {
    /// The f32 family, `cuda_attention_f32`.
    pub const F32: Attention = Attention {
        dtype: AttnDtype::F32,
    };
    /// The bf16 family, `cuda_attention_bf16`.
    pub const BF16: Attention = Attention {
        dtype: AttnDtype::Bf16,
    };
}

/// A config, typed, with the shape's head dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// Query rows per block (the `br` knob).
    pub br: u32,
    /// Keys per tile (the `bc` knob), a multiple of 32.
    pub bc: u32,
    /// Warps per block (the `warps` knob); each owns `br / warps` query rows.
    pub warps: u32,
    /// The shape's head dimension D, a compile-time constant of the kernel.
    pub head_dim: u32,
}

impl Params {
    fn new(c: &Config, head_dim: usize) -> Result<Self, String> {
        Ok(Params {
            br: knob(c, "br")?,
            bc: knob(c, "bc")?,
            warps: knob(c, "warps")?,
            head_dim: head_dim as u32,
        })
    }

    /// Threads per block: 32 per warp.
    pub fn threads(&self) -> u32 {
        self.warps * 32
    }

    /// Query rows each warp owns.
    pub fn rows_per_warp(&self) -> u32 {
        self.br / self.warps
    }

    /// Q tile, padded K tile, V tile and each warp's row of weights, as f32.
    pub fn smem_bytes(&self) -> usize {
        let (br, bc, d) = (self.br as usize, self.bc as usize, self.head_dim as usize);
        (br * d + bc * (d + 1) + bc * d + self.warps as usize * bc) * 4
    }

    /// Per-thread registers of running state: (D/32 outputs + max + sum) per owned row.
    pub fn state_registers(&self) -> u32 {
        self.rows_per_warp() * (self.head_dim.div_ceil(32) + 2)
    }

    /// Whether the tiles divide up: `br` a multiple of `warps`, `bc` of 32, at most 1024 threads
    /// per block.
    pub fn well_formed(&self) -> bool {
        self.warps > 0
            && self.br.is_multiple_of(self.warps)
            && self.bc.is_multiple_of(32)
            && self.threads() <= 1024
    }
}

/// Largest per-thread running state (registers) a config may keep.
const MAX_STATE_REGISTERS: u32 = 96;

/// Most query rows one warp owns. Rows are processed one after another (each reads the K and
/// V tiles from shared memory on its own), so more rows per warp save nothing at run time,
/// while the fully unrolled row loop grows the code and NVRTC's compile time with them.
const MAX_ROWS_PER_WARP: u32 = 8;

impl Template for Attention {
    type Shape = AttentionShape;

    fn name(&self) -> &'static str {
        match self.dtype {
            AttnDtype::F32 => "cuda_attention_f32",
            AttnDtype::Bf16 => "cuda_attention_bf16",
        }
    }

    fn version(&self) -> u32 {
        1
    }

    fn entry(&self) -> &'static str {
        "attention"
    }

    /// Whether the smallest config's tiles fit in shared memory.
    fn supports(&self, shape: &AttentionShape, arch: Arch) -> bool {
        let smallest = Params {
            br: 16,
            bc: 32,
            warps: 4,
            head_dim: shape.head_dim as u32,
        };
        smallest.smem_bytes() <= arch.max_smem_per_block()
    }

    fn space(&self, shape: &AttentionShape, arch: Arch) -> Space {
        let d = shape.head_dim;
        let smem_limit = arch.max_smem_per_block();
        let p = move |c: &Config| Params::new(c, d).ok().filter(Params::well_formed);
        Space::new()
            .knob("br", [16usize, 32, 64, 128])
            .knob("bc", [32usize, 64, 128])
            .knob("warps", [1usize, 2, 4, 8])
            .rule("tiles", move |c| p(c).is_some())
            .rule("rows_per_warp", move |c| {
                p(c).is_some_and(|p| p.rows_per_warp() <= MAX_ROWS_PER_WARP)
            })
            .rule("registers", move |c| {
                p(c).is_some_and(|p| p.state_registers() <= MAX_STATE_REGISTERS)
            })
            .rule("shared_memory", move |c| {
                p(c).is_some_and(|p| p.smem_bytes() <= smem_limit)
            })
    }

    fn default_config(&self, shape: &AttentionShape, arch: Arch) -> Config {
        let d = shape.head_dim as u32;
        // 4 warps of 8 (or 4) rows; the widest key tile that fits.
        for (br, bc) in [(32, 64), (32, 32), (16, 32)] {
            let p = Params {
                br,
                bc,
                warps: 4,
                head_dim: d,
            };
            if p.smem_bytes() <= arch.max_smem_per_block()
                && p.state_registers() <= MAX_STATE_REGISTERS
            {
                return Config::from_pairs([
                    ("br", br as usize),
                    ("bc", bc as usize),
                    ("warps", 4),
                ]);
            }
        }
        Config::from_pairs([("br", 16usize), ("bc", 32), ("warps", 4)])
    }

    fn source(&self, shape: &AttentionShape, config: &Config) -> Result<String, CompileError> {
        let p = self.params(shape, config)?;
        let defines = [
            ("BR", p.br as i64),
            ("BC", p.bc as i64),
            ("WARPS", p.warps as i64),
            ("HEAD_DIM", p.head_dim as i64),
            ("DTYPE_BF16", (self.dtype == AttnDtype::Bf16) as i64),
        ];
        Ok(render(self.name(), config, &defines, SOURCE))
    }

    fn launch_dims(
        &self,
        shape: &AttentionShape,
        config: &Config,
    ) -> Result<LaunchDims, CompileError> {
        let p = self.params(shape, config)?;
        Ok(LaunchDims {
            grid: (
                cdiv(shape.seq_q, p.br as usize) as u32,
                shape.batch_heads() as u32,
                1,
            ),
            block: (p.threads(), 1, 1),
            smem_bytes: p.smem_bytes() as u32,
        })
    }
}

impl Attention {
    /// The typed params of `config` for `shape`.
    pub fn params(&self, shape: &AttentionShape, config: &Config) -> Result<Params, CompileError> {
        let invalid = |reason: String| CompileError::BadConfig {
            kernel: self.name().into(),
            config: config.to_json(),
            reason,
        };
        let p = Params::new(config, shape.head_dim).map_err(invalid)?;
        if !p.well_formed() {
            return Err(invalid("br must be a multiple of warps, bc of 32".into()));
        }
        Ok(p)
    }
}

/// The f64 reference for one head-major problem, and a per-element tolerance.
///
/// Tolerance for output `(i, d)`: `ε_f32 · (2√Sk + 2√D + 8) · (1 + max_j |s_ij|) · Σ_j p_ij |v_jd|`
/// — the f32 score error (√D-growing dot products, scaled by the largest logit, which the
/// exponential turns into a relative error of each weight) and the f32 accumulation over
/// the keys (√Sk), applied to the magnitude of the weighted sum — plus, for a bf16 output,
/// its rounding (`2⁻⁸ · |o|`). Rows that see no key are exactly zero.
pub fn reference(
    shape: &AttentionShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    bf16_output: bool,
) -> (Vec<f32>, Vec<f32>) {
    let (sq, sk, d) = (shape.seq_q, shape.seq_k, shape.head_dim);
    let scale = 1.0 / (d as f64).sqrt();
    let eps = f32::EPSILON as f64 * (2.0 * (sk as f64).sqrt() + 2.0 * (d as f64).sqrt() + 8.0);
    let mut out = vec![0.0f32; shape.q_len()];
    let mut tol = vec![0.0f32; shape.q_len()];
    out.par_chunks_mut(d)
        .zip(tol.par_chunks_mut(d))
        .enumerate()
        .for_each(|(row, (o, t))| {
            let (bh, i) = (row / sq, row % sq);
            let qr = &q[row * d..(row + 1) * d];
            let kv = |x: &[f32], j: usize| -> Vec<f64> {
                x[(bh * sk + j) * d..(bh * sk + j + 1) * d]
                    .iter()
                    .map(|&e| e as f64)
                    .collect()
            };
            let visible = shape.visible_keys(i);
            if visible == 0 {
                return;
            }
            let scores: Vec<f64> = (0..visible)
                .map(|j| {
                    let kr = kv(k, j);
                    qr.iter().zip(&kr).map(|(&a, b)| a as f64 * b).sum::<f64>() * scale
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let sum: f64 = weights.iter().sum();
            let biggest = scores.iter().fold(0.0f64, |m, s| m.max(s.abs()));
            let mut acc = vec![0.0f64; d];
            let mut mag = vec![0.0f64; d];
            for (j, w) in weights.iter().enumerate() {
                let p = w / sum;
                for (dd, x) in kv(v, j).into_iter().enumerate() {
                    acc[dd] += p * x;
                    mag[dd] += p * x.abs();
                }
            }
            for dd in 0..d {
                o[dd] = acc[dd] as f32;
                let mut e = eps * (1.0 + biggest) * mag[dd];
                if bf16_output {
                    e += bf16::EPSILON_HALF * 2.0 * acc[dd].abs();
                }
                t[dd] = e as f32 + f32::MIN_POSITIVE;
            }
        });
    (out, tol)
}

enum Buffers {
    F32 {
        q: CudaSlice<f32>,
        k: CudaSlice<f32>,
        v: CudaSlice<f32>,
        o: CudaSlice<f32>,
    },
    Bf16 {
        q: CudaSlice<u16>,
        k: CudaSlice<u16>,
        v: CudaSlice<u16>,
        o: CudaSlice<u16>,
    },
}

/// Inputs for one attention shape on the device, and the f64 reference.
pub struct AttentionProblem {
    /// The attention shape the buffers are sized for.
    pub shape: AttentionShape,
    /// The family, whose element type the buffers hold.
    pub family: Attention,
    buffers: Buffers,
    expected: Vec<f32>,
    tolerance: Vec<f32>,
}

impl AttentionProblem {
    /// Random Q, K, V in `[-1, 1)` from `seed` (rounded to bf16 for the bf16 family),
    /// uploaded, and the CPU reference computed.
    pub fn new(
        gpu: &Gpu,
        shape: AttentionShape,
        family: Attention,
        seed: u64,
    ) -> Result<Self, CudaError> {
        let mut rng = Rng::new(seed);
        let is_bf16 = family.dtype == AttnDtype::Bf16;
        let mut gen = |len: usize| -> Vec<f32> {
            (0..len)
                .map(|_| {
                    let x = rng.symmetric_f32();
                    if is_bf16 {
                        bf16::round(x)
                    } else {
                        x
                    }
                })
                .collect()
        };
        let (hq, hk, hv) = (gen(shape.q_len()), gen(shape.kv_len()), gen(shape.kv_len()));
        let (expected, tolerance) = reference(&shape, &hq, &hk, &hv, is_bf16);
        let s = gpu.stream();
        let up = |what: &'static str| CudaError::driver(format!("uploading {what}"));
        let to16 = |v: &[f32]| v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<u16>>();
        let buffers = if is_bf16 {
            Buffers::Bf16 {
                q: s.clone_htod(&to16(&hq)).map_err(up("Q"))?,
                k: s.clone_htod(&to16(&hk)).map_err(up("K"))?,
                v: s.clone_htod(&to16(&hv)).map_err(up("V"))?,
                o: s.alloc_zeros(shape.q_len()).map_err(up("O"))?,
            }
        } else {
            Buffers::F32 {
                q: s.clone_htod(&hq).map_err(up("Q"))?,
                k: s.clone_htod(&hk).map_err(up("K"))?,
                v: s.clone_htod(&hv).map_err(up("V"))?,
                o: s.alloc_zeros(shape.q_len()).map_err(up("O"))?,
            }
        };
        Ok(AttentionProblem {
            shape,
            family,
            buffers,
            expected,
            tolerance,
        })
    }

    /// Compiles, runs once, verifies against the f64 reference, then times `config`.
    pub fn evaluate(&mut self, gpu: &Gpu, config: &Config, timing: &GpuTiming) -> GpuOutcome {
        trial(gpu, self, config, timing)
    }

    /// Queues one call of a config loaded with [`Gpu::load`].
    pub fn launch(&mut self, gpu: &Gpu, loaded: &Loaded) -> Result<(), CudaError> {
        let shape = self.shape;
        match &mut self.buffers {
            Buffers::F32 { q, k, v, o } => launch_attention(gpu, loaded, &shape, q, k, v, o),
            Buffers::Bf16 { q, k, v, o } => launch_attention(gpu, loaded, &shape, q, k, v, o),
        }
    }

    /// The output of the last call, as f32.
    pub fn output(&self, gpu: &Gpu) -> Result<Vec<f32>, CudaError> {
        let down = CudaError::driver("downloading O");
        match &self.buffers {
            Buffers::F32 { o, .. } => gpu.stream().clone_dtoh(o).map_err(down),
            Buffers::Bf16 { o, .. } => Ok(gpu
                .stream()
                .clone_dtoh(o)
                .map_err(down)?
                .into_iter()
                .map(bf16::to_f32)
                .collect()),
        }
    }

    /// Compares `got` with the reference.
    pub fn compare(&self, got: &[f32]) -> Result<(), Mismatch> {
        compare(got, &self.expected, &self.tolerance, self.shape.head_dim)
    }
}

impl GpuCase for AttentionProblem {
    fn prepare(&self, gpu: &Gpu, config: &Config) -> Result<Loaded, CudaError> {
        gpu.load(&self.family, &self.shape, config)
    }

    fn launch(&mut self, gpu: &Gpu, loaded: &Loaded) -> Result<(), CudaError> {
        AttentionProblem::launch(self, gpu, loaded)
    }

    fn check(&self, gpu: &Gpu) -> Result<(), CudaError> {
        let got = self.output(gpu)?;
        self.compare(&got).map_err(CudaError::from)
    }
}

fn launch_attention<T: DeviceRepr>(
    gpu: &Gpu,
    loaded: &Loaded,
    shape: &AttentionShape,
    q: &CudaSlice<T>,
    k: &CudaSlice<T>,
    v: &CudaSlice<T>,
    o: &mut CudaSlice<T>,
) -> Result<(), CudaError> {
    for (name, got, need) in [
        ("Q", q.len(), shape.q_len()),
        ("K", k.len(), shape.kv_len()),
        ("V", v.len(), shape.kv_len()),
        ("O", o.len(), shape.q_len()),
    ] {
        if got != need {
            return Err(CudaError::BufferSize { name, got, need });
        }
    }
    let seq_q = shape.seq_q as i32;
    let seq_k = shape.seq_k as i32;
    let scale_log2 = std::f32::consts::LOG2_E / (shape.head_dim as f32).sqrt();
    let causal = shape.causal as i32;
    let mut launch = gpu.stream().launch_builder(&loaded.function);
    launch
        .arg(q)
        .arg(k)
        .arg(v)
        .arg(&mut *o)
        .arg(&seq_q)
        .arg(&seq_k)
        .arg(&scale_log2)
        .arg(&causal);
    // SAFETY: the arguments match the template's signature — (Q, K, V, O, seq_q, seq_k,
    // scale_log2, causal): four pointers of the element type the source was rendered with,
    // two ints, a float, an int. The buffers hold batch·heads·seq·D elements (checked above)
    // and the kernel predicates every row on seq_q / seq_k, so it stays inside them. Grid and
    // block come from the config the source was rendered from (`Loaded::dims`).
    unsafe { launch.launch(loaded.launch_config()) }
        .map(|_| ())
        .map_err(CudaError::driver("launching attention"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shapes() -> Vec<AttentionShape> {
        [
            (1, 1, 1, 1, 1, false),
            (2, 3, 17, 33, 64, true),
            (1, 8, 128, 128, 128, true),
            (1, 2, 100, 300, 80, false),
            (1, 1, 64, 64, 256, true),
        ]
        .into_iter()
        .map(|(b, h, q, k, d, c)| AttentionShape::new(b, h, q, k, d, c).unwrap())
        .collect()
    }

    #[test]
    fn default_is_valid_for_every_shape_on_sm80_and_newer() {
        for fam in [Attention::F32, Attention::BF16] {
            for s in shapes() {
                for arch in [Arch::SM80, Arch::new(8, 6), Arch::SM90] {
                    assert!(fam.supports(&s, arch));
                    let c = fam.default_config(&s, arch);
                    assert_eq!(fam.space(&s, arch).check(&c), Ok(()), "{s:?} {arch} {c}");
                    let d = fam.launch_dims(&s, &c).unwrap();
                    assert_eq!(d.grid.1 as usize, s.batch_heads());
                }
                let n = fam.space(&s, Arch::SM90).count_valid();
                assert!(n >= 8, "{s:?}: {n}");
            }
        }
    }

    #[test]
    fn sources_differ_by_dtype_and_head_dim() {
        let s = AttentionShape::new(1, 1, 8, 8, 64, false).unwrap();
        let c = Attention::F32.default_config(&s, Arch::SM80);
        let f = Attention::F32.source(&s, &c).unwrap();
        let b = Attention::BF16.source(&s, &c).unwrap();
        assert!(f.contains("#define DTYPE_BF16 0") && b.contains("#define DTYPE_BF16 1"));
        assert!(f.contains("#define HEAD_DIM 64"));
    }

    /// The reference against a direct f64 softmax, and the causal mask's extremes.
    #[test]
    fn reference_matches_a_direct_computation() {
        let s = AttentionShape::new(1, 2, 5, 7, 3, true).unwrap();
        let mut r = Rng::new(3);
        let mut gen = |n: usize| (0..n).map(|_| r.symmetric_f32()).collect::<Vec<_>>();
        let (q, k, v) = (gen(s.q_len()), gen(s.kv_len()), gen(s.kv_len()));
        let (out, tol) = reference(&s, &q, &k, &v, false);
        for bh in 0..2 {
            for i in 0..5 {
                let vis = s.visible_keys(i);
                assert_eq!(vis, i + 3);
                let sc: Vec<f64> = (0..vis)
                    .map(|j| {
                        (0..3)
                            .map(|d| {
                                q[(bh * 5 + i) * 3 + d] as f64 * k[(bh * 7 + j) * 3 + d] as f64
                            })
                            .sum::<f64>()
                            / 3f64.sqrt()
                    })
                    .collect();
                let z: f64 = sc.iter().map(|x| x.exp()).sum();
                for d in 0..3 {
                    let want: f64 = (0..vis)
                        .map(|j| sc[j].exp() / z * v[(bh * 7 + j) * 3 + d] as f64)
                        .sum();
                    let got = out[(bh * 5 + i) * 3 + d] as f64;
                    assert!((got - want).abs() < 1e-6, "{bh} {i} {d}: {got} vs {want}");
                    assert!(tol[(bh * 5 + i) * 3 + d] > 0.0);
                }
            }
        }
        // More queries than keys: the first rows see nothing and are exactly zero.
        let s = AttentionShape::new(1, 1, 4, 2, 2, true).unwrap();
        let (out, _) = reference(&s, &[1.0; 8], &[1.0; 4], &[2.0; 4], false);
        assert_eq!(&out[..4], &[0.0; 4]);
        assert!((out[4] - 2.0).abs() < 1e-6 && (out[7] - 2.0).abs() < 1e-6);
    }

    /// The tolerance accepts an f32 computation and rejects a dropped key.
    #[test]
    fn tolerance_separates_rounding_from_bugs() {
        let s = AttentionShape::new(1, 1, 3, 64, 32, false).unwrap();
        let mut r = Rng::new(9);
        let mut gen = |n: usize| (0..n).map(|_| r.symmetric_f32()).collect::<Vec<_>>();
        let (q, k, v) = (gen(s.q_len()), gen(s.kv_len()), gen(s.kv_len()));
        let (want, tol) = reference(&s, &q, &k, &v, false);
        let f32_attention = |skip_last: bool| -> Vec<f32> {
            let mut out = Vec::new();
            for i in 0..3 {
                let keys = if skip_last { 63 } else { 64 };
                let sc: Vec<f32> = (0..keys)
                    .map(|j| {
                        (0..32).map(|d| q[i * 32 + d] * k[j * 32 + d]).sum::<f32>() / 32f32.sqrt()
                    })
                    .collect();
                let m = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let w: Vec<f32> = sc.iter().map(|x| (x - m).exp()).collect();
                let z: f32 = w.iter().sum();
                for d in 0..32 {
                    out.push((0..keys).map(|j| w[j] * v[j * 32 + d]).sum::<f32>() / z);
                }
            }
            out
        };
        assert!(compare(&f32_attention(false), &want, &tol, 32).is_ok());
        assert!(compare(&f32_attention(true), &want, &tol, 32).is_err());
    }
}
