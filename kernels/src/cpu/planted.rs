//! `planted_faults`: a GEMM family whose configs fail on purpose, for testing the tuner's
//! crash isolation. Compiled only with the `planted-faults` cargo feature, and registered in
//! [`registry()`](crate::registry()) only when the environment variable
//! [`ENV_VAR`] (`AUTOKERNEL_PLANTED_FAULTS`) is `1` in the process.
//!
//! Why two gates: the feature keeps this code out of every normal build; the variable keeps it
//! out of the registry of test binaries that were compiled with the feature only because
//! cargo unifies features across a workspace test build (`cargo test --workspace` would
//! otherwise hand a segfaulting family to every in-process test that tunes over the registry).
//!
//! The knob `fault` picks the behaviour of [`Executable::run`]:
//!
//! | fault      | what the candidate does                         | expected status |
//! |------------|-------------------------------------------------|-----------------|
//! | `none`     | a correct naive GEMM                            | `ok`            |
//! | `slow`     | the same GEMM computed three times (correct)    | `ok`            |
//! | `wrong`    | the GEMM with one element off by 1.0            | `wrong_result`  |
//! | `panic`    | `panic!`                                        | `run_failed`    |
//! | `segfault` | writes through an invalid pointer               | `crashed`       |
//! | `abort`    | `std::process::abort()`                         | `crashed`       |
//! | `illegal`  | executes an undefined instruction (`ud2`)       | `crashed`       |
//! | `hang`     | spins forever                                   | `timeout`       |
//! | `oom`      | allocates memory without bound (64 MiB at a time) | `oom`         |
//!
//! Run in-process, every fault but `none`, `slow`, `wrong` and `panic` takes the whole process
//! down with it: that is the point. Only tune this family with process isolation.

use std::sync::OnceLock;

use crate::error::{Error, Result};
use crate::hardware::HardwareFingerprint;
use crate::kernel::{Executable, Kernel};
use crate::operand::{host_f32, Operand, OperandMut};
use crate::space::{Config, Space};
use crate::workload::Workload;

/// The environment variable that registers the family (value `1`).
pub const ENV_VAR: &str = "AUTOKERNEL_PLANTED_FAULTS";

/// Every value of the `fault` knob, healthy ones first.
pub const FAULTS: &[&str] = &[
    "none", "slow", "wrong", "panic", "segfault", "abort", "illegal", "hang", "oom",
];

/// The planted family (see the module docs).
pub struct PlantedFaults;

/// Whether [`ENV_VAR`] asks for the family in this process (read once).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var(ENV_VAR).is_ok_and(|v| v == "1"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    Slow,
    Wrong,
    Panic,
    Segfault,
    Abort,
    Illegal,
    Hang,
    Oom,
}

impl Fault {
    fn parse(s: &str) -> Option<Fault> {
        Some(match s {
            "none" => Fault::None,
            "slow" => Fault::Slow,
            "wrong" => Fault::Wrong,
            "panic" => Fault::Panic,
            "segfault" => Fault::Segfault,
            "abort" => Fault::Abort,
            "illegal" => Fault::Illegal,
            "hang" => Fault::Hang,
            "oom" => Fault::Oom,
            _ => return None,
        })
    }
}

struct PlantedExe {
    fault: Fault,
    m: usize,
    n: usize,
    k: usize,
}

impl PlantedExe {
    fn naive_gemm(&self, a: &[f32], b: &[f32], c: &mut [f32]) {
        let (m, n, k) = (self.m, self.n, self.k);
        assert!(a.len() == m * k && b.len() == k * n && c.len() == m * n);
        c.fill(0.0);
        for i in 0..m {
            let row = &mut c[i * n..(i + 1) * n];
            for p in 0..k {
                let aip = a[i * k + p];
                for (cij, bpj) in row.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                    *cij += aip * bpj;
                }
            }
        }
    }
}

