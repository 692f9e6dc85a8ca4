//! What both GEMM families share: their kernel arguments, and [`GemmProblem`] — inputs on the
//! device plus a cuBLAS reference — which compiles, launches, verifies and times any config.
//!
//! Verification: the reference is cuBLAS `sgemm` on the same inputs (for bf16, on the f32
//! values of the bf16 inputs: a product of two bf16 is exact in f32, so the math is the same),
//! and the per-element tolerance is `c · ε_f32 · (2√K + 4) · (|A|·|B|)_ij`, the CPU kernels'
//! bound, with `|A|·|B|` also computed by cuBLAS; `c` = 2 for f32 (two summation orders, each
//! within the bound) and 4 for bf16 tensor cores.

use cudarc::cublas::{sys::cublasOperation_t, Gemm, GemmConfig};
use cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};

use crate::problem::Mismatch;
use crate::rng::Rng;
use crate::space::Config;

use super::bf16;
use super::compile::CompileError;
use super::gemm_bf16::GemmBf16;
use super::gemm_f32::GemmF32;
use super::gpu::{trial, Gpu, GpuCase, GpuOutcome, GpuTiming, Loaded};
use super::shape::GemmShape;
use super::template::Template;
use super::CudaError;

/// Run-time arguments of a GEMM launch, besides the pointers and `M, N, K`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmArgs {
    /// K extent of one split slice (a multiple of the block's `bk`).
    pub k_per_split: usize,
    /// Number of K slices; above 1, C is zeroed first and the slices add into it.
    pub split_k: usize,
    /// A's rows hold whole vector chunks (`K % vec == 0`).
    pub a_vec: bool,
    /// B's rows hold whole vector chunks (`N % vec == 0`).
    pub b_vec: bool,
    /// C's rows allow vector stores.
    pub c_vec: bool,
}

/// A GEMM template: the signature `(A, B, C, M, N, K, k_per_split, a_vec, b_vec, c_vec)`.
pub trait GemmTemplate: Template<Shape = GemmShape> {
    /// The run-time arguments for `config` on `shape`.
    fn gemm_args(&self, shape: &GemmShape, config: &Config) -> Result<GemmArgs, CompileError>;
}

/// Element type of the GEMM inputs (the output is f32 either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GemmDtype {
    /// f32 A and B.
    F32,
    /// bf16 A and B, multiplied on tensor cores (sm_80 and newer).
    Bf16,
}

/// Inputs for one GEMM shape on the device, the cuBLAS reference and its tolerance.
pub struct GemmProblem {
    /// The GEMM's `M × N × K`.
    pub shape: GemmShape,
    /// The element type of A and B.
    pub dtype: GemmDtype,
    a: CudaSlice<f32>,
    b: CudaSlice<f32>,
    a16: Option<CudaSlice<u16>>,
    b16: Option<CudaSlice<u16>>,
    c: CudaSlice<f32>,
    expected: Vec<f32>,
    tolerance: Vec<f32>,
}

