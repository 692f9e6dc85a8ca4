//! Fused GEMM epilogues: `C = act(A·B + bias)` (`gemm_bias` with no activation,
//! `gemm_bias_relu`, `gemm_bias_gelu`, `gemm_bias_gelu_erf`).
//!
//! Two families, both built on the GEMM drivers of this module:
//!
//! - `gemm_bias_act_packed`: the packed GEMM's knobs, plus
//!   - `fusion` = `fused` (bias + activation applied by the micro-kernel while the C tile is
//!     in registers, on the last depth block) or `separate` (the GEMM, then one vectorised
//!     pass over C);
//!   - `b_layout` = `rowmajor` (B packed block by block on every call, as plain GEMM does) or
//!     `prepacked` (B packed once into the micro-kernel's panel layout and reused — what an
//!     inference runtime does with a constant weight).
//! - `gemm_bias_act_direct`: the direct (unpacked, small-M) GEMM's knobs plus `fusion`.
//!
//! ```
//! use kernels::{default_for, HardwareFingerprint, Problem, Workload};
//!
//! let w: Workload = "gemm_bias_gelu:20x33x17".parse()?;
//! let (kernel, config) = default_for(&w, HardwareFingerprint::current())?;
//! let exe = kernel.prepare(&w, &config)?;
//! let p = Problem::random(&w, 1);
//! let mut c = p.output();
//! exe.run_f32(&p.input_slices(), &mut c)?; // inputs: A (M×K), B (K×N), bias (N)
//! p.check(&c, &p.reference())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! **The `prepacked` contract.** Through the generic [`Executable::run`], a `prepacked`
//! variant treats B as a constant weight: it packs B on the first call and reuses the packed
//! copy while later calls pass the same buffer (same address and length, and equal values at
//! 64 sampled positions, which catches a different weight that happens to reuse the
//! allocation). Writing new values into the same buffer between calls is outside that
//! contract; code that updates weights in place packs them explicitly with
//! [`EpilogueGemm::pack_weight`] and calls [`EpilogueGemm::run_prepacked`], which is what
//! the runtime's weight API does. The tuner times `prepacked` candidates through `run`, so it
//! measures the GEMM with an already packed weight: packing happens once, at the first
//! (verification) call.

use super::direct::DirectGemm;
use super::packed::{BSource, PackedB, PackedGemm};
use super::params::{knob, BLayout, Fusion, UkernelId};
use super::ukernel::{bias_act_row, TileEpilogue};
use super::{gemm_dims, Direct, Packed, DIRECT_DEFAULT_MAX_M};
use crate::cpu::knobs::{invalid, str_listed, unsupported};
use crate::cpu::weights::WeightCache;
use crate::dtype::DType;
use crate::error::Result;
use crate::hardware::HardwareFingerprint;
use crate::kernel::{Executable, Kernel};
use crate::operand::{host_f32, host_f32_prepared, Operand, OperandMut};
use crate::space::{Config, Space};
use crate::workload::{Act, Workload};

/// The packed GEMM with a bias + activation epilogue (fusion and weight-layout knobs).
pub struct EpiloguePacked;

/// The direct (small-M) GEMM with a bias + activation epilogue (fusion knob).
pub struct EpilogueDirect;

/// The epilogue families, in priority order.
pub static FAMILIES: &[&dyn Kernel] = &[&EpiloguePacked, &EpilogueDirect];

/// Values of the `fusion` knob.
pub const FUSION_VALUES: &[&str] = &[Fusion::Fused.name(), Fusion::Separate.name()];

/// Values of the `b_layout` knob.
pub const B_LAYOUT_VALUES: &[&str] = &[
    BLayout::RowMajor.name(),
    BLayout::Prepacked.name(),
    BLayout::InPlace.name(),
];

/// The fallback for a `gemm_bias_*` workload: like plain GEMM (direct for small M, packed
/// otherwise), with the epilogue fused and B read row-major, packed during the call or in
/// place as plain GEMM's default says (valid for every shape, and safe for weights that
/// change between calls).
pub fn default_family(w: &Workload) -> &'static dyn Kernel {
    let (m, _, _) = gemm_dims(w);
    if m <= DIRECT_DEFAULT_MAX_M {
        &EpilogueDirect
    } else {
        &EpiloguePacked
    }
}

