//! `tune --model` and `infer` on the tiny BERT: the model's workload list is tuned, every
//! kernel call of the forward pass is served by the database (exact for tuned shapes,
//! nearest_shape for the others), the output is checked against the f64 reference — and
//! that check fails on a planted fault — and bad input gets a clear error.

use serde_json::Value;

mod common;
use common::{autokernel, json_lines, stderr};

#[test]
fn tune_a_model_then_infer_with_exact_and_nearest_shape_levels() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("bert.db");
    let db = db.to_str().unwrap();
    let o = autokernel(&[
        "tune",
        "--model",
        "bert-tiny",
        "--batch",
        "1,2",
        "--seq",
        "4",
        "--db",
        db,
        "--budget",
        "1",
        "--finalists",
        "0",
        "--isolation",
        "none",
        "--threads",
        "1",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let tuned: Vec<String> = json_lines(&o)
        .iter()
        .map(|t| t["workload"].as_str().unwrap().to_string())
        .collect();
    // 5 calls per shape, none shared between M = 4 and M = 8: 10 distinct workloads.
    assert_eq!(tuned.len(), 10, "{tuned:?}");
    assert!(
        tuned.contains(&"gemm_bias:8x192x64".to_string()),
        "{tuned:?}"
    );
    assert!(
        tuned.contains(&"attention:2x4x4x16".to_string()),
        "{tuned:?}"
    );
    assert!(
        tuned.contains(&"gemm_bias_gelu:4x128x64".to_string()),
        "{tuned:?}"
    );

    // The first-use check off: which borrowed configs beat the default is the machine's call;
    // the structural levels are what this test pins down.
    let o = common::autokernel_env(
        &[
            "infer",
            "--model",
            "bert-tiny",
            "--batch",
            "2",
            "--seq",
            "4,5",
            "--db",
            db,
            "--iters",
            "2",
            "--threads",
            "1",
            "--check",
            "all",
            "--json",
        ],
        &[(runtime::FALLBACK_CHECK_ENV, "0")],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let rows = json_lines(&o);
    assert_eq!(rows.len(), 2);
    let field = |r: &Value, k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} in {r}"));
    for r in &rows {
        for k in [
            "p50_ms",
            "seqs_per_s",
            "untuned_seqs_per_s",
            "speedup_vs_untuned",
        ] {
            assert!(field(r, k) > 0.0, "{k}: {r}");
        }
        assert_eq!(r["batch"], 2);
        assert_eq!(r["checked_sequences"], 2);
        assert!(field(r, "max_abs_err") <= field(r, "tolerance"), "{r}");
        assert_eq!(r["untuned_calls"]["default"], 10, "{r}");
    }
    // Seq 4 was tuned: all 10 calls exact. Seq 5 was not: the nearest tuned shapes serve.
    assert_eq!(rows[0]["seq"], 4);
    assert_eq!(rows[0]["exact"], 10, "{}", rows[0]);
    assert_eq!(rows[1]["nearest_shape"], 10, "{}", rows[1]);
    assert_eq!(rows[1]["calls"]["nearest_shape"], 10);

    // --profile: each stage's time of the tuned pass; with --no-untuned there is no untuned
    // pass, so no untuned times (neither in the JSON nor in the text line).
    let profile = |json: bool| {
        let mut args = vec![
            "infer",
            "--model",
            "bert-tiny",
            "--batch",
            "1",
            "--seq",
            "4",
            "--db",
            db,
            "--iters",
            "1",
            "--threads",
            "1",
            "--profile",
            "--no-untuned",
        ];
        if json {
            args.push("--json");
        }
        let o = autokernel(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        o
    };
    let row = &json_lines(&profile(true))[0];
    let stages = row["profile"]["tuned_ms"].as_object().unwrap();
    let mut names: Vec<&str> = stages.keys().map(String::as_str).collect();
    let mut want = bert::StageTimes::NAMES.to_vec();
    names.sort_unstable();
    want.sort_unstable();
    assert_eq!(names, want, "{row}");
    assert!(stages.values().all(|v| v.as_f64().unwrap() >= 0.0), "{row}");
    assert!(row["profile"]["untuned_ms"].is_null(), "{row}");
    let e = stderr(&profile(false));
    let line = e
        .lines()
        .find(|l| l.contains("profile"))
        .unwrap_or_default();
    assert!(line.contains("profile, ms tuned: qkv"), "{e}");

    // The check can fail: one wrong bias value makes infer exit non-zero, naming it.
    let o = autokernel(&[
        "infer",
        "--model",
        "bert-tiny",
        "--batch",
        "2",
        "--seq",
        "4",
        "--db",
        db,
        "--iters",
        "1",
        "--plant-fault",
        "--no-untuned",
    ]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("differ from the f64 reference"), "{e}");
    assert!(e.contains("batch 2 seq 4, sequence 1 (tuned)"), "{e}");
}

#[test]
fn bad_input_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("none.db");
    let missing = missing.to_str().unwrap();
    for (args, needle) in [
        (vec!["infer", "--batch", "0"], "'0' is not a whole number"),
        (vec!["infer", "--seq", "abc"], "'abc' is not a whole number"),
        (vec!["infer", "--batch", "1,,2"], "'' is not a whole number"),
        (vec!["infer", "--model", "gpt-7"], "unknown model 'gpt-7'"),
        (
            vec!["infer", "--model", "bert-tiny", "--db", missing],
            "not found",
        ),
        (vec!["tune", "--model", "gpt-7"], "unknown model 'gpt-7'"),
        (
            vec!["tune", "--model", "bert-tiny", "--seq", "8,x"],
            "'x' is not a whole number",
        ),
        (vec!["tune", "--batch", "2"], "--model"),
    ] {
        let o = autokernel(&args);
        assert!(!o.status.success(), "{args:?}");
        let e = stderr(&o);
        assert!(e.contains(needle), "{args:?}: {e}");
        assert!(!e.contains("panicked"), "{args:?}: {e}");
    }
}

/// The tiny BERT that `transformers` saved (scripts/make-bert-fixture.py).
const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tiny-bert");

#[test]
fn roberta_distilbert_electra_and_albert_checkpoints_are_tuned_and_match_transformers() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ["roberta", "distilbert", "electra", "albert"] {
        let fixture = format!("{}/tests/fixtures/tiny-{arch}", env!("CARGO_MANIFEST_DIR"));
        let db = dir.path().join(format!("{arch}.db"));
        let db = db.to_str().unwrap();
        let mut args = vec!["tune", "--model", &fixture, "--db", db, "--budget", "1"];
        args.extend(["--finalists", "0", "--isolation", "none", "--threads", "1"]);
        let o = autokernel(&args);
        assert!(o.status.success(), "{arch}: {}", stderr(&o));
        // Its saved batch (4 sequences padded to 11), checked against transformers.
        let o = common::autokernel_env(
            &[
                "infer",
                "--model",
                &fixture,
                "--db",
                db,
                "--iters",
                "1",
                "--json",
                "--threads",
                "1",
            ],
            &[("AUTOKERNEL_FALLBACK_CHECK", "0")],
            &[],
        );
        let rows = common::ok_json_lines(&o);
        let r = &rows[0];
        assert_eq!(
            r["lengths"],
            serde_json::json!([11, 6, 1, 9]),
            "{arch}: {r}"
        );
        // Five calls a layer; ELECTRA's and ALBERT's embeddings projection one more (ALBERT
        // runs 6 layers over 4 shared weight sets).
        let calls = match arch {
            "electra" => 11,
            "albert" => 31,
            _ => 10,
        };
        assert_eq!(r["calls"]["exact"], calls, "{arch}: {r}");
        let vs_hf = r["transformers_max_abs_err"].as_f64().unwrap();
        assert!(vs_hf <= 1e-4, "{arch}: {r}");
        // Past the positions: RoBERTa's 18 rows hold 16 tokens (its padding id is 1).
        let o = autokernel(&["infer", "--model", &fixture, "--db", db, "--seq", "17"]);
        assert!(!o.status.success(), "{arch}");
        assert!(
            stderr(&o).contains("at most 16 tokens"),
            "{arch}: {}",
            stderr(&o)
        );
    }
}

