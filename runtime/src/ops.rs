//! Attention, fused GEMM epilogues, and constant weights packed once.
//!
//! ```
//! use kernels::Act;
//! use runtime::Runtime;
//!
//! let rt = Runtime::defaults_only();
//! // O = softmax(Q·Kᵀ/√D)·V over [B, H, S, D] tensors, causal.
//! let (b, h, s, d) = (1, 2, 5, 8);
//! let q = vec![0.1f32; b * h * s * d];
//! let mut o = vec![0.0f32; q.len()];
//! rt.attention(b, h, s, d, true, &q, &q, &q, &mut o)?;
//! assert!((o[0] - 0.1).abs() < 1e-6);
//!
//! // C = gelu(A·B + bias), with the weight B packed once and reused.
//! let (m, n, k) = (4, 3, 2);
//! let (a, w, bias) = (vec![1.0f32; m * k], vec![0.5f32; k * n], vec![0.0f32; n]);
//! let packed = rt.pack_weight(m, n, k, Act::Gelu, &w)?;
//! let mut c = vec![0.0f32; m * n];
//! rt.gemm_bias_act_packed(&packed, &a, &bias, &mut c)?;
//! assert!((c[0] - 0.8412).abs() < 1e-3); // gelu(1.0)
//! # Ok::<(), runtime::RuntimeError>(())
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kernels::cpu::gemm::epilogue::{EpilogueDirect, EpilogueGemm, EpiloguePacked};
use kernels::cpu::gemm::packed::PackedB;
use kernels::cpu::gemm::params::{BLayout, UkernelId};
use kernels::workload::{MAX_DIM, MAX_ELEMENTS};
use kernels::{Act, Config, Kernel, Operand, OperandMut, PreparedWeight, Workload};

use crate::{Choice, Level, Runtime, RuntimeError};

/// A constant weight (the `K×N` B operand of `gemm_bias_*`) packed once into the panel
/// layouts of the variants that serve it: calls with it skip packing B.
///
/// One packed weight serves **any M**. The panel layout depends only on the micro-kernel
/// width NR and the depth block KC ([`EpilogueGemm::weight_layout`]), not on M, so
/// [`Runtime::pack_weight_for`] looks up the variant of every M it is given, packs the
/// weight once per *distinct* layout among them, and keeps a prepared plan per M. A call
/// with an M that was not planned resolves it on first use: the tuned variant when its
/// layout is one of those packed (at the level that answered), otherwise the packed
/// family's default with its packing knobs set to a packed layout (reported as `default`).
/// An M whose tuned variant is the direct (unpacked) family is served by it from a row-major
/// copy kept only for that case.
///
/// Under a reduced-precision policy ([`Runtime::set_precision`]) the weight is also kept in
/// the form (bf16, or quantised int8) of each reduced-precision variant chosen for a planned
/// M. When every planned M is served that way the weight is kept in that form **only** (no
/// f32 copy: BERT-base's int8 weights take 86 MB instead of 426): any other M, and any M
/// after the policy changes, reads it too, through its tuned variant when that reads the
/// same form, else the family's default adapted to read it ([`Kernel::variant_reading`],
/// level `default`). Planned M keep the precision they were planned in either way.
pub struct PackedWeight {
    n: usize,
    k: usize,
    act: Act,
    /// The plan of the first M given at packing time.
    primary: Arc<Plan>,
    /// One packed copy per distinct layout `(NR, KC)`, with a micro-kernel of that NR.
    layouts: Vec<PackedLayout>,
    /// Row-major copy, kept only when a planned M is served by the direct family.
    rowmajor: Option<Arc<Vec<f32>>>,
    /// The weight as prepared by the reduced-precision variants the precision policy chose
    /// for planned M (converted to bf16 or quantised), one per distinct format.
    prepared: Vec<PreparedWeight>,
    /// Prepared plans by M (planned at packing time, or resolved on first use).
    plans: Mutex<HashMap<usize, Arc<Plan>>>,
}

struct PackedLayout {
    layout: (usize, usize),
    /// The micro-kernel of the variant that packed it (its NR is `layout.0`).
    ukernel: UkernelId,
    weight: PackedB,
}

/// How one M is served.
struct Plan {
    workload: Workload,
    config: Config,
    level: Level,
    exec: PlanExec,
}

enum PlanExec {
    /// The packed family with the packed copy `layouts[layout]`.
    Packed { gemm: EpilogueGemm, layout: usize },
    /// A reduced-precision variant with its prepared copy `prepared[weight]`.
    Prepared { choice: Arc<Choice>, weight: usize },
    /// The chosen (direct) variant over the row-major copy.
    RowMajor(Arc<Choice>),
}

impl std::fmt::Debug for PackedWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedWeight")
            .field("workload", &self.primary.workload.key())
            .field("config", &self.primary.config)
            .field("level", &self.primary.level)
            .field("layouts", &self.layouts())
            .field("rowmajor_copy", &self.rowmajor.is_some())
            .field("prepared", &self.prepared)
            .finish()
    }
}

impl PackedWeight {
    /// The `gemm_bias_*` workload of the first M it was packed for.
    pub fn workload(&self) -> Workload {
        self.primary.workload
    }

    /// The config that serves [`PackedWeight::workload`] (`b_layout = prepacked` for the
    /// packed family).
    pub fn config(&self) -> &Config {
        &self.primary.config
    }

    /// Where that config came from: the tuned record's level, or `default`.
    pub fn level(&self) -> Level {
        self.primary.level
    }

    /// The activation fused into every call.
    pub fn act(&self) -> Act {
        self.act
    }

    /// `(n, k)` of the weight.
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// The distinct panel layouts `(NR, KC)` it is packed in.
    pub fn layouts(&self) -> Vec<(usize, usize)> {
        self.layouts.iter().map(|l| l.layout).collect()
    }

