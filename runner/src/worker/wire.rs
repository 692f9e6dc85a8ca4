//! The wire format between the tuner and a worker process: the [`Request`]s the tuner writes
//! to the worker's stdin and the [`Reply`]s the worker writes to its stdout, one JSON object
//! per line, every reply line after [`REPLY_PREFIX`].

use std::time::Duration;

use serde::{Deserialize, Serialize};

use kernels::{Accuracy, Config, DType, Kernel, Measurement, Status, Workload};

use crate::protocol::Protocol;

/// Every reply line of the worker starts with this.
pub const REPLY_PREFIX: &str = "@autokernel-worker ";

/// [`Protocol`] on the wire (durations in seconds).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WireProtocol {
    /// [`Protocol::warmup`], seconds.
    pub warmup_s: f64,
    /// [`Protocol::min_sample`], seconds.
    pub min_sample_s: f64,
    /// [`Protocol::min_samples`].
    pub min_samples: usize,
    /// [`Protocol::max_samples`].
    pub max_samples: usize,
    /// [`Protocol::max_time`], seconds.
    pub max_time_s: f64,
    /// [`Protocol::target_ci`], relative (0.02 = ±2%).
    pub target_ci: f64,
}

impl From<&Protocol> for WireProtocol {
    fn from(p: &Protocol) -> Self {
        WireProtocol {
            warmup_s: p.warmup.as_secs_f64(),
            min_sample_s: p.min_sample.as_secs_f64(),
            min_samples: p.min_samples,
            max_samples: p.max_samples,
            max_time_s: p.max_time.as_secs_f64(),
            target_ci: p.target_ci,
        }
    }
}

impl WireProtocol {
    /// The protocol, or why these numbers are not one.
    pub fn to_protocol(&self) -> Result<Protocol, String> {
        let secs = |name: &str, s: f64| {
            Duration::try_from_secs_f64(s).map_err(|e| format!("protocol {name} {s}: {e}"))
        };
        Ok(Protocol {
            warmup: secs("warmup_s", self.warmup_s)?,
            min_sample: secs("min_sample_s", self.min_sample_s)?,
            min_samples: self.min_samples,
            max_samples: self.max_samples,
            max_time: secs("max_time_s", self.max_time_s)?,
            target_ci: self.target_ci,
        })
    }
}

/// A kernel family and config, named as the worker's registry knows them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WireCandidate {
    /// The kernel family's name ([`Kernel::name`]), resolved by the worker's [`Resolver`].
    ///
    /// [`Resolver`]: crate::worker::Resolver
    pub kernel: String,
    /// The family's version ([`Kernel::version`]): a worker whose family has another version
    /// answers with a `build_failed` outcome rather than time different code.
    pub version: u32,
    /// The config to build.
    pub config: Config,
    /// The element type to build it for, the set-up workload's shape in that type (in a
    /// re-measurement, [`Contender::dtype`](crate::Contender)); absent: the set-up
    /// workload's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<DType>,
}

impl WireCandidate {
    /// `kernel`'s name and version with a copy of `config`.
    pub fn new(kernel: &dyn Kernel, config: &Config) -> Self {
        WireCandidate {
            kernel: kernel.name().to_string(),
            version: kernel.version(),
            config: config.clone(),
            dtype: None,
        }
    }

    /// A re-measurement's contender, with its element type.
    pub fn contender(c: &crate::Contender<'_>) -> Self {
        WireCandidate {
            dtype: Some(c.dtype),
            ..WireCandidate::new(c.kernel, &c.config)
        }
    }
}