/// The plain GEMM workload inside `w`.
fn inner(w: &Workload) -> Workload {
    let (m, n, k) = gemm_dims(w);
    Workload::Gemm {
        m,
        n,
        k,
        dtype: w.dtype(),
    }
}

/// The GEMM part of `c`: every knob but `fusion`, with a pre-packed B (which this family
/// keeps, outside the GEMM) packed by the GEMM on a call without it.
fn gemm_config(c: &Config) -> Config {
    let mut g = c.clone();
    g.0.remove(knob::FUSION);
    if BLayout::of(c) == Some(BLayout::Prepacked) {
        BLayout::RowMajor.set_in(&mut g);
    }
    g
}

fn fused(kernel: &str, c: &Config) -> Result<bool> {
    let fusion = Fusion::try_from(c).map_err(|reason| invalid(kernel, c, reason))?;
    Ok(fusion == Fusion::Fused)
}

impl Kernel for EpiloguePacked {
    fn name(&self) -> &'static str {
        "gemm_bias_act_packed"
    }

    /// 3: the packed GEMM's `a_layout` knob; 4: with a pre-packed B, the next B panel is
    /// prefetched while the row tiles of the current one run.
    fn version(&self) -> u32 {
        4
    }

    fn supports(&self, w: &Workload) -> bool {
        matches!(w, Workload::GemmBiasAct { .. }) && w.dtype() == DType::F32
    }

    fn config_fits(&self, w: &Workload, hw: &HardwareFingerprint, c: &Config) -> bool {
        c.0.len() == 9
            && str_listed(c, knob::FUSION, FUSION_VALUES)
            && str_listed(c, knob::B_LAYOUT, B_LAYOUT_VALUES)
            && super::packed_knobs_fit(&inner(w), hw, c)
    }

    fn space(&self, w: &Workload, hw: &HardwareFingerprint) -> Space {
        super::packed_space(&inner(w), hw, B_LAYOUT_VALUES)
            .knob(knob::FUSION, FUSION_VALUES.iter().copied())
    }

    fn default_config(&self, w: &Workload, hw: &HardwareFingerprint) -> Config {
        let mut c = Packed.default_config(&inner(w), hw);
        Fusion::Fused.set_in(&mut c);
        c
    }

    fn build(&self, w: &Workload, c: &Config) -> Result<Box<dyn Executable>> {
        Ok(Box::new(EpilogueGemm::from_config(w, c)?))
    }
}

impl Kernel for EpilogueDirect {
    fn name(&self) -> &'static str {
        "gemm_bias_act_direct"
    }

    fn version(&self) -> u32 {
        1
    }

    fn supports(&self, w: &Workload) -> bool {
        matches!(w, Workload::GemmBiasAct { .. })
            && w.dtype() == DType::F32
            && Direct.supports(&inner(w))
    }

    fn config_fits(&self, w: &Workload, hw: &HardwareFingerprint, c: &Config) -> bool {
        c.0.len() == 5
            && str_listed(c, knob::FUSION, FUSION_VALUES)
            && super::direct_knobs_fit(&inner(w), hw, c)
    }

    fn space(&self, w: &Workload, hw: &HardwareFingerprint) -> Space {
        Direct
            .space(&inner(w), hw)
            .knob(knob::FUSION, FUSION_VALUES.iter().copied())
    }

    fn default_config(&self, w: &Workload, hw: &HardwareFingerprint) -> Config {
        let mut c = Direct.default_config(&inner(w), hw);
        Fusion::Fused.set_in(&mut c);
        c
    }

    fn build(&self, w: &Workload, c: &Config) -> Result<Box<dyn Executable>> {
        let name = self.name();
        let Workload::GemmBiasAct { m, n, k, act, .. } = *w else {
            return Err(unsupported(name, w));
        };
        let fused = fused(name, c)?;
        let gemm = Direct.build_direct(
            &Workload::Gemm {
                m,
                n,
                k,
                dtype: DType::F32,
            },
            &gemm_config(c),
        )?;
        Ok(Box::new(DirectEpilogue {
            gemm,
            n,
            act,
            fused,
        }))
    }
}