impl GemmProblem {
    /// Random inputs in `[-1, 1)` from `seed` (rounded to bf16 for [`GemmDtype::Bf16`]),
    /// uploaded, and the cuBLAS reference computed.
    pub fn new(
        gpu: &Gpu,
        shape: GemmShape,
        dtype: GemmDtype,
        seed: u64,
    ) -> Result<Self, CudaError> {
        let GemmShape { m, n, k } = shape;
        let mut rng = Rng::new(seed);
        let mut gen = |len: usize| -> Vec<f32> {
            (0..len)
                .map(|_| match dtype {
                    GemmDtype::F32 => rng.symmetric_f32(),
                    GemmDtype::Bf16 => bf16::round(rng.symmetric_f32()),
                })
                .collect()
        };
        let (ha, hb) = (gen(m * k), gen(k * n));
        let s = gpu.stream();
        let up = |what: &'static str| CudaError::driver(format!("uploading {what}"));
        let a = s.clone_htod(&ha).map_err(up("A"))?;
        let b = s.clone_htod(&hb).map_err(up("B"))?;
        let (a16, b16) = match dtype {
            GemmDtype::F32 => (None, None),
            GemmDtype::Bf16 => {
                let to16 = |v: &[f32]| v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<u16>>();
                (
                    Some(s.clone_htod(&to16(&ha)).map_err(up("A (bf16)"))?),
                    Some(s.clone_htod(&to16(&hb)).map_err(up("B (bf16)"))?),
                )
            }
        };
        let c = s
            .alloc_zeros::<f32>(m * n)
            .map_err(CudaError::driver("allocating C"))?;

        // Reference and |A|·|B| from cuBLAS.
        let mut reference = s
            .alloc_zeros::<f32>(m * n)
            .map_err(CudaError::driver("allocating the reference"))?;
        sgemm(gpu, shape, &a, &b, &mut reference)?;
        let abs = |v: &[f32]| v.iter().map(|x| x.abs()).collect::<Vec<f32>>();
        let aa = s.clone_htod(&abs(&ha)).map_err(up("|A|"))?;
        let ab = s.clone_htod(&abs(&hb)).map_err(up("|B|"))?;
        let mut magnitude = s
            .alloc_zeros::<f32>(m * n)
            .map_err(CudaError::driver("allocating |A||B|"))?;
        sgemm(gpu, shape, &aa, &ab, &mut magnitude)?;
        let down = |what: &'static str| CudaError::driver(format!("downloading {what}"));
        let expected = s.clone_dtoh(&reference).map_err(down("the reference"))?;
        let magnitude = s.clone_dtoh(&magnitude).map_err(down("|A||B|"))?;
        let c_factor = match dtype {
            GemmDtype::F32 => 2.0,
            GemmDtype::Bf16 => 4.0,
        };
        let scale = c_factor * f32::EPSILON as f64 * (2.0 * (k as f64).sqrt() + 4.0);
        let tolerance = magnitude
            .iter()
            .map(|&t| (scale * t as f64) as f32 + f32::MIN_POSITIVE)
            .collect();
        Ok(GemmProblem {
            shape,
            dtype,
            a,
            b,
            a16,
            b16,
            c,
            expected,
            tolerance,
        })
    }

    /// Compiles, runs once, verifies against cuBLAS, then times `config`; failures (with the
    /// NVRTC log for a config that does not compile) come back as outcomes.
    pub fn evaluate(&mut self, gpu: &Gpu, config: &Config, timing: &GpuTiming) -> GpuOutcome {
        trial(gpu, self, config, timing)
    }

    /// Queues one call of a config loaded with [`Gpu::load`].
    pub fn launch(&mut self, gpu: &Gpu, loaded: &Loaded) -> Result<(), CudaError> {
        let args = match self.dtype {
            GemmDtype::F32 => GemmF32.gemm_args(&self.shape, &loaded.config)?,
            GemmDtype::Bf16 => GemmBf16.gemm_args(&self.shape, &loaded.config)?,
        };
        match (&self.a16, &self.b16) {
            (Some(a), Some(b)) => launch_gemm(gpu, loaded, self.shape, &args, a, b, &mut self.c),
            _ => launch_gemm(
                gpu,
                loaded,
                self.shape,
                &args,
                &self.a,
                &self.b,
                &mut self.c,
            ),
        }
    }

    /// The output of the last call.
    pub fn output(&self, gpu: &Gpu) -> Result<Vec<f32>, CudaError> {
        gpu.stream()
            .clone_dtoh(&self.c)
            .map_err(CudaError::driver("downloading C"))
    }

    /// Compares `got` with the cuBLAS reference.
    pub fn compare(&self, got: &[f32]) -> Result<(), Mismatch> {
        compare(got, &self.expected, &self.tolerance, self.shape.n)
    }

    fn compile(&self, gpu: &Gpu, config: &Config) -> Result<Loaded, CudaError> {
        match self.dtype {
            GemmDtype::F32 => gpu.load(&GemmF32, &self.shape, config),
            GemmDtype::Bf16 => gpu.load(&GemmBf16, &self.shape, config),
        }
    }
}

impl GpuCase for GemmProblem {
    fn prepare(&self, gpu: &Gpu, config: &Config) -> Result<Loaded, CudaError> {
        self.compile(gpu, config)
    }

    fn launch(&mut self, gpu: &Gpu, loaded: &Loaded) -> Result<(), CudaError> {
        GemmProblem::launch(self, gpu, loaded)
    }

    fn check(&self, gpu: &Gpu) -> Result<(), CudaError> {
        let got = self.output(gpu)?;
        self.compare(&got).map_err(CudaError::from)
    }
}

