//! `autokernel infer`: a BERT model through the runtime — latency, throughput and which
//! level served each kernel call, tuned database vs kernel defaults, output checked against
//! the f64 reference, and against `transformers`' output when a checkpoint carries one.

mod model;

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::bail;
use bert::{check, LevelCounts};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use runtime::Runtime;
use serde_json::json;

#[derive(Args)]
pub struct InferArgs {
    /// The model: `bert-base` (12 layers, hidden 768, 12 heads, FFN 3072, seeded weights),
    /// `bert-large` (24 layers, hidden 1024, 16 heads, FFN 4096, seeded), `bert-tiny` (2
    /// layers, hidden 64; for tests), or a Hugging Face BERT, RoBERTa, DistilBERT, ELECTRA
    /// or ALBERT directory (`config.json` + `model.safetensors`; an `inputs.json` beside them is its
    /// default batch, and an `expected.safetensors` the output it is checked against).
    #[arg(long, default_value = "bert-base", value_name = "MODEL|DIR")]
    pub model: String,
    #[command(flatten)]
    pub db: crate::DbArg,
    /// Batch sizes, comma-separated [default: 1,2,4,8, or a checkpoint's inputs.json].
    #[arg(long, value_name = "B,..", value_parser = positive_list)]
    pub batch: Option<PositiveList>,
    /// Sequence lengths (padded), comma-separated [default: 32,64,128, or a checkpoint's
    /// inputs.json].
    #[arg(long, value_name = "S,..", value_parser = positive_list)]
    pub seq: Option<PositiveList>,
    /// A padded batch: the real lengths of its sequences, cycled over each batch (each
    /// clamped to the sequence length); attention masks the rest.
    #[arg(long, value_name = "L,..", value_parser = positive_list)]
    pub lengths: Option<PositiveList>,
    #[command(flatten)]
    pub threads: crate::ThreadsArg,
    /// The element type of each GEMM, from the database under the error budget:
    /// `f32` (default), `bf16`, `int8`, or `auto` (per workload, the fastest record measured
    /// within --max-rel-err). The untuned comparison stays f32 and is the accuracy baseline:
    /// rows add `cosine_vs_f32` and `max_abs_err_vs_f32` of `last_hidden_state`.
    #[command(flatten)]
    pub precision: crate::PrecisionArg,
    /// Timed forward passes per (batch, seq), for each of tuned and untuned (interleaved).
    #[arg(long, default_value_t = 20, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub iters: u32,
    /// Seed of the weights and inputs.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Which sequences of each batch are checked against the f64 reference: `ends` (the
    /// first and the last), `all`, or `none`.
    #[arg(long, default_value = "ends", value_parser = ["ends", "all", "none"])]
    pub check: String,
    /// Skip the untuned (kernel defaults) comparison.
    #[arg(long)]
    pub no_untuned: bool,
    /// One JSON object per (batch, seq) per line.
    #[arg(long)]
    pub json: bool,
    /// Also print where the time goes: seconds per stage (each GEMM, attention, the rest)
    /// of one extra pass, tuned and untuned.
    #[arg(long)]
    pub profile: bool,
    /// Test hook: plant a wrong bias value after loading, so the check must fail.
    #[arg(long, hide = true)]
    pub plant_fault: bool,
}

/// A comma-separated list of positive whole numbers, deduplicated, in the order given.
#[derive(Debug, Clone)]
pub struct PositiveList(pub Vec<usize>);

/// Parses `1,2,8` into a [`PositiveList`], naming the bad item.
pub fn positive_list(s: &str) -> Result<PositiveList, String> {
    let mut out = Vec::new();
    for item in s.split(',') {
        let item = item.trim();
        match item.parse::<usize>() {
            Ok(v) if (1..=1 << 20).contains(&v) => {
                if !out.contains(&v) {
                    out.push(v)
                }
            }
            _ => {
                return Err(format!(
                "'{item}' is not a whole number from 1 to 1048576 (expected a list such as 1,2,8)"
            ))
            }
        }
    }
    Ok(PositiveList(out))
}

pub use model::{model_config, saved_shape};

/// Refuses a `--seq` longer than the model takes, `max` positions.
fn check_seqs(seqs: &[usize], max: usize) -> anyhow::Result<()> {
    if let Some(s) = seqs.iter().find(|&&s| s > max) {
        bail!("--seq {s}: this model takes at most {max} tokens (its position embeddings)");
    }
    Ok(())
}