    /// Copies of the weight it holds: one per f32 panel layout, one per reduced-precision
    /// form, and the row-major copy, if any.
    pub fn copies(&self) -> usize {
        self.layouts.len() + self.prepared.len() + usize::from(self.rowmajor.is_some())
    }

    /// Bytes held: the packed copies plus the row-major copy, if any.
    pub fn bytes(&self) -> usize {
        let packed = self
            .layouts
            .iter()
            .map(|l| self.k * self.n.div_ceil(l.layout.0) * l.layout.0)
            .sum::<usize>();
        4 * (packed + self.rowmajor.as_ref().map_or(0, |r| r.len()))
            + self
                .prepared
                .iter()
                .map(PreparedWeight::bytes)
                .sum::<usize>()
    }

    /// The element types of the plans made so far (f32, and those the precision policy
    /// chose for some M).
    pub fn dtypes(&self) -> Vec<kernels::DType> {
        let plans = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        let mut d: Vec<_> = plans.values().map(|p| p.workload.dtype()).collect();
        d.sort_by_key(|d| d.name());
        d.dedup();
        d
    }

    /// The level and config that serve M = `m`, resolving it if it was not planned.
    pub fn plan_for(&self, rt: &Runtime, m: usize) -> Result<(Level, Config), RuntimeError> {
        let p = self.plan(rt, m)?;
        Ok((p.level, p.config.clone()))
    }

    fn plan(&self, rt: &Runtime, m: usize) -> Result<Arc<Plan>, RuntimeError> {
        let mut plans = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = plans.get(&m) {
            return Ok(p.clone());
        }
        let w = rt.serve_as(&Workload::gemm_bias_act(m, self.n, self.k, self.act)?);
        let choice = rt.lookup_uncounted(&w)?;
        if let Some(weight) = self.prepared_for(&choice) {
            let plan = Arc::new(Plan::prepared(w, choice, weight));
            plans.insert(m, plan.clone());
            return Ok(plan);
        }
        if self.layouts.is_empty() && self.rowmajor.is_none() {
            let plan = Arc::new(reading_prepared(&self.prepared, rt, &w)?);
            plans.insert(m, plan.clone());
            return Ok(plan);
        }
        let w = w.with_dtype(kernels::DType::F32);
        let choice = if choice.workload == w {
            choice
        } else {
            rt.lookup_uncounted(&w)?
        };
        let plan = match Candidate::of(rt, &w, &choice)? {
            Candidate::Packed(gemm, config) => {
                match self
                    .layouts
                    .iter()
                    .position(|l| l.layout == gemm.weight_layout())
                {
                    Some(layout) => Plan {
                        workload: w,
                        config,
                        level: choice.level,
                        exec: PlanExec::Packed { gemm, layout },
                    },
                    None => self.adapted(rt, &w)?,
                }
            }
            Candidate::Direct if self.rowmajor.is_some() => Plan {
                workload: w,
                config: choice.config.clone(),
                level: choice.level,
                exec: PlanExec::RowMajor(choice),
            },
            Candidate::Direct => self.adapted(rt, &w)?,
        };
        let plan = Arc::new(plan);
        plans.insert(m, plan.clone());
        Ok(plan)
    }

    /// The index of the prepared copy a reduced-precision `choice` can read, if any.
    fn prepared_for(&self, choice: &Choice) -> Option<usize> {
        let format = choice.executable()?.weight_format()?;
        self.prepared.iter().position(|p| p.format() == format)
    }

    /// The packed family's default for `w` with the packing knobs of the first layout.
    fn adapted(&self, rt: &Runtime, w: &Workload) -> Result<Plan, RuntimeError> {
        let l = &self.layouts[0];
        let config = EpiloguePacked.prepacked_config(w, rt.fingerprint(), l.ukernel, l.layout.1);
        let gemm = EpilogueGemm::from_config(w, &config)?;
        if gemm.weight_layout() != l.layout {
            // Cannot happen while KC only depends on K; an error, never a wrong result.
            return Err(kernels::Error::BadWorkload {
                input: w.key(),
                reason: format!(
                    "no packed layout of this weight fits (have {:?}, got {:?})",
                    l.layout,
                    gemm.weight_layout()
                ),
            }
            .into());
        }
        Ok(Plan {
            workload: *w,
            config,
            level: Level::Default,
            exec: PlanExec::Packed { gemm, layout: 0 },
        })
    }
}

impl Plan {
    fn prepared(workload: Workload, choice: Arc<Choice>, weight: usize) -> Plan {
        Plan {
            workload,
            config: choice.config.clone(),
            level: choice.level,
            exec: PlanExec::Prepared { choice, weight },
        }
    }
}

/// For a weight kept only in reduced-precision forms: the default variant of a family
/// that prepared one, adapted to read it ([`Kernel::variant_reading`]), at level
/// `default`.
fn reading_prepared(
    prepared: &[PreparedWeight],
    rt: &Runtime,
    w: &Workload,
) -> Result<Plan, RuntimeError> {
    let hw = rt.fingerprint();
    for (i, prepared) in prepared.iter().enumerate() {
        let format = prepared.format();
        let kernel = kernels::registry::kernel(format.family)?;
        let served = kernel.dtypes().iter().map(|&d| w.with_dtype(d));
        for w in served.filter(|w| kernel.serves(w).is_ok()) {
            if let Some((config, exe)) = kernel.variant_reading(&w, hw, format) {
                let choice =
                    Choice::new(&w, kernel, config, Level::Default, None, Some(exe.into()));
                return Ok(Plan::prepared(w, Arc::new(choice), i));
            }
        }
    }
    Err(kernels::Error::BadWorkload {
        input: w.key(),
        reason: "no variant reads this weight's prepared forms".into(),
    }
    .into())
}

