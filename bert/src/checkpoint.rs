//! Hugging Face BERT-family checkpoints: a directory with `config.json` and
//! `model.safetensors` or the shards of `model.safetensors.index.json` (what `save_pretrained`
//! writes), read with the `safetensors` crate — no network, no hub. Five families of model
//! types share the encoder (post-LayerNorm layers, one attention, a two-layer feed-forward
//! block) and differ in names, in token types, in the embeddings' width, in how positions
//! are counted and in whether layers share weights ([`NAMINGS`]):
//!
//! - `bert`: `embeddings.{word,position,token_type}_embeddings.weight`,
//!   `embeddings.LayerNorm.*`, `encoder.layer.N.attention.self.{query,key,value}.*`,
//!   `…attention.output.dense.*`, `…attention.output.LayerNorm.*`, `…intermediate.dense.*`,
//!   `…output.dense.*`, `…output.LayerNorm.*`; positions from 0.
//! - `roberta` (and `xlm-roberta`, `camembert`): BERT's names; positions counted after the
//!   padding id ([`Positions::AfterPadding`]), so `max_position_embeddings` − `pad_token_id`
//!   − 1 tokens at most.
//! - `distilbert`: `config.json`'s `dim`, `n_layers`, `n_heads`, `hidden_dim`, `activation`;
//!   `embeddings.{word,position}_embeddings.weight` (no token types),
//!   `transformer.layer.N.attention.{q_lin,k_lin,v_lin,out_lin}.*`, `…sa_layer_norm.*`,
//!   `…ffn.lin1.*`, `…ffn.lin2.*`, `…output_layer_norm.*`; LayerNorm epsilon 1e-12.
//! - `electra`: BERT's names; tables of `embedding_size` columns (default 128, as
//!   transformers' `ElectraConfig`), projected to `hidden_size` by `embeddings_project.*`
//!   when the two differ.
//! - `albert`: BERT's embedding names, `embedding_size` wide (default 128), always projected
//!   by `encoder.embedding_hidden_mapping_in.*`; `num_hidden_groups` groups (default 1) of
//!   `inner_group_num` layers (default 1), `encoder.albert_layer_groups.G.albert_layers.I.`
//!   `{attention.{query,key,value,dense,LayerNorm},ffn,ffn_output,full_layer_layer_norm}.*`,
//!   whose weights are shared: each of the `num_hidden_layers` steps runs one group's layers
//!   (as transformers picks it), so a forward pass runs `num_hidden_layers × inner_group_num`
//!   layers over `num_hidden_groups × inner_group_num` weight sets, each packed once;
//!   `hidden_act` defaults to `gelu_new`.
//!
//! Names are looked up with or without the model's prefix (`bert.`, `roberta.`,
//! `distilbert.`, `electra.`, `albert.`: the task heads' checkpoints, whose extra tensors are
//! ignored); LayerNorm as
//! `weight`/`bias`, or the legacy `gamma`/`beta`. `nn.Linear` weights are `[out, in]` and are
//! transposed into the encoder's `in × out`. Stored as F32, F16 or BF16 (converted exactly to
//! f32), or F64 (rounded to the nearest f32, as PyTorch's `.float()` does). Anything missing or of the wrong shape is a one-line error naming the tensor or the
//! `config.json` field.

use std::path::{Path, PathBuf};

use kernels::Act;
use safetensors::Dtype;
use serde_json::Value;

use crate::tensor_files::{TensorFiles, Tensors};
use crate::{BertConfig, BertError, Embeddings, LayerWeights, Positions, TokenBatch};

