//! int8 GEMM (`gemm:MxNxK:i8`): dynamic quantisation, exact `u8 × s8 → i32` products, f32
//! output — the `gemm_i8` family.
//!
//! ```
//! use kernels::{default_for, HardwareFingerprint, Problem, Workload};
//!
//! let w: Workload = "gemm:33x70x65:i8".parse()?;
//! let (kernel, config) = default_for(&w, HardwareFingerprint::current())?;
//! assert_eq!(kernel.name(), "gemm_i8");
//! let exe = kernel.prepare(&w, &config)?;
//! let p = Problem::random(&w, 3);
//! let mut c = p.output();
//! exe.run_f32(&p.input_slices(), &mut c)?;  // A, B in f32; C in f32
//! p.check(&c, &p.reference())?;             // within the quantisation bound of Problem
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Inputs and output are f32, as for the f32 GEMM: A (activations) is quantised per row on
//! every call ([`quant::quantize_rows`], `u8` asymmetric or `s8` symmetric: the `a_quant`
//! knob), B (weights) per output column, symmetric s8 ([`quant::QuantB`]); the integer
//! product is exact in i32 ([`ukernel`]: AVX512_VNNI, AVX2, portable); the store dequantises
//! with the zero-point correction. Knobs: `ukernel` (tile shape and ISA), `a_quant`, `par`
//! (`none`, or `m`: row blocks on `threads` tasks) and `threads`.

pub mod quant;
pub mod ukernel;

use std::cell::RefCell;

use crate::cpu::gemm::ukernel::{bias_act_row, TileEpilogue};
use crate::cpu::knobs::{
    int_knob, invalid, par_threads_listed, serial_iff_one_thread, str_knob, str_listed,
    thread_values, unsupported,
};
use crate::cpu::weights::WeightCache;
use crate::cpu::Isa;
use crate::dtype::DType;
use crate::error::Result;
use crate::hardware::HardwareFingerprint;
use crate::kernel::{Executable, Kernel};
use crate::operand::{host_f32, Operand, OperandMut};
use crate::space::{Config, Space};
use crate::workload::{Act, Workload};

use quant::{quantize_rows, AQuant, QuantA, QuantB};
use ukernel::{DotKernel, KERNELS};

/// The int8 GEMM family.
pub struct GemmI8;

const NAME: &str = "gemm_i8";

/// Values of the `par` knob.
const PAR_VALUES: &[&str] = &["none", "m"];

/// Below this many multiply-adds the default stays single-threaded.
const PARALLEL_MIN_MACS: f64 = 256.0 * 256.0 * 256.0;

/// The micro-kernels offered on `hw`: those of its ISA level (AVX2 ones on AVX-512 too), the
/// VNNI ones only where its flags have `avx512vnni`.
fn offered(hw: &HardwareFingerprint) -> Vec<&'static DotKernel> {
    let best = Isa::of(hw);
    let vnni = hw.isa.iter().any(|f| f == "avx512vnni");
    KERNELS
        .iter()
        .filter(|k| k.isa.offered_under(best) && (!k.vnni || vnni))
        .collect()
}

fn dims(w: &Workload) -> (usize, usize, usize) {
    w.gemm_dims().unwrap_or((1, 1, 1))
}