impl EpiloguePacked {
    /// The default config for `w` re-blocked to read a weight already packed for micro-kernel
    /// `ukernel` and depth block `kc`, with `b_layout = prepacked`: how a runtime serves
    /// another M from the packed copy it holds ([`EpilogueGemm::ukernel`] and
    /// [`EpilogueGemm::weight_layout`] of the variant that packed it).
    pub fn prepacked_config(
        &self,
        w: &Workload,
        hw: &HardwareFingerprint,
        ukernel: UkernelId,
        kc: usize,
    ) -> Config {
        let mut c = self.default_config(w, hw);
        ukernel.set_in(&mut c);
        c.set(knob::KC, kc);
        BLayout::Prepacked.set_in(&mut c);
        c
    }
}

/// A prepared `act(A·B + bias)` over the packed GEMM (the `gemm_bias_act_packed` family).
pub struct EpilogueGemm {
    gemm: PackedGemm,
    n: usize,
    k: usize,
    act: Act,
    fused: bool,
    /// `Some` for `b_layout = prepacked`: the weight packed at the first call.
    cache: Option<WeightCache<PackedB>>,
}

impl std::fmt::Debug for EpilogueGemm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpilogueGemm")
            .field("m", &self.gemm.m)
            .field("n", &self.n)
            .field("k", &self.k)
            .field("act", &self.act)
            .field("fused", &self.fused)
            .field("prepacked", &self.cache.is_some())
            .finish()
    }
}

impl EpilogueGemm {
    /// Builds the `gemm_bias_act_packed` variant `c` for `w` (without checking `c` against
    /// the space: see [`Kernel::prepare`]).
    pub fn from_config(w: &Workload, c: &Config) -> Result<EpilogueGemm> {
        let name = EpiloguePacked.name();
        let Workload::GemmBiasAct { m, n, k, act, .. } = *w else {
            return Err(unsupported(name, w));
        };
        let fused = fused(name, c)?;
        let b_layout = BLayout::try_from(c).map_err(|reason| invalid(name, c, reason))?;
        let gemm = Packed.build_packed(
            &Workload::Gemm {
                m,
                n,
                k,
                dtype: DType::F32,
            },
            &gemm_config(c),
        )?;
        Ok(EpilogueGemm {
            gemm,
            n,
            k,
            act,
            fused,
            cache: (b_layout == BLayout::Prepacked).then(WeightCache::default),
        })
    }

    /// Whether this variant keeps B pre-packed (`b_layout = prepacked`).
    pub fn prepacked(&self) -> bool {
        self.cache.is_some()
    }

    /// Its micro-kernel: with [`EpilogueGemm::weight_layout`]'s KC, what fixes the panel
    /// layout (see [`EpiloguePacked::prepacked_config`]).
    pub fn ukernel(&self) -> UkernelId {
        self.gemm.uk.id()
    }

    /// `(NR, KC)`: the panel layout [`EpilogueGemm::pack_weight`] produces. Two variants of
    /// the same `K×N` with equal layouts can share one packed weight, whatever their M,
    /// `mc`, `nc` or parallelisation.
    pub fn weight_layout(&self) -> (usize, usize) {
        (self.gemm.uk.nr, self.gemm.kc)
    }

    /// Packs a `K×N` weight once into this variant's panel layout, for
    /// [`EpilogueGemm::run_prepacked`] ([`crate::Error::OutOfMemory`] when it does not fit).
    /// Panics if `b` is not `K×N`.
    pub fn pack_weight(&self, b: &[f32]) -> crate::Result<PackedB> {
        self.gemm.pack_b(b)
    }

