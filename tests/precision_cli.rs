//! `tune --precision` and the precision policy of `lookup` / `run`: the command-line contract
//! of reduced precision as a tuned dimension. Nothing here depends on which type wins.

mod common;
use common::{autokernel, ok_json_lines, stderr};

#[test]
fn tune_in_several_precisions_then_serve_by_policy() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("p.db");
    let db = db.to_str().unwrap();
    let w = "gemm:24x40x33";
    let tune = |extra: &[&str]| {
        let mut all = vec![
            "tune",
            "--workload",
            w,
            "--precision",
            "f32,int8,bf16",
            "--budget",
            "3",
            "--db",
            db,
            "--isolation",
            "none",
        ];
        all.extend_from_slice(extra);
        autokernel(&all)
    };
    let o = tune(&["--json"]);
    let lines = ok_json_lines(&o);
    let keys: Vec<&str> = lines
        .iter()
        .map(|l| l["workload"].as_str().unwrap())
        .collect();
    assert_eq!(keys, [w, "gemm:24x40x33:i8", "gemm:24x40x33:bf16"]);
    for l in &lines {
        let e = l["max_rel_err_vs_f32"]
            .as_f64()
            .expect("accuracy stored and reported");
        assert!((0.0..0.05).contains(&e), "{l}");
    }

    let lookup = |args: &[&str]| {
        let mut all = vec!["lookup", "--workload", w, "--db", db, "--json"];
        all.extend_from_slice(args);
        ok_json_lines(&autokernel(&all)).remove(0)
    };
    // The default policy serves f32 and reports every precision with its stored error.
    let f = lookup(&[]);
    assert_eq!(f["served_as"], w);
    assert_eq!(f["workload"], w);
    assert_eq!(f["precision"], "f32");
    for d in ["f32", "i8", "bf16"] {
        assert_eq!(f["precisions"][d]["level"], "exact", "{f}");
        assert!(f["precisions"][d]["median_s"].as_f64().unwrap() > 0.0);
    }
    let (ef, ei) = (
        f["precisions"]["f32"]["rel_err"].as_f64().unwrap(),
        f["precisions"]["i8"]["rel_err"].as_f64().unwrap(),
    );
    assert!(ef < 1e-5 && ei > ef, "int8 costs accuracy: {ef} vs {ei}");
    assert_eq!(f["rel_err"].as_f64(), Some(ef));
    // int8 asked for: served in int8, unless the budget is below its stored error.
    // `workload` is the call as asked (as from C and Python), `served_as` what serves it.
    let i = lookup(&["--precision", "int8"]);
    assert_eq!(i["workload"], w);
    assert_eq!(i["served_as"], "gemm:24x40x33:i8");
    assert_eq!(i["dtype"], "i8");
    assert_eq!(i["kernel"], "gemm_i8");
    let tight = format!("{:e}", ei / 2.0);
    let t = lookup(&["--precision", "int8", "--max-rel-err", &tight]);
    assert_eq!((&t["workload"], &t["served_as"]), (&w.into(), &w.into()));
    let eb = f["precisions"]["bf16"]["rel_err"].as_f64().unwrap();
    assert!(eb > ef, "bf16 costs accuracy: {ef} vs {eb}");
    let b = lookup(&["--precision", "bf16"]);
    assert_eq!(
        (&b["kernel"], &b["dtype"]),
        (&"gemm_bf16".into(), &"bf16".into())
    );
    // The job ended by re-measuring the three winners side by side, in one set of rounds
    // (quietly with --json): those are the medians every precision reports (and `auto`
    // compares).
    assert!(!stderr(&o).contains("side by side"), "{}", stderr(&o));
    let conn = rusqlite::Connection::open(db).unwrap();
    let (sets, mut side_by_side): (i64, Vec<f64>) = (
        conn.query_row("SELECT count(DISTINCT set_id) FROM side_by_side", [], |r| {
            r.get(0)
        })
        .unwrap(),
        conn.prepare("SELECT median_s FROM side_by_side")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect(),
    );
    let mut reported: Vec<f64> = ["f32", "i8", "bf16"]
        .iter()
        .map(|d| {
            assert_eq!(f["precisions"][d]["median_from"], "side_by_side", "{f}");
            f["precisions"][d]["median_s"].as_f64().unwrap()
        })
        .collect();
    side_by_side.sort_by(f64::total_cmp);
    reported.sort_by(f64::total_cmp);
    assert_eq!(sets, 1);
    // (JSON text round-trips a float to within an ulp or so.)
    let same = |a: &f64, b: &f64| (a - b).abs() <= 1e-12 * a.abs();
    assert!(
        side_by_side.len() == 3 && side_by_side.iter().zip(&reported).all(|(a, b)| same(a, b)),
        "{side_by_side:?} vs {reported:?}"
    );
    // Run again, plainly: nothing new is searched, and the winners are compared side by
    // side once more, said on stderr, into a second set (the one now served).
    let again = tune(&[]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(
        stderr(&again).contains(&format!("side by side  {w}: f32 ")),
        "{}",
        stderr(&again)
    );
    let sets: i64 = conn
        .query_row("SELECT count(DISTINCT set_id) FROM side_by_side", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(sets, 2);
    // auto: the fastest of the three measured records (as now reported), whichever it is.
    let f = lookup(&[]);
    let a = lookup(&["--precision", "auto", "--max-rel-err", "0.05"]);
    let median = |d: &str| f["precisions"][d]["median_s"].as_f64().unwrap();
    let faster = [
        (w, "f32"),
        ("gemm:24x40x33:i8", "i8"),
        ("gemm:24x40x33:bf16", "bf16"),
    ]
    .into_iter()
    .min_by(|x, y| median(x.1).total_cmp(&median(y.1)))
    .unwrap()
    .0;
    assert_eq!(a["served_as"], faster);

    // run serves through the same policy, verified against its reference.
    let o = autokernel(&[
        "run",
        "--workload",
        w,
        "--db",
        db,
        "--precision",
        "int8",
        "--json",
    ]);
    let r = ok_json_lines(&o).remove(0);
    assert_eq!(r["dtype"], "i8", "{r}");
    // As lookup describes it: the workload as asked, and what served it.
    assert_eq!(
        (&r["workload"], &r["precision"]),
        (&w.into(), &"int8".into()),
        "{r}"
    );
    assert_eq!(r["served_as"], format!("{w}:i8"), "{r}");

    // Bad names and budgets are one-line errors.
    for bad in [
        vec!["lookup", "--workload", w, "--db", db, "--precision", "fp8"],
        vec!["lookup", "--workload", w, "--db", db, "--max-rel-err=-1"],
        vec!["tune", "--workload", w, "--db", db, "--precision", "int4"],
    ] {
        let o = autokernel(&bad);
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", stderr(&o));
        assert_eq!(stderr(&o).trim().lines().count(), 1, "{}", stderr(&o));
    }
}
