//! # runner — verify a candidate, then time it, by one written-down protocol
//!
//! ```
//! use kernels::{default_for, HardwareFingerprint, Problem, Workload};
//! use runner::{evaluate, Protocol};
//!
//! let w: Workload = "gemm:32x32x32".parse()?;
//! let (kernel, config) = default_for(&w, HardwareFingerprint::current())?;
//! let problem = Problem::random(&w, 1);
//! let reference = problem.reference();
//! let outcome = evaluate(kernel, &w, &config, &problem, &reference, &Protocol::quick());
//! let m = outcome.measurement.expect("the default config is correct");
//! println!("{w}: {:.1} GFLOP/s (±{:.1}%)", m.gflops(w.flops()), 100.0 * m.spread);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Why it exists: a timing only counts once the candidate's output matched the f64 reference,
//! and tuning, `autokernel run` and regression benchmarks must all measure the same way, so
//! the protocol lives in one place. See [`Protocol`] for the protocol itself.
//!
//! Where a candidate runs is an [`Evaluator`]: [`InProcess`], or [`Isolated`] in a watched
//! worker process ([`worker`]) so that a candidate that segfaults, hangs or allocates without
//! bound becomes a `crashed` / `timeout` / `oom` record instead of the end of the job.
//! Finalists are re-measured interleaved ([`measure_interleaved`]) and compared by the
//! confidence intervals of their medians ([`median_ci`]).

#![warn(missing_docs)]

pub mod compare;
mod contention;
#[cfg(feature = "cuda")]
pub mod cuda;
mod evaluator;
mod interleaved;
#[cfg(target_os = "linux")]
pub mod pin;
mod protocol;
#[cfg(unix)]
pub mod worker;

pub use compare::{compare, compare_rounds, CompareError, CompareOptions, Comparison, Verdict};
pub use contention::{cpu_share, CONTENDED};
pub use evaluator::{derived_timeout, Contender, EvalError, Evaluation, Evaluator, InProcess};
pub use interleaved::{
    measure_interleaved, median_ci, not_slower, overlaps, remeasure_limit, time_cap,
};
pub use protocol::{measure, Protocol};
#[cfg(unix)]
pub use worker::{Isolated, Worker, WorkerError, WorkerSpec, DEFAULT_MEM_LIMIT_MB};

use std::panic::{catch_unwind, AssertUnwindSafe};

use kernels::{
    Accuracy, Config, Executable, Kernel, Measurement, Problem, Reference, Status, Workload,
};

/// What happened to one candidate: a verified timing, or a failure with its reason.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// How it ended: [`Status::Ok`] for a verified timing, otherwise the kind of failure.
    pub status: Status,
    /// What went wrong, for a failure: the build error, the panic message, the mismatch
    /// against the reference, or how the worker process died. `None` for [`Status::Ok`].
    pub message: Option<String>,
    /// The timing by the [`Protocol`], for [`Status::Ok`] only; `None` for a failure.
    pub measurement: Option<Measurement>,
    /// The verified output's error against the exact f32 problem (`None` for a failure, or
    /// where the evaluator does not see the output).
    pub accuracy: Option<Accuracy>,
}

impl Outcome {
    fn failed(status: Status, message: String) -> Self {
        Outcome {
            status,
            message: Some(message),
            measurement: None,
            accuracy: None,
        }
    }
}

/// Runs `exe` once on `problem` and compares with `reference`; the output's [`Accuracy`] if it
/// is within the tolerance. A panic inside the kernel is caught and reported as
/// [`Status::RunFailed`].
pub fn verify(
    exe: &dyn Executable,
    problem: &Problem,
    reference: &Reference,
) -> Result<Accuracy, Outcome> {
    // Poison the output so a kernel that forgets to write an element cannot pass by luck.
    let mut out = vec![f32::NAN; problem.workload.output_len()];
    let inputs = problem.input_slices();
    catch_unwind(AssertUnwindSafe(|| exe.run_f32(&inputs, &mut out)))
        .map_err(|p| {
            Outcome::failed(
                Status::RunFailed,
                format!("panicked: {}", panic_message(&p)),
            )
        })?
        .map_err(|e| Outcome::failed(Status::RunFailed, e.to_string()))?;
    problem
        .check(&out, reference)
        .map_err(|m| Outcome::failed(Status::WrongResult, m.to_string()))?;
    Ok(problem.accuracy(&out, reference))
}

/// Build → verify → time one config of `kernel`. Never panics on a bad candidate: every
/// failure comes back as an [`Outcome`] with its status.
pub fn evaluate(
    kernel: &dyn Kernel,
    workload: &Workload,
    config: &Config,
    problem: &Problem,
    reference: &Reference,
    protocol: &Protocol,
) -> Outcome {
    match evaluator::build(kernel, workload, config) {
        Ok(exe) => evaluate_prepared(exe.as_ref(), problem, reference, protocol),
        Err(e) => Outcome::failed(Status::BuildFailed, e.to_string()),
    }
}