/// A loaded checkpoint: the encoder's sizes, its embedding block and its layers' weights.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// The directory it was read from.
    pub dir: PathBuf,
    /// The encoder's sizes and options, from `config.json`.
    pub config: BertConfig,
    /// The embedding tables and their LayerNorm.
    pub embeddings: Embeddings,
    /// The projection of the embeddings to the hidden size (`embedding × hidden`, bias
    /// `hidden`): ELECTRA's when their widths differ, ALBERT's always.
    pub projection: Option<(Vec<f32>, Vec<f32>)>,
    /// The distinct layers' weights: one per layer, but ALBERT's shared ones once.
    pub layers: Vec<LayerWeights>,
    /// The layer of `layers` each of the `config.layers` steps of a forward pass runs:
    /// `0, 1, 2, …` but for ALBERT.
    pub steps: Vec<usize>,
}

/// `hidden_act` values served, and the activation each is.
pub const HIDDEN_ACTS: [(&str, Act); 4] = [
    ("gelu", Act::GeluErf),
    ("gelu_new", Act::Gelu),
    ("gelu_pytorch_tanh", Act::Gelu),
    ("relu", Act::Relu),
];

/// How one family of model types names its `config.json` fields and its tensors.
#[derive(Debug)]
pub struct Naming {
    /// The `model_type` values it reads.
    pub model_types: &'static [&'static str],
    /// The prefix of its task heads' checkpoints (`bert.`).
    prefix: &'static str,
    /// `config.json` fields: layers, hidden size, heads, feed-forward width, activation.
    fields: [&'static str; 5],
    /// Other names transformers reads for some of them (its `attribute_map`): `(field, alias)`.
    aliases: &'static [(&'static str, &'static str)],
    /// The LayerNorm epsilon's field, or `None` for a fixed 1e-12.
    eps_field: Option<&'static str>,
    /// The `hidden_act` (or `activation`) when config.json leaves it out.
    act_default: &'static str,
    /// The field of the embedding tables' width, when it may differ from the hidden size
    /// (`embedding_size`, 128 when missing), or `None`: the hidden size.
    embedding_field: Option<&'static str>,
    /// The linear layer from the embeddings' width to the hidden size, if the model has one.
    projection: Projection,
    /// Whether it has a token-type table (`type_vocab_size`, default 2).
    token_types: bool,
    /// Whether positions are counted after the padding id (`pad_token_id`, default 1).
    positions_after_padding: bool,
    /// How the layers' weights are named and shared.
    layers: Layers,
    /// A layer's tensors: query, key, value, attention output, its LayerNorm, feed-forward up,
    /// down, and its LayerNorm.
    tensors: [&'static str; 8],
}

/// The projection of a [`Naming`]'s embeddings to the hidden size: the `nn.Linear`'s name.
#[derive(Debug)]
enum Projection {
    None,
    /// ELECTRA's: there when the embeddings are narrower (or wider) than the hidden size.
    IfWidthsDiffer(&'static str),
    /// ALBERT's: always there.
    Always(&'static str),
}

/// How a [`Naming`]'s layers are named and which weights each step runs.
#[derive(Debug)]
enum Layers {
    /// Layer `N`'s weights are under this, then `.N.`; step `N` runs them.
    Each(&'static str),
    /// ALBERT's groups of shared layers (see the module's documentation).
    AlbertGroups,
}

/// The model types [`Checkpoint::load`] reads.
pub const NAMINGS: [Naming; 5] = [
    Naming {
        model_types: &["bert"],
        prefix: "bert.",
        fields: BERT_FIELDS,
        aliases: &[],
        eps_field: Some("layer_norm_eps"),
        act_default: "gelu",
        embedding_field: None,
        projection: Projection::None,
        token_types: true,
        positions_after_padding: false,
        layers: Layers::Each("encoder.layer"),
        tensors: BERT_TENSORS,
    },
    Naming {
        model_types: &["roberta", "xlm-roberta", "camembert"],
        prefix: "roberta.",
        fields: BERT_FIELDS,
        aliases: &[],
        eps_field: Some("layer_norm_eps"),
        act_default: "gelu",
        embedding_field: None,
        projection: Projection::None,
        token_types: true,
        positions_after_padding: true,
        layers: Layers::Each("encoder.layer"),
        tensors: BERT_TENSORS,
    },
    Naming {
        model_types: &["distilbert"],
        prefix: "distilbert.",
        fields: ["n_layers", "dim", "n_heads", "hidden_dim", "activation"],
        aliases: &[
            ("n_layers", "num_hidden_layers"),
            ("dim", "hidden_size"),
            ("n_heads", "num_attention_heads"),
        ],
        eps_field: None,
        act_default: "gelu",
        embedding_field: None,
        projection: Projection::None,
        token_types: false,
        positions_after_padding: false,
        layers: Layers::Each("transformer.layer"),
        tensors: [
            "attention.q_lin",
            "attention.k_lin",
            "attention.v_lin",
            "attention.out_lin",
            "sa_layer_norm",
            "ffn.lin1",
            "ffn.lin2",
            "output_layer_norm",
        ],
    },
    Naming {
        model_types: &["electra"],
        prefix: "electra.",
        fields: BERT_FIELDS,
        aliases: &[],
        eps_field: Some("layer_norm_eps"),
        act_default: "gelu",
        embedding_field: Some("embedding_size"),
        projection: Projection::IfWidthsDiffer("embeddings_project"),
        token_types: true,
        positions_after_padding: false,
        layers: Layers::Each("encoder.layer"),
        tensors: BERT_TENSORS,
    },
    Naming {
        model_types: &["albert"],
        prefix: "albert.",
        fields: BERT_FIELDS,
        aliases: &[],
        eps_field: Some("layer_norm_eps"),
        act_default: "gelu_new",
        embedding_field: Some("embedding_size"),
        projection: Projection::Always("encoder.embedding_hidden_mapping_in"),
        token_types: true,
        positions_after_padding: false,
        layers: Layers::AlbertGroups,
        tensors: [
            "attention.query",
            "attention.key",
            "attention.value",
            "attention.dense",
            "attention.LayerNorm",
            "ffn",
            "ffn_output",
            "full_layer_layer_norm",
        ],
    },
];

const BERT_FIELDS: [&str; 5] = [
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
];

const BERT_TENSORS: [&str; 8] = [
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "attention.output.LayerNorm",
    "intermediate.dense",
    "output.dense",
    "output.LayerNorm",
];

impl Checkpoint {
    /// Only `dir/config.json`: the encoder's sizes and the longest sequence its position
    /// embeddings take (what `tune --model DIR` needs, without reading the weights).
    pub fn read_config(dir: &Path) -> Result<(BertConfig, usize), BertError> {
        let (config, tables) = read_config(&dir.join("config.json"))?;
        Ok((config, tables.max_seq()))
    }

    /// Checks that `tokens` fit the tables `dir/config.json` describes (ids, token types,
    /// positions), without reading the weights: what `tune --model DIR` plans must be a batch
    /// `infer` takes.
    pub fn check_tokens(dir: &Path, tokens: &TokenBatch) -> Result<(), BertError> {
        let (_, tables) = read_config(&dir.join("config.json"))?;
        tokens.check_fits(tables.vocab, tables.types.unwrap_or(1), tables.max_seq())
    }

    /// Reads `dir/config.json` and `dir/model.safetensors` (or the shards its
    /// `model.safetensors.index.json` lists).
    pub fn load(dir: &Path) -> Result<Checkpoint, BertError> {
        let cfg_path = dir.join("config.json");
        let (config, layout) = read_config(&cfg_path)?;
        let files = TensorFiles::read(dir)?;
        let bad = |reason: String| BertError::Checkpoint {
            path: files.origin.clone(),
            reason,
        };
        let tensors = files.parse()?;
        let reader = Reader::new(&tensors, layout.naming).map_err(bad)?;
        let (h, f, w) = (config.hidden, config.ffn, config.embedding);
        let e = |name: &str, dims: &[usize]| reader.get(&format!("embeddings.{name}"), dims);
        let token_type = match layout.types {
            Some(types) => e("token_type_embeddings.weight", &[types, w]).map_err(bad)?,
            None => vec![0.0; w],
        };
        let embeddings = Embeddings {
            word: e("word_embeddings.weight", &[layout.vocab, w]).map_err(bad)?,
            position: e("position_embeddings.weight", &[layout.positions, w]).map_err(bad)?,
            positions: layout.position_ids,
            token_type,
            ln_gamma: reader
                .layer_norm("embeddings.LayerNorm", true, w)
                .map_err(bad)?,
            ln_beta: reader
                .layer_norm("embeddings.LayerNorm", false, w)
                .map_err(bad)?,
            width: w,
            ln_eps: config.ln_eps,
        };
        let projection = match layout.naming.projection {
            Projection::IfWidthsDiffer(at) | Projection::Always(at) if config.projected => {
                Some(reader.linear(at, h, w).map_err(bad)?)
            }
            _ => None,
        };
        let layers = layout
            .layers
            .iter()
            .map(|at| reader.layer(at, h, f).map_err(bad))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            config,
            embeddings,
            projection,
            layers,
            steps: layout.steps,
        })
    }
}

/// What `config.json` says beyond the encoder's sizes: the embedding tables' row counts
/// (`None` types: no table), how positions are counted, the naming of the tensors, and the
/// layers' weights.
struct Layout {
    vocab: usize,
    positions: usize,
    types: Option<usize>,
    position_ids: Positions,
    naming: &'static Naming,
    /// The distinct layers' names (`encoder.layer.3`).
    layers: Vec<String>,
    /// The layer of `layers` each step runs.
    steps: Vec<usize>,
}

impl Layout {
    /// The longest sequence the position table takes (its rows past the positions' offset).
    fn max_seq(&self) -> usize {
        self.positions.saturating_sub(self.position_ids.offset())
    }
}

/// The [`Naming`] of `config.json`'s `model_type`.
fn naming(f: &Fields) -> Result<&'static Naming, BertError> {
    let known = || {
        NAMINGS
            .iter()
            .flat_map(|n| n.model_types.iter().map(|t| format!("'{t}'")))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some(model_type) = f.v.get("model_type").and_then(Value::as_str) else {
        return Err(f.bad(format!(
            "field 'model_type' is missing (expected one of {})",
            known()
        )));
    };
    NAMINGS
        .iter()
        .find(|n| n.model_types.contains(&model_type))
        .ok_or_else(|| {
            f.bad(format!(
                "model_type '{model_type}' is not a BERT-family encoder (served: {})",
                known()
            ))
        })
}

/// `config.json` as the encoder's sizes and the embedding tables' row counts.
fn read_config(path: &Path) -> Result<(BertConfig, Layout), BertError> {
    let f = Fields::read(path)?;
    let naming = naming(&f)?;
    // A field missing under its own name is read under its alias, if it has one.
    let [layers, hidden, heads, ffn, act_field] =
        naming.fields.map(
            |name| match naming.aliases.iter().find(|(field, _)| *field == name) {
                Some(&(_, alias)) if f.v.get(name).is_none() && f.v.get(alias).is_some() => alias,
                _ => name,
            },
        );
    let act_name = f.text(act_field, naming.act_default)?;
    let act = HIDDEN_ACTS
        .iter()
        .find(|(n, _)| *n == act_name)
        .map(|&(_, a)| a)
        .ok_or_else(|| {
            f.bad(format!(
                "{act_field} '{act_name}' is not supported (supported: {})",
                HIDDEN_ACTS.map(|(n, _)| n).join(", ")
            ))
        })?;
    let pos_type = f.text("position_embedding_type", "absolute")?;
    if pos_type != "absolute" {
        return Err(f.bad(format!(
            "position_embedding_type '{pos_type}' is not supported (only 'absolute')"
        )));
    }
    if f.flag("is_decoder")? {
        return Err(f.bad(
            "is_decoder true is not supported (a decoder masks attention causally; this \
             encoder attends both ways)"
                .into(),
        ));
    }
    let ln_eps = match naming.eps_field {
        Some(field) => f.layer_norm_eps(field)?,
        None => 1e-12,
    };
    let h = f.size(hidden)?;
    let embedding = match naming.embedding_field {
        Some(field) => f.size_or(field, 128)?,
        None => h,
    };
    let (names, steps) = layer_plan(&f, naming, layers)?;
    let config = BertConfig {
        name: naming.model_types[0],
        layers: steps.len(),
        hidden: h,
        embedding,
        projected: match naming.projection {
            Projection::None => false,
            Projection::IfWidthsDiffer(_) => embedding != h,
            Projection::Always(_) => true,
        },
        heads: f.size(heads)?,
        ffn: f.size(ffn)?,
        ln_eps,
        init_std: 0.0,
        act,
    };
    config
        .validate()
        .map_err(|e| f.bad(format!("{e} ({heads}, {hidden})")))?;
    let positions = f.size("max_position_embeddings")?;
    let position_ids = if naming.positions_after_padding {
        let pad_id = match f.v.get("pad_token_id") {
            None => 1,
            Some(_) => f.count("pad_token_id")?,
        };
        if pad_id + 1 >= positions {
            return Err(f.bad(format!(
                "pad_token_id {pad_id} leaves no position of the {positions} \
                 (max_position_embeddings): positions count from pad_token_id + 1"
            )));
        }
        Positions::AfterPadding {
            pad_id: pad_id as u32,
        }
    } else {
        Positions::FromZero
    };
    let layout = Layout {
        vocab: f.size("vocab_size")?,
        positions,
        types: match (naming.token_types, f.v.get("type_vocab_size")) {
            (false, _) => None,
            (true, None) => Some(2),
            (true, Some(_)) => Some(f.size("type_vocab_size")?),
        },
        position_ids,
        naming,
        layers: names,
        steps,
    };
    Ok((config, layout))
}

/// The distinct layers' names and the layer each step runs; `layers_field` holds the layer
/// count (the steps, for ALBERT).
fn layer_plan(
    f: &Fields,
    naming: &Naming,
    layers_field: &str,
) -> Result<(Vec<String>, Vec<usize>), BertError> {
    let n = f.size(layers_field)?;
    let at = match naming.layers {
        Layers::Each(at) => at,
        Layers::AlbertGroups => return albert_plan(f, n),
    };
    Ok((
        (0..n).map(|l| format!("{at}.{l}")).collect(),
        (0..n).collect(),
    ))
}

/// ALBERT's `num_hidden_groups × inner_group_num` layers, and the `n` steps' groups as
/// transformers picks them: step `i` runs every layer of group `int(i / (n / groups))`.
fn albert_plan(f: &Fields, n: usize) -> Result<(Vec<String>, Vec<usize>), BertError> {
    let groups = f.size_or("num_hidden_groups", 1)?;
    let inner = f.size_or("inner_group_num", 1)?;
    if n * inner > 1 << 20 || groups * inner > 1 << 20 {
        return Err(f.bad(format!(
            "num_hidden_layers {n}, num_hidden_groups {groups} and inner_group_num {inner} \
             make more than 1048576 layers"
        )));
    }
    let names = (0..groups)
        .flat_map(|g| {
            (0..inner).map(move |i| format!("encoder.albert_layer_groups.{g}.albert_layers.{i}"))
        })
        .collect();
    let steps = (0..n)
        .flat_map(|i| {
            let g = ((i as f64 / (n as f64 / groups as f64)) as usize).min(groups - 1);
            (0..inner).map(move |j| g * inner + j)
        })
        .collect();
    Ok((names, steps))
}

/// The fields of a `config.json`, read with errors that name the file and the field.
struct Fields<'a> {
    path: &'a Path,
    v: Value,
}

/// The most bytes a JSON file of a checkpoint directory is read up to.
pub(crate) const JSON_LIMIT: u64 = 64 << 20;

/// The bytes of regular file `path` of at most `limit` bytes (a device such as `/dev/zero`,
/// a FIFO or a directory named like a checkpoint file is refused, not read without end).
pub(crate) fn read_file(path: &Path, limit: u64) -> Result<Vec<u8>, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read: {e}"))?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if meta.len() > limit {
        return Err(format!("{} bytes, more than the {limit} read", meta.len()));
    }
    std::fs::read(path).map_err(|e| format!("cannot read: {e}"))
}

