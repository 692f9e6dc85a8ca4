//! What `infer` runs: a seeded model (`bert-base`, `bert-large`, `bert-tiny`: the encoder
//! alone, on generated inputs) or a Hugging Face checkpoint directory (embeddings and
//! encoder, on token ids) — with the inputs, and the f64 references, of each (batch, seq).

use std::path::Path;

use anyhow::bail;
use bert::{
    batch_input, reference_forward_len, sequence_input, BertConfig, BertModel, Checkpoint, Encoder,
    Expected, LevelCounts, Scratch, StageTimes, TokenBatch,
};
use runtime::Runtime;

/// A model to serve.
pub enum Source {
    /// Weights drawn from a seed; the input is the embedding block's output.
    Seeded { config: BertConfig, seed: u64 },
    /// A checkpoint, with the batch and transformers' output saved beside it if any
    /// (`inputs.json`, `expected.safetensors`).
    Checkpoint {
        ckpt: Box<Checkpoint>,
        fixture: Option<(TokenBatch, Option<Expected>)>,
    },
}

/// The sizes of model `name` and the longest sequence it takes, without reading weights:
/// a seeded model's name, or a checkpoint directory.
pub fn model_config(name: &str) -> anyhow::Result<(BertConfig, usize)> {
    if let Some(c) = seeded(name)? {
        return Ok((c, bert::MAX_SEQ));
    }
    if Path::new(name).is_dir() {
        return Ok(Checkpoint::read_config(Path::new(name))?);
    }
    bail!("{}", unknown(name))
}

/// `(batch, seq)` of the batch saved beside checkpoint `name` (`inputs.json`), if it is a
/// directory with one: what `infer --model DIR` runs when no shape is given.
pub fn saved_shape(name: &str) -> anyhow::Result<Option<(usize, usize)>> {
    let inputs = Path::new(name).join("inputs.json");
    if seeded(name)?.is_some() || !inputs.exists() {
        return Ok(None);
    }
    let t = TokenBatch::from_json(&inputs)?;
    // A batch `infer` refuses (too long for the positions, ids or token types outside the
    // tables) is not a shape to tune.
    Checkpoint::check_tokens(Path::new(name), &t)
        .map_err(|e| anyhow::anyhow!("{}: {e}", inputs.display()))?;
    Ok(Some((t.batch, t.seq)))
}

/// The seeded model `name` names, if it names one — refused when a checkpoint directory of
/// that name is here too (`git clone https://huggingface.co/prajjwal1/bert-tiny` makes one):
/// which was meant cannot be told, and random weights in place of the checkpoint would go
/// unnoticed.
fn seeded(name: &str) -> anyhow::Result<Option<BertConfig>> {
    let config = BertConfig::by_name(name);
    if config.is_some() && Path::new(name).join("config.json").exists() {
        bail!(
            "'{name}' names both a seeded model and the checkpoint directory here: give \
             ./{name} for the directory, or run elsewhere for the seeded model"
        );
    }
    Ok(config)
}

fn unknown(name: &str) -> String {
    let path = Path::new(name);
    if path.exists() {
        return format!("model '{name}' is not a directory (give a checkpoint directory with config.json and model.safetensors)");
    }
    if name.contains(std::path::MAIN_SEPARATOR) || name.starts_with('.') {
        return format!("model directory '{name}' does not exist");
    }
    format!(
        "unknown model '{name}': no seeded model of that name ({}) and no directory '{name}' here \
         (a Hugging Face BERT, RoBERTa, DistilBERT, ELECTRA or ALBERT directory with config.json \
         and model.safetensors)",
        BertConfig::NAMES.join(", ")
    )
}