#[test]
fn a_checkpoint_is_tuned_from_its_config_and_matches_transformers_on_a_padded_batch() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ckpt.db");
    let db = db.to_str().unwrap();
    let tune = |extra: &[&str]| {
        let mut args = vec!["tune", "--model", FIXTURE, "--db", db, "--budget", "1"];
        args.extend([
            "--finalists",
            "0",
            "--isolation",
            "none",
            "--threads",
            "1",
            "--json",
        ]);
        args.extend(extra);
        autokernel(&args)
    };
    // The saved batch is 4 sequences padded to 11: M = 44, the exact GELU from config.json.
    let o = tune(&["--batch", "4", "--seq", "11"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let tuned: Vec<String> = json_lines(&o)
        .iter()
        .map(|t| t["workload"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(tuned.len(), 5, "{tuned:?}");
    assert!(
        tuned.contains(&"gemm_bias_gelu_erf:44x128x64".to_string()),
        "{tuned:?}"
    );
    assert!(
        tuned.contains(&"attention:4x4x11x16".to_string()),
        "{tuned:?}"
    );
    // Without --seq, tune keeps to the model's 16 positions.
    let o = tune(&["--batch", "1", "--dry-run"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let plan = &json_lines(&o)[0]["workloads"];
    assert!(
        plan.as_array()
            .unwrap()
            .contains(&"gemm_bias_gelu_erf:16x128x64".into()),
        "{plan}"
    );
    // Without either, tune plans the saved batch (4 × 11), as infer runs it.
    let o = tune(&["--dry-run"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let plan = &json_lines(&o)[0]["workloads"];
    let plan: Vec<&str> = plan
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w.as_str())
        .collect();
    assert!(plan.contains(&"gemm_bias_gelu_erf:44x128x64"), "{plan:?}");
    assert!(plan.iter().all(|w| !w.contains(":16x")), "{plan:?}");

    // infer runs the saved batch by default, every call from the database, and checks it
    // against transformers' last_hidden_state (padded positions included).
    let infer = |extra: &[&str]| {
        let mut args = vec!["infer", "--model", FIXTURE, "--db", db, "--iters", "2"];
        args.extend(["--threads", "1", "--json", "--check", "all"]);
        args.extend(extra);
        common::autokernel_env(&args, &[("AUTOKERNEL_FALLBACK_CHECK", "0")], &[])
    };
    let o = infer(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows = json_lines(&o);
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!(
        (r["batch"].as_u64(), r["seq"].as_u64()),
        (Some(4), Some(11)),
        "{r}"
    );
    assert_eq!(r["lengths"], serde_json::json!([11, 6, 1, 9]), "{r}");
    assert_eq!(r["act"], "gelu_erf");
    assert_eq!(r["calls"]["exact"], 10, "{r}");
    let vs_hf = r["transformers_max_abs_err"].as_f64().unwrap();
    assert!(vs_hf <= 1e-4, "{r}");
    assert!(r["max_abs_err"].as_f64().unwrap() <= r["tolerance"].as_f64().unwrap());
    assert_eq!(r["non_finite_output"], false, "{r}");

    // A switch the runtime cannot read is an error naming it, not a silent guess.
    let o = common::autokernel_env(
        &["infer", "--model", FIXTURE, "--db", db, "--iters", "1"],
        &[("AUTOKERNEL_FALLBACK_CHECK", "disable")],
        &[],
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("AUTOKERNEL_FALLBACK_CHECK"),
        "{}",
        stderr(&o)
    );

    // --batch without --seq: the default lengths the model's 16 positions take (its 16).
    let o = infer(&["--batch", "2", "--no-untuned"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = &json_lines(&o)[0];
    assert_eq!(
        (r["batch"].as_u64(), r["seq"].as_u64()),
        (Some(2), Some(16)),
        "{r}"
    );

    // A generated padded batch (lengths 16, 5, 1), checked against the f64 reference.
    let o = infer(&[
        "--batch",
        "3",
        "--seq",
        "16",
        "--lengths",
        "16,5,1",
        "--no-untuned",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = &json_lines(&o)[0];
    assert_eq!(r["lengths"], serde_json::json!([16, 5, 1]), "{r}");
    assert_eq!(r["checked_sequences"], 3);
    assert!(r["transformers_max_abs_err"].is_null());
    assert!(r["max_abs_err"].as_f64().unwrap() <= r["tolerance"].as_f64().unwrap());

    // In int8 and bf16 (kernel defaults here: the database holds f32 records), every GEMM is
    // served in that type; the output stays close to the f32 model's (cosine similarity,
    // measured 0.99964 and 0.99998), the untuned f32 pass still matches transformers.
    for (p, dtype, min_cos) in [("int8", "i8", 0.99), ("bf16", "bf16", 0.999)] {
        let o = infer(&["--precision", p]);
        assert!(o.status.success(), "{p}: {}", stderr(&o));
        let r = &json_lines(&o)[0];
        assert_eq!(r["precision"], p, "{r}");
        assert_eq!(
            r["workloads_by_precision"],
            serde_json::json!({ dtype: 4 }),
            "{r}"
        );
        // Calls of one forward pass by the element type served: the GEMMs in `p`; attention
        // in bf16 where this CPU runs `attention_bf16` (AVX512_BF16), else in f32.
        let by = &r["calls_by_precision"];
        let total: u64 = ["exact", "same_arch", "nearest_shape", "default"]
            .iter()
            .map(|l| r["calls"][l].as_u64().unwrap())
            .sum();
        let reduced = by[p].as_u64().unwrap();
        let bf16_attention = kernels::cpu::attention::bf16::ukernel::TILES
            .iter()
            .any(|t| t.available());
        if p == "bf16" && bf16_attention {
            assert!(reduced == total, "{r}");
        } else {
            assert!(reduced >= 4 && reduced < total, "{r}");
        }
        assert_eq!(by["f32"].as_u64().unwrap() + reduced, total, "{r}");
        let cos = r["cosine_vs_f32"].as_f64().unwrap();
        assert!(cos >= min_cos && cos < 1.0, "{p}: cosine {cos}");
        assert!(r["max_abs_err_vs_f32"].as_f64().unwrap() > 0.0);
        // The bounds it was held to: the cosine guard, not f32's tolerances.
        assert_eq!(r["min_cosine_vs_f32"], 0.9, "{r}");
        assert!(
            r["tolerance"].is_null() && r["transformers_tolerance"].is_null(),
            "{r}"
        );
    }
    // A budget no stored record meets keeps f32.
    let o = infer(&["--precision", "int8", "--max-rel-err", "1e-9"]);
    let r = &json_lines(&o)[0];
    assert_eq!(
        r["workloads_by_precision"],
        serde_json::json!({ "f32": 4 }),
        "{r}"
    );
    assert_eq!(r["calls_by_precision"]["int8"], 0, "{r}");

    // A wrong result fails the transformers check too.
    let o = infer(&["--plant-fault", "--no-untuned"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("max |output - transformers|"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn broken_checkpoint_directories_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let base: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{FIXTURE}/config.json")).unwrap())
            .unwrap();
    for (name, edit, needle) in [
        (
            "layers",
            ("num_hidden_layers", serde_json::json!(3)),
            "tensor 'encoder.layer.2.attention.self.query.weight' is missing",
        ),
        (
            "shape",
            ("intermediate_size", serde_json::json!(96)),
            "tensor 'encoder.layer.0.intermediate.dense.weight' has shape [128, 64]",
        ),
        (
            "act",
            ("hidden_act", serde_json::json!("swish")),
            "hidden_act 'swish' is not supported",
        ),
        (
            "gpt2",
            ("model_type", serde_json::json!("gpt2")),
            "model_type 'gpt2' is not a BERT-family encoder",
        ),
        (
            "vocab",
            ("vocab_size", serde_json::json!("many")),
            "field 'vocab_size' is \"many\"",
        ),
        (
            "decoder",
            ("is_decoder", serde_json::json!(true)),
            "is_decoder true is not supported",
        ),
    ] {
        let d = dir.path().join(name);
        std::fs::create_dir(&d).unwrap();
        std::fs::copy(
            format!("{FIXTURE}/model.safetensors"),
            d.join("model.safetensors"),
        )
        .unwrap();
        let mut cfg = base.clone();
        cfg[edit.0] = edit.1;
        std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
        let d = d.to_str().unwrap();
        // tune reads config.json only: a tensor's fault is infer's to find.
        let in_config = !matches!(name, "layers" | "shape");
        let mut commands = vec![vec!["infer", "--model", d]];
        if in_config {
            commands.push(vec!["tune", "--model", d, "--dry-run"]);
        }
        for args in commands {
            let o = autokernel(&args);
            let e = stderr(&o);
            assert_eq!(o.status.code(), Some(2), "{name} {args:?}: {e}");
            assert!(e.contains(needle), "{name} {args:?}: {e}");
            assert_eq!(e.trim().lines().count(), 1, "{name}: one line: {e}");
            assert!(!e.contains("panicked"), "{name}: {e}");
        }
    }
    // A saved batch whose token id is outside the vocabulary: the file is named.
    let d = dir.path().join("ids");
    std::fs::create_dir(&d).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(format!("{FIXTURE}/{f}"), d.join(f)).unwrap();
    }
    let mut inputs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{FIXTURE}/inputs.json")).unwrap())
            .unwrap();
    inputs["input_ids"][0][0] = serde_json::json!(100_000);
    std::fs::write(d.join("inputs.json"), inputs.to_string()).unwrap();
    let o = autokernel(&["infer", "--model", d.to_str().unwrap()]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains("inputs.json: bad input: token id 100000") && e.trim().lines().count() == 1,
        "{e}"
    );
    // A weights file that is a device (it would never end): refused, not read.
    let d = dir.path().join("device");
    std::fs::create_dir(&d).unwrap();
    std::fs::copy(format!("{FIXTURE}/config.json"), d.join("config.json")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", d.join("model.safetensors")).unwrap();
    let o = autokernel(&["infer", "--model", d.to_str().unwrap()]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("model.safetensors: not a regular file"), "{e}");
    let o = autokernel(&["infer", "--model", "/nonexistent/bert"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("model directory '/nonexistent/bert' does not exist"),
        "{}",
        stderr(&o)
    );
}

/// A NaN in the weights is refused at load, naming the tensor and the element (it had run,
/// every output NaN).
#[test]
fn a_nan_in_the_weights_is_refused_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    for f in [
        "config.json",
        "model.safetensors",
        "inputs.json",
        "expected.safetensors",
    ] {
        std::fs::copy(format!("{FIXTURE}/{f}"), dir.path().join(f)).unwrap();
    }
    // The last layer's output bias, element 0, set to NaN in place (safetensors: an 8-byte
    // little-endian header length, the JSON header, then the data at its offsets).
    let path = dir.path().join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
    let at = 8
        + len
        + header["encoder.layer.1.output.dense.bias"]["data_offsets"][0]
            .as_u64()
            .unwrap() as usize;
    let tensor = &header["encoder.layer.1.output.dense.bias"];
    match tensor["dtype"].as_str().unwrap() {
        "F32" => bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes()),
        "F16" => bytes[at..at + 2].copy_from_slice(&0x7e00u16.to_le_bytes()),
        other => panic!("the fixture's dtype {other}"),
    }
    std::fs::write(&path, bytes).unwrap();
    let d = dir.path().to_str().unwrap();
    let db = format!("{d}/t.db");
    let o = autokernel(&[
        "tune",
        "--workload",
        "gemm:2x2x2",
        "--db",
        &db,
        "--budget",
        "1",
        "--finalists",
        "0",
        "--isolation",
        "none",
        "--threads",
        "1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = autokernel(&["infer", "--model", d, "--db", &db, "--iters", "1", "--json"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("tensor 'encoder.layer.1.output.dense.bias' holds NaN at index 0"),
        "{e}"
    );
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(json_lines(&o).is_empty());
}

#[test]
fn a_checkpoint_directory_named_like_a_seeded_model_is_not_shadowed_by_it() {
    // `git clone https://huggingface.co/prajjwal1/bert-tiny` makes ./bert-tiny: it had been
    // served the seeded random model without a word.
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("bert-tiny");
    std::fs::create_dir(&ckpt).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(std::path::Path::new(FIXTURE).join(f), ckpt.join(f)).unwrap();
    }
    for args in [
        &["infer", "--model", "bert-tiny"][..],
        &["tune", "--model", "bert-tiny", "--dry-run"][..],
    ] {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_autokernel"))
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("./bert-tiny"), "{err}");
    }
}

#[test]
fn tune_refuses_a_saved_batch_longer_than_the_model_takes_as_infer_does() {
    // It had planned attention:1x4x40x16 for a 16-position model that infer refuses.
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(std::path::Path::new(FIXTURE).join(f), dir.path().join(f)).unwrap();
    }
    let ids: Vec<u32> = (1..=40).collect();
    let inputs = serde_json::json!({ "input_ids": [ids] });
    std::fs::write(dir.path().join("inputs.json"), inputs.to_string()).unwrap();
    let d = dir.path().to_str().unwrap();
    let o = autokernel(&["tune", "--model", d, "--dry-run"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("sequences of 40 tokens, the model has 16 positions"),
        "{}",
        stderr(&o)
    );
    // Token types the model does not have: refused by tune as by infer.
    let types = serde_json::json!({ "input_ids": [[5, 6]], "token_type_ids": [[0, 2]] });
    std::fs::write(dir.path().join("inputs.json"), types.to_string()).unwrap();
    let o = autokernel(&["tune", "--model", d, "--dry-run"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("token type 2 is outside the 2 token types"),
        "{}",
        stderr(&o)
    );
}
