//! Fused GEMM epilogues: `C = act(A·B + bias)` (`gemm_bias_relu`, `gemm_bias_gelu`).

use super::{gemm_dims, unsupported, Packed};
use crate::error::Result;
use crate::hardware::HardwareFingerprint;
use crate::kernel::{Executable, Kernel};
use crate::space::{Config, Space};
use crate::workload::{Act, Workload};

/// The packed GEMM with a bias + activation epilogue.
pub struct EpiloguePacked;

/// The epilogue families, in priority order.
pub static FAMILIES: &[&dyn Kernel] = &[&EpiloguePacked];

/// The fallback for a `gemm_bias_*` workload.
pub fn default_for(w: &Workload, hw: &HardwareFingerprint) -> (&'static dyn Kernel, Config) {
    (&EpiloguePacked, EpiloguePacked.default_config(w, hw))
}

impl Kernel for EpiloguePacked {
    fn name(&self) -> &'static str {
        "gemm_bias_act_packed"
    }

    fn version(&self) -> u32 {
        1
    }

    fn supports(&self, w: &Workload) -> bool {
        matches!(w, Workload::GemmBiasAct { .. })
    }

    fn space(&self, w: &Workload, hw: &HardwareFingerprint) -> Space {
        let (m, n, k) = gemm_dims(w);
        Packed.space(&Workload::Gemm { m, n, k }, hw)
    }

    fn default_config(&self, w: &Workload, hw: &HardwareFingerprint) -> Config {
        let (m, n, k) = gemm_dims(w);
        Packed.default_config(&Workload::Gemm { m, n, k }, hw)
    }

    fn build(&self, w: &Workload, c: &Config) -> Result<Box<dyn Executable>> {
        let Workload::GemmBiasAct { m, n, k, act } = *w else {
            return Err(unsupported(self.name(), w));
        };
        let gemm = Packed.build(&Workload::Gemm { m, n, k }, c)?;
        Ok(Box::new(SeparatePass { gemm, n, act }))
    }
}

struct SeparatePass {
    gemm: Box<dyn Executable>,
    n: usize,
    act: Act,
}

impl Executable for SeparatePass {
    fn run(&self, inputs: &[&[f32]], out: &mut [f32]) {
        assert_eq!(inputs.len(), 3, "gemm_bias_act takes A, B and bias");
        assert_eq!(
            inputs[2].len(),
            self.n,
            "bias must have N = {} values",
            self.n
        );
        self.gemm.run(&inputs[..2], out);
        for row in out.chunks_exact_mut(self.n) {
            for (x, b) in row.iter_mut().zip(inputs[2]) {
                let z = *x + b;
                *x = match self.act {
                    Act::Relu => z.max(0.0),
                    Act::Gelu => {
                        0.5 * z * (1.0 + (0.797_884_6 * (z + 0.044715 * z * z * z)).tanh())
                    }
                };
            }
        }
    }
}
