//! The registry of kernel families: every family this build serves, on every device, looked
//! up by name or by workload and device; the fallback default for a workload; and the one
//! policy on whether a stored record can still be served. The only module that knows both the
//! CPU families ([`crate::cpu`]) and the CUDA ones (`crate::cuda`, with the `cuda` feature);
//! the families depend on the [`Kernel`] trait and the vocabulary only.

use std::sync::OnceLock;

use crate::device::DeviceKind;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::hardware::HardwareFingerprint;
use crate::kernel::Kernel;
use crate::space::Config;
use crate::workload::Workload;

/// Every registered kernel family, in priority order: the CPU families, then (in builds with
/// the `cuda` feature) the CUDA ones.
///
/// Builds with the `planted-faults` feature append the test-only `planted_faults` family
/// (`kernels/src/cpu/planted.rs`) when the environment has `AUTOKERNEL_PLANTED_FAULTS=1`.
pub fn registry() -> &'static [&'static dyn Kernel] {
    static ALL: OnceLock<Vec<&'static dyn Kernel>> = OnceLock::new();
    ALL.get_or_init(|| {
        #[cfg_attr(
            not(any(feature = "cuda", feature = "planted-faults")),
            allow(unused_mut)
        )]
        let mut all = CPU_FAMILIES.to_vec();
        #[cfg(feature = "cuda")]
        all.extend_from_slice(crate::cuda::FAMILIES);
        #[cfg(feature = "planted-faults")]
        if crate::cpu::planted::enabled() {
            all.push(&crate::cpu::planted::PlantedFaults);
        }
        all
    })
}

/// The CPU families: GEMM, GEMM with a fused epilogue, attention, int8 and bf16 GEMM, bf16
/// attention.
static CPU_FAMILIES: &[&dyn Kernel] = &[
    &crate::cpu::gemm::Packed,
    &crate::cpu::gemm::Direct,
    &crate::cpu::gemm::epilogue::EpiloguePacked,
    &crate::cpu::gemm::epilogue::EpilogueDirect,
    &crate::cpu::attention::Fused,
    &crate::cpu::attention::Unfused,
    &crate::cpu::qgemm::GemmI8,
    &crate::cpu::bgemm::GemmBf16,
    &crate::cpu::attention::bf16::AttentionBf16,
];

/// The family called `name`.
pub fn kernel(name: &str) -> Result<&'static dyn Kernel> {
    registry()
        .iter()
        .copied()
        .find(|k| k.name() == name)
        .ok_or_else(|| Error::UnknownKernel(name.to_string()))
}

/// The families that run `w` on the kind of device `hw` describes.
pub fn kernels_for(w: &Workload, hw: &HardwareFingerprint) -> Vec<&'static dyn Kernel> {
    registry()
        .iter()
        .copied()
        .filter(|k| k.device() == hw.device_kind() && k.supports(w))
        .collect()
}

/// The fallback for `w` on `hw`: the family and config used when nothing was tuned, or
/// [`Error::NoFamily`] when no family of this build runs `w` on that kind of device (an
/// element type nobody serves, an op CUDA does not run, a build without the `cuda` feature).
pub fn default_for(
    w: &Workload,
    hw: &HardwareFingerprint,
) -> Result<(&'static dyn Kernel, Config)> {
    let chosen: Option<&'static dyn Kernel> = match hw.device_kind() {
        DeviceKind::Cpu => Some(match w {
            _ if w.dtype() == DType::I8 && w.gemm_dims().is_some() => &crate::cpu::qgemm::GemmI8,
            _ if w.dtype() == DType::Bf16 && w.gemm_dims().is_some() => {
                &crate::cpu::bgemm::GemmBf16
            }
            Workload::Attention { .. } if w.dtype() == DType::Bf16 => {
                &crate::cpu::attention::bf16::AttentionBf16
            }
            Workload::Gemm { .. } => crate::cpu::gemm::default_family(w),
            Workload::GemmBiasAct { .. } => crate::cpu::gemm::epilogue::default_family(w),
            Workload::Attention { .. } => crate::cpu::attention::default_family(w),
        }),
        DeviceKind::Cuda => kernels_for(w, hw).first().copied(),
    };
    match chosen {
        Some(k) if k.supports(w) => Ok((k, k.default_config(w, hw))),
        _ => Err(no_family(w, hw.device_kind())),
    }
}

/// Whether some family of this build runs `w` on `device` (any GPU of that kind: no device
/// is opened); [`Error::NoFamily`] naming what would, otherwise. Commands call it before they
/// touch a device or a database.
pub fn check_runs_on(w: &Workload, device: DeviceKind) -> Result<()> {
    if registry()
        .iter()
        .any(|k| k.device() == device && k.supports(w))
    {
        Ok(())
    } else {
        Err(no_family(w, device))
    }
}

