//! Offline replay against small recorded spaces (real measurements of this project's GEMM
//! kernels, in tests/data/): the file format, determinism, the metrics, and export from a
//! tuning database.

use std::path::{Path, PathBuf};

use costmodel::ModelKind;
use kernels::{HardwareFingerprint, Status, Workload};
use search::replay::{evaluate_model, median_trials, summarize, Entry};
use search::{
    tune, RecordedSpace, ReplayError, ReplayOptions, Replayer, StrategyKind, TuneOptions,
};
use tuning_db::TuningDb;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn small() -> RecordedSpace {
    RecordedSpace::read(&data("gemm_16x64x48.jsonl")).unwrap()
}

fn other() -> RecordedSpace {
    RecordedSpace::read(&data("gemm_24x48x40.jsonl")).unwrap()
}

/// Equal entries, times to the last bit or two (JSON floats need not parse back exactly).
fn assert_same(a: &[Entry], b: &[Entry]) {
    assert_eq!(a.len(), b.len());
    let close = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) => (x - y).abs() <= 1e-12 * x.abs(),
        (x, y) => x == y,
    };
    for (x, y) in a.iter().zip(b) {
        assert_eq!(
            (&x.kernel, x.kernel_version, &x.config, x.status, x.default),
            (&y.kernel, y.kernel_version, &y.config, y.status, y.default)
        );
        assert!(
            close(x.median_s, y.median_s) && close(x.spread, y.spread),
            "{x:?} {y:?}"
        );
    }
}

#[test]
fn recorded_spaces_read_and_round_trip() {
    let s = small();
    assert_eq!(s.workload, "gemm:16x64x48".parse::<Workload>().unwrap());
    assert_eq!(s.entries.len(), 84);
    assert_eq!(s.entries.iter().filter(|e| e.default).count(), 1);
    let best = s.best_s().unwrap();
    assert!(best > 0.0);
    assert_eq!(s.count_within(1.0), 1);
    assert_eq!(s.random_expected_trials(1.0), 85.0 / 2.0);
    let mut buf = Vec::new();
    s.write_to(&mut buf, "test").unwrap();
    let back = RecordedSpace::from_reader(&buf[..], Path::new("mem")).unwrap();
    assert_same(&back.entries, &s.entries);
    assert_eq!(back.hw, s.hw);
}

#[test]
fn malformed_space_files_are_refused_with_their_line() {
    let s = small();
    let mut buf = Vec::new();
    s.write_to(&mut buf, "test").unwrap();
    let text = String::from_utf8(buf).unwrap();
    let parse =
        |t: &str| RecordedSpace::from_reader(t.as_bytes(), Path::new("f.jsonl")).unwrap_err();
    assert!(matches!(parse(""), ReplayError::Parse { line: 1, .. }));
    assert!(matches!(
        parse("{\"x\":1}\n"),
        ReplayError::Parse { line: 1, .. }
    ));
    let v2 = text.replacen("\"version\":1", "\"version\":2", 1);
    assert!(parse(&v2).to_string().contains("version 2"));
    // An ok entry without a time, on line 3.
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    let mut e: Entry = serde_json::from_str(&lines[2]).unwrap();
    e.median_s = None;
    e.status = Status::Ok;
    lines[2] = serde_json::to_string(&e).unwrap();
    let err = parse(&lines.join("\n"));
    assert!(matches!(err, ReplayError::Parse { line: 3, .. }), "{err}");
    // A duplicated candidate (and so a count mismatch, fixed up in the header).
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    lines[2] = lines[1].clone();
    assert!(parse(&lines.join("\n")).to_string().contains("twice"));
    let truncated: Vec<&str> = text.lines().take(10).collect();
    assert!(parse(&truncated.join("\n"))
        .to_string()
        .contains("header says 84"));
}

#[test]
fn replay_is_deterministic_and_reaches_the_best() {
    let s = small();
    let o = other();
    let r = Replayer::new(&s, &[&o]);
    let opts = ReplayOptions {
        budget: 84,
        batch: 8,
    };
    for kind in [
        "random",
        "annealing",
        "evolutionary",
        "model",
        "model-notransfer",
    ] {
        let kind: StrategyKind = kind.parse().unwrap();
        let a = r.run(kind, 3, &opts);
        assert_eq!(a, r.run(kind, 3, &opts), "{kind} is deterministic");
        assert_eq!(a.best_so_far.len(), 84);
        assert!(
            a.best_so_far.windows(2).all(|w| w[1] <= w[0]),
            "best so far never worsens"
        );
        // With the whole space as budget every strategy finds the best.
        assert_eq!(*a.best_so_far.last().unwrap(), r.best_s(), "{kind}");
        // The replay stops at the end of the batch that found the best.
        let found = a.trials_to(r.best_s(), 1.0).unwrap();
        assert!(
            found <= a.played && a.played < found + 8,
            "{kind}: {found} {}",
            a.played
        );
    }
    let exhaustive = r.run(StrategyKind::Exhaustive, 0, &opts);
    let best_index = s
        .entries
        .iter()
        .position(|e| e.median_s == s.best_s())
        .unwrap();
    assert_eq!(exhaustive.trials_to(r.best_s(), 1.0), Some(best_index + 1));
}