impl<'a> Fields<'a> {
    fn read(path: &'a Path) -> Result<Fields<'a>, BertError> {
        let f = Fields {
            path,
            v: Value::Null,
        };
        let text = read_file(path, JSON_LIMIT).map_err(|e| f.bad(e))?;
        let v: Value =
            serde_json::from_slice(&text).map_err(|e| f.bad(format!("not JSON: {e}")))?;
        if !v.is_object() {
            return Err(f.bad("not a JSON object of the model's fields".into()));
        }
        Ok(Fields { path, v })
    }

    fn bad(&self, reason: String) -> BertError {
        BertError::Checkpoint {
            path: self.path.to_path_buf(),
            reason,
        }
    }

    /// A required count: a whole number from 0 to 2^20.
    fn count(&self, name: &str) -> Result<usize, BertError> {
        self.whole(name, 0)
    }

    /// A required size: a whole number from 1 to 2^20.
    fn size(&self, name: &str) -> Result<usize, BertError> {
        self.whole(name, 1)
    }

    /// An optional size: `default` when missing (null is refused, as transformers does).
    fn size_or(&self, name: &str, default: usize) -> Result<usize, BertError> {
        match self.v.get(name) {
            None => Ok(default),
            Some(_) => self.size(name),
        }
    }

    /// A required whole number from `min` to 2^20.
    fn whole(&self, name: &str, min: u64) -> Result<usize, BertError> {
        match self.v.get(name) {
            None => Err(self.bad(format!("field '{name}' is missing"))),
            Some(x) => match x.as_u64() {
                Some(n) if (min..=1 << 20).contains(&n) => Ok(n as usize),
                _ => Err(self.bad(format!(
                    "field '{name}' is {x}, not a whole number from {min} to 1048576"
                ))),
            },
        }
    }

    /// An optional string (`default` when missing; null is refused, as transformers does).
    fn text(&self, name: &str, default: &str) -> Result<String, BertError> {
        match self.v.get(name) {
            None => Ok(default.to_string()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(x) => Err(self.bad(format!("field '{name}' is {x}, not a string"))),
        }
    }

    /// An optional boolean (false when missing or null).
    fn flag(&self, name: &str) -> Result<bool, BertError> {
        match self.v.get(name) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(x) => Err(self.bad(format!("field '{name}' is {x}, not true or false"))),
        }
    }

    /// A LayerNorm epsilon, field `name` (1e-12 when missing): in (0, 1), and positive in f32
    /// too (a subnormal f64 would round to 0).
    fn layer_norm_eps(&self, name: &str) -> Result<f32, BertError> {
        let Some(x) = self.v.get(name) else {
            return Ok(1e-12);
        };
        match x.as_f64() {
            Some(e) if e > 0.0 && e < 1.0 && (e as f32) > 0.0 => Ok(e as f32),
            _ => Err(self.bad(format!("field '{name}' is {x}, not a number in (0, 1)"))),
        }
    }
}

/// Tensors by Hugging Face name, with the checkpoint's prefix (`bert.` or none).
struct Reader<'a> {
    st: &'a Tensors<'a>,
    prefix: &'static str,
    naming: &'static Naming,
}

