//! Attention, fused GEMM epilogues, and constant weights packed once.
//!
//! ```
//! use kernels::Act;
//! use runtime::Runtime;
//!
//! let rt = Runtime::defaults_only();
//! // O = softmax(Q·Kᵀ/√D)·V over [B, H, S, D] tensors, causal.
//! let (b, h, s, d) = (1, 2, 5, 8);
//! let q = vec![0.1f32; b * h * s * d];
//! let mut o = vec![0.0f32; q.len()];
//! rt.attention(b, h, s, d, true, &q, &q, &q, &mut o)?;
//! assert!((o[0] - 0.1).abs() < 1e-6);
//!
//! // C = gelu(A·B + bias), with the weight B packed once and reused.
//! let (m, n, k) = (4, 3, 2);
//! let (a, w, bias) = (vec![1.0f32; m * k], vec![0.5f32; k * n], vec![0.0f32; n]);
//! let packed = rt.pack_weight(m, n, k, Act::Gelu, &w)?;
//! let mut c = vec![0.0f32; m * n];
//! rt.gemm_bias_act_packed(&packed, &a, &bias, &mut c)?;
//! assert!((c[0] - 0.8412).abs() < 1e-3); // gelu(1.0)
//! # Ok::<(), runtime::RuntimeError>(())
//! ```

use kernels::cpu::gemm::epilogue::{EpilogueGemm, EpiloguePacked};
use kernels::cpu::gemm::packed::PackedB;
use kernels::{Act, Config, Kernel, Workload};

use crate::{Level, Runtime, RuntimeError};

/// A constant weight (the `K×N` B operand of `gemm_bias_*`) packed once into the panel
/// layout of the variant that serves its workload: calls with it skip packing B.
pub struct PackedWeight {
    workload: Workload,
    config: Config,
    level: Level,
    gemm: EpilogueGemm,
    weight: PackedB,
}

impl std::fmt::Debug for PackedWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedWeight")
            .field("workload", &self.workload.key())
            .field("config", &self.config)
            .field("level", &self.level)
            .finish()
    }
}

impl PackedWeight {
    /// The `gemm_bias_*` workload it serves.
    pub fn workload(&self) -> Workload {
        self.workload
    }

    /// The `gemm_bias_act_packed` config it runs (with `b_layout = prepacked`).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Where that config came from: the tuned record's level, or `default`.
    pub fn level(&self) -> Level {
        self.level
    }
}

fn buffer(
    w: &Workload,
    name: &'static str,
    got: usize,
    expected: usize,
) -> Result<(), RuntimeError> {
    if got == expected {
        Ok(())
    } else {
        Err(RuntimeError::BufferSize {
            name,
            workload: w.key(),
            got,
            expected,
        })
    }
}

impl Runtime {
    /// Scaled dot-product attention, f32: `O = softmax(Q·Kᵀ/√d)·V` for each of the `b·h`
    /// heads of `[b, h, s, d]` tensors (row-major); with `causal`, query `i` sees keys
    /// `j ≤ i`. `o` is overwritten. Returns the level that answered.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        b: usize,
        h: usize,
        s: usize,
        d: usize,
        causal: bool,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        o: &mut [f32],
    ) -> Result<Level, RuntimeError> {
        let w = Workload::attention(b, h, s, d, causal)?;
        let len = w.output_len();
        buffer(&w, "q", q.len(), len)?;
        buffer(&w, "k", k.len(), len)?;
        buffer(&w, "v", v.len(), len)?;
        buffer(&w, "o", o.len(), len)?;
        self.run(&w, &[q, k, v], o)
    }

    /// `C = act(A·B + bias)`, f32 row-major (A `m×k`, B `k×n`, bias `n`, C `m×n`,
    /// overwritten); GELU in its tanh form. Returns the level that answered.
    ///
    /// B is packed during the call even when the tuned variant keeps it pre-packed, so `b`
    /// may change freely between calls; for a constant weight, [`Runtime::pack_weight`] once
    /// and [`Runtime::gemm_bias_act_packed`] skip that work.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_bias_act(
        &self,
        m: usize,
        n: usize,
        k: usize,
        act: Act,
        a: &[f32],
        b: &[f32],
        bias: &[f32],
        c: &mut [f32],
    ) -> Result<Level, RuntimeError> {
        let w = Workload::gemm_bias_act(m, n, k, act)?;
        buffer(&w, "a", a.len(), m * k)?;
        buffer(&w, "b", b.len(), k * n)?;
        buffer(&w, "bias", bias.len(), n)?;
        buffer(&w, "c", c.len(), m * n)?;
        let choice = self.lookup(&w)?;
        if choice.config.str("b_layout") == Some("prepacked") {
            // The same variant with B packed on this call: never relies on `b` staying put.
            let mut config = choice.config.clone();
            config.set("b_layout", "rowmajor");
            let gemm = EpilogueGemm::from_config(&w, &config)?;
            kernels::Executable::run(&gemm, &[a, b, bias], c);
            return Ok(choice.level);
        }
        self.run(&w, &[a, b, bias], c)
    }

    /// Packs the constant weight `b` (`k×n`, row-major) once for `act(A·B + bias)` calls of
    /// shape `m×n×k`, in the layout of the tuned `gemm_bias_act_packed` variant for that
    /// workload (the family default when the tuned one is another family or nothing is
    /// tuned). Use it with [`Runtime::gemm_bias_act_packed`].
    pub fn pack_weight(
        &self,
        m: usize,
        n: usize,
        k: usize,
        act: Act,
        b: &[f32],
    ) -> Result<PackedWeight, RuntimeError> {
        let w = Workload::gemm_bias_act(m, n, k, act)?;
        buffer(&w, "b", b.len(), k * n)?;
        let choice = self.lookup(&w)?;
        let (mut config, level) = if choice.kernel.name() == EpiloguePacked.name() {
            (choice.config.clone(), choice.level)
        } else {
            (
                EpiloguePacked.default_config(&w, self.fingerprint()),
                Level::Default,
            )
        };
        config.set("b_layout", "prepacked");
        let gemm = EpilogueGemm::from_config(&w, &config)?;
        let weight = gemm.pack_weight(b);
        Ok(PackedWeight {
            workload: w,
            config,
            level,
            gemm,
            weight,
        })
    }

    /// `C = act(A·B + bias)` with a weight packed by [`Runtime::pack_weight`] (A `m×k`,
    /// bias `n`, C `m×n` of its workload). Returns the level its config came from.
    pub fn gemm_bias_act_packed(
        &self,
        weight: &PackedWeight,
        a: &[f32],
        bias: &[f32],
        c: &mut [f32],
    ) -> Result<Level, RuntimeError> {
        let w = weight.workload;
        let (m, n, k) = w.gemm_dims().expect("a gemm_bias workload");
        buffer(&w, "a", a.len(), m * k)?;
        buffer(&w, "bias", bias.len(), n)?;
        buffer(&w, "c", c.len(), m * n)?;
        weight.gemm.run_prepacked(a, &weight.weight, bias, c);
        Ok(weight.level)
    }
}