/// Every (batch, seq) of the batches asked for (default 1, 2, 4, 8) and the sequence
/// lengths asked for (each within the model's `max` positions), or by default 32, 64 and
/// 128 — those the model takes (its longest, if it takes none of them) (`infer` and `tune
/// --model`).
pub fn model_shapes(
    batch: Option<&PositiveList>,
    seq: Option<&PositiveList>,
    max: usize,
) -> anyhow::Result<Vec<(usize, usize)>> {
    let seqs = match seq {
        Some(s) => {
            check_seqs(&s.0, max)?;
            s.0.clone()
        }
        None => {
            let fit: Vec<usize> = [32, 64, 128].into_iter().filter(|&s| s <= max).collect();
            if fit.is_empty() {
                vec![max]
            } else {
                fit
            }
        }
    };
    let batches = batch.map_or(vec![1, 2, 4, 8], |b| b.0.clone());
    Ok(batches
        .iter()
        .flat_map(|&b| seqs.iter().map(move |&s| (b, s)))
        .collect())
}

/// Largest accepted `|ours − transformers|` on a checkpoint's saved output (f32 both).
pub const TRANSFORMERS_TOLERANCE: f64 = 1e-4;

/// Latency statistics of one variant at one shape.
struct Timing {
    p50: f64,
    p90: f64,
    p99: f64,
}