impl Kernel for GemmI8 {
    fn name(&self) -> &'static str {
        NAME
    }

    fn version(&self) -> u32 {
        1
    }

    fn dtypes(&self) -> &'static [DType] {
        &[DType::I8]
    }

    fn supports(&self, w: &Workload) -> bool {
        matches!(w, Workload::Gemm { .. } | Workload::GemmBiasAct { .. }) && w.dtype() == DType::I8
    }

    fn space(&self, _w: &Workload, hw: &HardwareFingerprint) -> Space {
        let ukernels: Vec<&str> = offered(hw).iter().map(|k| k.name).collect();
        let par: &[&str] = if hw.cores > 1 { PAR_VALUES } else { &["none"] };
        Space::new()
            .knob("ukernel", ukernels)
            .knob("a_quant", AQuant::ALL.map(AQuant::name))
            .knob("par", par.to_vec())
            .knob("threads", thread_values(hw))
            .rule("serial iff one thread", serial_iff_one_thread)
    }

    fn config_fits(&self, _w: &Workload, hw: &HardwareFingerprint, c: &Config) -> bool {
        let ukernels: Vec<&str> = offered(hw).iter().map(|k| k.name).collect();
        c.0.len() == 4
            && str_listed(c, "ukernel", &ukernels)
            && str_listed(c, "a_quant", &AQuant::ALL.map(AQuant::name))
            && par_threads_listed(c, hw, PAR_VALUES)
            && serial_iff_one_thread(c)
    }

    fn default_config(&self, w: &Workload, hw: &HardwareFingerprint) -> Config {
        let (m, n, k) = dims(w);
        let uk = offered(hw)
            .first()
            .copied()
            .unwrap_or(&KERNELS[KERNELS.len() - 1]);
        let parallel = hw.cores > 1 && m >= 2 * uk.mr && (m * n * k) as f64 >= PARALLEL_MIN_MACS;
        let threads = if parallel { hw.cores } else { 1 };
        let mut c = Config::default();
        c.set("ukernel", uk.name);
        c.set("a_quant", AQuant::U8.name());
        c.set("par", if parallel { "m" } else { "none" });
        c.set("threads", threads);
        c
    }

    fn build(&self, w: &Workload, c: &Config) -> Result<Box<dyn Executable>> {
        if !self.supports(w) {
            return Err(unsupported(NAME, w));
        }
        let (m, n, k) = dims(w);
        let name = str_knob(NAME, c, "ukernel")?;
        let uk = ukernel::DotKernel::by_name(name)
            .ok_or_else(|| invalid(NAME, c, format!("ukernel '{name}' does not run here")))?;
        let a_quant = match str_knob(NAME, c, "a_quant")? {
            "u8" => AQuant::U8,
            "s8" => AQuant::S8,
            other => return Err(invalid(NAME, c, format!("unknown a_quant '{other}'"))),
        };
        let threads = match str_knob(NAME, c, "par")? {
            "none" => 1,
            "m" => int_knob(NAME, c, "threads")?.max(1),
            other => return Err(invalid(NAME, c, format!("unknown par '{other}'"))),
        };
        let act = match w {
            Workload::GemmBiasAct { act, .. } => Some(*act),
            _ => None,
        };
        Ok(Box::new(QGemm {
            w: *w,
            m,
            n,
            k,
            act,
            uk,
            a_quant,
            threads,
            weights: WeightCache::default(),
        }))
    }
}

/// A built int8 GEMM.
struct QGemm {
    w: Workload,
    m: usize,
    n: usize,
    k: usize,
    /// The epilogue's activation, after the bias (`gemm_bias_*`); `None` for plain GEMM.
    act: Option<Act>,
    uk: &'static DotKernel,
    a_quant: AQuant,
    threads: usize,
    /// B quantised and packed once per weight buffer.
    weights: WeightCache<QuantB>,
}

thread_local! {
    /// Quantised activations, reused across calls on this thread.
    static QA: RefCell<QuantA> = RefCell::new(QuantA::default());
}

impl Executable for QGemm {
    fn run(&self, inputs: &[Operand<'_>], out: OperandMut<'_>) -> Result<()> {
        let (a, b, bias, c) = match self.act {
            None => {
                let ([a, b], c) = host_f32(&self.w, inputs, out)?;
                (a, b, None, c)
            }
            Some(act) => {
                let ([a, b, bias], c) = host_f32(&self.w, inputs, out)?;
                (a, b, Some(TileEpilogue { bias, act }), c)
            }
        };
        let qb = self
            .weights
            .get(b, || QuantB::new(b, self.k, self.n, self.uk.nr));
        QA.with_borrow_mut(|qa| {
            quantize_rows(a, self.k, self.a_quant, self.uk.max_code, qa);
            self.compute(qa, &qb, bias, c);
        });
        Ok(())
    }
}

impl QGemm {
    /// `c = ep(dequant(qa · qb))`, row blocks split over `threads` tasks.
    fn compute(&self, qa: &QuantA, qb: &QuantB, ep: Option<TileEpilogue<'_>>, c: &mut [f32]) {
        let (m, n, mr) = (self.m, self.n, self.uk.mr);
        let tiles = m.div_ceil(mr);
        let per_task = tiles.div_ceil(self.threads).max(1) * mr;
        if self.threads <= 1 || per_task >= m {
            return self.rows(qa, qb, ep, 0, c);
        }
        use rayon::prelude::*;
        c.par_chunks_mut(per_task * n)
            .enumerate()
            .for_each(|(t, block)| self.rows(qa, qb, ep, t * per_task, block));
    }