#[cfg(test)]
mod tests {
    use kernels::Problem;

    use super::*;

    #[test]
    fn attention_and_epilogues_match_the_reference() {
        let rt = Runtime::defaults_only();
        for text in ["attention:2x3x17x32", "attention:1x1x40x80:causal"] {
            let w: Workload = text.parse().unwrap();
            let Workload::Attention { b, h, s, d, causal } = w else {
                unreachable!()
            };
            let p = Problem::random(&w, 2);
            let mut o = p.output();
            let (q, k, v) = (&p.inputs[0], &p.inputs[1], &p.inputs[2]);
            let level = rt.attention(b, h, s, d, causal, q, k, v, &mut o).unwrap();
            assert_eq!(level, Level::Default);
            p.check(&o, &p.reference()).unwrap();
        }
        for act in Act::ALL {
            let w = Workload::gemm_bias_act(20, 33, 17, act).unwrap();
            let p = Problem::random(&w, 3);
            let (a, b, bias) = (&p.inputs[0], &p.inputs[1], &p.inputs[2]);
            let mut c = p.output();
            rt.gemm_bias_act(20, 33, 17, act, a, b, bias, &mut c)
                .unwrap();
            p.check(&c, &p.reference()).unwrap();
            let packed = rt.pack_weight(20, 33, 17, act, b).unwrap();
            assert_eq!(packed.config().str("b_layout"), Some("prepacked"));
            assert_eq!(packed.workload(), w);
            for _ in 0..2 {
                let mut c = p.output();
                rt.gemm_bias_act_packed(&packed, a, bias, &mut c).unwrap();
                p.check(&c, &p.reference()).unwrap();
            }
        }
    }

    #[test]
    fn bad_sizes_and_shapes_are_errors_not_panics() {
        let rt = Runtime::defaults_only();
        let x = vec![0.0f32; 64];
        let mut o = vec![0.0f32; 64];
        let e = rt
            .attention(1, 1, 4, 16, false, &x, &x[..63], &x, &mut o)
            .unwrap_err();
        assert!(e.to_string().contains("'k' has 63 elements"), "{e}");
        assert!(rt
            .attention(1, 0, 4, 16, false, &x, &x, &x, &mut o)
            .is_err());
        let e = rt
            .gemm_bias_act(2, 3, 4, Act::Relu, &x[..8], &x[..12], &x[..2], &mut o[..6])
            .unwrap_err();
        assert!(e.to_string().contains("'bias' has 2 elements"), "{e}");
        assert!(rt.pack_weight(2, 3, 4, Act::Gelu, &x[..11]).is_err());
        let packed = rt.pack_weight(2, 3, 4, Act::Gelu, &x[..12]).unwrap();
        let e = rt
            .gemm_bias_act_packed(&packed, &x[..8], &x[..3], &mut o[..5])
            .unwrap_err();
        assert!(e.to_string().contains("'c' has 5 elements"), "{e}");
    }
}