/// What the tuner asks the worker, one JSON object per line.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Make the test problem (`Problem::random(workload, seed)`) and its reference. The
    /// workload travels in its text form (`"gemm:64x64x64"`), parsed once, on receipt.
    Setup {
        /// The workload whose problem every later request measures on.
        workload: Workload,
        /// Seed of the problem's random inputs: the same seed gives the same inputs.
        seed: u64,
    },
    /// Build, verify and time one candidate on the current problem.
    Evaluate {
        /// The candidate.
        candidate: WireCandidate,
        /// The timing protocol to measure it by.
        protocol: WireProtocol,
    },
    /// Re-verify, then time the candidates interleaved for `rounds` rounds.
    Interleave {
        /// The finalists; the reply's measurements come in this order.
        candidates: Vec<WireCandidate>,
        /// The protocol: its warm-up and sample length apply to each candidate, and its
        /// limits may end the rounds early ([`measure_interleaved`](crate::measure_interleaved)).
        protocol: WireProtocol,
        /// Most rounds to run, each taking one sample of every candidate (at least one round
        /// is run).
        rounds: usize,
    },
}

/// What the worker answers, one JSON object per line after [`REPLY_PREFIX`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    /// Sent once, at start.
    Ready {
        /// The worker's process id.
        pid: u32,
        /// The id of the worker's hardware fingerprint, which the tuner checks against its
        /// own ([`WorkerSpec::fingerprint`](crate::worker::WorkerSpec::fingerprint)).
        fingerprint: String,
    },
    /// The answer to [`Request::Setup`]: the problem is made.
    SetupDone {
        /// The workload set up.
        workload: Workload,
        /// Seconds making the problem and its reference took.
        elapsed_s: f64,
    },
    /// The answer to [`Request::Evaluate`]: the candidate's [`Outcome`](crate::Outcome),
    /// field by field.
    Evaluated {
        /// How the candidate ended.
        status: Status,
        /// What went wrong, for a failure.
        message: Option<String>,
        /// The timing, for a candidate that passed verification.
        measurement: Option<Measurement>,
        /// The verified output's error against the exact f32 problem; `None` for a failure,
        /// and from a worker that predates the field.
        #[serde(default)]
        accuracy: Option<Accuracy>,
        /// Seconds the evaluation took in the worker (build, verification and timing).
        elapsed_s: f64,
    },
    /// The answer to [`Request::Interleave`].
    Interleaved {
        /// One measurement per candidate, in the request's order, one sample per round.
        measurements: Vec<Measurement>,
        /// Seconds the re-verification and timing took.
        elapsed_s: f64,
    },
    /// The request could not be served (malformed, no problem set up, a finalist failed).
    Failed {
        /// Why, in words (for a failed finalist: its kernel, config, status and message).
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip_as_json_lines() {
        let req = Request::Evaluate {
            candidate: WireCandidate {
                kernel: "gemm_packed".into(),
                version: 3,
                config: Config::from_pairs([("kc", 256usize)]),
                dtype: None,
            },
            protocol: (&Protocol::quick()).into(),
        };
        let line = serde_json::to_string(&req).unwrap();
        assert!(line.starts_with(r#"{"op":"evaluate""#), "{line}");
        assert!(!line.contains('\n'));
        assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), req);
        assert!(!line.contains("dtype"), "{line}");
        let Request::Evaluate { protocol, .. } = req.clone() else {
            unreachable!()
        };
        assert_eq!(protocol.to_protocol().unwrap(), Protocol::quick());
        let bad = WireProtocol {
            warmup_s: -1.0,
            ..protocol
        };
        assert!(bad.to_protocol().unwrap_err().contains("warmup_s"));
    }

    #[test]
    fn the_workload_travels_typed_in_its_text_form() {
        let req = Request::Setup {
            workload: "gemm:9x8x7".parse().unwrap(),
            seed: 3,
        };
        let line = serde_json::to_string(&req).unwrap();
        assert_eq!(line, r#"{"op":"setup","workload":"gemm:9x8x7","seed":3}"#);
        assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), req);
        let bad = r#"{"op":"setup","workload":"gemm:9x","seed":3}"#;
        assert!(serde_json::from_str::<Request>(bad).is_err());
    }
}