/// What [`Runtime::pack_weight_for`] collects for one weight: its packed copies (one per
/// panel layout), its reduced-precision preparations (one per weight format) and a plan
/// per M.
#[derive(Default)]
struct Packing {
    layouts: Vec<PackedLayout>,
    prepared: Vec<PreparedWeight>,
    plans: HashMap<usize, Arc<Plan>>,
    /// Direct (row-major B) variants, planned once the packing is done.
    direct: Vec<(Workload, Arc<Choice>)>,
}

impl Packing {
    /// Whether M = `m` (or another M served as the same shape `w`) has a plan already.
    fn planned(&self, m: usize, w: &Workload) -> bool {
        self.plans.contains_key(&m)
            || self
                .direct
                .iter()
                .any(|(pw, _)| pw.gemm_dims() == w.gemm_dims())
    }

    /// Plans M = `m` with a reduced-precision variant that prepares its weight itself (its
    /// format prepared once); false if `choice` is not one.
    fn plan_prepared(
        &mut self,
        m: usize,
        w: Workload,
        choice: &Arc<Choice>,
        b: &[f32],
    ) -> Result<bool, RuntimeError> {
        let Some(exe) = choice
            .executable()
            .filter(|_| w.dtype() != kernels::DType::F32)
        else {
            return Ok(false);
        };
        let Some(format) = exe.weight_format() else {
            return Ok(false);
        };
        let i = match self.prepared.iter().position(|p| p.format() == format) {
            Some(i) => i,
            None => {
                self.prepared.push(exe.prepare_weight(b)?);
                self.prepared.len() - 1
            }
        };
        self.plans
            .insert(m, Arc::new(Plan::prepared(w, choice.clone(), i)));
        Ok(true)
    }

    /// The index of `gemm`'s packed copy of `b`, packed now if no earlier variant shares its
    /// layout (out of memory: an error).
    fn layout_of(&mut self, gemm: &EpilogueGemm, b: &[f32]) -> Result<usize, RuntimeError> {
        let layout = gemm.weight_layout();
        if let Some(i) = self.layouts.iter().position(|l| l.layout == layout) {
            return Ok(i);
        }
        self.layouts.push(PackedLayout {
            layout,
            ukernel: gemm.ukernel(),
            weight: gemm.pack_weight(b)?,
        });
        Ok(self.layouts.len() - 1)
    }
}

/// What a lookup chose, seen from the packing side.
enum Candidate {
    /// A packed-family variant, prepared with `b_layout = prepacked`.
    Packed(EpilogueGemm, Config),
    /// A direct-family variant (reads B row-major).
    Direct,
}

impl Candidate {
    fn of(rt: &Runtime, w: &Workload, choice: &Choice) -> Result<Candidate, RuntimeError> {
        if choice.kernel.name() == EpilogueDirect.name() {
            return Ok(Candidate::Direct);
        }
        let mut config = if choice.kernel.name() == EpiloguePacked.name() {
            choice.config.clone()
        } else {
            EpiloguePacked.default_config(w, rt.fingerprint())
        };
        BLayout::Prepacked.set_in(&mut config);
        let gemm = EpilogueGemm::from_config(w, &config)?;
        Ok(Candidate::Packed(gemm, config))
    }
}

/// `Ok` if buffer `name` of the call `what` (a workload, or what else describes the call) has
/// the `expected` length; the description is only formatted for the error.
pub(crate) fn buffer(
    what: impl std::fmt::Display,
    name: &'static str,
    got: usize,
    expected: usize,
) -> Result<(), RuntimeError> {
    if got == expected {
        Ok(())
    } else {
        Err(RuntimeError::BufferSize {
            name,
            workload: what.to_string(),
            got,
            expected,
        })
    }
}

/// The most rows one GEMM workload with `n` columns and depth `k` takes: [`MAX_DIM`], or
/// fewer where its operands would pass [`MAX_ELEMENTS`]; at least 1.
pub(crate) fn rows_per_call(n: usize, k: usize) -> usize {
    let (n, k) = (n as u128, k as u128);
    let fit = MAX_ELEMENTS.saturating_sub(k * n + n) / (k + n).max(1);
    fit.clamp(1, MAX_DIM as u128) as usize
}

/// Runs `call(rows, a_rows, c_rows)` on blocks of at most [`rows_per_call`] rows of a GEMM
/// whose M is past what one workload takes (`a` is `m×k`, `c` is `m×n`; `what` names the
/// call in a size error). Each block is a call of its own (counted as one); returns the
/// first block's level. None when `m` fits one call.
pub(crate) fn by_row_blocks(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    c: &mut [f32],
    what: impl Fn() -> String,
    mut call: impl FnMut(usize, &[f32], &mut [f32]) -> Result<Level, RuntimeError>,
) -> Option<Result<Level, RuntimeError>> {
    // The common case without a division (a call's hot path).
    let (m128, n128, k128) = (m as u128, n as u128, k as u128);
    if m <= MAX_DIM && m128 * (k128 + n128) + k128 * n128 + n128 <= MAX_ELEMENTS {
        return None;
    }
    let rows = rows_per_call(n, k);
    // An empty dimension is the workload's error to give (no block holds a row).
    if m <= rows || n == 0 || k == 0 {
        return None;
    }
    let size = |name, got, expected| RuntimeError::BufferSize {
        name,
        workload: what(),
        got,
        expected,
    };
    if a.len() != m.saturating_mul(k) {
        return Some(Err(size("a", a.len(), m.saturating_mul(k))));
    }
    if c.len() != m.saturating_mul(n) {
        return Some(Err(size("c", c.len(), m.saturating_mul(n))));
    }
    let blocks = a.chunks(rows * k).zip(c.chunks_mut(rows * n));
    let mut first = None;
    for (a, c) in blocks {
        let level = call(a.len() / k, a, c);
        match level {
            Ok(level) => _ = first.get_or_insert(level),
            Err(e) => return Some(Err(e)),
        }
    }
    first.map(Ok)
}

