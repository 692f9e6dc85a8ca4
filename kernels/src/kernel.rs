//! The [`Kernel`] trait every operator family implements, and [`Executable`], what it
//! prepares. The registry of families is in `registry.rs` ([`crate::registry()`]).

use std::any::Any;
use std::sync::Arc;

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

    /// For an `attention:…` variant: the same attention over the rows of a transformer
    /// layer's fused QKV projection, read and written in place — `qkv` is `[B·S, 3·H·D]`
    /// (Q, then K, then V; head `h` at columns `h·D..` of each), `out` gets `[B·S, H·D]`
    /// (head `h` at columns `h·D..`), `key_lens` as [`run`](Self::run)'s fourth operand.
    /// Operands of the wrong length are an [`Error::Operand`]. `None` (the default) where
    /// the variant reads `[B, H, S, D]` operands only: the caller splits the heads out.
    fn run_qkv_rows(
        &self,
        _qkv: &[f32],
        _key_lens: Option<&[i32]>,
        _out: &mut [f32],
    ) -> Option<Result<()>> {
        None
    }

    /// The form this variant keeps a constant B operand (the weight of a `gemm*` workload)
    /// in, if it prepares weights at all: variants with equal formats share one
    /// [`PreparedWeight`]. `None` (the default): B is read as given on every call.
    fn weight_format(&self) -> Option<WeightFormat> {
        None
    }

    /// Prepares the constant weight `b` (`K×N`, row-major f32) once, in
    /// [`weight_format`](Self::weight_format), for [`run_prepared`](Self::run_prepared).
    fn prepare_weight(&self, _b: &[f32]) -> Result<PreparedWeight> {
        Err(Error::Operand {
            workload: "(any)".into(),
            operand: "b".into(),
            reason: "this variant does not prepare weights".into(),
        })
    }

    /// [`run_f32`](Self::run_f32) with `weight` (prepared by a variant of the same
    /// [`weight_format`](Self::weight_format)) in place of B: `inputs` are the workload's
    /// inputs without B (A, then the bias for `gemm_bias_*`).
    fn run_prepared(
        &self,
        _inputs: &[&[f32]],
        _weight: &PreparedWeight,
        _output: &mut [f32],
    ) -> Result<()> {
        Err(Error::Operand {
            workload: "(any)".into(),
            operand: "b".into(),
            reason: "this variant does not run with prepared weights".into(),
        })
    }
}

/// How a prepared weight is laid out: the family that made it and the parameters its layout
/// depends on (for instance the panel width and depth block), so that a variant can tell
/// whether a weight prepared by another variant is one it can read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WeightFormat {
    /// Name of the kernel family that prepared the weight, e.g. `gemm_bf16`.
    pub family: &'static str,
    /// The family's layout parameters, e.g. the panel width NR and a layout code; unused slots
    /// are 0.
    pub params: [usize; 2],
}

/// A constant weight prepared once (packed, converted to bf16, or quantised) by a variant,
/// shared by every variant of its [`WeightFormat`]. Cheap to clone.
#[derive(Clone)]
pub struct PreparedWeight {
    format: WeightFormat,
    bytes: usize,
    data: Arc<dyn Any + Send + Sync>,
}

impl PreparedWeight {
    /// Wraps a family's prepared form `data`, which holds `bytes` bytes.
    pub fn new<T: Any + Send + Sync>(format: WeightFormat, bytes: usize, data: T) -> Self {
        PreparedWeight {
            format,
            bytes,
            data: Arc::new(data),
        }
    }

    /// Its layout.
    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// Bytes it holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The family's prepared form, if it is a `T` of format `format`; otherwise an operand
    /// error naming both formats.
    pub fn get<T: Any>(&self, format: WeightFormat, workload: &Workload) -> Result<&T> {
        match self.data.downcast_ref::<T>() {
            Some(t) if self.format == format => Ok(t),
            _ => Err(Error::Operand {
                workload: workload.key(),
                operand: "b".into(),
                reason: format!(
                    "a weight prepared as {:?} cannot serve a variant reading {:?}",
                    self.format, format
                ),
            }),
        }
    }
}

impl std::fmt::Debug for PreparedWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedWeight")
            .field("format", &self.format)
            .field("bytes", &self.bytes)
            .finish()
    }
}

/// A family of variants of one op: a name and version stored in every record, the space of
/// its configs for a workload, a default valid for every supported workload, and a way to
/// turn a config into an [`Executable`].
pub trait Kernel: Send + Sync {
    /// Stable name, stored in the database (e.g. `gemm_packed`).
    fn name(&self) -> &'static str;

    /// Bumped whenever the meaning of a config changes; records of older versions are ignored
    /// unless [`Kernel::upgrade`] reads them.
    fn version(&self) -> u32;

    /// `c`, stored by version `from` of this family, as this version reads it: `Some` for the
    /// current version, and for an older one whose configs this version still runs the same
    /// way (a version that only added a knob fills in the value that behaves as before);
    /// `None` for a record that must be re-tuned. The tuning database upgrades records as it
    /// reads them, so a shipped database keeps serving across such a change.
    fn upgrade(&self, from: u32, c: &Config) -> Option<Config> {
        (from == self.version()).then(|| c.clone())
    }

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

    /// Why this family, which serves `w`'s op and element type, does not run `w` in this
    /// process (a CPU feature it needs), if that is the reason; `None` otherwise.
    fn missing_here(&self, _w: &Workload) -> Option<String> {
        None
    }

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

    /// A variant of this family for `w` on `hw` that reads a weight prepared in `format`,
    /// with its config: the default config, or failing that the default with another
    /// `ukernel` (and, failing that, also run on one thread), as long as it fits the space.
    /// How a weight prepared for some shapes serves another without a second copy; `None`
    /// when no such variant exists (or the family prepares no weights).
    fn variant_reading(
        &self,
        w: &Workload,
        hw: &HardwareFingerprint,
        format: WeightFormat,
    ) -> Option<(Config, Box<dyn Executable>)> {
        let space = self.space(w, hw);
        let reads = |c: Config| {
            space.check(&c).ok()?;
            let exe = self.build(w, &c).ok()?;
            (exe.weight_format() == Some(format)).then_some((c, exe))
        };
        let default = self.default_config(w, hw);
        let ukernels = space.knobs().iter().find(|k| k.name == "ukernel");
        let serial = {
            let mut c = default.clone();
            c.set("par", "none");
            c.set("threads", 1usize);
            c
        };
        reads(default.clone()).or_else(|| {
            let values = ukernels.map(|k| k.values.as_slice()).unwrap_or_default();
            [default, serial].into_iter().find_map(|base| {
                values.iter().find_map(|v| {
                    let mut c = base.clone();
                    c.set("ukernel", v.clone());
                    reads(c)
                })
            })
        })
    }
}
