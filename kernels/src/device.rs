//! Where a kernel runs: the CPU, or CUDA device `N`.
//!
//! ```
//! use kernels::Device;
//!
//! let d: Device = "cuda:1".parse()?;
//! assert_eq!(d, Device::Cuda(1));
//! assert_eq!(d.to_string(), "cuda:1");
//! assert_eq!("cpu".parse::<Device>()?, Device::Cpu);
//! assert!("gpu".parse::<Device>().is_err());
//! # Ok::<(), kernels::DeviceParseError>(())
//! ```
//!
//! The text form (`cpu`, `cuda:N`) is what the command line's `--device` takes. Parsing never
//! touches the driver; opening the device does (`kernels::cuda::Gpu::open`, in builds with
//! the `cuda` feature), and says why a CUDA device cannot be used (no driver library, no
//! device `N`).

use std::fmt;
use std::str::FromStr;

/// A compute device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Device {
    /// The host CPU (the CPU kernel families).
    #[default]
    Cpu,
    /// CUDA device with this ordinal (the order `nvidia-smi` and `CUDA_VISIBLE_DEVICES` use).
    Cuda(usize),
}

/// Why a `--device` string does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad device '{input}': {reason} (expected 'cpu' or 'cuda:N', e.g. cuda:0)")]
pub struct DeviceParseError {
    /// The string as given.
    pub input: String,
    /// What is wrong with it, e.g. `unknown device kind`.
    pub reason: String,
}

/// The kind of device a kernel family runs on ([`crate::Kernel::device`]) and a hardware
/// fingerprint describes ([`crate::HardwareFingerprint::device_kind`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceKind {
    /// The host CPU.
    #[default]
    Cpu,
    /// An NVIDIA GPU through CUDA.
    Cuda,
}

impl DeviceKind {
    /// `cpu` or `cuda`.
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
        }
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Device {
    /// The kind of this device.
    pub fn kind(&self) -> DeviceKind {
        match self {
            Device::Cpu => DeviceKind::Cpu,
            Device::Cuda(_) => DeviceKind::Cuda,
        }
    }

    /// Whether this is a CUDA device.
    pub fn is_cuda(&self) -> bool {
        matches!(self, Device::Cuda(_))
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl FromStr for Device {
    type Err = DeviceParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason: &str| DeviceParseError {
            input: s.to_string(),
            reason: reason.to_string(),
        };
        let t = s.trim().to_ascii_lowercase();
        if t == "cpu" {
            return Ok(Device::Cpu);
        }
        let Some(rest) = t.strip_prefix("cuda") else {
            return Err(err("unknown device kind"));
        };
        if rest.is_empty() {
            return Err(err("missing device number"));
        }
        let Some(num) = rest.strip_prefix(':') else {
            return Err(err("the device number follows a ':'"));
        };
        if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err("the device number must be a whole number"));
        }
        num.parse::<usize>()
            .ok()
            .filter(|&n| n <= 1024)
            .map(Device::Cuda)
            .ok_or_else(|| err("device number out of range"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form_round_trips() {
        for d in [Device::Cpu, Device::Cuda(0), Device::Cuda(7)] {
            assert_eq!(d.to_string().parse::<Device>(), Ok(d));
        }
        assert_eq!(" CUDA:2 ".parse::<Device>(), Ok(Device::Cuda(2)));
        assert_eq!(Device::default(), Device::Cpu);
        assert!(Device::Cuda(3).is_cuda() && !Device::Cpu.is_cuda());
    }

    #[test]
    fn bad_strings_name_the_problem() {
        for (s, why) in [
            ("gpu", "unknown device kind"),
            ("cuda", "missing device number"),
            ("cuda0", "follows a ':'"),
            ("cuda:", "whole number"),
            ("cuda:-1", "whole number"),
            ("cuda:x", "whole number"),
            ("cuda:99999999999999999999999", "out of range"),
        ] {
            let e = s.parse::<Device>().unwrap_err();
            assert!(e.to_string().contains(why), "{s}: {e}");
            assert!(e.to_string().contains("cuda:N"), "{s}: {e}");
        }
    }
}
