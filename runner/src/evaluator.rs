//! Evaluation backends: where a candidate is built, verified and timed.
//!
//! The tuning loop talks to an [`Evaluator`] and does not care where the candidate runs:
//! [`InProcess`] runs it in the tuning process itself (fastest; a candidate that segfaults or
//! hangs takes the job down with it), [`Isolated`](crate::worker::Isolated) in a watched
//! worker process (a crash, hang or runaway allocation becomes a record with status
//! `crashed`, `timeout` or `oom`, and the worker is restarted).
//!
//! Both run the same build → verify → time sequence, [`Bench`]: [`InProcess`] directly, the
//! worker process inside its server loop.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rayon::prelude::*;

use kernels::{
    Config, DType, Executable, Kernel, Measurement, Problem, Reference, Status, Workload,
};

use crate::interleaved::measure_interleaved;
use crate::protocol::Protocol;
use crate::{evaluate_prepared, verify, Outcome};

/// One candidate's outcome and how long evaluating it took (build + verify + timing), the
/// figure per-candidate timeouts are derived from.
#[derive(Debug, Clone)]
pub struct Evaluation {
    /// The candidate's verified timing, or its failure and why.
    pub outcome: Outcome,
    /// Wall time of the whole evaluation: build, verification and timing. For a candidate
    /// in a worker process, the time the worker reports, or the time until the worker died
    /// or was killed.
    pub elapsed: Duration,
}

/// Errors that stop an evaluator from evaluating anything (a candidate's failure is never one
/// of these: it is an [`Outcome`]).
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// A candidate was evaluated or re-measured before [`Evaluator::setup`] made the problem.
    #[error("no problem set up: call Evaluator::setup first")]
    NotSetUp,
    /// The device cannot be used, or cannot hold the workload's problem.
    #[error("{0}")]
    Device(String),
    /// The workload's problem cannot be made (too large for this machine's memory).
    #[error(transparent)]
    Kernel(#[from] kernels::Error),
    /// The worker process machinery failed: the worker could not be started or set up, or
    /// it broke the protocol. A candidate that kills the worker is not one of these.
    #[error(transparent)]
    Worker(#[from] crate::worker::WorkerError),
    /// A finalist failed during re-measurement (it had passed before: a flaky candidate).
    #[error("re-measuring {kernel} {config}: {status}: {message}")]
    Remeasure {
        /// The finalist's kernel family; a placeholder such as `"finalists"` where the failure
        /// cannot be pinned on one finalist (a worker that died, a panic while timing).
        kernel: String,
        /// The finalist's config as JSON; likewise a placeholder (such as `"(3 configs)"`, or
        /// empty) where the failure is not one finalist's.
        config: String,
        /// How it failed: `build_failed`, `wrong_result` or `run_failed`; `crashed`,
        /// `timeout` or `oom` where a worker process died.
        status: Status,
        /// The failure's message.
        message: String,
    },
}

/// One entry of an interleaved re-measurement ([`Evaluator::remeasure`]): a config of
/// `kernel`, built for the set-up workload's shape in element type `dtype`. That is the
/// workload's own type for a decision's finalists; the winners of one shape's precisions
/// are re-measured side by side, each in its own type, on the same inputs.
#[derive(Clone)]
pub struct Contender<'a> {
    /// The kernel family.
    pub kernel: &'a dyn Kernel,
    /// Its config.
    pub config: Config,
    /// The element type it runs the set-up shape in.
    pub dtype: DType,
}

impl<'a> Contender<'a> {
    /// `config` of `kernel` on the set-up workload `w` itself.
    pub fn of(w: &Workload, kernel: &'a dyn Kernel, config: Config) -> Self {
        Contender {
            kernel,
            config,
            dtype: w.dtype(),
        }
    }
}

impl std::fmt::Debug for Contender<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} ({})", self.kernel.name(), self.config, self.dtype)
    }
}

