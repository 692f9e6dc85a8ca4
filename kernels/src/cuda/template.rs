//! The [`Template`] trait every CUDA kernel family implements, and the source renderer.
//!
//! A template is CUDA C text with its knobs left as preprocessor names; [`render`] puts the
//! config in front as `#define`s, so NVRTC sees compile-time constants (fully unrolled loops,
//! register arrays of the right size) and every config is its own kernel.

use std::fmt;
use std::sync::Arc;

use rayon::prelude::*;

use crate::space::{Config, Space};

use super::arch::Arch;
use super::compile::{compile_source, CompileError, Ptx};

/// Helpers shared by every template (bf16 bits, `cp.async`, warp reductions).
pub const COMMON: &str = include_str!("templates/common.cuh");

/// Grid, block and dynamic shared memory of one launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchDims {
    /// Blocks per grid, `(x, y, z)`.
    pub grid: (u32, u32, u32),
    /// Threads per block, `(x, y, z)`.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes.
    pub smem_bytes: u32,
}

/// A family of CUDA kernels generated from one template.
pub trait Template: Send + Sync {
    /// The problem size the space and default depend on.
    type Shape: Copy + fmt::Debug + Send + Sync;

    /// Stable name, stored in the database (e.g. `cuda_gemm_f32`).
    fn name(&self) -> &'static str;

    /// Bumped whenever the meaning of a config changes.
    fn version(&self) -> u32;

    /// The `extern "C"` symbol of the kernel in the rendered source.
    fn entry(&self) -> &'static str;

    /// Whether the family can run `shape` on `arch` at all.
    fn supports(&self, shape: &Self::Shape, arch: Arch) -> bool;

    /// The configs the search may try for `shape` on `arch`.
    fn space(&self, shape: &Self::Shape, arch: Arch) -> Space;

    /// A config of `space(shape, arch)`, valid wherever `supports(shape, arch)`.
    fn default_config(&self, shape: &Self::Shape, arch: Arch) -> Config;

    /// The CUDA source with `config` as compile-time constants.
    fn source(&self, shape: &Self::Shape, config: &Config) -> Result<String, CompileError>;

    /// Grid, block and shared memory for running `config` on `shape`.
    fn launch_dims(&self, shape: &Self::Shape, config: &Config)
        -> Result<LaunchDims, CompileError>;

    /// Checks `config` against the space, renders it and compiles it with NVRTC (cached).
    fn compile(
        &self,
        shape: &Self::Shape,
        config: &Config,
        arch: Arch,
    ) -> Result<Arc<Ptx>, CompileError> {
        let invalid = |reason: String| CompileError::InvalidConfig {
            kernel: self.name().into(),
            config: config.to_json(),
            arch,
            reason,
        };
        if !self.supports(shape, arch) {
            return Err(invalid(format!("{shape:?} is not supported on {arch}")));
        }
        self.space(shape, arch)
            .check(config)
            .map_err(|e| invalid(e.to_string()))?;
        compile_source(self.name(), &self.source(shape, config)?, arch)
    }

    /// [`compile`](Template::compile)s many configs in parallel (rayon); results in order.
    fn compile_many(
        &self,
        shape: &Self::Shape,
        configs: &[Config],
        arch: Arch,
    ) -> Vec<Result<Arc<Ptx>, CompileError>> {
        configs
            .par_iter()
            .map(|c| self.compile(shape, c, arch))
            .collect()
    }
}

/// Renders a template: a header naming the kernel and config, one `#define` per constant,
/// the shared helpers, then the template body.
pub fn render(kernel: &str, config: &Config, defines: &[(&str, i64)], body: &str) -> String {
    let mut s = String::with_capacity(COMMON.len() + body.len() + 512);
    s.push_str(&format!(
        "// autokernel {kernel}, config {}\n",
        config.to_json()
    ));
    for (name, value) in defines {
        s.push_str(&format!("#define {name} {value}\n"));
    }
    s.push_str(COMMON);
    s.push('\n');
    s.push_str(body);
    s
}

/// Largest value a numeric template knob may take: keeps every product the rules compute
/// (threads, registers, shared memory) far from overflow, whatever a stored config says.
pub(crate) const MAX_KNOB: i64 = 4096;

/// The whole-number knob `name` of `c`, in `1..=MAX_KNOB`.
pub(crate) fn knob(c: &Config, name: &str) -> Result<u32, String> {
    match c.int(name) {
        Some(v) if v > 0 && v <= MAX_KNOB => Ok(v as u32),
        Some(v) => Err(format!("knob '{name}' = {v} is out of range")),
        None => Err(format!("knob '{name}' is missing or not a number")),
    }
}

/// `ceil(a / b)` for `b > 0`.
pub(crate) const fn cdiv(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_puts_defines_first() {
        let c = Config::from_pairs([("bm", 64usize)]);
        let s = render("k", &c, &[("BM", 64), ("SPLIT_K", 1)], "BODY");
        assert!(s.starts_with(
            "// autokernel k, config {\"bm\":64}\n#define BM 64\n#define SPLIT_K 1\n"
        ));
        assert!(s.ends_with("\nBODY"));
        assert!(s.contains("ak_cp_async"));
    }

    #[test]
    fn knob_reads_positive_ints() {
        let mut c = Config::from_pairs([("a", 3usize)]);
        c.set("b", "x");
        c.set("z", 0i64);
        c.set("huge", 1i64 << 40);
        assert_eq!(knob(&c, "a"), Ok(3));
        assert!(knob(&c, "huge").is_err());
        assert!(knob(&c, "b").is_err());
        assert!(knob(&c, "z").is_err());
        assert!(knob(&c, "missing").is_err());
    }
}