/// Verify → time an already-built executable.
pub fn evaluate_prepared(
    exe: &dyn Executable,
    problem: &Problem,
    reference: &Reference,
    protocol: &Protocol,
) -> Outcome {
    let accuracy = match verify(exe, problem, reference) {
        Ok(a) => a,
        Err(failure) => return failure,
    };
    match catch_unwind(AssertUnwindSafe(|| measure(exe, problem, protocol))) {
        Ok(m) => Outcome {
            status: Status::Ok,
            message: None,
            measurement: Some(m),
            accuracy: Some(accuracy),
        },
        Err(p) => Outcome::failed(
            Status::RunFailed,
            format!("panicked while timing: {}", panic_message(&p)),
        ),
    }
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels::{HardwareFingerprint, Space};

    /// A deliberately broken kernel: correct except for one element, or panicking.
    struct Broken {
        panic: bool,
    }
    struct BrokenExe {
        panic: bool,
        n: usize,
        k: usize,
    }
    impl Executable for BrokenExe {
        fn run(
            &self,
            inputs: &[kernels::Operand<'_>],
            out: kernels::OperandMut<'_>,
        ) -> kernels::Result<()> {
            if self.panic {
                panic!("planted panic");
            }
            let (Some(kernels::Operand::F32(a)), Some(kernels::Operand::F32(b))) =
                (inputs.first(), inputs.get(1))
            else {
                unreachable!("the tests pass f32 operands")
            };
            let kernels::OperandMut::F32(out) = out else {
                unreachable!("the tests pass an f32 output")
            };
            let m = out.len() / self.n;
            for i in 0..m {
                for j in 0..self.n {
                    out[i * self.n + j] = (0..self.k)
                        .map(|p| a[i * self.k + p] * b[p * self.n + j])
                        .sum();
                }
            }
            out[out.len() - 1] += 1.0;
            Ok(())
        }
    }
    impl Kernel for Broken {
        fn name(&self) -> &'static str {
            "broken"
        }
        fn version(&self) -> u32 {
            1
        }
        fn supports(&self, _: &Workload) -> bool {
            true
        }
        fn space(&self, _: &Workload, _: &HardwareFingerprint) -> Space {
            Space::new().knob("x", [1usize])
        }
        fn default_config(&self, _: &Workload, _: &HardwareFingerprint) -> Config {
            Config::from_pairs([("x", 1usize)])
        }
        fn build(&self, w: &Workload, _: &Config) -> kernels::Result<Box<dyn Executable>> {
            let Workload::Gemm { n, k, .. } = *w else {
                unreachable!("the tests only build gemm workloads")
            };
            Ok(Box::new(BrokenExe {
                panic: self.panic,
                n,
                k,
            }))
        }
    }

    fn setup() -> (Workload, Problem, Reference) {
        let w: Workload = "gemm:9x7x5".parse().unwrap();
        let p = Problem::random(&w, 3);
        let r = p.reference();
        (w, p, r)
    }

    #[test]
    fn wrong_answers_and_panics_are_failures_not_crashes() {
        let (w, p, r) = setup();
        let cfg = Config::from_pairs([("x", 1usize)]);
        let o = evaluate(
            &Broken { panic: false },
            &w,
            &cfg,
            &p,
            &r,
            &Protocol::quick(),
        );
        assert_eq!(o.status, Status::WrongResult);
        assert!(o.message.unwrap().contains("row 8, col 6"));
        assert!(o.measurement.is_none());
        let o = evaluate(
            &Broken { panic: true },
            &w,
            &cfg,
            &p,
            &r,
            &Protocol::quick(),
        );
        assert_eq!(o.status, Status::RunFailed);
        assert!(o.message.unwrap().contains("planted panic"));
        let bad = Config::from_pairs([("x", 2usize)]);
        let o = evaluate(
            &Broken { panic: false },
            &w,
            &bad,
            &p,
            &r,
            &Protocol::quick(),
        );
        assert_eq!(o.status, Status::BuildFailed);
        assert!(o.message.unwrap().contains("not one of its values"));
    }

    #[test]
    fn every_registered_default_verifies_and_times() {
        let (w, p, r) = setup();
        for k in kernels::kernels_for(&w, HardwareFingerprint::current()) {
            let cfg = k.default_config(&w, HardwareFingerprint::current());
            let o = evaluate(k, &w, &cfg, &p, &r, &Protocol::quick());
            assert_eq!(o.status, Status::Ok, "{}: {:?}", k.name(), o.message);
            let m = o.measurement.unwrap();
            assert!(m.samples.len() >= Protocol::quick().min_samples);
            assert!(m.median_s > 0.0);
        }
    }
}