/// Where candidates are built, verified against the reference and timed. See the module docs.
pub trait Evaluator {
    /// `"none"` (in-process) or `"process"` (a worker process), as the CLI spells it.
    fn isolation(&self) -> &'static str;

    /// Makes the test problem for `workload`: inputs from [`Problem::random`]`(workload, seed)`
    /// and their f64 reference. Every later call measures on it.
    fn setup(&mut self, workload: &Workload, seed: u64) -> Result<(), EvalError>;

    /// Builds (or takes the prepared executable from [`prepare`](Self::prepare)), verifies and
    /// times one config of `kernel` by `protocol`. Candidate failures come back as outcomes.
    fn evaluate(
        &mut self,
        kernel: &dyn Kernel,
        config: &Config,
        protocol: &Protocol,
    ) -> Result<Evaluation, EvalError>;

    /// Re-verifies the finalists, then times them interleaved
    /// ([`measure_interleaved`]) for `rounds` rounds; one measurement per finalist, in order.
    /// Each is built and verified as the set-up shape in its [`Contender::dtype`]; all are
    /// timed on the same inputs.
    fn remeasure(
        &mut self,
        finalists: &[Contender<'_>],
        protocol: &Protocol,
        rounds: usize,
    ) -> Result<Vec<Measurement>, EvalError>;

    /// Builds a batch ahead of evaluation, in parallel where that is safe. Optional.
    fn prepare(&mut self, _batch: &[(&'static dyn Kernel, Config)]) {}

    /// Sets how long one candidate may take before it is killed and recorded as `timeout`.
    /// Ignored by evaluators that cannot enforce it.
    fn set_timeout(&mut self, _timeout: Duration) {}

    /// The per-candidate time limit in force, if this evaluator enforces one.
    fn timeout(&self) -> Option<Duration> {
        None
    }

    /// How many times a worker process was restarted after a candidate killed it.
    fn restarts(&self) -> usize {
        0
    }

    /// The share of `threads` CPUs that `threads` threads get right now, where candidates
    /// run ([`cpu_share`](crate::cpu_share)); `None` where thread counts do not apply (a GPU)
    /// or it cannot be measured. The tuner asks before it judges finalists of different
    /// thread counts.
    fn cpu_share(&mut self, threads: usize) -> Option<f64> {
        crate::cpu_share(threads, &[])
    }
}

/// The per-candidate time limit derived from the default config's evaluation time:
/// `max(2 s, 50 × elapsed)`. Generous on purpose: a candidate 50 times slower than the
/// default is not worth finishing, and a limit close to real times would turn a noisy
/// moment into a spurious `timeout`.
pub fn derived_timeout(default_elapsed: Duration) -> Duration {
    default_elapsed
        .saturating_mul(50)
        .max(Duration::from_secs(2))
}

/// The problem an evaluator measures on, its f64 reference, and the build → verify → time
/// sequence run on them: the one copy of that sequence, behind both [`InProcess`] and the
/// worker process's server loop ([`serve`](crate::worker::serve)). A candidate's failure is
/// an [`Outcome`] (or, while re-measuring, an [`EvalError::Remeasure`]), never a panic.
pub(crate) struct Bench {
    problem: Problem,
    reference: Reference,
    /// The seed of the problem's inputs: another element type's problem of the same shape
    /// ([`Problem::random`] with this seed) holds the same inputs.
    seed: u64,
    /// What [`prepare`](Self::prepare) built ahead, by kernel name and config JSON.
    prepared: HashMap<(String, String), kernels::Result<Box<dyn Executable>>>,
}

impl Bench {
    /// Inputs from [`Problem::random`]`(workload, seed)` and their f64 reference.
    pub(crate) fn setup(workload: &Workload, seed: u64) -> Self {
        let problem = Problem::random(workload, seed);
        let reference = problem.reference();
        Bench {
            problem,
            reference,
            seed,
            prepared: HashMap::new(),
        }
    }

    /// The workload set up.
    pub(crate) fn workload(&self) -> &Workload {
        &self.problem.workload
    }

    /// Builds (or takes the executable [`prepare`](Self::prepare) built), verifies and times
    /// one config of `kernel` by `protocol`.
    pub(crate) fn evaluate(
        &mut self,
        kernel: &dyn Kernel,
        config: &Config,
        protocol: &Protocol,
    ) -> Evaluation {
        let start = Instant::now();
        let key = (kernel.name().to_string(), config.to_json());
        let built = match self.prepared.remove(&key) {
            Some(b) => b,
            None => build(kernel, &self.problem.workload, config),
        };
        let outcome = match built {
            Ok(exe) => evaluate_prepared(exe.as_ref(), &self.problem, &self.reference, protocol),
            Err(e) => Outcome::failed(Status::BuildFailed, e.to_string()),
        };
        Evaluation {
            outcome,
            elapsed: start.elapsed(),
        }
    }

    /// Builds and re-verifies every finalist, then times them interleaved for `rounds`
    /// rounds: one measurement per finalist, in order, or the first finalist that failed.
    /// A finalist of another element type than the set-up workload's is verified against
    /// that type's problem of the same shape (the same inputs, that type's tolerance).
    pub(crate) fn remeasure(
        &self,
        finalists: &[Contender<'_>],
        protocol: &Protocol,
        rounds: usize,
    ) -> Result<Vec<Measurement>, EvalError> {
        let mut others: HashMap<DType, (Problem, Reference)> = HashMap::new();
        let mut exes = Vec::with_capacity(finalists.len());
        for f in finalists {
            let (problem, reference) = if f.dtype == self.problem.workload.dtype() {
                (&self.problem, &self.reference)
            } else {
                let (p, r) = others.entry(f.dtype).or_insert_with(|| {
                    let p = Problem::random(&self.problem.workload.with_dtype(f.dtype), self.seed);
                    let r = p.reference();
                    (p, r)
                });
                (&*p, &*r)
            };
            exes.push(build_verified(f, problem, reference)?);
        }
        drop(others);
        let refs: Vec<&dyn Executable> = exes.iter().map(|e| e.as_ref()).collect();
        let timed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            measure_interleaved(&refs, &self.problem, protocol, rounds)
        }));
        timed.map_err(|p| EvalError::Remeasure {
            kernel: "(one of the finalists)".into(),
            config: String::new(),
            status: Status::RunFailed,
            message: format!("panicked while timing: {}", crate::panic_message(&p)),
        })
    }

    /// Builds a batch ahead of [`evaluate`](Self::evaluate), in parallel on rayon's pool.
    pub(crate) fn prepare(&mut self, batch: &[(&'static dyn Kernel, Config)]) {
        let w = &self.problem.workload;
        let built: Vec<_> = batch
            .par_iter()
            .map(|(k, c)| ((k.name().to_string(), c.to_json()), build(*k, w, c)))
            .collect();
        self.prepared.extend(built);
    }
}

/// `kernel.prepare`, with a panic turned into an error.
pub(crate) fn build(
    kernel: &dyn Kernel,
    w: &Workload,
    config: &Config,
) -> kernels::Result<Box<dyn Executable>> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| kernel.prepare(w, config))) {
        Ok(built) => built,
        Err(p) => Err(kernels::Error::InvalidConfig {
            kernel: kernel.name().into(),
            config: config.to_json(),
            reason: format!("panicked while building: {}", crate::panic_message(&p)),
        }),
    }
}

/// A finalist, built for `problem`'s workload and verified against `reference` again (it
/// passed before: a failure now means a flaky candidate).
fn build_verified(
    f: &Contender<'_>,
    problem: &Problem,
    reference: &Reference,
) -> Result<Box<dyn Executable>, EvalError> {
    let fail = |status: Status, message: String| EvalError::Remeasure {
        kernel: f.kernel.name().into(),
        config: f.config.to_json(),
        status,
        message,
    };
    let exe = build(f.kernel, &problem.workload, &f.config)
        .map_err(|e| fail(Status::BuildFailed, e.to_string()))?;
    verify(exe.as_ref(), problem, reference)
        .map_err(|o| fail(o.status, o.message.unwrap_or_default()))?;
    Ok(exe)
}

/// Evaluates in the calling process (`--isolation none`): no protection against crashes or
/// hangs, no process start-up or pipe overhead. A thin wrapper over the build → verify → time
/// sequence a worker process runs too; [`prepare`](Evaluator::prepare) builds a batch in
/// parallel on rayon's pool.
#[derive(Default)]
pub struct InProcess {
    bench: Option<Bench>,
}

impl InProcess {
    /// An evaluator with no problem yet: [`Evaluator::setup`] comes first.
    pub fn new() -> Self {
        InProcess::default()
    }

