//! The [`Kernel`] trait every operator family implements, and the registry of families.

use crate::error::{Error, Result};
use crate::hardware::HardwareFingerprint;
use crate::space::{Config, Space};
use crate::workload::Workload;

/// A prepared variant, ready to run many times (the tuning loop's "compiled candidate").
pub trait Executable: Send + Sync {
    /// Computes the workload once. `inputs` are in the workload's order
    /// ([`Workload::input_lens`]); `output` ([`Workload::output_len`]) is overwritten.
    /// Panics if the buffer lengths do not match the workload it was prepared for.
    fn run(&self, inputs: &[&[f32]], output: &mut [f32]);
}

/// A family of variants of one op: a name and version stored in every record, the space of
/// its configs for a workload, a default valid for every supported workload, and a way to
/// turn a config into an [`Executable`].
pub trait Kernel: Send + Sync {
    /// Stable name, stored in the database (e.g. `gemm_packed`).
    fn name(&self) -> &'static str;

    /// Bumped whenever the meaning of a config changes; records of older versions are ignored.
    fn version(&self) -> u32;

    /// Whether this family can run `w` at all.
    fn supports(&self, w: &Workload) -> bool;

    /// The configs the search may try for `w` on `hw`.
    fn space(&self, w: &Workload, hw: &HardwareFingerprint) -> Space;

    /// A config from `space(w, hw)`, chosen analytically (cache sizes), valid for `w`.
    fn default_config(&self, w: &Workload, hw: &HardwareFingerprint) -> Config;

    /// Builds the variant without checking `c` against the space (see [`Kernel::prepare`]).
    fn build(&self, w: &Workload, c: &Config) -> Result<Box<dyn Executable>>;

    /// Checks `c` against this machine's space for `w`, then builds it.
    fn prepare(&self, w: &Workload, c: &Config) -> Result<Box<dyn Executable>> {
        if !self.supports(w) {
            return Err(Error::Unsupported {
                kernel: self.name().into(),
                workload: w.key(),
            });
        }
        self.space(w, HardwareFingerprint::current())
            .check(c)
            .map_err(|e| Error::InvalidConfig {
                kernel: self.name().into(),
                config: c.to_json(),
                reason: e.to_string(),
            })?;
        self.build(w, c)
    }
}

/// Every registered kernel family, in priority order.
///
/// Builds with the `planted-faults` feature append the test-only `planted_faults` family
/// (`kernels/src/cpu/planted.rs`) when the environment has `AUTOKERNEL_PLANTED_FAULTS=1`.
pub fn registry() -> &'static [&'static dyn Kernel] {
    #[cfg(feature = "planted-faults")]
    if crate::cpu::planted::enabled() {
        return crate::cpu::planted::with_planted(FAMILIES);
    }
    FAMILIES
}

/// The CPU families: GEMM, GEMM with a fused epilogue, attention.
static FAMILIES: &[&dyn Kernel] = &[
    &crate::cpu::gemm::Packed,
    &crate::cpu::gemm::Direct,
    &crate::cpu::gemm::epilogue::EpiloguePacked,
    &crate::cpu::gemm::epilogue::EpilogueDirect,
    &crate::cpu::attention::Fused,
    &crate::cpu::attention::Unfused,
];

/// The family called `name`.
pub fn kernel(name: &str) -> Result<&'static dyn Kernel> {
    registry()
        .iter()
        .copied()
        .find(|k| k.name() == name)
        .ok_or_else(|| Error::UnknownKernel(name.to_string()))
}

/// The families that support `w`.
pub fn kernels_for(w: &Workload) -> Vec<&'static dyn Kernel> {
    registry()
        .iter()
        .copied()
        .filter(|k| k.supports(w))
        .collect()
}

/// The fallback for `w`: the family and config used when nothing was tuned.
pub fn default_for(w: &Workload, hw: &HardwareFingerprint) -> (&'static dyn Kernel, Config) {
    match w {
        Workload::Gemm { .. } => crate::cpu::gemm::default_for(w, hw),
        Workload::GemmBiasAct { .. } => crate::cpu::gemm::epilogue::default_for(w, hw),
        Workload::Attention { .. } => crate::cpu::attention::default_for(w, hw),
    }
}