    /// `C = act(A·B + bias)` with a weight packed by [`EpilogueGemm::pack_weight`] of a
    /// variant with the same blocking. Panics on wrong buffer sizes.
    pub fn run_prepacked(&self, a: &[f32], b: &PackedB, bias: &[f32], c: &mut [f32]) {
        self.compute(a, BSource::Packed(b), bias, c);
    }

    fn compute(&self, a: &[f32], b: BSource<'_>, bias: &[f32], c: &mut [f32]) {
        assert_eq!(bias.len(), self.n, "bias must have N = {} values", self.n);
        let ep = TileEpilogue {
            bias,
            act: self.act,
        };
        if self.fused {
            self.gemm.run_with(a, b, c, Some(ep));
        } else {
            self.gemm.run_with(a, b, c, None);
            separate_pass(c, bias, self.act);
        }
    }
}

/// The separate-pass epilogue: `act(c + bias)` row by row, vectorised.
fn separate_pass(c: &mut [f32], bias: &[f32], act: Act) {
    for row in c.chunks_exact_mut(bias.len()) {
        bias_act_row(row, bias, act);
    }
}

impl Executable for EpilogueGemm {
    fn run(&self, inputs: &[Operand<'_>], out: OperandMut<'_>) -> crate::Result<()> {
        let w = workload(self.gemm.m, self.n, self.k, self.act);
        let ([a, b, bias], out) = host_f32(&w, inputs, out)?;
        match &self.cache {
            Some(cache) => {
                let packed = cache.get(b, || self.gemm.pack_b(b))?;
                self.compute(a, BSource::Packed(&packed), bias, out);
            }
            None => self.compute(a, BSource::RowMajor(b), bias, out),
        }
        Ok(())
    }
}

/// A GEMM call's host operands: A, B, the epilogue (if the workload has a bias) and C.
type GemmOperands<'a, 'o> = (
    &'a [f32],
    &'a [f32],
    Option<TileEpilogue<'a>>,
    &'o mut [f32],
);

/// The host f32 operands of a call to a GEMM family that serves both `gemm` (`act` none) and
/// `gemm_bias_<act>`: A, B, the epilogue (the bias input with `act`) and C, checked against `w`.
pub(crate) fn gemm_operands<'a, 'o>(
    w: &Workload,
    act: Option<Act>,
    inputs: &[Operand<'a>],
    out: OperandMut<'o>,
) -> crate::Result<GemmOperands<'a, 'o>> {
    Ok(match act {
        None => {
            let ([a, b], c) = host_f32(w, inputs, out)?;
            (a, b, None, c)
        }
        Some(act) => {
            let ([a, b, bias], c) = host_f32(w, inputs, out)?;
            (a, b, Some(TileEpilogue { bias, act }), c)
        }
    })
}

/// [`gemm_operands`] for a call with a prepared B: A, the epilogue and C.
pub(crate) fn gemm_operands_prepared<'a, 'o>(
    w: &Workload,
    act: Option<Act>,
    inputs: &[&'a [f32]],
    out: &'o mut [f32],
) -> crate::Result<(&'a [f32], Option<TileEpilogue<'a>>, &'o mut [f32])> {
    Ok(match act {
        None => {
            let ([a], c) = host_f32_prepared(w, inputs, out)?;
            (a, None, c)
        }
        Some(act) => {
            let ([a, bias], c) = host_f32_prepared(w, inputs, out)?;
            (a, Some(TileEpilogue { bias, act }), c)
        }
    })
}

/// The f32 `gemm_bias_<act>` workload of these dimensions (what the operands are checked
/// against).
fn workload(m: usize, n: usize, k: usize, act: Act) -> Workload {
    Workload::GemmBiasAct {
        m,
        n,
        k,
        act,
        dtype: DType::F32,
    }
}

/// The direct GEMM with the epilogue fused into its stores, or as a separate pass.
struct DirectEpilogue {
    gemm: DirectGemm,
    n: usize,
    act: Act,
    fused: bool,
}

impl Executable for DirectEpilogue {
    fn run(&self, inputs: &[Operand<'_>], out: OperandMut<'_>) -> crate::Result<()> {
        let w = workload(self.gemm.m, self.n, self.gemm.k, self.act);
        let ([a, b, bias], out) = host_f32(&w, inputs, out)?;
        let ep = TileEpilogue {
            bias,
            act: self.act,
        };
        if self.fused {
            self.gemm.run_with(a, b, out, Some(ep));
        } else {
            self.gemm.run_with(a, b, out, None);
            separate_pass(out, bias, self.act);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::Problem;

    #[test]
    fn every_fusion_and_layout_is_correct_on_awkward_shapes() {
        let hw = HardwareFingerprint::current();
        for text in [
            "gemm_bias_gelu:1x1x1",
            "gemm_bias_relu:7x13x5",
            "gemm_bias_gelu:37x70x300",
            "gemm_bias_relu:3x17x9",
            "gemm_bias_gelu_erf:37x70x300",
        ] {
            let w: Workload = text.parse().unwrap();
            let p = Problem::random(&w, 5);
            let r = p.reference();
            for family in FAMILIES.iter().filter(|f| f.supports(&w)) {
                let base = family.default_config(&w, hw);
                for fusion in FUSION_VALUES {
                    for layout in B_LAYOUT_VALUES {
                        let mut c = base.clone();
                        c.set(knob::FUSION, *fusion);
                        if c.get(knob::B_LAYOUT).is_some() {
                            c.set(knob::B_LAYOUT, *layout);
                        }
                        let exe = family.prepare(&w, &c).unwrap();
                        for _ in 0..2 {
                            let mut out = vec![f32::NAN; w.output_len()];
                            exe.run_f32(&p.input_slices(), &mut out).unwrap();
                            p.check(&out, &r)
                                .unwrap_or_else(|e| panic!("{w} {} {c}: {e}", family.name()));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_prepacked_variant_notices_a_different_weight() {
        let w: Workload = "gemm_bias_relu:9x20x11".parse().unwrap();
        let hw = HardwareFingerprint::current();
        let mut c = EpiloguePacked.default_config(&w, hw);
        BLayout::Prepacked.set_in(&mut c);
        let exe = EpiloguePacked.prepare(&w, &c).unwrap();
        for seed in [1, 2, 3] {
            let p = Problem::random(&w, seed);
            let mut out = p.output();
            exe.run_f32(&p.input_slices(), &mut out).unwrap();
            p.check(&out, &p.reference()).unwrap();
        }
    }

    #[test]
    fn explicit_weight_packing_matches_the_generic_path() {
        let w: Workload = "gemm_bias_gelu:12x40x33".parse().unwrap();
        let hw = HardwareFingerprint::current();
        let exe = EpilogueGemm::from_config(&w, &EpiloguePacked.default_config(&w, hw)).unwrap();
        let p = Problem::random(&w, 8);
        let packed = exe.pack_weight(&p.inputs[1]).unwrap();
        assert_eq!(packed.dims(), (33, 40));
        let mut out = p.output();
        exe.run_prepacked(&p.inputs[0], &packed, &p.inputs[2], &mut out);
        p.check(&out, &p.reference()).unwrap();
    }

    #[test]
    fn spaces_hold_their_defaults_and_bad_knobs_are_errors() {
        let hw = HardwareFingerprint::current();
        for text in ["gemm_bias_relu:1x8x8", "gemm_bias_gelu:300x30x3"] {
            let w: Workload = text.parse().unwrap();
            let (k, c) = crate::default_for(&w, hw).unwrap();
            assert!(k.prepare(&w, &c).is_ok(), "{w} {c}");
            for family in FAMILIES.iter().filter(|f| f.supports(&w)) {
                let c = family.default_config(&w, hw);
                family.space(&w, hw).check(&c).unwrap();
                let mut bad = c.clone();
                bad.set(knob::FUSION, "sideways");
                assert!(family.prepare(&w, &bad).is_err());
                assert!(family.build(&w, &bad).is_err());
            }
        }
        let gemm: Workload = "gemm:4x4x4".parse().unwrap();
        assert!(EpiloguePacked.build(&gemm, &Config::default()).is_err());
    }
}