/// Why nothing runs `w` on `device`, naming what would.
fn no_family(w: &Workload, device: DeviceKind) -> Error {
    let on_device: Vec<&'static dyn Kernel> = registry()
        .iter()
        .copied()
        .filter(|k| k.device() == device)
        .collect();
    let same_op = on_device
        .iter()
        .any(|k| k.supports(&w.with_dtype(Default::default())));
    let served: Vec<&str> = on_device
        .iter()
        .filter(|k| k.dtypes().contains(&w.dtype()))
        .map(|k| k.name())
        .collect();
    let reason = if on_device.is_empty() {
        format!("this build has no {device} kernel families (built without the `{device}` feature)")
    } else if !same_op {
        let hint = match device {
            DeviceKind::Cuda => "; use --device cpu",
            DeviceKind::Cpu => "",
        };
        format!(
            "no {device} family runs '{}' workloads yet{hint}",
            w.op().name()
        )
    } else if served.is_empty() {
        format!("no family of this build serves {} workloads yet", w.dtype())
    } else if let Some(why) = on_device.iter().find_map(|k| k.missing_here(w)) {
        why
    } else {
        format!(
            "{} workloads are served only by {}",
            w.dtype(),
            served.join(", ")
        )
    };
    Error::NoFamily {
        workload: w.key(),
        device: device.to_string(),
        reason,
    }
}

/// A stored record's family version and config as this build reads them
/// ([`Kernel::upgrade`]): unchanged when the family is unknown or the record cannot be
/// upgraded (it is then stale, and says so where it is checked).
pub fn upgrade_record(kernel: &str, version: u32, config: Config) -> (u32, Config) {
    match crate::registry::kernel(kernel) {
        Ok(k) if k.version() != version => match k.upgrade(version, &config) {
            Some(c) => (k.version(), c),
            None => (version, config),
        },
        _ => (version, config),
    }
}

