//! Real checkpoints: the tiny BERT, RoBERTa, DistilBERT, ELECTRA and ALBERT that `transformers` saved
//! (tests/fixtures/tiny-*, made by scripts/make-bert-fixture.py) against the output
//! `transformers` computed for a padded batch; the same weights stored in other ways; broken
//! directories as one-line errors.

use std::path::{Path, PathBuf};

use bert::{BertModel, Checkpoint, Expected, Positions, Scratch, TokenBatch};
use kernels::Act;
use runtime::Runtime;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

fn fixture() -> PathBuf {
    fixture_of("bert")
}

/// The fixture of model type `arch`: `bert`, `roberta`, `distilbert`, `electra` or `albert`.
fn fixture_of(arch: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../tests/fixtures/tiny-{arch}"))
}

/// A fresh temporary directory for one test.
fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("bert-ckpt-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The BERT fixture copied into `dir` with its tensors passed through `f` (`None` drops one)
/// and its config through `cfg`.
fn rewrite(
    dir: &Path,
    f: impl Fn(&str, Dtype, &[usize], &[u8]) -> Option<Tensor>,
    cfg: impl Fn(&mut serde_json::Value),
) {
    rewrite_of("bert", dir, f, cfg)
}

/// [`rewrite`] of the fixture of model type `arch`.
fn rewrite_of(
    arch: &str,
    dir: &Path,
    f: impl Fn(&str, Dtype, &[usize], &[u8]) -> Option<Tensor>,
    cfg: impl Fn(&mut serde_json::Value),
) {
    let bytes = std::fs::read(fixture_of(arch).join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<Tensor> = st
        .tensors()
        .into_iter()
        .filter_map(|(name, t)| f(&name, t.dtype(), t.shape(), t.data()))
        .collect();
    let views = kept
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()));
    std::fs::write(
        dir.join("model.safetensors"),
        safetensors::serialize(views, None).unwrap(),
    )
    .unwrap();
    let text = std::fs::read_to_string(fixture_of(arch).join("config.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    cfg(&mut v);
    std::fs::write(dir.join("config.json"), v.to_string()).unwrap();
}

/// A tensor as `rewrite` takes it back: name, type, shape, bytes.
type Tensor = (String, Dtype, Vec<usize>, Vec<u8>);

fn same(name: &str, d: Dtype, s: &[usize], b: &[u8]) -> Option<Tensor> {
    Some((name.to_string(), d, s.to_vec(), b.to_vec()))
}

/// The error of loading the fixture of `arch` rewritten into `dir` without the tensors whose
/// names start with `dropped`.
fn load_error_without(arch: &str, dir: &Path, dropped: &str) -> String {
    let keep = |n: &str, d, s: &[usize], b: &[u8]| {
        (!n.starts_with(dropped)).then(|| same(n, d, s, b).unwrap())
    };
    rewrite_of(arch, dir, keep, |_| {});
    Checkpoint::load(dir).unwrap_err().to_string()
}

/// The hidden size of the "huge" broken directory.
const HUGE: usize = 30_000;

/// The embedding tables and their LayerNorm at one row of [`HUGE`] zeros; no layers.
fn huge_tables(name: &str, _: Dtype, _: &[usize], _: &[u8]) -> Option<Tensor> {
    let shape = match name {
        n if n.ends_with("_embeddings.weight") => vec![1, HUGE],
        n if n.starts_with("embeddings.LayerNorm") => vec![HUGE],
        _ => return None,
    };
    Some((name.to_string(), Dtype::F32, shape, vec![0; 4 * HUGE]))
}

/// The fixture's batch through the runtime: `last_hidden_state`.
fn run(ckpt: &Checkpoint, tokens: &TokenBatch) -> Vec<f32> {
    let rt = Runtime::defaults_only();
    let model = BertModel::load(&rt, ckpt, &[(tokens.batch, tokens.seq)]).unwrap();
    let mut scratch = Scratch::default();
    let calls = model.forward_with(&rt, tokens, &mut scratch).unwrap();
    let projection = ckpt.projection.is_some() as u64;
    assert_eq!(calls.total(), 5 * ckpt.config.layers as u64 + projection);
    scratch.output().to_vec()
}

#[test]
fn the_padded_batch_matches_transformers_within_1e_4() {
    for arch in ["bert", "roberta", "distilbert", "electra"] {
        let ckpt = Checkpoint::load(&fixture_of(arch)).unwrap();
        assert_eq!(ckpt.config.name, arch);
        assert_eq!(
            ckpt.config.act,
            Act::GeluErf,
            "{arch}: 'gelu' is the exact form"
        );
        assert_eq!(
            (ckpt.config.layers, ckpt.config.hidden, ckpt.config.heads),
            (2, 64, 4)
        );
        assert_eq!(ckpt.embeddings.max_seq(), 16, "{arch}");
        matches_transformers(&ckpt);
    }
}

/// `ckpt`'s saved batch within 1e-4 of transformers' output, padded positions included;
/// within the tolerance of the f64 reference; and each sequence alone, unpadded, as in the
/// padded batch at its real tokens.
fn matches_transformers(ckpt: &Checkpoint) {
    let dir = &ckpt.dir;
    let tokens = TokenBatch::from_json(&dir.join("inputs.json")).unwrap();
    assert_eq!(
        tokens.lens,
        vec![11, 6, 1, 9],
        "sequences of different lengths"
    );
    let expected = Expected::load(&dir.join("expected.safetensors")).unwrap();
    let out = run(ckpt, &tokens);
    let err = expected.max_abs_err(&out).unwrap();
    eprintln!("{}: max |ours − transformers| = {err:.2e}", dir.display());
    assert!(
        err <= 1e-4,
        "{}: max |ours − transformers| = {err:e}",
        dir.display()
    );
    let h = ckpt.config.hidden;
    for i in 0..tokens.batch {
        let want = ckpt.reference(&tokens, i);
        let got = &out[i * tokens.seq * h..(i + 1) * tokens.seq * h];
        bert::check(got, &want).unwrap_or_else(|a| panic!("sequence {i}: {a:?}"));
    }
    for i in 0..tokens.batch {
        let len = tokens.lens[i] as usize;
        let (ids, types) = tokens.sequence(i);
        let alone = TokenBatch {
            batch: 1,
            seq: len,
            ids: ids[..len].to_vec(),
            types: types[..len].to_vec(),
            lens: vec![len as i32],
        };
        let got = run(ckpt, &alone);
        let padded = &out[i * tokens.seq * h..][..len * h];
        let diff = got
            .iter()
            .zip(padded)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff < 2e-5, "sequence {i}: {diff}");
    }
}

#[test]
fn roberta_positions_count_after_the_padding_id_as_transformers_does() {
    let mut ckpt = Checkpoint::load(&fixture_of("roberta")).unwrap();
    assert_eq!(
        ckpt.embeddings.positions,
        Positions::AfterPadding { pad_id: 1 }
    );
    assert_eq!(ckpt.embeddings.pad_id(), 1);
    // BERT's positions on RoBERTa's table miss transformers' output.
    ckpt.embeddings.positions = Positions::FromZero;
    let tokens = TokenBatch::from_json(&ckpt.dir.join("inputs.json")).unwrap();
    let expected = Expected::load(&ckpt.dir.join("expected.safetensors")).unwrap();
    let err = expected.max_abs_err(&run(&ckpt, &tokens)).unwrap();
    assert!(err > 1e-2, "positions from 0: {err}");
}

#[test]
fn prefixed_roberta_distilbert_electra_and_albert_checkpoints_load_the_same_model() {
    for (arch, prefix) in [
        ("roberta", "roberta."),
        ("distilbert", "distilbert."),
        ("electra", "electra."),
        ("albert", "albert."),
    ] {
        let dir = scratch_dir(&format!("prefix-{arch}"));
        rewrite_of(
            arch,
            &dir,
            |name, t, shape, data| {
                Some((format!("{prefix}{name}"), t, shape.to_vec(), data.to_vec()))
            },
            |_| {},
        );
        let (a, b) = (
            Checkpoint::load(&fixture_of(arch)).unwrap(),
            Checkpoint::load(&dir).unwrap(),
        );
        assert_eq!(a.embeddings.position, b.embeddings.position, "{arch}");
        assert_eq!(a.layers[1].w_ffn2, b.layers[1].w_ffn2, "{arch}");
        assert_eq!(a.layers[0].ln1_gamma, b.layers[0].ln1_gamma, "{arch}");
        assert_eq!(a.projection, b.projection, "{arch}");
        // A prefixed file without its word embeddings names the prefixed tensor.
        let word = format!("{prefix}embeddings.word_embeddings.weight");
        rewrite_of(
            arch,
            &dir,
            |name, t, shape, data| {
                let full = format!("{prefix}{name}");
                (full != word).then(|| (full, t, shape.to_vec(), data.to_vec()))
            },
            |_| {},
        );
        let e = Checkpoint::load(&dir).unwrap_err().to_string();
        assert!(
            e.contains(&format!("tensor '{word}' is missing")),
            "{arch}: {e}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn distilbert_configs_may_name_their_sizes_as_transformers_aliases_them() {
    // transformers' attribute_map reads hidden_size, num_attention_heads, num_hidden_layers
    // for DistilBERT's dim, n_heads, n_layers.
    let dir = scratch_dir("distilbert-aliases");
    rewrite_of("distilbert", &dir, same, |v| {
        let o = v.as_object_mut().unwrap();
        for (field, alias) in [
            ("dim", "hidden_size"),
            ("n_heads", "num_attention_heads"),
            ("n_layers", "num_hidden_layers"),
        ] {
            let x = o.remove(field).unwrap();
            o.insert(alias.into(), x);
        }
    });
    let (a, b) = (
        Checkpoint::load(&fixture_of("distilbert")).unwrap(),
        Checkpoint::load(&dir).unwrap(),
    );
    assert_eq!(
        (a.config.hidden, a.config.heads, a.config.layers),
        (b.config.hidden, b.config.heads, b.config.layers)
    );
    assert_eq!(a.layers[1].w_qkv, b.layers[1].w_qkv);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_wrong_activation_or_an_ignored_mask_misses_transformers() {
    let mut ckpt = Checkpoint::load(&fixture()).unwrap();
    let tokens = TokenBatch::from_json(&fixture().join("inputs.json")).unwrap();
    let expected = Expected::load(&fixture().join("expected.safetensors")).unwrap();
    let mut unmasked = tokens.clone();
    unmasked.lens = vec![tokens.seq as i32; tokens.batch];
    let err = expected.max_abs_err(&run(&ckpt, &unmasked)).unwrap();
    assert!(err > 1e-2, "without the mask: {err}");
    ckpt.config.act = Act::Gelu;
    let err = expected.max_abs_err(&run(&ckpt, &tokens)).unwrap();
    assert!(err > 1e-4, "tanh GELU instead of erf: {err}");
}

#[test]
fn f32_and_f64_storage_and_the_bert_prefix_load_the_same_model() {
    let dir = scratch_dir("f32");
    rewrite(
        &dir,
        |name, _, shape, data| {
            let v = bert::to_f32(Dtype::F16, data).unwrap();
            let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            Some((format!("bert.{name}"), Dtype::F32, shape.to_vec(), bytes))
        },
        |_| {},
    );
    // F64 storage (as a model saved in double precision): the same values, rounded to f32.
    let dir64 = scratch_dir("f64");
    rewrite(
        &dir64,
        |name, _, shape, data| {
            let v = bert::to_f32(Dtype::F16, data).unwrap();
            let bytes = v.iter().flat_map(|&x| f64::from(x).to_le_bytes()).collect();
            Some((name.to_string(), Dtype::F64, shape.to_vec(), bytes))
        },
        |_| {},
    );
    let a = Checkpoint::load(&fixture()).unwrap();
    for b in [
        Checkpoint::load(&dir).unwrap(),
        Checkpoint::load(&dir64).unwrap(),
    ] {
        assert_eq!(a.embeddings.word, b.embeddings.word);
        assert_eq!(a.layers[1].w_ffn2, b.layers[1].w_ffn2);
        assert_eq!(a.layers[0].w_qkv, b.layers[0].w_qkv);
    }
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(dir64);
}

/// Writes a broken copy of the fixture into a directory.
type Breaker = Box<dyn Fn(&Path)>;

#[test]
fn broken_directories_are_one_line_errors_naming_the_tensor_or_field() {
    const LAYER1: &str = "encoder.layer.1.intermediate.dense.weight";
    let cases: Vec<(&str, Breaker, &str)> = vec![
        (
            "missing",
            Box::new(|d: &Path| rewrite(d, |n, t, s, b| (n != LAYER1).then(|| same(n, t, s, b)).flatten(), |_| {})),
            "tensor 'encoder.layer.1.intermediate.dense.weight' is missing",
        ),
        (
            "shape",
            Box::new(|d: &Path| rewrite(d, same, |v| v["intermediate_size"] = 96.into())),
            "tensor 'encoder.layer.0.intermediate.dense.weight' has shape [128, 64], config.json says [96, 64]",
        ),
        (
            "act",
            Box::new(|d: &Path| rewrite(d, same, |v| v["hidden_act"] = "silu".into())),
            "hidden_act 'silu' is not supported",
        ),
        (
            "null-act",
            Box::new(|d: &Path| rewrite(d, same, |v| v["hidden_act"] = serde_json::Value::Null)),
            "field 'hidden_act' is null, not a string",
        ),
        (
            "nan",
            Box::new(|d: &Path| {
                rewrite(
                    d,
                    |n, t, s, b| {
                        let mut b = b.to_vec();
                        if n == LAYER1 {
                            // An f32 NaN over the elements at bytes 20..24.
                            b[20..24].copy_from_slice(&f32::NAN.to_le_bytes());
                        }
                        Some((n.to_string(), t, s.to_vec(), b))
                    },
                    |_| {},
                )
            }),
            "tensor 'encoder.layer.1.intermediate.dense.weight' holds NaN at index",
        ),
        (
            "gpt2",
            Box::new(|d: &Path| rewrite(d, same, |v| v["model_type"] = "gpt2".into())),
            "model_type 'gpt2' is not a BERT-family encoder",
        ),
        (
            "heads",
            Box::new(|d: &Path| rewrite(d, same, |v| v["num_attention_heads"] = 5.into())),
            "not a multiple of heads 5",
        ),
        (
            "hidden",
            Box::new(|d: &Path| rewrite(d, same, |v| v.as_object_mut().unwrap().remove("hidden_size").map(|_| ()).unwrap())),
            "field 'hidden_size' is missing",
        ),
        (
            "dtype",
            Box::new(|d: &Path| {
                rewrite(
                    d,
                    |n, t, s, b| {
                        if n == "embeddings.LayerNorm.bias" {
                            Some((n.into(), Dtype::I16, s.to_vec(), b.to_vec()))
                        } else {
                            same(n, t, s, b)
                        }
                    },
                    |_| {},
                )
            }),
            "tensor 'embeddings.LayerNorm.bias' is I16",
        ),
        (
            // 3·hidden past the workloads' dimension limit: refused from config.json.
            "wide",
            Box::new(|d: &Path| rewrite(d, same, |v| v["hidden_size"] = (1 << 20).into())),
            "exceeds the maximum of 1048576",
        ),
        (
            // A config whose sizes alone would ask for gigabytes, with tables to match and
            // no layers: the missing tensor is the error, nothing is allocated for it.
            "huge",
            Box::new(|d: &Path| rewrite(d, huge_tables, |v| {
                for f in ["vocab_size", "max_position_embeddings", "type_vocab_size", "num_attention_heads"] {
                    v[f] = 1.into();
                }
                v["hidden_size"] = HUGE.into();
                v["intermediate_size"] = HUGE.into();
            })),
            "tensor 'encoder.layer.0.attention.self.query.weight' is missing",
        ),
        (
            "nofile",
            Box::new(|d: &Path| {
                rewrite(d, same, |_| {});
                std::fs::remove_file(d.join("model.safetensors")).unwrap();
            }),
            "model.safetensors: cannot read",
        ),
        (
            "distilbert-missing",
            Box::new(|d: &Path| {
                let gone = "transformer.layer.1.ffn.lin1.weight";
                rewrite_of("distilbert", d, |n, t, s, b| (n != gone).then(|| same(n, t, s, b)).flatten(), |_| {})
            }),
            "tensor 'transformer.layer.1.ffn.lin1.weight' is missing",
        ),
        (
            "distilbert-act",
            Box::new(|d: &Path| rewrite_of("distilbert", d, same, |v| v["activation"] = "silu".into())),
            "activation 'silu' is not supported",
        ),
        (
            "distilbert-dim",
            Box::new(|d: &Path| rewrite_of("distilbert", d, same, |v| v["dim"] = 96.into())),
            "tensor 'embeddings.word_embeddings.weight' has shape [100, 64], config.json says [100, 96]",
        ),
        (
            "roberta-pad",
            Box::new(|d: &Path| rewrite_of("roberta", d, same, |v| v["pad_token_id"] = 17.into())),
            "pad_token_id 17 leaves no position of the 18",
        ),
        (
            "array",
            Box::new(|d: &Path| {
                rewrite(d, same, |_| {});
                std::fs::write(d.join("config.json"), "[1, 2]").unwrap();
            }),
            "config.json: not a JSON object",
        ),
        (
            "header-shape",
            // The header says [32] of a tensor whose bytes hold 64 values (edited in place:
            // no writer would save it).
            Box::new(|d: &Path| {
                rewrite(d, same, |_| {});
                let path = d.join("model.safetensors");
                let bytes = std::fs::read(&path).unwrap();
                let from: &[u8] = b"\"encoder.layer.0.attention.self.key.bias\":{\"dtype\":\"F16\",\"shape\":[64]";
                let at = bytes
                    .windows(from.len())
                    .position(|w| w == from)
                    .expect("the fixture's header");
                let mut bytes = bytes;
                bytes[at + from.len() - 3..at + from.len() - 1].copy_from_slice(b"32");
                std::fs::write(&path, bytes).unwrap();
            }),
            "tensor 'encoder.layer.0.attention.self.key.bias' holds 128 bytes, but its shape [32] of F16 needs 64",
        ),
    ];
    for (name, make, needle) in cases {
        let dir = scratch_dir(name);
        make(&dir);
        let e = Checkpoint::load(&dir).unwrap_err().to_string();
        assert!(e.contains(needle), "{name}: {e}");
        assert!(!e.contains('\n'), "{name}: one line: {e}");
        let _ = std::fs::remove_dir_all(dir);
    }
    let e = Checkpoint::load(Path::new("/nonexistent/bert"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("config.json: cannot read"), "{e}");
}

#[test]
fn a_file_holding_a_tensor_with_and_without_the_prefix_is_refused() {
    // Every tensor as `bert.NAME`, and one of them again as plain `NAME`: which of the two
    // to serve cannot be told (the plain one had been ignored without a word).
    let dir = scratch_dir("twin");
    rewrite(&dir, same, |_| {});
    let bytes = std::fs::read(fixture().join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut views: Vec<(String, TensorView)> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| (format!("bert.{n}"), t))
        .collect();
    let twin = "embeddings.LayerNorm.bias";
    views.push((twin.into(), st.tensor(twin).unwrap()));
    std::fs::write(
        dir.join("model.safetensors"),
        safetensors::serialize(views, None).unwrap(),
    )
    .unwrap();
    let e = Checkpoint::load(&dir).unwrap_err().to_string();
    assert!(
        e.contains("holds both 'bert.embeddings.LayerNorm.bias'"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn tokens_outside_the_tables_are_errors() {
    let ckpt = Checkpoint::load(&fixture()).unwrap();
    let rt = Runtime::defaults_only();
    let model = BertModel::load(&rt, &ckpt, &[(1, 4)]).unwrap();
    let mut scratch = Scratch::default();
    let mut t = TokenBatch::random((100, 0), 1, (1, 4), &[]);
    t.ids[2] = 100;
    let e = model
        .forward_with(&rt, &t, &mut scratch)
        .unwrap_err()
        .to_string();
    assert!(e.contains("token id 100 (sequence 0, position 2)"), "{e}");
    let t = TokenBatch::random((100, 0), 1, (1, 17), &[]);
    let e = model
        .forward_with(&rt, &t, &mut scratch)
        .unwrap_err()
        .to_string();
    assert!(e.contains("the model has 16 positions"), "{e}");
    // An empty batch and lengths outside 0..=seq: errors, not a panic (an empty one had
    // panicked in the embeddings) nor a late complaint from attention.
    for (batch, seq) in [(0, 0), (1, 0), (0, 4)] {
        let t = TokenBatch::random((100, 0), 1, (batch, seq), &[]);
        let e = model.forward_with(&rt, &t, &mut scratch).unwrap_err();
        assert!(e.to_string().contains("must be at least 1"), "{e}");
    }
    for len in [-3, 5] {
        let mut t = TokenBatch::random((100, 0), 1, (2, 4), &[]);
        t.lens[1] = len;
        let e = model.forward_with(&rt, &t, &mut scratch).unwrap_err();
        let want = format!("sequence 1 has length {len}, not one of 0..=4");
        assert!(e.to_string().contains(&want), "{e}");
    }

    // RoBERTa's 18 rows hold 16 positions (counted from its padding id + 1); DistilBERT has
    // no token types.
    for (arch, tokens) in [("roberta", (1, 17)), ("distilbert", (1, 4))] {
        let ckpt = Checkpoint::load(&fixture_of(arch)).unwrap();
        let model = BertModel::load(&rt, &ckpt, &[(1, 4)]).unwrap();
        let mut t = TokenBatch::random((100, ckpt.embeddings.pad_id()), 1, tokens, &[]);
        t.types[0] = 1;
        let e = model
            .forward_with(&rt, &t, &mut scratch)
            .unwrap_err()
            .to_string();
        let want = match arch {
            "roberta" => "the model has 16 positions",
            _ => "token type 1: this model has no token types",
        };
        assert!(e.contains(want), "{arch}: {e}");
    }
}

#[test]
fn a_sharded_checkpoint_loads_the_same_model_and_a_pickled_one_says_how_to_convert() {
    // The fixture's tensors split over two shards and an index, as save_pretrained writes a
    // checkpoint larger than its shard size.
    let dir = scratch_dir("sharded");
    let bytes = std::fs::read(fixture().join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut names = st.names();
    names.sort();
    let mut map = serde_json::Map::new();
    // The first shard also holds a stale copy (zeros) of a tensor the index puts in the
    // second: transformers reads the second's, and so must the loader.
    let stale = "encoder.layer.1.output.dense.weight";
    let t = st.tensor(stale).unwrap();
    let zeros = vec![0u8; t.data().len()];
    let stale_view = TensorView::new(t.dtype(), t.shape().to_vec(), &zeros).unwrap();
    for (i, part) in names.chunks(names.len() / 2 + 1).enumerate() {
        assert_eq!(part.contains(&stale), i == 1);
        let file = format!("model-0000{}-of-00002.safetensors", i + 1);
        let mut views: Vec<_> = part
            .iter()
            .map(|n| (n.to_string(), st.tensor(n).unwrap()))
            .collect();
        if i == 0 {
            views.push((stale.to_string(), stale_view.clone()));
        }
        std::fs::write(
            dir.join(&file),
            safetensors::serialize(views, None).unwrap(),
        )
        .unwrap();
        map.extend(part.iter().map(|n| (n.to_string(), file.clone().into())));
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    std::fs::copy(fixture().join("config.json"), dir.join("config.json")).unwrap();
    let (a, b) = (
        Checkpoint::load(&fixture()).unwrap(),
        Checkpoint::load(&dir).unwrap(),
    );
    assert_eq!(a.embeddings.word, b.embeddings.word);
    assert_eq!(a.layers[1].w_ffn2, b.layers[1].w_ffn2);
    assert_eq!(a.layers[0].w_qkv, b.layers[0].w_qkv);
    assert_eq!(
        a.layers[1].w_ffn2, b.layers[1].w_ffn2,
        "the index's shard, not the stale copy"
    );

    // An index naming the wrong shard for a tensor: missing from that shard, said so.
    let mut wrong = index.clone();
    let first = "model-00001-of-00002.safetensors";
    wrong["weight_map"]["encoder.layer.1.output.LayerNorm.bias"] = first.into();
    std::fs::write(dir.join("model.safetensors.index.json"), wrong.to_string()).unwrap();
    let e = Checkpoint::load(&dir).unwrap_err().to_string();
    let want =
        format!("'encoder.layer.1.output.LayerNorm.bias' is missing from {first}, the shard");
    assert!(e.contains(&want), "{e}");
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();

    // A shard the index names but the directory lacks is named.
    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors")).unwrap();
    let e = Checkpoint::load(&dir).unwrap_err().to_string();
    assert!(
        e.contains("model-00002-of-00002.safetensors: a shard model.safetensors.index.json lists"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(dir);

    // Only PyTorch's pickle: not read, and the error says how to save safetensors.
    let dir = scratch_dir("pickled");
    std::fs::copy(fixture().join("config.json"), dir.join("config.json")).unwrap();
    std::fs::write(dir.join("pytorch_model.bin"), b"PK").unwrap();
    let e = Checkpoint::load(&dir).unwrap_err().to_string();
    assert!(
        e.contains("pytorch_model.bin here holds the weights as a PyTorch pickle"),
        "{e}"
    );
    assert!(e.contains("save_pretrained"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}

/// ELECTRA's embeddings are `embedding_size` wide (128 when config.json leaves it out, as
/// transformers reads it) and projected to the hidden size by `embeddings_project`; a missing
/// projection is named.
#[test]
fn electra_projects_its_narrower_embeddings() {
    let ckpt = Checkpoint::load(&fixture_of("electra")).unwrap();
    assert_eq!((ckpt.config.embedding, ckpt.config.hidden), (32, 64));
    assert_eq!(ckpt.embeddings.width, 32);
    let (w, b) = ckpt.projection.as_ref().unwrap();
    assert_eq!((w.len(), b.len()), (32 * 64, 64));
    assert!(ckpt.config.to_string().contains("embeddings 32 projected"));
    let shapes = ckpt.config.workload_list(&[(4, 11)]);
    assert_eq!(shapes[0].key(), "gemm_bias:44x64x32", "{shapes:?}");

    let dir = scratch_dir("electra-no-projection");
    let e = load_error_without("electra", &dir, "embeddings_project.");
    assert!(
        e.contains("tensor 'embeddings_project.weight' is missing"),
        "{e}"
    );

    // Without embedding_size the tables are read as 128 wide, which these are not.
    let dir = scratch_dir("electra-default-width");
    rewrite_of("electra", &dir, same, |v| {
        v.as_object_mut().unwrap().remove("embedding_size");
    });
    let e = Checkpoint::load(&dir).unwrap_err().to_string();
    assert!(e.contains("config.json says [2, 128]"), "{e}");
}

/// ALBERT: embeddings 32 wide always projected (`encoder.embedding_hidden_mapping_in`); 3
/// layer steps over 2 groups of 2 shared layers, the groups split as transformers splits them
/// (steps 0 and 1 run group 0, step 2 group 1): 6 layers run over 4 weight sets, each
/// packed once; tanh GELU (`gelu_new`, ALBERT's default when config.json leaves it out).
#[test]
fn albert_shares_its_layers_as_transformers_groups_them() {
    let ckpt = Checkpoint::load(&fixture_of("albert")).unwrap();
    assert_eq!(ckpt.config.name, "albert");
    assert_eq!(ckpt.config.act, Act::Gelu);
    assert_eq!((ckpt.config.embedding, ckpt.config.hidden), (32, 64));
    assert_eq!(ckpt.layers.len(), 4);
    assert_eq!(ckpt.steps, [0, 1, 0, 1, 2, 3]);
    assert_eq!(ckpt.config.layers, 6);
    matches_transformers(&ckpt);

    // The common layout: one group of one layer, shared by every step.
    let dir = scratch_dir("albert-one-group");
    rewrite_of(
        "albert",
        &dir,
        |n, d, s, b| {
            let shared = "encoder.albert_layer_groups.0.albert_layers.0.";
            let layer = n.starts_with("encoder.albert_layer_groups.");
            (!layer || n.starts_with(shared)).then(|| same(n, d, s, b).unwrap())
        },
        |v| {
            let v = v.as_object_mut().unwrap();
            v.remove("num_hidden_groups");
            v.remove("inner_group_num");
            v.remove("hidden_act");
        },
    );
    let one = Checkpoint::load(&dir).unwrap();
    assert_eq!((one.layers.len(), one.steps.clone()), (1, vec![0, 0, 0]));
    assert_eq!(one.config.act, Act::Gelu, "gelu_new by default");
    assert_eq!(one.layers[0].w_qkv, ckpt.layers[0].w_qkv);
    let rt = Runtime::defaults_only();
    let model = BertModel::load(&rt, &one, &[(1, 5)]).unwrap();
    let per_layer = model.encoder.weight_bytes();
    let tokens = TokenBatch::from_json(&ckpt.dir.join("inputs.json")).unwrap();
    let out = run(&one, &tokens);
    for i in 0..tokens.batch {
        let want = one.reference(&tokens, i);
        let got = &out[i * tokens.seq * 64..(i + 1) * tokens.seq * 64];
        bert::check(got, &want).unwrap_or_else(|a| panic!("sequence {i}: {a:?}"));
    }
    // Packed once: the four-set model holds four times the one-set model's weights.
    let four = BertModel::load(&rt, &ckpt, &[(1, 5)]).unwrap();
    assert_eq!(four.encoder.weight_bytes(), 4 * per_layer);

    // A missing shared layer is named; so is the projection.
    let e = load_error_without("albert", &dir, "encoder.albert_layer_groups.1.");
    assert!(
        e.contains("tensor 'encoder.albert_layer_groups.1.albert_layers.0.attention.query.weight' is missing"),
        "{e}"
    );
    let e = load_error_without("albert", &dir, "encoder.embedding_hidden_mapping_in.");
    assert!(
        e.contains("tensor 'encoder.embedding_hidden_mapping_in.weight' is missing"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Sizes whose product passes usize::MAX are errors, in debug and release builds alike (they
/// had panicked in debug and, wrapped, returned Ok with an empty output in release).
#[test]
fn batch_times_seq_past_usize_is_an_error() {
    let rt = Runtime::defaults_only();
    let config = bert::BertConfig::tiny();
    let encoder = bert::Encoder::load(&rt, config, 1, &[(1, 4)]).unwrap();
    let e = encoder.forward(&rt, 1 << 62, 4, &[]).unwrap_err();
    assert!(
        e.to_string().contains("needs 1180591620717411303424"),
        "{e}"
    );
    assert!(bert::Encoder::load(&rt, config, 1, &[(1 << 62, 4)]).is_err());
    let w = config.workloads(1 << 62, 4);
    assert!(w.iter().all(|w| w.check().is_err()), "{w:?}");
    let rows = runtime::AttentionRows {
        batch: 1 << 40,
        seq: 1 << 40,
        heads: 1,
        d: 1,
        causal: false,
    };
    assert_eq!(rows.len(), usize::MAX);
}