#[test]
fn summaries_report_medians_over_seeds_and_transfer_helps() {
    let s = small();
    let o = other();
    let r = Replayer::new(&s, &[&o]);
    let opts = ReplayOptions {
        budget: 84,
        batch: 8,
    };
    let random = summarize(&r, "small", StrategyKind::Random, 0, 9, &opts);
    let model = summarize(&r, "small", StrategyKind::DEFAULT, 0, 9, &opts);
    assert_eq!(random.seeds, 9);
    assert_eq!(random.curve.len(), 84);
    assert!((random.best_at_budget - 1.0).abs() < 1e-12);
    let (r95, m95) = (random.trials_to_95.unwrap(), model.trials_to_95.unwrap());
    assert!(r95 >= 10.0, "random needs {r95}");
    assert!(
        m95 * 2.0 <= r95,
        "model with transfer needs {m95}, random {r95}"
    );
    // The recorded answer itself is never transfer history.
    let selfish = Replayer::new(&s, &[&s]);
    let alone = Replayer::new(&s, &[]);
    let kind: StrategyKind = "model".parse().unwrap();
    assert_eq!(selfish.run(kind, 1, &opts), alone.run(kind, 1, &opts));
    // The order the other spaces are listed in does not matter.
    let one_order = Replayer::new(&s, &[&o, &s]);
    let other_order = Replayer::new(&s, &[&s, &o]);
    assert_eq!(
        one_order.run(kind, 2, &opts),
        other_order.run(kind, 2, &opts)
    );
    assert_eq!(one_order.run(kind, 2, &opts), r.run(kind, 2, &opts));
}

#[test]
fn median_of_trials_treats_unreached_as_last() {
    assert_eq!(median_trials(&[Some(3), Some(5), None]), Some(5.0));
    assert_eq!(median_trials(&[Some(3), None, None]), None);
    assert_eq!(median_trials(&[Some(2), Some(4)]), Some(3.0));
    assert_eq!(median_trials(&[]), None);
}

#[test]
fn models_are_scored_on_held_out_records() {
    let s = small();
    let o = other();
    for kind in ModelKind::ALL {
        let alone = evaluate_model(&s, &[], kind, 24, 0, 3).unwrap();
        let with = evaluate_model(&s, &[&o], kind, 24, 0, 3).unwrap();
        for r in [&alone, &with] {
            assert!((-1.0..=1.0).contains(&r.spearman), "{r:?}");
            assert!((0.0..=1.0).contains(&r.top_k_recall), "{r:?}");
            assert!(r.regret >= 1.0, "{r:?}");
        }
        assert!(!alone.transfer && with.transfer);
    }
    let forest = evaluate_model(&s, &[], ModelKind::Forest, 24, 0, 3).unwrap();
    assert!(forest.spearman > 0.5, "{forest:?}");
    assert!(matches!(
        evaluate_model(&s, &[], ModelKind::Forest, 3, 0, 1),
        Err(costmodel::ModelError::TooFewPoints { .. })
    ));
    // Fitting on (nearly) the whole space leaves nothing to score: an error, not metrics.
    let all = s.entries.len();
    assert!(matches!(
        evaluate_model(&s, &[], ModelKind::Forest, all, 0, 1),
        Err(costmodel::ModelError::NothingToScore { need: 10, .. })
    ));
}

#[test]
fn export_from_a_database_needs_the_whole_space() {
    let db = TuningDb::in_memory().unwrap();
    let hw = HardwareFingerprint::current();
    let w: Workload = "gemm:9x20x8".parse().unwrap();
    let opts = |budget, strategy| TuneOptions {
        budget,
        strategy,
        seed: 1,
        ..TuneOptions::default()
    };
    tune(&db, &w, hw, &opts(4, StrategyKind::Random), &mut |_| {}).unwrap();
    match RecordedSpace::from_db(&db, &w, hw) {
        Err(ReplayError::Incomplete {
            measured, total, ..
        }) => {
            assert!(measured >= 4 && measured < total)
        }
        other => panic!("expected Incomplete, got {other:?}"),
    }
    tune(
        &db,
        &w,
        hw,
        &opts(10_000, StrategyKind::Exhaustive),
        &mut |_| {},
    )
    .unwrap();
    let space = RecordedSpace::from_db(&db, &w, hw).unwrap();
    let cands = search::candidates(&w, hw, &kernels::kernels_for(&w, hw));
    assert_eq!(space.entries.len(), cands.len());
    assert_eq!(space.entries.iter().filter(|e| e.default).count(), 1);
    let fastest = db
        .trials(&hw.id, &w)
        .unwrap()
        .iter()
        .filter_map(|r| r.median_s())
        .fold(f64::INFINITY, f64::min);
    assert_eq!(space.best_s(), Some(fastest));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.jsonl");
    space.write(&path, "test").unwrap();
    assert_same(&RecordedSpace::read(&path).unwrap().entries, &space.entries);
    // A second write to the same path is refused and leaves the file as it was.
    let before = std::fs::read(&path).unwrap();
    let err = space.write(&path, "test").unwrap_err();
    assert!(
        matches!(&err, search::replay::ReplayError::Io { cause, .. } if cause.kind() == std::io::ErrorKind::AlreadyExists),
        "{err}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), before);
}