impl<'a> Reader<'a> {
    /// The reader of `st`'s model; a file that holds a tensor both with and without the
    /// prefix is refused (which of the two to serve cannot be told).
    fn new(st: &'a Tensors<'a>, naming: &'static Naming) -> Result<Self, String> {
        let p = naming.prefix;
        // Any tensor under the prefix: a missing one is then named with it.
        let names = st.names();
        let prefixed = names.iter().any(|n| n.starts_with(p));
        if prefixed {
            if let Some(twin) = names
                .into_iter()
                .find(|n| !n.starts_with(p) && st.tensor(&format!("{p}{n}")).is_some())
            {
                return Err(format!(
                    "holds both '{p}{twin}' and '{twin}': which to serve cannot be told \
                     (save the model to serve on its own)"
                ));
            }
        }
        let prefix = if prefixed { p } else { "" };
        Ok(Reader { st, prefix, naming })
    }

    /// Tensor `name` (prefixed) as f32, checked to have shape `dims`.
    fn get(&self, name: &str, dims: &[usize]) -> Result<Vec<f32>, String> {
        let full = format!("{}{name}", self.prefix);
        let t = self
            .st
            .tensor(&full)
            .ok_or_else(|| self.st.missing(&full))?;
        if t.shape() != dims {
            return Err(format!(
                "tensor '{full}' has shape {:?}, config.json says {dims:?}",
                t.shape()
            ));
        }
        let v = to_f32(t.dtype(), t.data()).ok_or_else(|| {
            format!(
                "tensor '{full}' is {:?}; F32, F16, BF16 and F64 are read",
                t.dtype()
            )
        })?;
        // A NaN or ∞ weight makes every output NaN: said here, naming it. (No early exit:
        // the fold vectorises, ~10 ms for BERT-base's weights.)
        if !v.iter().fold(true, |ok, x| ok & x.is_finite()) {
            let i = v
                .iter()
                .position(|x| !x.is_finite())
                .expect("one is not finite");
            return Err(format!(
                "tensor '{full}' holds {} at index {i} (flat): a damaged checkpoint, or one \
                 saved after a diverged update",
                v[i]
            ));
        }
        Ok(v)
    }

