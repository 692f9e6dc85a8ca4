//! Scaled dot-product attention (`attention:BxHxSxD[:causal]`) on the CPU.

use crate::error::{Error, Result};
use crate::hardware::HardwareFingerprint;
use crate::kernel::{Executable, Kernel};
use crate::space::{Config, Space};
use crate::workload::Workload;

/// The fused (online-softmax) family.
pub struct Fused;

/// The attention families, in priority order.
pub static FAMILIES: &[&dyn Kernel] = &[&Fused];

/// The fallback for an attention workload.
pub fn default_for(w: &Workload, hw: &HardwareFingerprint) -> (&'static dyn Kernel, Config) {
    (&Fused, Fused.default_config(w, hw))
}

impl Kernel for Fused {
    fn name(&self) -> &'static str {
        "attention_fused"
    }

    fn version(&self) -> u32 {
        0
    }

    fn supports(&self, w: &Workload) -> bool {
        matches!(w, Workload::Attention { .. })
    }

    fn space(&self, _: &Workload, _: &HardwareFingerprint) -> Space {
        Space::new().knob("par", ["none"])
    }

    fn default_config(&self, _: &Workload, _: &HardwareFingerprint) -> Config {
        Config::from_pairs([("par", "none")])
    }

    fn build(&self, w: &Workload, _: &Config) -> Result<Box<dyn Executable>> {
        let Workload::Attention { s, d, causal, .. } = *w else {
            return Err(Error::Unsupported {
                kernel: self.name().into(),
                workload: w.key(),
            });
        };
        Ok(Box::new(Naive {
            s,
            d,
            causal,
            len: w.output_len(),
        }))
    }
}

struct Naive {
    s: usize,
    d: usize,
    causal: bool,
    len: usize,
}

impl Executable for Naive {
    fn run(&self, inputs: &[&[f32]], out: &mut [f32]) {
        let (s, d) = (self.s, self.d);
        assert_eq!(inputs.len(), 3, "attention takes Q, K and V");
        assert!(
            inputs.iter().all(|x| x.len() == self.len),
            "Q, K, V must be B·H·S·D"
        );
        assert_eq!(out.len(), self.len, "O must be B·H·S·D");
        let (q, k, v) = (inputs[0], inputs[1], inputs[2]);
        let scale = 1.0 / (d as f32).sqrt();
        let mut sc = Vec::with_capacity(s);
        for (row, o) in out.chunks_exact_mut(d).enumerate() {
            let (head, i) = (row / s, row % s);
            let base = head * s * d;
            let keys = if self.causal { i + 1 } else { s };
            sc.clear();
            sc.extend((0..keys).map(|j| {
                (0..d)
                    .map(|c| q[base + i * d + c] * k[base + j * d + c])
                    .sum::<f32>()
                    * scale
            }));
            let m = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut l = 0.0;
            for x in sc.iter_mut() {
                *x = (*x - m).exp();
                l += *x;
            }
            o.fill(0.0);
            for (j, p) in sc.iter().enumerate() {
                for c in 0..d {
                    o[c] += p / l * v[base + j * d + c];
                }
            }
        }
    }
}