/// The row counts of the blocks a GEMM call of `m` rows with `n` columns and depth `k` is
/// served in, each once: `[m]` where it is one workload, else the full block's
/// ([`rows_per_call`]) and the remainder's. A call's workloads are these row counts' (what
/// to tune for it).
pub fn row_blocks(m: usize, n: usize, k: usize) -> Vec<usize> {
    blocks(m, rows_per_call(n, k))
}

/// The sequence counts of the blocks an attention call on `batch` sequences of `heads`
/// heads of `seq × d` is served in, each once (see [`row_blocks`]).
pub fn sequence_blocks(batch: usize, heads: usize, seq: usize, d: usize) -> Vec<usize> {
    blocks(batch, sequences_per_call(heads, seq, d))
}

/// The distinct sizes of the blocks of at most `per` that `total` is cut into, in order.
fn blocks(total: usize, per: usize) -> Vec<usize> {
    match (total <= per, total % per.max(1)) {
        (true, _) => vec![total],
        (false, 0) => vec![per],
        (false, rest) => vec![per, rest],
    }
}

/// The most sequences of `heads` heads of `seq × d` one attention workload takes: [`MAX_DIM`],
/// or fewer where its four operands would pass [`MAX_ELEMENTS`]; at least 1.
pub(crate) fn sequences_per_call(heads: usize, seq: usize, d: usize) -> usize {
    let per_sequence = 4 * heads as u128 * seq as u128 * d as u128;
    (MAX_ELEMENTS / per_sequence.max(1)).clamp(1, MAX_DIM as u128) as usize
}

/// An attention call on `b` sequences of `h` heads of `s × d`: one workload, or — past one
/// workload's size — blocks of at most `per_call` sequences, the call named in errors by its
/// whole key (`attention:BxHxSxD[:causal]`, which no workload can hold).
pub(crate) enum AttentionCall {
    One(Workload),
    Blocks { per_call: usize, key: String },
}

impl AttentionCall {
    pub(crate) fn of(
        b: usize,
        h: usize,
        s: usize,
        d: usize,
        causal: bool,
    ) -> Result<AttentionCall, RuntimeError> {
        let per_call = sequences_per_call(h, s, d);
        if b <= per_call {
            return Ok(AttentionCall::One(Workload::attention(b, h, s, d, causal)?));
        }
        let causal = if causal { ":causal" } else { "" };
        let key = format!("attention:{b}x{h}x{s}x{d}{causal}");
        Ok(AttentionCall::Blocks { per_call, key })
    }
}

impl std::fmt::Display for AttentionCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttentionCall::One(w) => w.fmt(f),
            AttentionCall::Blocks { key, .. } => f.write_str(key),
        }
    }
}

/// Runs `call(first, count)` on blocks of at most `per_call` of `batch` sequences (the
/// caller has checked that the buffers hold the whole batch). Each block is a call of its
/// own (counted as one); returns the first block's level.
pub(crate) fn by_batch_blocks(
    batch: usize,
    per_call: usize,
    mut call: impl FnMut(usize, usize) -> Result<Level, RuntimeError>,
) -> Result<Level, RuntimeError> {
    let mut first = None;
    for start in (0..batch).step_by(per_call.max(1)) {
        let level = call(start, per_call.min(batch - start))?;
        first.get_or_insert(level);
    }
    Ok(first.expect("at least one block"))
}