    /// Rows `i0 ..` of C (as many as `c` holds): every column panel, then every row tile.
    fn rows(
        &self,
        qa: &QuantA,
        qb: &QuantB,
        ep: Option<TileEpilogue<'_>>,
        i0: usize,
        c: &mut [f32],
    ) {
        let (n, kp, mr, nr) = (self.n, qa.kp, self.uk.mr, self.uk.nr);
        let rows = c.len() / n;
        let mut acc = vec![0i32; mr * nr];
        let mut edge = vec![0u8; mr * kp];
        for panel in 0..n.div_ceil(nr) {
            let (j0, cols) = (panel * nr, nr.min(n - panel * nr));
            let b = qb.panel(panel);
            for r0 in (0..rows).step_by(mr) {
                let (i, live) = (i0 + r0, mr.min(rows - r0));
                let a = &qa.codes[i * kp..];
                let a = if live == mr {
                    a
                } else {
                    edge.fill(0);
                    edge[..live * kp].copy_from_slice(&a[..live * kp]);
                    &edge[..]
                };
                self.uk.tile(kp, a, kp, b, &mut acc);
                for t in 0..live {
                    let (sa, za) = (qa.scale[i + t], qa.zero[i + t]);
                    let row = &mut c[(r0 + t) * n + j0..(r0 + t) * n + j0 + cols];
                    let acc = &acc[t * nr..t * nr + cols];
                    for (j, (x, &s)) in row.iter_mut().zip(acc).enumerate() {
                        let q = s - za * qb.colsum[j0 + j];
                        *x = sa * qb.scale[j0 + j] * q as f32;
                    }
                    if let Some(e) = &ep {
                        bias_act_row(row, &e.bias[j0..j0 + cols], e.act);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::Problem;

    #[test]
    fn every_offered_config_matches_the_reference_on_awkward_shapes() {
        let hw = HardwareFingerprint::current();
        for text in [
            "gemm:1x1x1:i8",
            "gemm:1x67x65:i8",
            "gemm:5x7x9:i8",
            "gemm:63x65x67:i8",
            "gemm:17x3x130:i8",
            "gemm:128x96x768:i8",
            "gemm_bias_gelu:13x67x65:i8",
            "gemm_bias_relu:9x33x7:i8",
            "gemm_bias:65x50x31:i8",
        ] {
            let w: Workload = text.parse().unwrap();
            let space = GemmI8.space(&w, hw);
            assert!(GemmI8.config_fits(&w, hw, &GemmI8.default_config(&w, hw)));
            let p = Problem::random(&w, 5);
            let r = p.reference();
            for c in space.iter_valid() {
                assert!(GemmI8.config_fits(&w, hw, &c));
                let exe = GemmI8.prepare(&w, &c).unwrap();
                let mut out = vec![f32::NAN; w.output_len()];
                exe.run_f32(&p.input_slices(), &mut out).unwrap();
                p.check(&out, &r).unwrap_or_else(|e| panic!("{w} {c}: {e}"));
                assert_eq!(
                    out,
                    integer_reference(&p, &c),
                    "{w} {c}: not the exact integer product"
                );
            }
        }
    }

    /// The output computed from the exact integer product of the operands quantised as `c`
    /// quantises them (i64 sums, no SIMD), then the same bias + activation: the kernels' i32
    /// products must equal it exactly, so the outputs agree to the bit.
    fn integer_reference(p: &Problem, c: &Config) -> Vec<f32> {
        let (m, n, k) = p.workload.gemm_dims().unwrap();
        let uk = DotKernel::by_name(c.str("ukernel").unwrap()).unwrap();
        let scheme = if c.str("a_quant") == Some("s8") {
            AQuant::S8
        } else {
            AQuant::U8
        };
        let mut qa = QuantA::default();
        quantize_rows(&p.inputs[0], k, scheme, uk.max_code, &mut qa);
        let qb = QuantB::new(&p.inputs[1], k, n, uk.nr);
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let dot: i64 = (0..k)
                    .map(|l| qa.codes[i * qa.kp + l] as i64 * qb.code(l, j) as i64)
                    .sum();
                let q = dot - qa.zero[i] as i64 * qb.colsum[j] as i64;
                out[i * n + j] = qa.scale[i] * qb.scale[j] * q as i32 as f32;
            }
            if let Workload::GemmBiasAct { act, .. } = p.workload {
                bias_act_row(&mut out[i * n..(i + 1) * n], &p.inputs[2], act);
            }
        }
        out
    }
}