impl Source {
    /// The seeded model called `name`, or the checkpoint in directory `name`.
    pub fn open(name: &str, seed: u64) -> anyhow::Result<Source> {
        if let Some(config) = seeded(name)? {
            return Ok(Source::Seeded { config, seed });
        }
        let dir = Path::new(name);
        if !dir.is_dir() {
            bail!("{}", unknown(name));
        }
        let ckpt = Box::new(Checkpoint::load(dir)?);
        let inputs = dir.join("inputs.json");
        let fixture = if inputs.exists() {
            let tokens = TokenBatch::from_json(&inputs)?;
            // Ids and types that fit the tables, named with the file they came from.
            ckpt.embeddings
                .check(&tokens)
                .map_err(|e| anyhow::anyhow!("{}: {e}", inputs.display()))?;
            let exp = dir.join("expected.safetensors");
            let expected = exp.exists().then(|| Expected::load(&exp)).transpose()?;
            if let Some(e) = &expected {
                let want = (tokens.batch, tokens.seq, ckpt.config.hidden);
                if (e.batch, e.seq, e.hidden) != want {
                    bail!(
                        "{}: last_hidden_state is [{}, {}, {}], inputs.json and config.json make it {want:?}",
                        exp.display(), e.batch, e.seq, e.hidden
                    );
                }
            }
            Some((tokens, expected))
        } else {
            let exp = dir.join("expected.safetensors");
            if exp.exists() {
                eprintln!(
                    "note: {} is not checked against: it is the output of the batch in \
                     inputs.json, which is missing",
                    exp.display()
                );
            }
            None
        };
        Ok(Source::Checkpoint { ckpt, fixture })
    }

    pub fn config(&self) -> &BertConfig {
        match self {
            Source::Seeded { config, .. } => config,
            Source::Checkpoint { ckpt, .. } => &ckpt.config,
        }
    }

    /// The name in reports: the seeded model's, or the checkpoint's directory.
    pub fn label(&self) -> String {
        match self {
            Source::Seeded { config, .. } => config.name.to_string(),
            Source::Checkpoint { ckpt, .. } => ckpt.dir.display().to_string(),
        }
    }

    /// The longest sequence the model takes.
    pub fn max_seq(&self) -> usize {
        match self {
            Source::Seeded { .. } => bert::MAX_SEQ,
            Source::Checkpoint { ckpt, .. } => ckpt.embeddings.max_seq(),
        }
    }

    /// `(batch, seq)` of the batch saved beside the checkpoint, if any.
    pub fn fixture_shape(&self) -> Option<(usize, usize)> {
        match self {
            Source::Checkpoint {
                fixture: Some((t, _)),
                ..
            } => Some((t.batch, t.seq)),
            _ => None,
        }
    }

    /// The model with its weights packed through `rt` for `shapes`.
    pub fn load(&self, rt: &Runtime, shapes: &[(usize, usize)]) -> anyhow::Result<Loaded> {
        Ok(match self {
            Source::Seeded { config, seed } => {
                Loaded::Encoder(Encoder::load(rt, *config, *seed, shapes)?)
            }
            Source::Checkpoint { ckpt, .. } => {
                Loaded::Model(Box::new(BertModel::load(rt, ckpt, shapes)?))
            }
        })
    }

    /// The input of one (batch, seq): the saved batch when it has that shape and no
    /// `lengths` are asked for, otherwise generated from the seed (`lengths` cycled over the
    /// batch, each clamped to `seq`; empty: full length).
    pub fn input(&self, batch: usize, seq: usize, lengths: &[usize], seed: u64) -> Input {
        match self {
            Source::Seeded { config, seed } => Input {
                lens: TokenBatch::lengths(batch, seq, lengths),
                kind: InputKind::Hidden(batch_input(config, *seed, batch, seq)),
                expected: None,
            },
            Source::Checkpoint { ckpt, fixture } => match fixture {
                Some((t, expected)) if (t.batch, t.seq) == (batch, seq) && lengths.is_empty() => {
                    Input {
                        lens: t.lens.clone(),
                        kind: InputKind::Tokens(t.clone()),
                        expected: expected.clone(),
                    }
                }
                _ => {
                    let e = &ckpt.embeddings;
                    let t =
                        TokenBatch::random((e.vocab(), e.pad_id()), seed, (batch, seq), lengths);
                    Input {
                        lens: t.lens.clone(),
                        kind: InputKind::Tokens(t),
                        expected: None,
                    }
                }
            },
        }
    }