impl Runtime {
    /// Scaled dot-product attention, f32: `O = softmax(Q·Kᵀ/√d)·V` for each of the `b·h`
    /// heads of `[b, h, s, d]` tensors (row-major); with `causal`, query `i` sees keys
    /// `j ≤ i`. `o` is overwritten. Returns the level that answered.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        b: usize,
        h: usize,
        s: usize,
        d: usize,
        causal: bool,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        o: &mut [f32],
    ) -> Result<Level, RuntimeError> {
        self.attention_masked_or_not(b, h, s, d, causal, None, q, k, v, o)
    }

    /// [`Runtime::attention`] over a padded batch: in batch `i`, only keys
    /// `j < key_lens[i]` are seen (`key_lens`: one value per batch, each in `0..=s`) — what
    /// Hugging Face's 0/1 `attention_mask` of right-padded sequences means. Queries at padded
    /// positions still attend to their batch's real keys; a batch of length 0 gets zeros.
    /// The workload (and so the tuned variant serving it) is the unmasked one: a mask only
    /// removes work. Returns the level that answered.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_masked(
        &self,
        b: usize,
        h: usize,
        s: usize,
        d: usize,
        causal: bool,
        key_lens: &[i32],
        q: &[f32],
        k: &[f32],
        v: &[f32],
        o: &mut [f32],
    ) -> Result<Level, RuntimeError> {
        self.attention_masked_or_not(b, h, s, d, causal, Some(key_lens), q, k, v, o)
    }

    /// [`Runtime::attention`], masked by `key_lens` when given ([`Runtime::attention_masked`]);
    /// a batch past one workload's size in blocks of sequences.
    #[allow(clippy::too_many_arguments)]
    fn attention_masked_or_not(
        &self,
        b: usize,
        h: usize,
        s: usize,
        d: usize,
        causal: bool,
        key_lens: Option<&[i32]>,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        o: &mut [f32],
    ) -> Result<Level, RuntimeError> {
        let call = AttentionCall::of(b, h, s, d, causal)?;
        let len = [s, h, d].into_iter().fold(b, usize::saturating_mul);
        for (name, got) in [
            ("q", q.len()),
            ("k", k.len()),
            ("v", v.len()),
            ("o", o.len()),
        ] {
            buffer(&call, name, got, len)?;
        }
        if let Some(lens) = key_lens {
            buffer(&call, "key_lens", lens.len(), b)?;
        }
        let w = match call {
            AttentionCall::One(w) => w,
            AttentionCall::Blocks { per_call, .. } => {
                let per = h * s * d;
                return by_batch_blocks(b, per_call, |first, count| {
                    let rows = first * per..(first + count) * per;
                    let lens = key_lens.map(|l| &l[first..first + count]);
                    let (q, k, v) = (&q[rows.clone()], &k[rows.clone()], &v[rows.clone()]);
                    self.attention_masked_or_not(
                        count,
                        h,
                        s,
                        d,
                        causal,
                        lens,
                        q,
                        k,
                        v,
                        &mut o[rows],
                    )
                });
            }
        };
        let Some(lens) = key_lens else {
            return self.run(&w, &[q, k, v], o);
        };
        let inputs = [
            Operand::F32(q),
            Operand::F32(k),
            Operand::F32(v),
            Operand::I32(lens),
        ];
        let w = self.serve_as(&w);
        self.serve(&w, |c| c.run_operands(&inputs, OperandMut::F32(o)))
    }

    /// `C = act(A·B + bias)`, f32 row-major (A `m×k`, B `k×n`, bias `n`, C `m×n`,
    /// overwritten); `Act::Gelu` is GELU's tanh form, `Act::GeluErf` its exact (erf) form.
    /// Returns the level that answered.
    ///
    /// B is packed during the call even when the tuned variant keeps it pre-packed, so `b`
    /// may change freely between calls; for a constant weight, [`Runtime::pack_weight`] once
    /// and [`Runtime::gemm_bias_act_packed`] skip that work.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_bias_act(
        &self,
        m: usize,
        n: usize,
        k: usize,
        act: Act,
        a: &[f32],
        b: &[f32],
        bias: &[f32],
        c: &mut [f32],
    ) -> Result<Level, RuntimeError> {
        let what = || format!("{}:{m}x{n}x{k}", act.op().name());
        if let Some(done) = by_row_blocks(m, n, k, a, c, what, |m, a, c| {
            self.gemm_bias_act(m, n, k, act, a, b, bias, c)
        }) {
            return done;
        }
        let w = self.serve_as(&Workload::gemm_bias_act(m, n, k, act)?);
        buffer(w, "a", a.len(), m * k)?;
        buffer(w, "b", b.len(), k * n)?;
        buffer(w, "bias", bias.len(), n)?;
        buffer(w, "c", c.len(), m * n)?;
        // Counted once, by the call below.
        let choice = self.lookup_uncounted(&w)?;
        if BLayout::of(&choice.config) == Some(BLayout::Prepacked) {
            // The same variant reading B on this call (packed, or in place as the family
            // default does for this M: 1.09–1.26× on the M = 128 BERT shapes, Zen 4, 2
            // threads): never relies on `b` staying put.
            let mut config = choice.config.clone();
            kernels::cpu::gemm::default_b_layout(m).set_in(&mut config);
            let gemm = EpilogueGemm::from_config(&w, &config)?;
            kernels::Executable::run_f32(&gemm, &[a, b, bias], c)?;
            self.count_call(choice.level, w.dtype());
            return Ok(choice.level);
        }
        self.run(&w, &[a, b, bias], c)
    }

    /// Packs the constant weight `b` (`k×n`, row-major) once for `act(A·B + bias)` calls,
    /// planned for M = `m` (other M work too: see [`PackedWeight`]), in the layout of the
    /// tuned `gemm_bias_act_packed` variant for that workload (the family default when
    /// nothing is tuned). Use it with [`Runtime::gemm_bias_act_packed`].
    pub fn pack_weight(
        &self,
        m: usize,
        n: usize,
        k: usize,
        act: Act,
        b: &[f32],
    ) -> Result<PackedWeight, RuntimeError> {
        self.pack_weight_for(n, k, act, b, &[m])
    }

    /// Packs the constant weight `b` (`k×n`, row-major) once per distinct panel layout among
    /// the variants that serve `act(A·B + bias)` at each M of `ms` (at least one), and
    /// prepares a plan for each: what a model does at load time for the batch shapes it
    /// expects. See [`PackedWeight`] for other M.
    pub fn pack_weight_for(
        &self,
        n: usize,
        k: usize,
        act: Act,
        b: &[f32],
        ms: &[usize],
    ) -> Result<PackedWeight, RuntimeError> {
        let first = *ms.first().ok_or_else(|| kernels::Error::BadWorkload {
            input: format!("{}:?x{n}x{k}", act.op().name()),
            reason: "pack_weight_for needs at least one M".into(),
        })?;
        // An M past one workload's rows runs in blocks of the most it takes: planned as that.
        let most = rows_per_call(n, k);
        let w0 = Workload::gemm_bias_act(first.min(most), n, k, act)?;
        buffer(w0, "b", b.len(), k * n)?;
        let mut p = Packing::default();
        for m in ms.iter().map(|&m| m.min(most)) {
            let w = self.serve_as(&Workload::gemm_bias_act(m, n, k, act)?);
            if p.planned(m, &w) {
                continue;
            }
            let choice = self.lookup_uncounted(&w)?;
            if p.plan_prepared(m, w, &choice, b)? {
                continue;
            }
            match Candidate::of(self, &w, &choice)? {
                Candidate::Packed(gemm, config) => {
                    let layout = p.layout_of(&gemm, b)?;
                    let plan = Plan {
                        workload: w,
                        config,
                        level: choice.level,
                        exec: PlanExec::Packed { gemm, layout },
                    };
                    p.plans.insert(m, Arc::new(plan));
                }
                Candidate::Direct => p.direct.push((w, choice)),
            }
        }
        // Every planned M served in a reduced precision: the weight is kept in that form
        // only, and other M read it too (the f32 copy would be 2-4x its size), as long as a
        // variant reads it (checked at M = 1).
        let only_prepared = p.layouts.is_empty()
            && p.direct.is_empty()
            && reading_prepared(&p.prepared, self, &Workload::gemm_bias_act(1, n, k, act)?).is_ok();
        if p.layouts.is_empty() && !only_prepared {
            // Only direct variants: still pack the family default, so unplanned M have a
            // layout to fall back on.
            let mut config = EpiloguePacked.default_config(&w0, self.fingerprint());
            BLayout::Prepacked.set_in(&mut config);
            p.layout_of(&EpilogueGemm::from_config(&w0, &config)?, b)?;
        }
        let rowmajor = match p.direct.is_empty() {
            true => None,
            false => Some(Arc::new(kernels::alloc::copied(
                b,
                "a row-major copy of the weight",
            )?)),
        };
        for (w, choice) in std::mem::take(&mut p.direct) {
            let (m, _, _) = w.gemm_dims().expect("a gemm_bias workload");
            let plan = Plan {
                workload: w,
                config: choice.config.clone(),
                level: choice.level,
                exec: PlanExec::RowMajor(choice),
            };
            p.plans.insert(m, Arc::new(plan));
        }
        let primary = p.plans[&first.min(most)].clone();
        Ok(PackedWeight {
            n,
            k,
            act,
            primary,
            layouts: p.layouts,
            rowmajor,
            prepared: p.prepared,
            plans: Mutex::new(p.plans),
        })
    }

    /// `C = act(A·B + bias)` with a weight packed by [`Runtime::pack_weight`] or
    /// [`Runtime::pack_weight_for`]: A is `m×k` for any `m ≥ 1` (taken from its length), bias
    /// `n`, C `m×n`. Returns the level the config serving this M came from.
    pub fn gemm_bias_act_packed(
        &self,
        weight: &PackedWeight,
        a: &[f32],
        bias: &[f32],
        c: &mut [f32],
    ) -> Result<Level, RuntimeError> {
        let (n, k) = (weight.n, weight.k);
        let m = a.len() / k;
        let what = || format!("{}:{m}x{n}x{k}", weight.act.op().name());
        if let Some(done) = by_row_blocks(m, n, k, a, c, what, |_, a, c| {
            self.gemm_bias_act_packed(weight, a, bias, c)
        }) {
            return done;
        }
        let w = Workload::gemm_bias_act(m.max(1), n, k, weight.act)?;
        buffer(w, "a", a.len(), m.max(1) * k)?;
        buffer(w, "bias", bias.len(), n)?;
        buffer(w, "c", c.len(), m * n)?;
        let plan = weight.plan(self, m)?;
        match &plan.exec {
            PlanExec::Packed { gemm, layout } => {
                gemm.run_prepacked(a, &weight.layouts[*layout].weight, bias, c)
            }
            PlanExec::RowMajor(choice) => {
                let b = weight.rowmajor.as_deref().expect("kept for direct plans");
                choice.run(&[a, b, bias], c)?;
            }
            PlanExec::Prepared { choice, weight: i } => {
                let exe = choice
                    .executable()
                    .expect("prepared plans have a host executable");
                exe.run_prepared(&[a, bias], &weight.prepared[*i], c)?;
            }
        }
        self.count_call(plan.level, plan.workload.dtype());
        Ok(plan.level)
    }
}

