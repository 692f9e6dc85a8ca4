//! The isolating evaluator against real worker processes that really crash.
//!
//! The workers are this test binary itself: started with `--exact worker_child` and
//! `RUNNER_TEST_WORKER=1`, the `worker_child` "test" below serves the worker protocol (with
//! the `planted_faults` family resolvable) instead of returning. libtest's own chatter on
//! stdout is ignored by the protocol (replies carry a prefix).

use std::ffi::OsString;
use std::time::{Duration, Instant};

use kernels::cpu::planted::PlantedFaults;
use kernels::{default_for, Config, DType, HardwareFingerprint, Kernel, Status, Workload};
use runner::worker::serve_stdio;
use runner::{Contender, EvalError, Evaluator, Isolated, Protocol, WorkerError, WorkerSpec};

const CHILD_ENV: &str = "RUNNER_TEST_WORKER";

fn resolve(name: &str) -> Option<&'static dyn Kernel> {
    if name == PlantedFaults.name() {
        Some(&PlantedFaults)
    } else {
        kernels::kernel(name).ok()
    }
}

/// Not a test: the worker's entry point when this binary is started as a worker.
#[test]
fn worker_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let code = match serve_stdio(&resolve) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("worker: {e}");
            1
        }
    };
    std::process::exit(code);
}

fn spec() -> WorkerSpec {
    let mut spec = WorkerSpec::new(
        std::env::current_exe().unwrap(),
        [
            "--exact",
            "worker_child",
            "--nocapture",
            "--test-threads",
            "1",
        ],
    );
    spec.env = vec![(OsString::from(CHILD_ENV), OsString::from("1"))];
    spec.fingerprint = Some(HardwareFingerprint::current().id.clone());
    spec
}

fn fault(name: &str) -> Config {
    Config::from_pairs([("fault", name)])
}

fn workload() -> Workload {
    "gemm:16x12x8".parse().unwrap()
}

#[test]
fn every_planted_fault_gets_its_status_and_the_worker_comes_back() {
    let mut spec = spec();
    spec.mem_limit_bytes = Some(256 << 20);
    let mut ev = Isolated::new(spec, Duration::from_secs(60));
    ev.setup(&workload(), 7).unwrap();
    let p = Protocol::quick();
    let ok = ev.evaluate(&PlantedFaults, &fault("none"), &p).unwrap();
    assert_eq!(ok.outcome.status, Status::Ok, "{:?}", ok.outcome.message);
    // Generous enough for the oom config to reach the limit on a loaded 2-core machine.
    ev.set_timeout(Duration::from_secs(3));

    for (name, want, needle) in [
        ("segfault", Status::Crashed, "SIGSEGV"),
        ("abort", Status::Crashed, "SIGABRT"),
        // `ud2` on x86-64; other architectures plant an abort.
        (
            "illegal",
            Status::Crashed,
            if cfg!(target_arch = "x86_64") {
                "SIGILL"
            } else {
                "SIGABRT"
            },
        ),
        ("oom", Status::Oom, "memory allocation of"),
        ("hang", Status::Timeout, "3.0 s"),
        ("wrong", Status::WrongResult, "wrong result"),
        ("panic", Status::RunFailed, "planted panic"),
        ("none", Status::Ok, ""),
    ] {
        let t = Instant::now();
        let e = ev.evaluate(&PlantedFaults, &fault(name), &p).unwrap();
        let msg = e.outcome.message.clone().unwrap_or_default();
        assert_eq!(e.outcome.status, want, "{name}: {msg}");
        assert!(msg.contains(needle), "{name}: {msg}");
        assert_eq!(
            e.outcome.measurement.is_some(),
            want == Status::Ok,
            "{name}"
        );
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{name} took {:?}",
            t.elapsed()
        );
    }
    // One restart per process-killing fault (segfault, abort, illegal, oom, hang); wrong
    // results and panics are survived.
    assert_eq!(ev.restarts(), 5);

    // The restarted worker was set up again: finalists re-measure on the same problem.
    let w = workload();
    let hw = HardwareFingerprint::current();
    let (dk, dc) = default_for(&w, hw).unwrap();
    let ms = ev
        .remeasure(
            &[
                Contender::of(&w, &PlantedFaults, fault("none")),
                Contender::of(&w, dk, dc.clone()),
            ],
            &p,
            5,
        )
        .unwrap();
    assert_eq!(ms.len(), 2);
    assert!(ms.iter().all(|m| m.samples.len() == 5));
    // The winners of the shape's other precisions re-measure beside it, each built and
    // verified in its own element type.
    let mut side_by_side = vec![Contender::of(&w, dk, dc)];
    for d in [DType::Bf16, DType::I8] {
        let (k, c) = default_for(&w.with_dtype(d), hw).unwrap();
        side_by_side.push(Contender {
            kernel: k,
            config: c,
            dtype: d,
        });
    }
    let ms = ev.remeasure(&side_by_side, &p, 4).unwrap();
    assert_eq!(ms.len(), 3);
    assert!(ms.iter().all(|m| m.samples.len() == 4 && m.median_s > 0.0));
    // An f32 kernel asked to run the shape in int8 fails to build, named.
    let wrong = Contender {
        dtype: DType::I8,
        ..side_by_side[0].clone()
    };
    let e = ev.remeasure(&[wrong], &p, 3).unwrap_err();
    assert!(
        matches!(
            &e,
            EvalError::Remeasure {
                status: Status::RunFailed,
                message,
                ..
            } if message.contains("build_failed")
        ),
        "{e}"
    );
    // A finalist that fails re-verification fails the re-measurement, with its name.
    let e = ev
        .remeasure(&[Contender::of(&w, &PlantedFaults, fault("wrong"))], &p, 3)
        .unwrap_err();
    assert!(
        matches!(
            e,
            EvalError::Remeasure {
                status: Status::RunFailed,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("wrong_result"), "{e}");
}

#[test]
fn limits_and_pinning_reach_the_worker_process() {
    let mut spec = spec();
    spec.mem_limit_bytes = Some(1 << 30);
    spec.cpus = vec![0];
    // Pinned to one CPU, rayon's pool in the worker has one thread: another fingerprint.
    spec.fingerprint = Some(HardwareFingerprint::current().with_cores(1).id);
    let mut ev = Isolated::new(spec, Duration::from_secs(60));
    ev.setup(&workload(), 1).unwrap();
    let pid = ev.worker().pid().expect("running after setup");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let allowed = status
        .lines()
        .find(|l| l.starts_with("Cpus_allowed_list:"))
        .unwrap();
    assert_eq!(allowed.split_whitespace().nth(1), Some("0"), "{allowed}");
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let data = limits
        .lines()
        .find(|l| l.starts_with("Max data size"))
        .unwrap();
    assert!(data.contains(&(1u64 << 30).to_string()), "{data}");
    let e = ev
        .evaluate(&PlantedFaults, &fault("none"), &Protocol::quick())
        .unwrap();
    assert_eq!(e.outcome.status, Status::Ok);
}

#[test]
fn a_worker_on_another_fingerprint_is_refused() {
    let mut spec = spec();
    spec.fingerprint = Some("0123456789abcdef".into());
    let mut ev = Isolated::new(spec, Duration::from_secs(60));
    let e = ev.setup(&workload(), 1).unwrap_err();
    assert!(
        matches!(
            e,
            EvalError::Worker(WorkerError::FingerprintMismatch { .. })
        ),
        "{e}"
    );
}