    fn bench(&mut self) -> Result<&mut Bench, EvalError> {
        self.bench.as_mut().ok_or(EvalError::NotSetUp)
    }
}

impl Evaluator for InProcess {
    fn isolation(&self) -> &'static str {
        "none"
    }

    fn setup(&mut self, workload: &Workload, seed: u64) -> Result<(), EvalError> {
        Problem::check_memory(workload)?;
        self.bench = Some(Bench::setup(workload, seed));
        Ok(())
    }

    fn evaluate(
        &mut self,
        kernel: &dyn Kernel,
        config: &Config,
        protocol: &Protocol,
    ) -> Result<Evaluation, EvalError> {
        Ok(self.bench()?.evaluate(kernel, config, protocol))
    }

    fn remeasure(
        &mut self,
        finalists: &[Contender<'_>],
        protocol: &Protocol,
        rounds: usize,
    ) -> Result<Vec<Measurement>, EvalError> {
        self.bench()?.remeasure(finalists, protocol, rounds)
    }

    fn prepare(&mut self, batch: &[(&'static dyn Kernel, Config)]) {
        if let Some(bench) = self.bench.as_mut() {
            bench.prepare(batch);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels::{default_for, HardwareFingerprint};

    #[test]
    fn timeout_is_fifty_times_the_default_but_at_least_two_seconds() {
        assert_eq!(
            derived_timeout(Duration::from_millis(1)),
            Duration::from_secs(2)
        );
        assert_eq!(
            derived_timeout(Duration::from_millis(100)),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn in_process_evaluates_prepared_and_unprepared_configs_alike() {
        let w: Workload = "gemm:12x10x8".parse().unwrap();
        let hw = HardwareFingerprint::current();
        let (k, c) = default_for(&w, hw).unwrap();
        let mut ev = InProcess::new();
        assert!(matches!(
            ev.evaluate(k, &c, &Protocol::quick()),
            Err(EvalError::NotSetUp)
        ));
        ev.setup(&w, 1).unwrap();
        ev.prepare(&[(k, c.clone())]);
        let a = ev.evaluate(k, &c, &Protocol::quick()).unwrap();
        let b = ev.evaluate(k, &c, &Protocol::quick()).unwrap();
        assert_eq!(
            (a.outcome.status, b.outcome.status),
            (Status::Ok, Status::Ok)
        );
        assert!(a.elapsed > Duration::ZERO);
        let ms = ev
            .remeasure(
                &[
                    Contender::of(&w, k, c.clone()),
                    Contender::of(&w, k, c.clone()),
                ],
                &Protocol::quick(),
                5,
            )
            .unwrap();
        assert_eq!(ms.len(), 2);
        assert!(ms.iter().all(|m| m.samples.len() == 5 && m.median_s > 0.0));
        // The int8 form of the shape, verified against its own tolerance, beside f32.
        let (ik, ic) = default_for(&w.with_dtype(DType::I8), hw).unwrap();
        let int8 = Contender {
            kernel: ik,
            config: ic,
            dtype: DType::I8,
        };
        let ms = ev
            .remeasure(&[Contender::of(&w, k, c), int8], &Protocol::quick(), 3)
            .unwrap();
        assert!(ms.iter().all(|m| m.samples.len() == 3 && m.median_s > 0.0));
    }
}