/// `c = a · b` (row-major, f32) with cuBLAS.
pub(crate) fn sgemm(
    gpu: &Gpu,
    shape: GemmShape,
    a: &CudaSlice<f32>,
    b: &CudaSlice<f32>,
    c: &mut CudaSlice<f32>,
) -> Result<(), CudaError> {
    let GemmShape { m, n, k } = shape;
    check_len("A", a.len(), m * k)?;
    check_len("B", b.len(), k * n)?;
    check_len("C", c.len(), m * n)?;
    let blas = gpu.blas()?;
    // Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ: cuBLAS sees B (ld N) times A (ld K).
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: n as i32,
        n: m as i32,
        k: k as i32,
        alpha: 1.0f32,
        lda: n as i32,
        ldb: k as i32,
        beta: 0.0f32,
        ldc: n as i32,
    };
    // SAFETY: the buffers hold exactly K·N, M·K and M·N floats (checked above), which is what
    // a column-major N×K times K×M product with these leading dimensions reads and writes.
    unsafe { blas.gemm(cfg, b, a, c) }.map_err(|e| CudaError::Cublas {
        context: "sgemm".into(),
        reason: e.to_string(),
    })
}

fn check_len(name: &'static str, got: usize, need: usize) -> Result<(), CudaError> {
    if got == need {
        Ok(())
    } else {
        Err(CudaError::BufferSize { name, got, need })
    }
}

/// Queues one GEMM launch (zeroing C first when K is split).
pub(crate) fn launch_gemm<T: DeviceRepr>(
    gpu: &Gpu,
    loaded: &Loaded,
    shape: GemmShape,
    args: &GemmArgs,
    a: &CudaSlice<T>,
    b: &CudaSlice<T>,
    c: &mut CudaSlice<f32>,
) -> Result<(), CudaError> {
    let GemmShape { m, n, k } = shape;
    check_len("A", a.len(), m * k)?;
    check_len("B", b.len(), k * n)?;
    check_len("C", c.len(), m * n)?;
    let s = gpu.stream();
    if args.split_k > 1 {
        s.memset_zeros(c)
            .map_err(CudaError::driver("zeroing C for split-K"))?;
    }
    let ints = [
        m as i32,
        n as i32,
        k as i32,
        args.k_per_split as i32,
        args.a_vec as i32,
        args.b_vec as i32,
        args.c_vec as i32,
    ];
    let mut launch = s.launch_builder(&loaded.function);
    launch.arg(a).arg(b).arg(&mut *c);
    for v in &ints {
        launch.arg(v);
    }
    // SAFETY: the arguments match the template's signature — (A, B, C, M, N, K, k_per_split,
    // a_vec, b_vec, c_vec): two input pointers of the template's element type, the f32 output,
    // seven ints. The buffers hold M·K, K·N and M·N elements (checked above) and the kernel
    // predicates every access on M, N, K and its K slice, so it stays inside them. The grid
    // and block come from the same config the source was rendered from (`Loaded::dims`).
    unsafe { launch.launch(loaded.launch_config()) }
        .map(|_| ())
        .map_err(CudaError::driver("launching a GEMM"))
}

/// Compares `got` with `expected ± tolerance`; NaN and infinities always fail.
pub(crate) fn compare(
    got: &[f32],
    expected: &[f32],
    tolerance: &[f32],
    cols: usize,
) -> Result<(), Mismatch> {
    let bad = |i: usize| {
        let g = got[i];
        !g.is_finite() || ((g - expected[i]).abs()) > tolerance[i]
    };
    let Some(index) = (0..got.len()).find(|&i| bad(i)) else {
        return Ok(());
    };
    Err(Mismatch {
        index,
        row: index / cols.max(1),
        col: index % cols.max(1),
        got: got[index],
        expected: expected[index] as f64,
        tolerance: tolerance[index] as f64,
        bad: (0..got.len()).filter(|&i| bad(i)).count(),
        total: got.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_finds_the_first_bad_element() {
        let e = [1.0, 2.0, 3.0, 4.0];
        let t = [0.1; 4];
        assert!(compare(&[1.05, 2.0, 3.0, 3.95], &e, &t, 2).is_ok());
        let m = compare(&[1.0, 2.0, 3.5, f32::NAN], &e, &t, 2).unwrap_err();
        assert_eq!((m.index, m.row, m.col, m.bad, m.total), (2, 1, 0, 2, 4));
    }
}