impl Executable for PlantedExe {
    fn run(&self, inputs: &[Operand<'_>], output: OperandMut<'_>) -> crate::Result<()> {
        let w = Workload::Gemm {
            m: self.m,
            n: self.n,
            k: self.k,
            dtype: crate::DType::F32,
        };
        let ([a, b], output) = host_f32(&w, inputs, output)?;
        self.fault_in(a, b, output);
        Ok(())
    }
}

impl PlantedExe {
    fn fault_in(&self, a: &[f32], b: &[f32], output: &mut [f32]) {
        match self.fault {
            Fault::None => self.naive_gemm(a, b, output),
            Fault::Slow => {
                for _ in 0..3 {
                    self.naive_gemm(a, b, output);
                    std::hint::black_box(&mut *output);
                }
            }
            Fault::Wrong => {
                self.naive_gemm(a, b, output);
                if let Some(last) = output.last_mut() {
                    *last += 1.0;
                }
            }
            Fault::Panic => panic!("planted panic"),
            Fault::Segfault => {
                let p: *mut u64 = std::ptr::without_provenance_mut(64);
                // SAFETY: deliberately unsound, for tests only: address 64 lies in the
                // never-mapped first page (Linux refuses mappings below vm.mmap_min_addr), so
                // this store raises SIGSEGV — the fault this config exists to plant. The
                // pointer is non-null and aligned, so the precondition checks of
                // `write_volatile` pass and the real invalid access happens.
                unsafe { p.write_volatile(1) };
            }
            Fault::Abort => std::process::abort(),
            Fault::Illegal => illegal_instruction(),
            Fault::Hang => loop {
                std::hint::spin_loop();
                std::hint::black_box(&mut *output);
            },
            Fault::Oom => {
                const CHUNK: usize = 64 << 20;
                // Never touched: a memory limit on private writable memory (RLIMIT_DATA)
                // refuses the mapping itself, so the fault is quick and costs no real memory
                // even on a loaded machine, and without a limit it exhausts address space,
                // not RAM.
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(std::hint::black_box(vec![0u8; CHUNK]));
                }
            }
        }
    }
}

/// Raises SIGILL (an undefined instruction); elsewhere than x86-64, aborts instead.
fn illegal_instruction() -> ! {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: deliberately faulting, for tests only: `ud2` is the architecturally undefined
    // instruction; it touches no memory or registers and raises SIGILL, which ends the process.
    unsafe {
        std::arch::asm!("ud2", options(noreturn, nomem, nostack));
    }
    #[cfg(not(target_arch = "x86_64"))]
    std::process::abort()
}

impl Kernel for PlantedFaults {
    fn name(&self) -> &'static str {
        "planted_faults"
    }

    fn version(&self) -> u32 {
        1
    }

    fn supports(&self, w: &Workload) -> bool {
        matches!(w, Workload::Gemm { .. }) && w.dtype() == crate::DType::F32
    }

    fn space(&self, _: &Workload, _: &HardwareFingerprint) -> Space {
        Space::new().knob("fault", FAULTS.iter().copied())
    }

    fn default_config(&self, _: &Workload, _: &HardwareFingerprint) -> Config {
        Config::from_pairs([("fault", "none")])
    }

    fn build(&self, w: &Workload, c: &Config) -> Result<Box<dyn Executable>> {
        let fault = c
            .str("fault")
            .and_then(Fault::parse)
            .ok_or_else(|| Error::InvalidConfig {
                kernel: self.name().into(),
                config: c.to_json(),
                reason: "knob 'fault' must be one of the planted faults".into(),
            })?;
        let Workload::Gemm { m, n, k, .. } = *w else {
            return Err(Error::Unsupported {
                kernel: self.name().into(),
                workload: w.key(),
            });
        };
        Ok(Box::new(PlantedExe { fault, m, n, k }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::Problem;

    fn run(fault: &str, w: &Workload) -> (Problem, Vec<f32>) {
        let exe = PlantedFaults
            .build(w, &Config::from_pairs([("fault", fault)]))
            .unwrap();
        let p = Problem::random(w, 4);
        let mut out = p.output();
        exe.run_f32(&p.input_slices(), &mut out).unwrap();
        (p, out)
    }

    #[test]
    fn healthy_configs_are_correct_and_wrong_is_wrong() {
        let w: Workload = "gemm:7x5x3".parse().unwrap();
        for fault in ["none", "slow"] {
            let (p, out) = run(fault, &w);
            p.check(&out, &p.reference()).unwrap();
        }
        let (p, out) = run("wrong", &w);
        let e = p.check(&out, &p.reference()).unwrap_err();
        assert_eq!((e.row, e.col, e.bad), (6, 4, 1));
    }

    #[test]
    fn space_lists_every_fault_and_builds_only_those() {
        let w: Workload = "gemm:2x2x2".parse().unwrap();
        let hw = HardwareFingerprint::current();
        assert_eq!(PlantedFaults.space(&w, hw).count_valid(), FAULTS.len());
        for f in FAULTS {
            assert!(Fault::parse(f).is_some(), "{f}");
        }
        let bad = Config::from_pairs([("fault", "meteor")]);
        assert!(PlantedFaults.build(&w, &bad).is_err());
        assert!(PlantedFaults
            .prepare(&w, &PlantedFaults.default_config(&w, hw))
            .is_ok());
    }
}
