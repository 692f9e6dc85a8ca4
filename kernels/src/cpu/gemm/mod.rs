//! PLACEHOLDER — being replaced by the real BLIS-style packed and direct GEMM families.
//! Interface contract (kept by the real implementation): `FAMILIES`, `default_for`,
//! kernel names `gemm_packed` and `gemm_direct`.

use crate::error::Result;
use crate::hardware::HardwareFingerprint;
use crate::kernel::{Executable, Kernel};
use crate::space::{Config, Space};
use crate::workload::Workload;

pub struct Packed;
pub struct Direct;

pub static FAMILIES: &[&dyn Kernel] = &[&Packed, &Direct];

pub fn default_for(w: &Workload, hw: &HardwareFingerprint) -> (&'static dyn Kernel, Config) {
    (&Packed, Packed.default_config(w, hw))
}

struct Naive(usize, usize, usize);
impl Executable for Naive {
    fn run(&self, inputs: &[&[f32]], c: &mut [f32]) {
        let (m, n, k) = (self.0, self.1, self.2);
        let (a, b) = (inputs[0], inputs[1]);
        c.fill(0.0);
        for i in 0..m {
            for p in 0..k {
                let x = a[i * k + p];
                for j in 0..n {
                    c[i * n + j] += x * b[p * n + j];
                }
            }
        }
    }
}

macro_rules! placeholder {
    ($t:ty, $name:expr) => {
        impl Kernel for $t {
            fn name(&self) -> &'static str {
                $name
            }
            fn version(&self) -> u32 {
                0
            }
            fn supports(&self, _w: &Workload) -> bool {
                true
            }
            fn space(&self, _w: &Workload, _hw: &HardwareFingerprint) -> Space {
                Space::new()
                    .knob("kc", [64usize, 128, 256])
                    .knob("par", ["none"])
            }
            fn default_config(&self, _w: &Workload, _hw: &HardwareFingerprint) -> Config {
                Config::from_pairs([("kc", crate::Value::from(128usize)), ("par", "none".into())])
            }
            fn build(&self, w: &Workload, _c: &Config) -> Result<Box<dyn Executable>> {
                let Workload::Gemm { m, n, k } = *w;
                Ok(Box::new(Naive(m, n, k)))
            }
        }
    };
}
placeholder!(Packed, "gemm_packed");
placeholder!(Direct, "gemm_direct");