    /// A LayerNorm's scale (`weight`, or legacy `gamma`) or shift (`bias` / `beta`).
    fn layer_norm(&self, at: &str, scale: bool, h: usize) -> Result<Vec<f32>, String> {
        let (name, legacy) = if scale {
            ("weight", "gamma")
        } else {
            ("bias", "beta")
        };
        let legacy_name = format!("{}{at}.{legacy}", self.prefix);
        if self.st.tensor(&legacy_name).is_some() {
            return self.get(&format!("{at}.{legacy}"), &[h]);
        }
        self.get(&format!("{at}.{name}"), &[h])
    }

    /// `nn.Linear` `at` (`weight [out, in]`, `bias [out]`) as `(in × out, bias)`.
    fn linear(&self, at: &str, out: usize, inp: usize) -> Result<(Vec<f32>, Vec<f32>), String> {
        let w = self.get(&format!("{at}.weight"), &[out, inp])?;
        let b = self.get(&format!("{at}.bias"), &[out])?;
        let mut t = vec![0.0f32; inp * out];
        for (o, row) in w.chunks_exact(inp).enumerate() {
            for (i, x) in row.iter().enumerate() {
                t[i * out + o] = *x;
            }
        }
        Ok((t, b))
    }

    /// The layer named `layer` in the encoder's layout (Q, K, V side by side in one
    /// `H × 3H` matrix).
    fn layer(&self, layer: &str, h: usize, f: usize) -> Result<LayerWeights, String> {
        let at = |s: &str| format!("{layer}.{s}");
        let [q, k, v, out, ln1, up, down, ln2] = self.naming.tensors;
        // The three projections are read (so their shapes checked against the file) before
        // the fused matrix is allocated: a config's sizes alone allocate nothing.
        let qkv = [q, k, v].map(|name| self.linear(&at(name), h, h));
        let (mut w_qkv, mut b_qkv) = (vec![0.0f32; h * 3 * h], Vec::with_capacity(3 * h));
        for (part, projection) in qkv.into_iter().enumerate() {
            let (w, b) = projection?;
            for (dst, src) in w_qkv.chunks_exact_mut(3 * h).zip(w.chunks_exact(h)) {
                dst[part * h..(part + 1) * h].copy_from_slice(src);
            }
            b_qkv.extend(b);
        }
        let (w_o, b_o) = self.linear(&at(out), h, h)?;
        let (w_ffn1, b_ffn1) = self.linear(&at(up), f, h)?;
        let (w_ffn2, b_ffn2) = self.linear(&at(down), h, f)?;
        let ln = |s: &str, scale| self.layer_norm(&at(s), scale, h);
        Ok(LayerWeights {
            w_qkv,
            b_qkv,
            w_o,
            b_o,
            ln1_gamma: ln(ln1, true)?,
            ln1_beta: ln(ln1, false)?,
            w_ffn1,
            b_ffn1,
            w_ffn2,
            b_ffn2,
            ln2_gamma: ln(ln2, true)?,
            ln2_beta: ln(ln2, false)?,
        })
    }
}

