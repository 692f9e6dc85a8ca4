//! The isolating [`Evaluator`] (`--isolation process`): the [`Evaluator`] calls as requests to
//! a watched [`Worker`], and a worker's death as the candidate's outcome.

use std::time::{Duration, Instant};

use kernels::{Config, Kernel, Measurement, Status, Workload};

use super::process::{Exchange, Worker, WorkerError, WorkerSpec};
use super::wire::{Reply, Request, WireCandidate};
use crate::evaluator::{Contender, EvalError, Evaluation, Evaluator};
use crate::protocol::Protocol;
use crate::Outcome;

/// The isolating [`Evaluator`] (`--isolation process`): every candidate runs in a [`Worker`]
/// under a deadline; a crash, hang or allocation failure becomes an outcome with status
/// `crashed`, `timeout` or `oom` and the next candidate gets a fresh worker.
pub struct Isolated {
    worker: Worker,
    timeout: Duration,
}

impl Isolated {
    /// An evaluator over workers started by `spec`, with a first time limit of `timeout`
    /// (the tuner lowers it once the default config has been timed).
    pub fn new(spec: WorkerSpec, timeout: Duration) -> Self {
        Isolated {
            worker: Worker::new(spec),
            timeout,
        }
    }

    /// The worker, for its pid and restart count.
    pub fn worker(&self) -> &Worker {
        &self.worker
    }
}

fn unexpected(reply: Reply) -> EvalError {
    WorkerError::Protocol(format!("unexpected reply {reply:?}")).into()
}

impl Evaluator for Isolated {
    fn isolation(&self) -> &'static str {
        "process"
    }

    /// On the CPUs the worker is pinned to, if it is.
    fn cpu_share(&mut self, threads: usize) -> Option<f64> {
        crate::cpu_share(threads, self.worker.cpus())
    }

    fn setup(&mut self, workload: &Workload, seed: u64) -> Result<(), EvalError> {
        Ok(self.worker.setup(workload, seed)?)
    }

    fn evaluate(
        &mut self,
        kernel: &dyn Kernel,
        config: &Config,
        protocol: &Protocol,
    ) -> Result<Evaluation, EvalError> {
        if !self.worker.is_set_up() {
            return Err(EvalError::NotSetUp);
        }
        let start = Instant::now();
        let req = Request::Evaluate {
            candidate: WireCandidate::new(kernel, config),
            protocol: protocol.into(),
        };
        match self.worker.exchange(&req, self.timeout)? {
            Exchange::Reply(Reply::Evaluated {
                status,
                message,
                measurement,
                accuracy,
                elapsed_s,
            }) => Ok(Evaluation {
                outcome: Outcome {
                    status,
                    message,
                    measurement,
                    accuracy,
                },
                elapsed: Duration::try_from_secs_f64(elapsed_s).unwrap_or(start.elapsed()),
            }),
            Exchange::Reply(Reply::Failed { message }) => {
                Err(WorkerError::Protocol(format!("evaluate refused: {message}")).into())
            }
            Exchange::Reply(other) => Err(unexpected(other)),
            Exchange::Died { status, message } => Ok(Evaluation {
                outcome: Outcome::failed(status, message),
                elapsed: start.elapsed(),
            }),
        }
    }

    fn remeasure(
        &mut self,
        finalists: &[Contender<'_>],
        protocol: &Protocol,
        rounds: usize,
    ) -> Result<Vec<Measurement>, EvalError> {
        if !self.worker.is_set_up() {
            return Err(EvalError::NotSetUp);
        }
        let req = Request::Interleave {
            candidates: finalists.iter().map(WireCandidate::contender).collect(),
            protocol: protocol.into(),
            rounds,
        };
        let failed = |status: Status, message: String| EvalError::Remeasure {
            kernel: "finalists".into(),
            config: format!("({} configs)", finalists.len()),
            status,
            message,
        };
        let limit = crate::remeasure_limit(self.timeout, protocol, finalists.len());
        match self.worker.exchange(&req, limit)? {
            Exchange::Reply(Reply::Interleaved { measurements, .. })
                if measurements.len() == finalists.len() =>
            {
                Ok(measurements)
            }
            Exchange::Reply(Reply::Failed { message }) => Err(failed(Status::RunFailed, message)),
            Exchange::Reply(other) => Err(unexpected(other)),
            Exchange::Died { status, message } => Err(failed(status, message)),
        }
    }

    fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    fn timeout(&self) -> Option<Duration> {
        Some(self.timeout)
    }

    fn restarts(&self) -> usize {
        self.worker.restarts()
    }
}