/// Whether a stored record (family `kernel` at `version`, config `config` for `w`, measured
/// on `hw`) can still be served: the family is registered at that version, runs on `hw`'s
/// kind of device, supports `w`, and `config` fits its space for `hw`. The tuning database
/// asks this before it serves or verifies a record; the reason comes back as text.
pub fn check_record(
    kernel: &str,
    version: u32,
    w: &Workload,
    config: &Config,
    hw: &HardwareFingerprint,
) -> std::result::Result<&'static dyn Kernel, String> {
    let k = crate::registry::kernel(kernel).map_err(|e| e.to_string())?;
    if version > k.version() {
        return Err(format!(
            "{kernel} v{version} is newer than this build's v{}: serve it with the build that \
             tuned it, or re-tune with this one",
            k.version()
        ));
    }
    if k.version() != version {
        return Err(format!(
            "{kernel} v{version} is stale (this build has v{}): re-tune",
            k.version()
        ));
    }
    if k.device() != hw.device_kind() {
        return Err(format!(
            "{kernel} runs on {}, fingerprint {} is a {}",
            k.device(),
            hw.id,
            hw.device_kind()
        ));
    }
    if !k.supports(w) {
        return Err(format!("{kernel} does not run {w}"));
    }
    if k.config_fits(w, hw, config) {
        return Ok(k);
    }
    let why = match k.space(w, hw).check(config) {
        Err(e) => e.to_string(),
        Ok(()) => "config_fits and the space disagree".into(),
    };
    Err(format!(
        "config {config} does not fit {kernel} v{version} on {}: {why}",
        hw.id
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::space::Value;
    use crate::workload::Act;

    fn workloads_of(k: &dyn Kernel) -> Vec<Workload> {
        let mut all = Vec::new();
        for (m, n, kk) in [
            (1, 1, 1),
            (1, 768, 768),
            (5, 7, 9),
            (8, 64, 3072),
            (17, 3, 100),
            (32, 1000, 16),
            (33, 64, 64),
            (200, 768, 900),
            (1024, 4096, 512),
            (3000, 9000, 130),
        ] {
            all.push(Workload::Gemm {
                m,
                n,
                k: kk,
                dtype: crate::DType::F32,
            });
            for act in Act::ALL {
                all.push(Workload::GemmBiasAct {
                    m,
                    n,
                    k: kk,
                    act,
                    dtype: crate::DType::F32,
                });
            }
        }
        for (b, h, s, d) in [
            (1, 1, 1, 1),
            (1, 1, 17, 64),
            (1, 2, 64, 80),
            (2, 12, 128, 64),
            (1, 1, 300, 32),
            (4, 16, 1024, 64),
        ] {
            for causal in [false, true] {
                all.push(Workload::Attention {
                    b,
                    h,
                    s,
                    d,
                    causal,
                    dtype: crate::DType::F32,
                });
            }
        }
        // The families' own workloads (in each element type they serve), plus one of
        // another op (space and check are defined for every workload, supported or not).
        let mut own: Vec<Workload> = all
            .iter()
            .flat_map(|w| k.dtypes().iter().map(|d| w.with_dtype(*d)))
            .filter(|w| k.supports(w))
            .collect();
        own.extend(all.iter().copied().find(|w| !k.supports(w)));
        own
    }

    #[test]
    fn families_refuse_element_types_they_do_not_serve() {
        let hw = HardwareFingerprint::current();
        for k in registry().iter().copied() {
            for w in workloads_of(k).into_iter().filter(|w| k.supports(w)) {
                let config = k.default_config(&w, hw);
                for dtype in DType::PRECISIONS {
                    let wd = w.with_dtype(dtype);
                    let served = k.dtypes().contains(&dtype);
                    assert_eq!(k.supports(&wd), served, "{} on {wd}", k.name());
                    if !served {
                        let e = k.prepare(&wd, &config).err().expect("refused").to_string();
                        assert!(
                            e.contains(k.name())
                                && e.contains(dtype.name())
                                && k.dtypes().iter().all(|d| e.contains(d.name())),
                            "{e}"
                        );
                    }
                }
            }
        }
        // bf16 GEMM has a CPU family; bf16 attention one that runs only with AVX512_BF16.
        let bf16: Workload = "gemm_bias_gelu:64x64x64:bf16".parse().unwrap();
        assert_eq!(default_for(&bf16, hw).unwrap().0.name(), "gemm_bf16");
        let bf16: Workload = "attention:1x2x16x8:bf16".parse().unwrap();
        let runs = crate::cpu::attention::bf16::ukernel::TILES
            .iter()
            .any(|t| t.available());
        match default_for(&bf16, hw) {
            Ok((k, _)) => {
                assert!(runs, "served without AVX512_BF16");
                assert_eq!(k.name(), "attention_bf16");
                assert_eq!(kernels_for(&bf16, hw).len(), 1);
            }
            Err(e) => {
                assert!(!runs, "{e}");
                let e = e.to_string();
                assert!(e.contains("attention:1x2x16x8:bf16") && e.contains("AVX512_BF16"));
                assert!(kernels_for(&bf16, hw).is_empty());
            }
        }
    }

    /// Configs of the unconstrained product of `k`'s knobs on `hw` (valid or not by the
    /// rules: all of them for small spaces, 300 drawn at random otherwise), and broken
    /// variants: a knob missing, an extra knob, an unlisted value, a value of the wrong kind.
    fn configs_of(k: &dyn Kernel, w: &Workload, hw: &HardwareFingerprint) -> Vec<Config> {
        let space = k.space(w, hw);
        let n = space.cardinality();
        let mut v: Vec<Config> = if n <= 300 {
            (0..n).map(|i| space.config_at(i)).collect()
        } else {
            let mut rng = crate::rng::Rng::new(n as u64 ^ hw.cores as u64);
            (0..300)
                .map(|_| space.config_at(u128::from(rng.below(n as u64))))
                .collect()
        };
        // The defaults of every own workload: configs that fit some shapes, not others.
        for w in workloads_of(k) {
            v.push(k.default_config(&w, hw));
        }
        let base = k.default_config(w, hw);
        for knob in space.knobs() {
            let mut missing = base.clone();
            missing.0.remove(&knob.name);
            v.push(missing);
            for bad in [
                Value::Int(-1),
                Value::Int(7),
                Value::Int(1 << 40),
                "x".into(),
            ] {
                let mut c = base.clone();
                c.0.insert(knob.name.clone(), bad);
                v.push(c);
            }
        }
        let mut extra = base.clone();
        extra.set("unrolled", 4usize);
        v.push(extra);
        v.push(Config::default());
        v
    }

    #[test]
    fn config_fits_agrees_with_space_check() {
        // Every ISA level (spaces follow the fingerprint, whatever this CPU runs) and
        // several thread counts.
        let here = HardwareFingerprint::current();
        // AVX-512 with AVX512_BF16, so the families that offer `vdpbf16ps` tiles only there
        // are covered too.
        let avx512 = ["avx2", "fma", "avx512f", "avx512bw", "avx512bf16"];
        let levels: [&[&str]; 3] = [&["sse4.2"], &["avx2", "fma"], &avx512];
        let hws: Vec<HardwareFingerprint> = levels
            .iter()
            .flat_map(|flags| {
                let mut hw = here.clone();
                hw.isa = flags.iter().map(|f| f.to_string()).collect();
                [1, 2, 3, 4, here.cores].map(|c| hw.with_cores(c))
            })
            .collect();
        // The CPU families, which override `config_fits` (the CUDA ones keep the default,
        // which builds the space).
        for k in registry()
            .iter()
            .copied()
            .filter(|k| k.device() == DeviceKind::Cpu)
        {
            let ws = workloads_of(k);
            let mut configs = Vec::new();
            for hw in &hws {
                configs.extend(configs_of(k, &ws[0], hw));
            }
            configs.sort();
            configs.dedup();
            let (mut fit, mut total) = (0usize, 0usize);
            for w in &ws {
                for hw in &hws {
                    let space = k.space(w, hw);
                    for c in &configs {
                        let want = space.check(c).is_ok();
                        assert_eq!(
                            k.config_fits(w, hw, c),
                            want,
                            "{} on {w} ({} cores): {c} (space check: {:?})",
                            k.name(),
                            hw.cores,
                            space.check(c)
                        );
                        fit += usize::from(want);
                        total += 1;
                    }
                }
            }
            // The comparison covers both answers.
            assert!(fit > 0 && fit < total, "{}: {fit} of {total} fit", k.name());
        }
    }
}