#[cfg(test)]
mod tests {
    use kernels::Problem;

    use super::*;

    #[test]
    fn attention_and_epilogues_match_the_reference() {
        let rt = Runtime::defaults_only();
        for text in ["attention:2x3x17x32", "attention:1x1x40x80:causal"] {
            let w: Workload = text.parse().unwrap();
            let Workload::Attention {
                b, h, s, d, causal, ..
            } = w
            else {
                unreachable!()
            };
            let p = Problem::random(&w, 2);
            let mut o = p.output();
            let (q, k, v) = (&p.inputs[0], &p.inputs[1], &p.inputs[2]);
            let level = rt.attention(b, h, s, d, causal, q, k, v, &mut o).unwrap();
            assert_eq!(level, Level::Default);
            p.check(&o, &p.reference()).unwrap();
            // A padded batch: the first sequence of length 1, the last (when there are
            // two) of length s − 3; the same lookup counts it.
            let lens: Vec<i32> = (0..b as i32)
                .map(|i| if i == 0 { 1 } else { s as i32 - 3 })
                .collect();
            let before = rt.lookups().total();
            rt.attention_masked(b, h, s, d, causal, &lens, q, k, v, &mut o)
                .unwrap();
            assert_eq!(rt.lookups().total(), before + 1);
            p.check(&o, &p.reference_with_key_lens(&lens).unwrap())
                .unwrap();
            let e = rt
                .attention_masked(b, h, s, d, causal, &lens[..b - 1], q, k, v, &mut o)
                .unwrap_err();
            assert!(e.to_string().contains("key_lens"), "{e}");
            let bad = vec![s as i32 + 1; b];
            let e = rt
                .attention_masked(b, h, s, d, causal, &bad, q, k, v, &mut o)
                .unwrap_err();
            assert!(e.to_string().contains("outside 0..="), "{e}");
        }
        for act in Act::ALL {
            let w = Workload::gemm_bias_act(20, 33, 17, act).unwrap();
            let p = Problem::random(&w, 3);
            let (a, b, bias) = (&p.inputs[0], &p.inputs[1], &p.inputs[2]);
            let mut c = p.output();
            rt.gemm_bias_act(20, 33, 17, act, a, b, bias, &mut c)
                .unwrap();
            p.check(&c, &p.reference()).unwrap();
            let packed = rt.pack_weight(20, 33, 17, act, b).unwrap();
            assert_eq!(BLayout::of(packed.config()), Some(BLayout::Prepacked));
            assert_eq!(packed.workload(), w);
            for _ in 0..2 {
                let mut c = p.output();
                rt.gemm_bias_act_packed(&packed, a, bias, &mut c).unwrap();
                p.check(&c, &p.reference()).unwrap();
            }
        }
    }