    /// The f64 reference of sequence `i` of `input` (`seq × hidden`).
    pub fn reference(&self, input: &Input, seq: usize, i: usize) -> Vec<f64> {
        let len = input.lens[i].max(0) as usize;
        match (self, &input.kind) {
            (Source::Seeded { config, seed }, _) => {
                let x = sequence_input(config, *seed, seq, i);
                reference_forward_len(config, *seed, seq, &x, len)
            }
            (Source::Checkpoint { ckpt, .. }, InputKind::Tokens(t)) => ckpt.reference(t, i),
            (Source::Checkpoint { .. }, InputKind::Hidden(_)) => {
                unreachable!("a checkpoint's inputs are tokens")
            }
        }
    }
}

/// One (batch, seq)'s input.
pub struct Input {
    /// Real tokens per sequence.
    pub lens: Vec<i32>,
    kind: InputKind,
    /// transformers' output for it, when saved beside the checkpoint.
    pub expected: Option<Expected>,
}

enum InputKind {
    /// The encoder input (`batch × seq × hidden`).
    Hidden(Vec<f32>),
    /// Token ids for the embeddings.
    Tokens(TokenBatch),
}

impl Input {
    /// Whether a sequence is shorter than the batch's `seq` (so attention is masked).
    pub fn padded(&self, seq: usize) -> bool {
        self.lens.iter().any(|&l| l as usize != seq)
    }
}

/// A model packed for one runtime.
pub enum Loaded {
    Encoder(Encoder),
    Model(Box<BertModel>),
}

impl Loaded {
    fn encoder(&self) -> &Encoder {
        match self {
            Loaded::Encoder(e) => e,
            Loaded::Model(m) => &m.encoder,
        }
    }

    /// Seconds the load took (generating or reading is not counted for checkpoints).
    pub fn load_seconds(&self) -> f64 {
        self.encoder().load_seconds()
    }

    /// Bytes of weights held (a checkpoint's embedding tables and projection too).
    pub fn weight_bytes(&self) -> usize {
        match self {
            Loaded::Encoder(e) => e.weight_bytes(),
            Loaded::Model(m) => m.weight_bytes(),
        }
    }

    pub fn max_copies(&self) -> usize {
        self.encoder().max_copies()
    }

    /// Test hook: see [`Encoder::plant_fault`].
    pub fn plant_fault(&mut self, delta: f32) {
        match self {
            Loaded::Encoder(e) => e.plant_fault(delta),
            Loaded::Model(m) => m.encoder.plant_fault(delta),
        }
    }

    /// One forward pass over `input` (`batch × seq`), into `scratch`; with `times`, the
    /// seconds per stage are added to it.
    pub fn forward(
        &self,
        rt: &Runtime,
        (batch, seq): (usize, usize),
        input: &Input,
        scratch: &mut Scratch,
        times: Option<&mut StageTimes>,
    ) -> anyhow::Result<LevelCounts> {
        let lens = Some(input.lens.as_slice()).filter(|_| input.padded(seq));
        let calls = match (self, &input.kind, times) {
            (Loaded::Encoder(e), InputKind::Hidden(x), Some(t)) => {
                e.forward_profiled(rt, (batch, seq), lens, x, scratch, t)?
            }
            (Loaded::Encoder(e), InputKind::Hidden(x), None) => match lens {
                Some(l) => e.forward_masked(rt, (batch, seq), l, x, scratch)?,
                None => e.forward_with(rt, batch, seq, x, scratch)?,
            },
            (Loaded::Model(m), InputKind::Tokens(t), Some(times)) => {
                m.forward_profiled(rt, t, scratch, times)?
            }
            (Loaded::Model(m), InputKind::Tokens(t), None) => m.forward_with(rt, t, scratch)?,
            _ => unreachable!("seeded models take hidden states, checkpoints tokens"),
        };
        Ok(calls)
    }
}
