//! The [`Kernel`] trait every operator family implements, and [`Executable`], what it
//! prepares. The registry of families is in `registry.rs` ([`crate::registry()`]).

use crate::device::DeviceKind;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::hardware::HardwareFingerprint;
use crate::operand::{f32_operands, Operand, OperandMut};
use crate::space::{Config, Space};
use crate::workload::Workload;

/// A prepared variant, ready to run many times (the tuning loop's "compiled candidate").
pub trait Executable: Send + Sync {
    /// Computes the workload once. `inputs` are in the workload's order
    /// ([`Workload::input_names`]); `output` is overwritten. Operands that do not match the
    /// workload it was prepared for (count, element type, length, device) are an
    /// [`Error::Operand`] naming the operand, never a panic.
    fn run(&self, inputs: &[Operand<'_>], output: OperandMut<'_>) -> Result<()>;

    /// [`run`](Self::run) on f32 host buffers, the common case (no allocation).
    fn run_f32(&self, inputs: &[&[f32]], output: &mut [f32]) -> Result<()> {
        match f32_operands(inputs) {
            Some(ops) => self.run(&ops[..inputs.len()], OperandMut::F32(output)),
            None => Err(Error::Operand {
                workload: "(any)".into(),
                operand: "inputs".into(),
                reason: format!("{} inputs, more than any workload has", inputs.len()),
            }),
        }
    }
}

/// A family of variants of one op: a name and version stored in every record, the space of
/// its configs for a workload, a default valid for every supported workload, and a way to
/// turn a config into an [`Executable`].
pub trait Kernel: Send + Sync {
    /// Stable name, stored in the database (e.g. `gemm_packed`).
    fn name(&self) -> &'static str;

    /// Bumped whenever the meaning of a config changes; records of older versions are ignored.
    fn version(&self) -> u32;

    /// The kind of device it runs on; its spaces and defaults are those of fingerprints of
    /// that kind ([`HardwareFingerprint::device_kind`]).
    fn device(&self) -> DeviceKind {
        DeviceKind::Cpu
    }

    /// The element types of the workloads it runs ([`Workload::dtype`]); f32 unless a
    /// family says otherwise.
    fn dtypes(&self) -> &'static [DType] {
        &[DType::F32]
    }

    /// Whether this family can run `w` at all: its op, its shape and its element type
    /// (false for every element type outside [`Kernel::dtypes`]).
    fn supports(&self, w: &Workload) -> bool;

    /// The configs the search may try for `w` on `hw`.
    fn space(&self, w: &Workload, hw: &HardwareFingerprint) -> Space;

    /// Whether `c` fits `space(w, hw)`: always the same answer as
    /// `self.space(w, hw).check(c).is_ok()`, without building the space (the runtime asks
    /// it for every nearest-shape candidate of an untuned workload, where building the
    /// space's value lists and rules would cost microseconds). This default builds the
    /// space; families override it with a direct check of the same knobs and rules (their
    /// agreement is tested in this module).
    fn config_fits(&self, w: &Workload, hw: &HardwareFingerprint, c: &Config) -> bool {
        self.space(w, hw).check(c).is_ok()
    }

    /// A config from `space(w, hw)`, chosen analytically (cache sizes), valid for `w`.
    fn default_config(&self, w: &Workload, hw: &HardwareFingerprint) -> Config;

    /// Builds the variant without checking `c` against the space (see [`Kernel::prepare`]).
    fn build(&self, w: &Workload, c: &Config) -> Result<Box<dyn Executable>>;

    /// Whether it runs `w` at all, as an error that says why not: an element type outside
    /// [`Kernel::dtypes`], or another op or shape ([`Kernel::supports`]).
    fn serves(&self, w: &Workload) -> Result<()> {
        if !self.dtypes().contains(&w.dtype()) {
            return Err(Error::UnsupportedDtype {
                kernel: self.name().into(),
                workload: w.key(),
                dtype: w.dtype(),
                served: self
                    .dtypes()
                    .iter()
                    .map(|d| d.name())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        if !self.supports(w) {
            return Err(Error::Unsupported {
                kernel: self.name().into(),
                workload: w.key(),
            });
        }
        Ok(())
    }

    /// Checks `c` against this machine's space for `w`, then builds it.
    fn prepare(&self, w: &Workload, c: &Config) -> Result<Box<dyn Executable>> {
        self.serves(w)?;
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
