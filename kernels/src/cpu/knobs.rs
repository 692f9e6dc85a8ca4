//! The knob and rule helpers every CPU family builds its space, `config_fits` and `build`
//! from: typed knob reads with the family's error, listed-value checks, block-size caps and
//! the thread knobs.

use crate::error::{Error, Result};
use crate::hardware::HardwareFingerprint;
use crate::space::Config;
use crate::workload::Workload;

/// The error `build` returns for a workload the family does not support.
pub(crate) fn unsupported(kernel: &str, w: &Workload) -> Error {
    Error::Unsupported {
        kernel: kernel.into(),
        workload: w.key(),
    }
}

pub(crate) fn invalid(kernel: &str, c: &Config, reason: String) -> Error {
    Error::InvalidConfig {
        kernel: kernel.into(),
        config: c.to_json(),
        reason,
    }
}

/// The knob naming how a CPU family splits its work across threads (`none` or a family's
/// dimension), shared by every CPU family.
pub const PAR: &str = "par";
/// The knob counting the threads of a split (1 with `par = none`).
pub const THREADS: &str = "threads";

/// Knob `name` of `c` as a non-negative whole number; the reason it is not one otherwise.
pub(crate) fn int_value(c: &Config, name: &str) -> std::result::Result<usize, String> {
    match c.int(name) {
        Some(v) if v >= 0 => Ok(v as usize),
        _ => Err(format!("knob '{name}' must be a non-negative whole number")),
    }
}

/// Knob `name` of `c` as a name; the reason it is not one otherwise.
pub(crate) fn str_value<'c>(c: &'c Config, name: &str) -> std::result::Result<&'c str, String> {
    c.str(name)
        .ok_or_else(|| format!("knob '{name}' must be a name"))
}

pub(crate) fn int_knob(kernel: &str, c: &Config, name: &str) -> Result<usize> {
    int_value(c, name).map_err(|reason| invalid(kernel, c, reason))
}

pub(crate) fn str_knob<'c>(kernel: &str, c: &'c Config, name: &str) -> Result<&'c str> {
    str_value(c, name).map_err(|reason| invalid(kernel, c, reason))
}

/// Thread counts offered: powers of two below the core count, and the core count.
pub(crate) fn thread_values(hw: &HardwareFingerprint) -> Vec<usize> {
    let cores = hw.cores.max(1);
    let mut v: Vec<usize> = (0..)
        .map(|s| 1usize << s)
        .take_while(|&t| t < cores)
        .collect();
    v.push(cores);
    v
}

/// The smallest listed value `≥ x`, if any: every larger value behaves the same once the
/// block size is clamped to the matrix, so the spaces only admit values up to this one.
pub(crate) fn first_at_least(values: &[usize], x: usize) -> Option<usize> {
    values.iter().copied().filter(|&v| v >= x).min()
}

/// The listed value nearest to `target`, but no more than `first_at_least(values, dim)`.
pub(crate) fn snap(values: &[usize], target: usize, dim: usize) -> usize {
    let cap = first_at_least(values, dim).unwrap_or(usize::MAX);
    values
        .iter()
        .copied()
        .filter(|&v| v <= cap)
        .min_by_key(|&v| (v.abs_diff(target), v))
        .expect("knob lists are not empty")
}

pub(crate) fn serial_iff_one_thread(c: &Config) -> bool {
    (c.str(PAR) == Some("none")) == (c.int(THREADS) == Some(1))
}

/// Rule: knob `name` ≤ `first_at_least(values, dim)` (no cap when every value is below `dim`).
pub(crate) fn cap_rule(
    name: &'static str,
    values: &[usize],
    dim: usize,
) -> impl Fn(&Config) -> bool + Send + Sync + 'static {
    let cap = first_at_least(values, dim).map_or(i64::MAX, |v| v as i64);
    move |c: &Config| c.int(name).is_some_and(|v| v <= cap)
}

/// Whether knob `name` of `c` is a whole number listed in `values` (a [`Space::check`](crate::Space::check)
/// membership test without building the space).
pub(crate) fn int_listed(c: &Config, name: &str, values: &[usize]) -> bool {
    c.int(name)
        .is_some_and(|v| values.iter().any(|&x| x as i64 == v))
}

/// Whether knob `name` of `c` is a name listed in `values`.
pub(crate) fn str_listed(c: &Config, name: &str, values: &[&str]) -> bool {
    c.str(name).is_some_and(|v| values.contains(&v))
}

/// Whether `par` and `threads` are listed for `hw` (`par` among the family's `par` values
/// when it has more than one core, [`thread_values`]).
pub(crate) fn par_threads_listed(c: &Config, hw: &HardwareFingerprint, par: &[&str]) -> bool {
    let par_ok = if hw.cores > 1 {
        str_listed(c, PAR, par)
    } else {
        c.str(PAR) == Some("none")
    };
    par_ok && int_listed(c, THREADS, &thread_values(hw))
}