    #[test]
    fn one_packed_weight_serves_every_m() {
        let rt = Runtime::defaults_only();
        let (n, k) = (37, 70);
        let w = Workload::gemm_bias_act(1, n, k, Act::Identity).unwrap();
        let b = Problem::random(&w, 5).inputs[1].clone();
        // 3 is served by the direct family (row-major copy kept), 20 and 64 by packed
        // variants sharing one layout; 2, 33 and 130 are resolved on first use.
        let packed = rt
            .pack_weight_for(n, k, Act::Identity, &b, &[20, 3, 64, 20])
            .unwrap();
        assert_eq!(packed.layouts().len(), 1, "{packed:?}");
        assert!(
            packed.bytes() >= 4 * (n * k) * 2,
            "packed + row-major copies"
        );
        for m in [20, 3, 64, 2, 33, 130] {
            let w = Workload::gemm_bias_act(m, n, k, Act::Identity).unwrap();
            let mut p = Problem::random(&w, 100 + m as u64);
            p.inputs[1] = b.clone();
            let mut c = p.output();
            rt.gemm_bias_act_packed(&packed, &p.inputs[0], &p.inputs[2], &mut c)
                .unwrap();
            p.check(&c, &p.reference())
                .unwrap_or_else(|e| panic!("m = {m}: {e}"));
        }
        // Without a direct M at packing time there is no row-major copy: a small M is
        // served by the packed default on the packed layout, reported as `default`.
        let only_packed = rt.pack_weight_for(n, k, Act::Identity, &b, &[40]).unwrap();
        assert_eq!(
            only_packed.bytes(),
            4 * k * n.div_ceil(only_packed.layouts()[0].0) * only_packed.layouts()[0].0
        );
        let w = Workload::gemm_bias_act(4, n, k, Act::Identity).unwrap();
        let mut p = Problem::random(&w, 7);
        p.inputs[1] = b.clone();
        let mut c = p.output();
        let level = rt
            .gemm_bias_act_packed(&only_packed, &p.inputs[0], &p.inputs[2], &mut c)
            .unwrap();
        assert_eq!(level, Level::Default);
        p.check(&c, &p.reference()).unwrap();
        assert_eq!(
            BLayout::of(&only_packed.plan_for(&rt, 4).unwrap().1),
            Some(BLayout::Prepacked)
        );
        assert!(rt.pack_weight_for(n, k, Act::Identity, &b, &[]).is_err());
    }

    #[test]
    fn bad_sizes_and_shapes_are_errors_not_panics() {
        let rt = Runtime::defaults_only();
        let x = vec![0.0f32; 64];
        let mut o = vec![0.0f32; 64];
        let e = rt
            .attention(1, 1, 4, 16, false, &x, &x[..63], &x, &mut o)
            .unwrap_err();
        assert!(e.to_string().contains("'k' has 63 elements"), "{e}");
        assert!(rt
            .attention(1, 0, 4, 16, false, &x, &x, &x, &mut o)
            .is_err());
        let e = rt
            .gemm_bias_act(2, 3, 4, Act::Relu, &x[..8], &x[..12], &x[..2], &mut o[..6])
            .unwrap_err();
        assert!(e.to_string().contains("'bias' has 2 elements"), "{e}");
        assert!(rt.pack_weight(2, 3, 4, Act::Gelu, &x[..11]).is_err());
        let packed = rt.pack_weight(2, 3, 4, Act::Gelu, &x[..12]).unwrap();
        let e = rt
            .gemm_bias_act_packed(&packed, &x[..8], &x[..3], &mut o[..5])
            .unwrap_err();
        assert!(e.to_string().contains("'c' has 5 elements"), "{e}");
        // A is not a whole number of rows of K = 4.
        let e = rt
            .gemm_bias_act_packed(&packed, &x[..9], &x[..3], &mut o[..6])
            .unwrap_err();
        assert!(e.to_string().contains("'a' has 9 elements"), "{e}");
    }

    #[test]
    fn blocks_are_the_distinct_sizes_a_call_is_cut_into() {
        assert_eq!(row_blocks(128, 768, 768), [128]);
        assert_eq!(row_blocks(MAX_DIM, 768, 768), [MAX_DIM]);
        assert_eq!(row_blocks(MAX_DIM + 5, 768, 768), [MAX_DIM, 5]);
        assert_eq!(row_blocks(3 * MAX_DIM, 768, 768), [MAX_DIM]);
        let per = rows_per_call(1 << 16, 1 << 15);
        assert_eq!(row_blocks(per + 1, 1 << 16, 1 << 15), [per, 1]);
        assert_eq!(sequence_blocks(8, 12, 128, 64), [8]);
        let per = sequences_per_call(12, 128, 64);
        assert_eq!(sequence_blocks(2 * per + 3, 12, 128, 64), [per, 3]);
        // Each block is a workload.
        assert!(Workload::attention(per, 12, 128, 64, false).is_ok());
    }