/// Little-endian `F32`, `F16` or `BF16` data as f32 (exact), or `F64` rounded to the nearest
/// f32; `None` for other types.
pub fn to_f32(dtype: Dtype, data: &[u8]) -> Option<Vec<f32>> {
    let halves = || {
        data.chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    match dtype {
        Dtype::F32 => Some(
            data.chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        ),
        Dtype::BF16 => Some(halves().map(|h| f32::from_bits((h as u32) << 16)).collect()),
        Dtype::F16 => Some(halves().map(f16_to_f32).collect()),
        Dtype::F64 => Some(
            data.chunks_exact(8)
                .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")) as f32)
                .collect(),
        ),
        _ => None,
    }
}

/// IEEE binary16 bits as f32 (exact: normals, subnormals, zeros, infinities, NaN).
fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match (exp, man) {
        (0, 0) => sign,
        // Subnormal: man · 2^-24, exact in f32.
        (0, m) => {
            let v = m as f32 * 2f32.powi(-24);
            return if sign != 0 { -v } else { v };
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_precision_converts_exactly() {
        for (bits, want) in [
            (0x3c00u16, 1.0f32),
            (0xc000, -2.0),
            (0x3555, 0.333_251_95),
            (0x7bff, 65504.0),
            (0x0001, 5.960_464_5e-8),
            (0x8001, -5.960_464_5e-8),
            (0x03ff, 6.097_555e-5),
            (0x0000, 0.0),
            (0x7c00, f32::INFINITY),
            (0xfc00, f32::NEG_INFINITY),
        ] {
            assert_eq!(f16_to_f32(bits), want, "{bits:#06x}");
        }
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
        let bf = to_f32(Dtype::BF16, &[0x80, 0x3f, 0xc0, 0xbf]).unwrap();
        assert_eq!(bf, vec![1.0, -1.5]);
        assert_eq!(
            to_f32(Dtype::F32, &1.25f32.to_le_bytes()).unwrap(),
            vec![1.25]
        );
        let doubles: Vec<u8> = [1.0f64 / 3.0, -2.5, 1e300]
            .iter()
            .flat_map(|d| d.to_le_bytes())
            .collect();
        let rounded = to_f32(Dtype::F64, &doubles).unwrap();
        assert_eq!(rounded, vec![1.0f32 / 3.0, -2.5, f32::INFINITY]);
        assert!(to_f32(Dtype::I64, &[0; 8]).is_none());
    }
}