impl Timing {
    fn of(mut samples: Vec<f64>) -> Timing {
        samples.sort_by(f64::total_cmp);
        // Nearest rank: the smallest sample with at least q of them at or below it.
        let q = |q: f64| {
            samples[((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1]
        };
        Timing {
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
        }
    }
}

fn counts_json(c: &LevelCounts) -> serde_json::Value {
    runtime::Level::ALL
        .iter()
        .map(|&l| (l.as_str().to_string(), json!(c.get(l))))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The (batch, seq) shapes to run: the options', else a checkpoint's saved batch, else
/// the defaults; each seq within the model's positions.
fn shapes_of(args: &InferArgs, source: &model::Source) -> anyhow::Result<Vec<(usize, usize)>> {
    let fixture = source
        .fixture_shape()
        .filter(|_| args.batch.is_none() && args.seq.is_none() && args.lengths.is_none());
    if let Some(shape) = fixture {
        return Ok(vec![shape]);
    }
    model_shapes(args.batch.as_ref(), args.seq.as_ref(), source.max_seq())
}

/// Refuses, before anything is allocated, a (batch, seq) whose activations this process
/// cannot allocate (under `ulimit -v`, or with overcommit off): a one-line error naming the
/// shape instead of an abort mid-run. Only address space is reserved; nothing is touched.
fn check_memory(
    config: &bert::BertConfig,
    shapes: &[(usize, usize)],
    models: usize,
) -> anyhow::Result<()> {
    for &(batch, seq) in shapes {
        let bytes = activation_bytes(config, batch, seq, models);
        let mut probe: Vec<u8> = Vec::new();
        if bytes.is_none_or(|b| probe.try_reserve_exact(b).is_err()) {
            bail!(
                "batch {batch} seq {seq}: its activations need {:.1} GB, more than this process can allocate (lower --batch or --seq)",
                bytes.map_or(f64::INFINITY, |b| b as f64 / 1e9)
            );
        }
    }
    Ok(())
}

/// The activation bytes of `models` models run side by side on (batch, seq), counted per
/// token: the input and output rows, a layer's scratch (x, Q/K/V, context, projection,
/// head-major copies: 10 hidden rows) and an FFN row. None if it overflows.
fn activation_bytes(
    config: &bert::BertConfig,
    batch: usize,
    seq: usize,
    models: usize,
) -> Option<usize> {
    let per_token = config.hidden.checked_mul(12)?.checked_add(config.ffn)?;
    batch
        .checked_mul(seq)?
        .checked_mul(per_token)?
        .checked_mul(models.checked_mul(4)?)
}

/// Which sequences of a batch of `batch` are checked against the f64 reference.
fn checked(how: &str, batch: usize) -> Vec<usize> {
    match how {
        "all" => (0..batch).collect(),
        "none" => vec![],
        _ if batch > 1 => vec![0, batch - 1],
        _ => vec![0],
    }
}

pub fn run(args: InferArgs) -> anyhow::Result<ExitCode> {
    let mut session = Session::open(&args)?;
    for i in 0..session.shapes.len() {
        let row = session.measure(session.shapes[i])?;
        // Each row as soon as its shape is done.
        if args.json {
            super::print_json(&row)?;
        } else {
            session.bar.suspend(|| {
                if i == 0 {
                    print_header();
                }
                print_row(&row);
            });
        }
    }
    session.bar.finish_and_clear();
    if !session.failures.is_empty() {
        bail!(
            "{} output(s) differ from the f64 reference forward or transformers' output:\n  {}",
            session.failures.len(),
            session.failures.join("\n  ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// One `infer` run: the model loaded for every shape asked for, tuned (the database under
/// the precision policy) and, unless `--no-untuned`, untuned (kernel defaults, f32: also the
/// baseline a reduced precision is compared with).
struct Session<'a> {
    args: &'a InferArgs,
    source: model::Source,
    rt: Runtime,
    untuned_rt: Runtime,
    tuned: model::Loaded,
    untuned: Option<model::Loaded>,
    shapes: Vec<(usize, usize)>,
    bar: ProgressBar,
    /// f64 reference outputs by (seq, sequence, its length, batch for checkpoints).
    references: HashMap<(usize, usize, i32, usize), Vec<f64>>,
    failures: Vec<String>,
}

/// The outputs of the latest tuned and untuned passes.
#[derive(Default)]
struct Outputs {
    tuned: bert::Scratch,
    untuned: bert::Scratch,
}

/// What one shape's warm-up passes served, and how they compare with the references.
struct Checked {
    calls: LevelCounts,
    untuned_calls: Option<LevelCounts>,
    calls_by_precision: serde_json::Value,
    /// The sequences checked against the f64 reference, and the largest error among them.
    sequences: usize,
    worst: f64,
    vs_transformers: Option<f64>,
    /// Cosine similarity and max |error| against the f32 model (reduced precisions).
    vs_f32: Option<(f64, f64)>,
}

impl<'a> Session<'a> {
    /// Opens the database and the model, checks the shapes fit in memory, loads (packs) the
    /// weights for every shape and says so.
    fn open(args: &'a InferArgs) -> anyhow::Result<Session<'a>> {
        let source = model::Source::open(&args.model, args.seed)?;
        super::require_db(&args.db.db)?;
        args.threads.apply()?;
        let policy = args.precision.policy()?;
        let rt = super::open_runtime(&args.db.db)?;
        rt.set_precision(policy);
        let untuned_rt = Runtime::defaults_only();
        let shapes = shapes_of(args, &source)?;
        let config = *source.config();
        check_memory(&config, &shapes, 1 + usize::from(!args.no_untuned))?;
        if !args.json {
            eprintln!(
                "{}: {config}, FFN activation {}, {} shape(s), {} thread(s), {} iterations each, database {} ({} workloads tuned here)",
                source.label(),
                describe_act(config.act),
                shapes.len(),
                rt.fingerprint().cores,
                args.iters,
                args.db.db.display(),
                rt.tuned_workloads()
            );
            eprintln!("loading the weights and planning every shape's kernels ...");
        }
        let mut tuned = source.load(&rt, &shapes)?;
        let untuned = match args.no_untuned {
            true => None,
            false => Some(source.load(&untuned_rt, &shapes)?),
        };
        if args.plant_fault {
            tuned.plant_fault(0.1);
        }
        if !args.json {
            let copies = tuned.max_copies();
            eprintln!(
                "loaded in {:.2} s: {:.0} MB of weights, at most {copies} {} per weight",
                tuned.load_seconds(),
                tuned.weight_bytes() as f64 / 1e6,
                if copies == 1 { "copy" } else { "copies" },
            );
        }
        let bar = progress_bar(args, &shapes);
        Ok(Session {
            args,
            source,
            rt,
            untuned_rt,
            tuned,
            untuned,
            shapes,
            bar,
            references: HashMap::new(),
            failures: Vec::new(),
        })
    }

    /// Warms up, checks and times one shape; its row.
    fn measure(&mut self, (batch, seq): (usize, usize)) -> anyhow::Result<serde_json::Value> {
        let shape = (batch, seq);
        self.bar.set_message(format!("batch {batch} seq {seq}"));
        let lengths = self.args.lengths.as_ref().map_or(&[][..], |l| &l.0[..]);
        let input = self.source.input(batch, seq, lengths, self.args.seed);
        let mut out = Outputs::default();
        let checked = self.warm_up_and_check(shape, &input, &mut out)?;
        let by_precision = served_by_precision(&self.rt, self.source.config(), batch, seq);
        self.bar.set_message(format!("batch {batch} seq {seq}"));
        let (tuned, untuned) = self.time(shape, &input, &mut out)?;
        let profile = match self.args.profile {
            true => Some(self.profile(shape, &input, &mut out)?),
            false => None,
        };
        let tt = Timing::of(tuned);
        let ut = (!untuned.is_empty()).then(|| Timing::of(untuned));
        let seqs = |p50: f64| batch as f64 / p50;
        let calls = &checked.calls;
        // JSON has no NaN or ∞: such an error reads null, as does one not checked at all.
        let errors = [
            (checked.sequences > 0).then_some(checked.worst),
            checked.vs_transformers,
            checked.vs_f32.map(|v| v.1),
        ];
        let non_finite = errors.iter().flatten().any(|e| !e.is_finite());
        let at_f32 = judged_at_f32_tolerance(self.rt.precision(), "tuned");
        Ok(json!({
            "model": self.source.label(),
            "act": self.source.config().act.name(),
            "batch": batch,
            "seq": seq,
            "lengths": input.padded(seq).then_some(&input.lens),
            "threads": self.rt.fingerprint().cores,
            "iters": self.args.iters,
            "p50_ms": tt.p50 * 1e3,
            "p90_ms": tt.p90 * 1e3,
            "p99_ms": tt.p99 * 1e3,
            "seqs_per_s": seqs(tt.p50),
            "gflops": self.source.config().flops(batch, seq) / tt.p50 / 1e9,
            "untuned_p50_ms": ut.as_ref().map(|u| u.p50 * 1e3),
            "untuned_seqs_per_s": ut.as_ref().map(|u| seqs(u.p50)),
            "speedup_vs_untuned": ut.as_ref().map(|u| u.p50 / tt.p50),
            "exact": calls.exact,
            "same_arch": calls.same_arch,
            "nearest_shape": calls.nearest_shape,
            "default": calls.default,
            "calls": counts_json(calls),
            "untuned_calls": checked.untuned_calls.as_ref().map(counts_json),
            "checked_sequences": checked.sequences,
            "max_abs_err": (checked.sequences > 0).then_some(checked.worst),
            // The bounds the tuned output was held to: f32's, or in reduced precision only
            // the cosine to the f32 model.
            "tolerance": at_f32.then_some(bert::TOLERANCE),
            "transformers_max_abs_err": checked.vs_transformers,
            "transformers_tolerance": checked
                .vs_transformers
                .filter(|_| at_f32)
                .map(|_| TRANSFORMERS_TOLERANCE),
            "min_cosine_vs_f32": (!at_f32).then_some(MIN_COSINE_VS_F32),
            "profile": profile,
            "precision": self.rt.precision().to_string(),
            "workloads_by_precision": by_precision,
            "calls_by_precision": checked.calls_by_precision,
            "cosine_vs_f32": checked.vs_f32.map(|v| v.0),
            "max_abs_err_vs_f32": checked.vs_f32.map(|v| v.1),
            "non_finite_output": non_finite,
        }))
    }

    /// One untimed pass of each model (caches, page faults, lazily planned shapes), whose
    /// outputs are then checked: against the f64 reference, against transformers' output
    /// when the checkpoint carries one, and (a reduced precision) against the f32 model.
    fn warm_up_and_check(
        &mut self,
        shape: (usize, usize),
        input: &model::Input,
        out: &mut Outputs,
    ) -> anyhow::Result<Checked> {
        let tokens = (shape.0 * shape.1) as u64;
        let before = self.rt.lookups();
        let calls = self
            .tuned
            .forward(&self.rt, shape, input, &mut out.tuned, None)?;
        let after = self.rt.lookups();
        self.bar.inc(tokens);
        let untuned_calls = match &self.untuned {
            Some(u) => {
                let c = u.forward(&self.untuned_rt, shape, input, &mut out.untuned, None)?;
                self.bar.inc(tokens);
                Some(c)
            }
            None => None,
        };
        let (sequences, worst) = self.check_reference(shape, input, out);
        let vs_transformers = self.check_transformers(shape, input, out)?;
        let vs_f32 = self.check_vs_f32(shape, input, out);
        Ok(Checked {
            calls,
            untuned_calls,
            calls_by_precision: json!({
                "f32": after.f32 - before.f32,
                "bf16": after.bf16 - before.bf16,
                "int8": after.int8 - before.int8,
            }),
            sequences,
            worst,
            vs_transformers,
            vs_f32,
        })
    }

    /// The outputs to check, by name: tuned, and untuned where it ran.
    fn outputs<'o>(&self, out: &'o Outputs) -> Vec<(&'static str, &'o [f32])> {
        let mut v = vec![("tuned", out.tuned.output())];
        if self.untuned.is_some() {
            v.push(("untuned", out.untuned.output()));
        }
        v
    }

    /// Checks the `--check` sequences of each output against the f64 reference (f32's
    /// tolerance; a reduced precision's tuned output is judged against the f32 model
    /// instead); how many were checked and the largest error.
    fn check_reference(
        &mut self,
        (batch, seq): (usize, usize),
        input: &model::Input,
        out: &Outputs,
    ) -> (usize, f64) {
        let h = self.source.config().hidden;
        let which = checked(&self.args.check, batch);
        let seeded = matches!(self.source, model::Source::Seeded { .. });
        let outputs = self.outputs(out);
        let policy = self.rt.precision();
        let mut worst = 0.0f64;
        for &i in &which {
            self.bar.set_message(format!(
                "batch {batch} seq {seq}: reference of sequence {i}"
            ));
            // Seeded inputs depend on (seq, i) only; checkpoint tokens on the batch too.
            let key = (seq, i, input.lens[i], if seeded { 0 } else { batch });
            let source = &self.source;
            let reference = self
                .references
                .entry(key)
                .or_insert_with(|| source.reference(input, seq, i));
            for &(name, out) in &outputs {
                let (a, judged) = match check(&out[i * seq * h..(i + 1) * seq * h], reference) {
                    Ok(a) => (a, false),
                    Err(a) => (a, judged_at_f32_tolerance(policy, name)),
                };
                worst = worse(worst, a.max_abs_err);
                if judged {
                    // A NaN output is measured as an infinite error: say what it is.
                    let err = match a.max_abs_err {
                        e if e.is_finite() => format!("= {e:.3e}"),
                        _ => "is not finite (a NaN or ∞ output)".into(),
                    };
                    self.failures.push(format!(
                        "batch {batch} seq {seq}, sequence {i} ({name}): max |output - reference| {err} at token {}, dim {} (tolerance {:.0e})",
                        a.at / h,
                        a.at % h,
                        bert::TOLERANCE
                    ));
                }
            }
        }
        (which.len(), worst)
    }

    /// The largest |output − transformers' output| when the checkpoint carries one (f32
    /// outputs must be within [`TRANSFORMERS_TOLERANCE`]).
    fn check_transformers(
        &mut self,
        (batch, seq): (usize, usize),
        input: &model::Input,
        out: &Outputs,
    ) -> anyhow::Result<Option<f64>> {
        let Some(expected) = &input.expected else {
            return Ok(None);
        };
        let policy = self.rt.precision();
        let mut worst: Option<f64> = None;
        for (name, out) in self.outputs(out) {
            let e = expected.max_abs_err(out)?;
            worst = Some(worst.map_or(e, |w| worse(w, e)));
            if e.is_nan() || (judged_at_f32_tolerance(policy, name) && e > TRANSFORMERS_TOLERANCE) {
                self.failures.push(format!(
                    "batch {batch} seq {seq} ({name}): max |output - transformers| = {e:.3e} (tolerance {TRANSFORMERS_TOLERANCE:.0e})"
                ));
            }
        }
        Ok(worst)
    }

    /// A reduced precision's agreement with the f32 model (the untuned pass), where both
    /// ran; below [`MIN_COSINE_VS_F32`] is a failure.
    fn check_vs_f32(
        &mut self,
        (batch, seq): (usize, usize),
        input: &model::Input,
        out: &Outputs,
    ) -> Option<(f64, f64)> {
        let policy = self.rt.precision();
        if policy.is_exact() || self.untuned.is_none() {
            return None;
        }
        let h = self.source.config().hidden;
        let (cos, worst) = agreement(
            out.tuned.output(),
            out.untuned.output(),
            &input.lens,
            seq,
            h,
        );
        if cos.is_nan() || cos < MIN_COSINE_VS_F32 {
            self.failures.push(format!(
                "batch {batch} seq {seq} ({}): cosine similarity to the f32 model {cos:.6} < {MIN_COSINE_VS_F32}",
                policy
            ));
        }
        Some((cos, worst))
    }

    /// `--iters` timed passes of the tuned model, each followed by one of the untuned where
    /// it runs: their seconds.
    fn time(
        &self,
        shape: (usize, usize),
        input: &model::Input,
        out: &mut Outputs,
    ) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
        let tokens = (shape.0 * shape.1) as u64;
        let (mut t, mut u) = (Vec::new(), Vec::new());
        for _ in 0..self.args.iters {
            let start = Instant::now();
            self.tuned
                .forward(&self.rt, shape, input, &mut out.tuned, None)?;
            t.push(start.elapsed().as_secs_f64());
            self.bar.inc(tokens);
            if let Some(enc) = &self.untuned {
                let start = Instant::now();
                enc.forward(&self.untuned_rt, shape, input, &mut out.untuned, None)?;
                u.push(start.elapsed().as_secs_f64());
                self.bar.inc(tokens);
            }
        }
        Ok((t, u))
    }

    /// `--profile`: one more pass of each model with the seconds per stage, printed (unless
    /// `--json`) and returned as the row's `profile`.
    fn profile(
        &self,
        (batch, seq): (usize, usize),
        input: &model::Input,
        out: &mut Outputs,
    ) -> anyhow::Result<serde_json::Value> {
        let mut pt = bert::StageTimes::default();
        self.tuned
            .forward(&self.rt, (batch, seq), input, &mut out.tuned, Some(&mut pt))?;
        let mut pu = self.untuned.as_ref().map(|_| bert::StageTimes::default());
        if let (Some(enc), Some(times)) = (&self.untuned, pu.as_mut()) {
            let shape = (batch, seq);
            enc.forward(
                &self.untuned_rt,
                shape,
                input,
                &mut out.untuned,
                Some(times),
            )?;
        }
        if !self.args.json {
            // Without the untuned pass (`--no-untuned`), only the tuned times.
            let stages: Vec<String> = match &pu {
                Some(pu) => pt
                    .by_stage()
                    .zip(pu.0)
                    .map(|((k, a), b)| format!("{k} {:.1} / {:.1}", a * 1e3, b * 1e3))
                    .collect(),
                None => pt
                    .by_stage()
                    .map(|(k, a)| format!("{k} {:.1}", a * 1e3))
                    .collect(),
            };
            let which = match pu {
                Some(_) => "tuned / untuned",
                None => "tuned",
            };
            let line = format!(
                "batch {batch} seq {seq} profile, ms {which}: {}",
                stages.join(", ")
            );
            self.bar.suspend(|| eprintln!("{line}"));
        }
        let ms = |p: &bert::StageTimes| {
            p.by_stage()
                .map(|(k, v)| (k.to_string(), json!(v * 1e3)))
                .collect::<serde_json::Map<_, _>>()
        };
        Ok(json!({"tuned_ms": ms(&pt), "untuned_ms": pu.as_ref().map(ms)}))
    }
}

/// Whether output `name` is held to f32's tolerances: all but the tuned output of a reduced
/// precision, which is judged by its agreement with the f32 model instead.
fn judged_at_f32_tolerance(policy: runtime::PrecisionPolicy, name: &str) -> bool {
    policy.is_exact() || name != "tuned"
}

/// The progress bar of a run: tokens through either model, hidden with `--json`.
fn progress_bar(args: &InferArgs, shapes: &[(usize, usize)]) -> ProgressBar {
    let passes = (args.iters as u64 + 1) * if args.no_untuned { 1 } else { 2 };
    let work: u64 = shapes.iter().map(|&(b, s)| (b * s) as u64 * passes).sum();
    let bar = match args.json {
        true => ProgressBar::hidden(),
        false => ProgressBar::new(work),
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:40} {pos}/{len} tokens [{elapsed_precise} < {eta}] {msg}",
        )
        .expect("a valid template"),
    );
    bar
}

/// The FFN activation in words: our names (`gelu` is the tanh form, as in the op
/// `gemm_bias_gelu`) next to Hugging Face's (`gelu` there is the exact erf form).
fn describe_act(act: kernels::Act) -> String {
    match act {
        kernels::Act::Gelu => "gelu (tanh form; Hugging Face's gelu_new)".into(),
        kernels::Act::GeluErf => "gelu_erf (exact erf; Hugging Face's gelu)".into(),
        other => other.name().into(),
    }
}

/// Below this cosine similarity to the f32 model a reduced-precision forward is reported as
/// a failure: not a target (bf16 ≈ 0.9999, int8 ≈ 0.999 are typical), a guard against garbage.
const MIN_COSINE_VS_F32: f64 = 0.9;

/// The larger error of the two, NaN if either is (`f64::max` would drop it and report a NaN
/// output as agreeing exactly).
fn worse(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// Cosine similarity and max |a − b| of two `last_hidden_state`s over the real (unpadded)
/// tokens of each sequence.
fn agreement(a: &[f32], b: &[f32], lens: &[i32], seq: usize, h: usize) -> (f64, f64) {
    let (mut dot, mut na, mut nb, mut worst) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    for (i, &len) in lens.iter().enumerate() {
        let rows = i * seq..i * seq + (len.max(0) as usize).min(seq);
        let (x, y) = (
            &a[rows.start * h..rows.end * h],
            &b[rows.start * h..rows.end * h],
        );
        for (&p, &q) in x.iter().zip(y) {
            let (p, q) = (p as f64, q as f64);
            dot += p * q;
            na += p * p;
            nb += q * q;
            worst = worse(worst, (p - q).abs());
        }
    }
    (dot / (na.sqrt() * nb.sqrt()), worst)
}

/// How many of the model's distinct GEMM workloads at (batch, seq) the runtime's precision
/// policy serves in each element type.
fn served_by_precision(
    rt: &Runtime,
    config: &bert::BertConfig,
    batch: usize,
    seq: usize,
) -> serde_json::Value {
    let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
    for w in config.workload_list(&[(batch, seq)]) {
        if w.gemm_dims().is_some() {
            *counts.entry(rt.serve_as(&w).dtype().name()).or_default() += 1;
        }
    }
    json!(counts)
}

fn print_header() {
    println!(
        "{:>5} {:>5} {:>9} {:>9} {:>9} {:>9} {:>8} {:>10} {:>8}  {:<24} {:>8} {:>8}",
        "batch",
        "seq",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "seq/s",
        "GFLOP/s",
        "untuned/s",
        "speedup",
        "exact/arch/near/default",
        "max err",
        "vs HF"
    );
}

fn print_row(r: &serde_json::Value) {
    {
        let f = |k: &str| r[k].as_f64();
        let u = |k: &str| r[k].as_u64().unwrap_or(0);
        let opt =
            |x: Option<f64>, suffix: &str| x.map_or("-".to_string(), |x| format!("{x:.2}{suffix}"));
        println!(
            "{:>5} {:>5} {:>9.2} {:>9.2} {:>9.2} {:>9.1} {:>8.1} {:>10} {:>8}  {:<24} {:>8} {:>8}",
            u("batch"),
            u("seq"),
            f("p50_ms").unwrap_or(0.0),
            f("p90_ms").unwrap_or(0.0),
            f("p99_ms").unwrap_or(0.0),
            f("seqs_per_s").unwrap_or(0.0),
            f("gflops").unwrap_or(0.0),
            opt(f("untuned_seqs_per_s"), ""),
            opt(f("speedup_vs_untuned"), "x"),
            format!(
                "{}/{}/{}/{}",
                u("exact"),
                u("same_arch"),
                u("nearest_shape"),
                u("default")
            ),
            f("max_abs_err").map_or("-".to_string(), |e| format!("{e:.1e}")),
            f("transformers_max_abs_err").map_or("-".to_string(), |e| format!("{e:.1e}")),
        );
    }
}