    #[test]
    fn rows_per_call_is_the_most_one_workload_takes() {
        for (n, k) in [(1, 1), (3, 2), (768, 768), (4096, 4096), (1 << 16, 1 << 15)] {
            let rows = rows_per_call(n, k);
            assert!(Workload::gemm(rows, n, k).is_ok(), "{rows}x{n}x{k}");
            assert!(
                Workload::gemm(rows + 1, n, k).is_err(),
                "{}x{n}x{k}",
                rows + 1
            );
        }
        assert_eq!(rows_per_call(768, 768), MAX_DIM);
    }

    /// A GEMM past one workload's M (2^20 rows) is served in row blocks: every entry point,
    /// a remainder block of 3 rows, each block counted as a call.
    #[test]
    fn more_rows_than_one_workload_takes_are_served_in_blocks() {
        let (m, n, k) = (MAX_DIM + 3, 3, 2);
        let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
        let b = [0.5, -1.0, 2.0, 1.5, 0.25, -0.75];
        let bias = [1.0, -2.0, 0.5];
        let want = |i: usize, j: usize, with_bias: bool| {
            let dot: f32 = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            dot + if with_bias { bias[j] } else { 0.0 }
        };
        let check = |c: &[f32], with_bias: bool, relu: bool| {
            for i in [0, 1, MAX_DIM - 1, MAX_DIM, m - 1] {
                for j in 0..n {
                    let mut w = want(i, j, with_bias);
                    if relu {
                        w = w.max(0.0);
                    }
                    assert_eq!(c[i * n + j], w, "row {i} col {j}");
                }
            }
        };
        let rt = Runtime::defaults_only();
        let mut c = vec![f32::NAN; m * n];
        rt.gemm(m, n, k, &a, &b, &mut c).unwrap();
        check(&c, false, false);
        c.fill(f32::NAN);
        rt.gemm_bias_act(m, n, k, Act::Relu, &a, &b, &bias, &mut c)
            .unwrap();
        check(&c, true, true);
        let packed = rt.pack_weight(64, n, k, Act::Identity, &b).unwrap();
        let before = rt.lookups().total();
        c.fill(f32::NAN);
        rt.gemm_bias_act_packed(&packed, &a, &bias, &mut c).unwrap();
        check(&c, true, false);
        assert_eq!(rt.lookups().total() - before, 2, "two blocks, two calls");
        // A short output is an error naming the whole call, not a panic.
        let e = rt
            .gemm_bias_act_packed(&packed, &a, &bias, &mut c[1..])
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("gemm_bias:{m}x3x2")), "{e}");
        // Sizes that overflow, or an empty dimension, are errors too.
        for (m, n, k) in [
            (usize::MAX / 2, 3, 2),
            (MAX_DIM + 3, 0, 2),
            (MAX_DIM + 3, 3, 0),
        ] {
            assert!(rt.gemm(m, n, k, &a, &b, &mut c).is_err(), "{m}x{n}x{k}");
        }
    }

    /// Attention over more sequences than one workload takes (2^20) is served in blocks of
    /// sequences: each sequence as a call on it alone computes it, masked or not, from
    /// [b, h, s, d] tensors and from QKV rows.
    #[test]
    fn more_sequences_than_one_workload_takes_are_served_in_blocks() {
        use crate::layer::AttentionRows;
        let (b, h, s, d) = (MAX_DIM + 3, 1, 2, 1);
        let n = b * h * s * d;
        let val = |i: usize, seed: usize| ((i * 31 + seed * 17) % 13) as f32 / 4.0 - 1.5;
        let operand = |seed: usize| -> Vec<f32> { (0..n).map(|i| val(i, seed)).collect() };
        let (q, k, v) = (operand(1), operand(2), operand(3));
        let lens: Vec<i32> = (0..b).map(|i| (i % 3) as i32).collect();
        let rt = Runtime::defaults_only();
        let one = |i: usize, lens: Option<&[i32]>| {
            let r = i * s..(i + 1) * s;
            let mut o = vec![0.0; s];
            let (q, k, v) = (&q[r.clone()], &k[r.clone()], &v[r]);
            match lens {
                None => rt.attention(1, h, s, d, false, q, k, v, &mut o),
                Some(l) => rt.attention_masked(1, h, s, d, false, &l[i..=i], q, k, v, &mut o),
            }
            .unwrap();
            o
        };
        let seen = [0, 1, 2, MAX_DIM - 1, MAX_DIM, b - 1];
        for mask in [None, Some(&lens[..])] {
            let mut o = vec![f32::NAN; n];
            match mask {
                None => rt.attention(b, h, s, d, false, &q, &k, &v, &mut o),
                Some(l) => rt.attention_masked(b, h, s, d, false, l, &q, &k, &v, &mut o),
            }
            .unwrap();
            let mut rows = vec![f32::NAN; n];
            let qkv: Vec<f32> = (0..b * s).flat_map(|r| [q[r], k[r], v[r]]).collect();
            let dims = AttentionRows {
                batch: b,
                seq: s,
                heads: h,
                d,
                causal: false,
            };
            rt.attention_qkv(dims, mask, &qkv, &mut rows).unwrap();
            for i in seen {
                let want = one(i, mask);
                assert_eq!(
                    &o[i * s..(i + 1) * s],
                    &want[..],
                    "sequence {i}, mask {}",
                    mask.is_some()
                );
                assert_eq!(
                    &rows[i * s..(i + 1) * s],
                    &want[..],
                    "qkv rows, sequence {i}"
                );
            }
        }
        let e = rt
            .attention(b, h, s, d, false, &q, &k, &v[1..], &mut vec![0.0; n])
            .unwrap_err();
        assert!(
            e.to_string().contains(&format!("attention:{b}x1x2x1")),
            "{e}"
        );
    }
}
