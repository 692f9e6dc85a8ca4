//! Scaled dot-product attention (`attention:BxHxSxD[:causal]`), f32, Q/K/V/O laid out
//! `[B, H, S, D]`, `scale = 1/√D`: two kernel families, their search spaces and defaults.
//! Both take an optional fourth operand, the key lengths of a padded batch (i32 per batch,
//! [`crate::operand::host_attention`]): padding and causal masks combine, and a query that
//! sees no key gets zeros.
//!
//! - `attention_fused` ([`fused`]): flash-style — `Br` query rows × `Bc` keys per block, an
//!   online (running max / running sum) softmax, the `S×S` matrix never materialised; SIMD
//!   register tiles for the scores and the `P·V` update ([`ukernel`]); causal masking skips
//!   fully masked blocks. Knobs:
//!   - `tile`: the register tile, `{isa}_{MR}x{NR}` (MR query rows × NR keys);
//!   - `br`, `bc`: query rows and keys per block (rounded up to MR / NR);
//!   - `k_layout`: `prepacked` (Kᵀ of every head packed into NR-key panels and V into the
//!     P·V tile's column stripes once per call: up front for `par = blocks`, else by each
//!     head's task as it starts) or `blockwise` (each task packs the key and value block it
//!     is about to use);
//!   - `par` / `threads`: `none`, `heads` (tasks over B·H) or `blocks` (B·H × query blocks).
//! - `attention_unfused` ([`unfused`]): per head, `Q·Kᵀ` with the packed GEMM, a row
//!   softmax, then `·V` with the packed GEMM. Knobs: the GEMMs' `ukernel`, and `par` =
//!   `none`, `heads` (heads in parallel) or `gemm` (parallel inside each GEMM).
//!
//! bf16 attention (`attention:…:bf16`) is the `attention_bf16` family ([`bf16`]): flash-style
//! with `vdpbf16ps`, served only where the CPU has AVX512_BF16.
//!
//! Both flash-style families also read a transformer layer's fused QKV projection rows and
//! write its output rows in place ([`layout`], [`crate::Executable::run_qkv_rows`]): the
//! same computation to the bit, without splitting the heads out and merging them back
//! (BERT-base batch 8: 10 ms of ~300 a forward on a Zen 4 core pair).
//!
//! ```
//! use kernels::{default_for, HardwareFingerprint, Problem, Workload};
//!
//! let w: Workload = "attention:1x2x37x80:causal".parse()?;
//! let (kernel, config) = default_for(&w, HardwareFingerprint::current())?;
//! assert_eq!(kernel.name(), "attention_fused");
//! let exe = kernel.prepare(&w, &config)?;
//! let p = Problem::random(&w, 3);
//! let mut o = p.output();
//! exe.run_f32(&p.input_slices(), &mut o)?; // inputs: Q, K, V
//! p.check(&o, &p.reference())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod bf16;
pub mod fused;
pub mod layout;
pub mod ukernel;
pub mod unfused;

use crate::cpu::gemm::view::CView;
use crate::cpu::gemm::Packed;
use crate::cpu::knobs::{
    cap_rule, int_knob, int_listed, invalid, par_threads_listed, serial_iff_one_thread, snap,
    str_knob, str_listed, thread_values, unsupported,
};
use crate::cpu::pool;
use crate::cpu::Isa;
use crate::dtype::DType;
use crate::error::Result;
use crate::hardware::HardwareFingerprint;
use crate::kernel::{Executable, Kernel};
use crate::operand::{host_attention, host_qkv_rows, Operand, OperandMut};
use crate::space::{Config, Space, Value};
use crate::workload::Workload;

use fused::{FusedAttention, KLayout};
use layout::{Layout, Rows};
use unfused::{UnfusedAttention, UNFUSED_MAX_S};

/// The fused (flash-style) family.
pub struct Fused;

/// The unfused (GEMM, softmax, GEMM) family.
pub struct Unfused;

/// The attention families, in priority order.
pub static FAMILIES: &[&dyn Kernel] = &[&Fused, &Unfused];

/// Values of the `br` knob (query rows per block; rounded up to MR when built).
pub const BR_VALUES: &[usize] = &[16, 32, 64, 128, 256];
/// Values of the `bc` knob (keys per block; rounded up to NR when built).
pub const BC_VALUES: &[usize] = &[16, 32, 64, 128, 256, 512];
/// Values of the `k_layout` knob.
pub const K_LAYOUT_VALUES: &[&str] = &["prepacked", "blockwise"];

/// Below this many flops the defaults stay single-threaded (a fork-join costs several µs).
const PARALLEL_MIN_FLOPS: f64 = 4.0e6;

/// How attention work is split across threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnPar {
    /// One thread.
    None,
    /// Whole heads (B·H tasks) on this many rayon tasks.
    Heads(usize),
    /// Heads × query blocks on this many rayon tasks.
    Blocks(usize),
}

impl AttnPar {
    /// Tasks the work is spread over.
    pub fn threads(self) -> usize {
        match self {
            AttnPar::None => 1,
            AttnPar::Heads(t) | AttnPar::Blocks(t) => t,
        }
    }

    /// Runs a flash-style family's work on `heads` (each head's `S × D` output window, in
    /// head order) as this split says: whole heads through `head(hd, window)` (`none`,
    /// `heads`), or query blocks of `br` rows through `block(hd, i0, window)` (`blocks`;
    /// with `causal`, the later blocks, which see more keys, start first).
    pub(crate) fn run<'a>(
        self,
        heads: Vec<CView<'a>>,
        (br, causal): (usize, bool),
        head: impl Fn(usize, CView<'a>) + Sync,
        block: impl Fn(usize, usize, CView<'a>) + Sync,
    ) {
        match self {
            AttnPar::None => {
                for (hd, oh) in heads.into_iter().enumerate() {
                    head(hd, oh);
                }
            }
            AttnPar::Heads(t) => {
                let items: Vec<_> = heads.into_iter().enumerate().collect();
                pool::for_each(t, items, |(hd, oh)| head(hd, oh));
            }
            AttnPar::Blocks(t) => {
                let mut items: Vec<(usize, usize, CView<'a>)> = Vec::new();
                for (hd, oh) in heads.into_iter().enumerate() {
                    for (i0, ob) in oh.row_chunks(br) {
                        items.push((hd, i0, ob));
                    }
                }
                if causal {
                    items.sort_by_key(|&(hd, i0, _)| (std::cmp::Reverse(i0), hd));
                }
                pool::for_each(t, items, |(hd, i0, ob)| block(hd, i0, ob));
            }
        }
    }
}

/// A flash-style family's prepared variant once its operands are checked: attention over
/// `[q, k, v]` and `out` laid out as `rows` says, from the calling thread. The provided
/// methods are its two [`Executable`] entry points.
trait Flash: Sync {
    /// The workload it was prepared for.
    fn workload(&self) -> Workload;
    fn attend(&self, rows: Rows, qkv: [&[f32]; 3], key_lens: Option<&[i32]>, out: &mut [f32]);

    /// [`Executable::run`]: the workload's `[B, H, S, D]` operands.
    fn run_heads(&self, inputs: &[Operand<'_>], out: OperandMut<'_>) -> Result<()> {
        let w = self.workload();
        let (qkv, lens, out) = host_attention(&w, inputs, out)?;
        let rows = Rows::of(&w, Layout::Heads);
        self.attend(rows, qkv, lens, out);
        Ok(())
    }

    /// [`Executable::run_qkv_rows`]: a fused QKV projection's rows, read in place.
    fn run_rows(&self, qkv: &[f32], key_lens: Option<&[i32]>, out: &mut [f32]) -> Result<()> {
        let w = self.workload();
        host_qkv_rows(&w, qkv, key_lens, out)?;
        let rows = Rows::of(&w, Layout::QkvRows);
        self.attend(rows, [qkv; 3], key_lens, out);
        Ok(())
    }
}

/// The fallback for an attention workload: the fused family's default (valid for every shape).
pub fn default_family(_: &Workload) -> &'static dyn Kernel {
    &Fused
}

/// `(b, h, s, d, causal)` of an attention workload; a 1-element shape for any other (the
/// families describe spaces only for workloads they support, and `build` refuses the rest).
fn shape(w: &Workload) -> (usize, usize, usize, usize, bool) {
    match *w {
        Workload::Attention {
            b, h, s, d, causal, ..
        } => (b, h, s, d, causal),
        _ => (1, 1, 1, 1, false),
    }
}

fn par_values(hw: &HardwareFingerprint, parallel: &'static str) -> Vec<&'static str> {
    if hw.cores > 1 {
        vec!["none", "heads", parallel]
    } else {
        vec!["none"]
    }
}

/// The rules of a flash-style space (`attention_fused`, `attention_bf16`) over its `br`, `bc`,
/// `par` and `threads` knobs: serial iff one thread, blocks no larger than S needs, a head
/// per thread for `par = heads`.
fn block_rules(space: Space, w: &Workload) -> Space {
    let (b, h, s, _, _) = shape(w);
    space
        .rule("serial_iff_one_thread", serial_iff_one_thread)
        .rule("br_not_beyond_s", cap_rule("br", BR_VALUES, s))
        .rule("bc_not_beyond_s", cap_rule("bc", BC_VALUES, s))
        .rule("heads_split_has_a_head_per_thread", heads_rule(b * h))
}

/// Whether `c`'s `br`, `bc`, `par` and `threads` are listed values that pass
/// [`block_rules`] (the shared part of a flash-style family's `config_fits`).
fn blocks_fit(w: &Workload, hw: &HardwareFingerprint, c: &Config) -> bool {
    let (b, h, s, _, _) = shape(w);
    int_listed(c, "br", BR_VALUES)
        && int_listed(c, "bc", BC_VALUES)
        && par_threads_listed(c, hw, &["none", "heads", "blocks"])
        && serial_iff_one_thread(c)
        && cap_rule("br", BR_VALUES, s)(c)
        && cap_rule("bc", BC_VALUES, s)(c)
        && heads_rule(b * h)(c)
}

/// The default split of a flash-style family: one thread below [`PARALLEL_MIN_FLOPS`], whole
/// heads when there are at least two per core, heads × query blocks otherwise.
fn default_par(w: &Workload, hw: &HardwareFingerprint) -> (&'static str, usize) {
    let (b, h, _, _, _) = shape(w);
    let cores = hw.cores.max(1);
    if cores == 1 || w.flops() < PARALLEL_MIN_FLOPS {
        ("none", 1)
    } else if b * h >= 2 * cores {
        ("heads", cores)
    } else {
        ("blocks", cores)
    }
}

/// Rule: `par = heads` only with at least as many heads as threads.
fn heads_rule(heads: usize) -> impl Fn(&Config) -> bool + Send + Sync + 'static {
    move |c: &Config| {
        c.str("par") != Some("heads") || c.int("threads").is_some_and(|t| t as usize <= heads)
    }
}

fn par_from_config(kernel: &str, c: &Config, parallel: &str) -> Result<(String, usize)> {
    let threads = int_knob(kernel, c, "threads")?.max(1);
    let par = str_knob(kernel, c, "par")?;
    if par != "none" && par != "heads" && par != parallel {
        return Err(invalid(kernel, c, format!("unknown par '{par}'")));
    }
    if par == "none" || threads == 1 {
        return Ok(("none".into(), 1));
    }
    Ok((par.into(), threads))
}

impl Kernel for Fused {
    fn name(&self) -> &'static str {
        "attention_fused"
    }

    fn version(&self) -> u32 {
        // 2: queries read in place, scale inside the exp2 FMA, tail kernels instead of
        // padding rows, outputs finished in the last step.
        2
    }

    fn supports(&self, w: &Workload) -> bool {
        matches!(w, Workload::Attention { .. }) && w.dtype() == DType::F32
    }

    fn config_fits(&self, w: &Workload, hw: &HardwareFingerprint, c: &Config) -> bool {
        c.0.len() == 6
            && c.str("tile").is_some_and(|t| {
                let offered = ukernel::tiles_offered(Isa::of(hw));
                offered.iter().any(|o| o.name == t)
            })
            && str_listed(c, "k_layout", K_LAYOUT_VALUES)
            && blocks_fit(w, hw, c)
    }

    fn space(&self, w: &Workload, hw: &HardwareFingerprint) -> Space {
        let names: Vec<&str> = ukernel::tiles_offered(Isa::of(hw))
            .iter()
            .map(|t| t.name.as_str())
            .collect();
        let space = Space::new()
            .knob("tile", names)
            .knob("br", BR_VALUES.iter().copied())
            .knob("bc", BC_VALUES.iter().copied())
            .knob("k_layout", K_LAYOUT_VALUES.iter().copied())
            .knob("par", par_values(hw, "blocks"))
            .knob("threads", thread_values(hw));
        block_rules(space, w)
    }

    fn default_config(&self, w: &Workload, hw: &HardwareFingerprint) -> Config {
        let (_, _, s, _, _) = shape(w);
        let tile = default_tile(hw);
        // 64 queries × 256 keys per block: few per-block softmax updates (their fixed cost
        // per row group is what larger key blocks amortise), and a key block, a value block
        // and the block's running outputs stay within L2 for D ≤ 128 (measured on Zen 3 at
        // D = 64, version 2: bc = 256 1-3% faster than 128 at S = 512 and 2048, 512 no better,
        // 64 3% and 32 10% slower; br 32..128 within 1%).
        let br = snap(BR_VALUES, 64, s);
        let bc = snap(BC_VALUES, 256, s);
        let (par, threads) = default_par(w, hw);
        Config::from_pairs([
            ("tile", Value::from(tile.name.as_str())),
            ("br", br.into()),
            ("bc", bc.into()),
            ("k_layout", "prepacked".into()),
            ("par", par.into()),
            ("threads", threads.into()),
        ])
    }

    fn build(&self, w: &Workload, c: &Config) -> Result<Box<dyn Executable>> {
        Ok(Box::new(self.build_fused(w, c)?))
    }
}

impl Fused {
    /// [`Kernel::build`], returning the concrete driver.
    pub fn build_fused(&self, w: &Workload, c: &Config) -> Result<FusedAttention> {
        let name = self.name();
        let Workload::Attention {
            b, h, s, d, causal, ..
        } = *w
        else {
            return Err(unsupported(name, w));
        };
        let tile_name = str_knob(name, c, "tile")?;
        let tile = ukernel::tile(tile_name).ok_or_else(|| {
            invalid(
                name,
                c,
                format!("tile '{tile_name}' is unknown or not supported by this CPU"),
            )
        })?;
        let k_layout = match str_knob(name, c, "k_layout")? {
            "prepacked" => KLayout::Prepacked,
            "blockwise" => KLayout::Blockwise,
            other => return Err(invalid(name, c, format!("unknown k_layout '{other}'"))),
        };
        let par = match par_from_config(name, c, "blocks")? {
            (p, t) if p == "heads" => AttnPar::Heads(t),
            (p, t) if p == "blocks" => AttnPar::Blocks(t),
            _ => AttnPar::None,
        };
        let (br, bc) = (int_knob(name, c, "br")?, int_knob(name, c, "bc")?);
        if br == 0 || bc == 0 {
            return Err(invalid(name, c, "br and bc must be at least 1".into()));
        }
        Ok(FusedAttention::new(
            (b, h, s, d, causal),
            tile,
            br,
            bc,
            k_layout,
            par,
        ))
    }
}

/// How many of keys `[j0, j0 + kvb)` each query row `r0 + r` of a row group sees, into
/// `lim[r]`: all of them, or under `causal` those up to its own position; rows from `valid`
/// on see none. Returns the most any row sees (0: the group skips the block).
fn key_limits(
    lim: &mut [usize],
    valid: usize,
    causal: bool,
    r0: usize,
    (j0, kvb): (usize, usize),
) -> usize {
    for (r, x) in lim.iter_mut().enumerate() {
        *x = match r < valid {
            false => 0,
            true if causal => kvb.min((r0 + r + 1).saturating_sub(j0)),
            true => kvb,
        };
    }
    lim.iter().copied().max().unwrap_or(0)
}

/// The best ISA's first (largest-throughput) tile on `hw`.
fn default_tile(hw: &HardwareFingerprint) -> &'static ukernel::AttnTile {
    let offered = ukernel::tiles_offered(Isa::of(hw));
    let best = offered.iter().map(|t| t.isa).max().unwrap_or(Isa::Portable);
    offered
        .into_iter()
        .find(|t| t.isa == best)
        .expect("at least one attention tile")
}

impl Kernel for Unfused {
    fn name(&self) -> &'static str {
        "attention_unfused"
    }

    fn version(&self) -> u32 {
        1
    }

    fn supports(&self, w: &Workload) -> bool {
        matches!(*w, Workload::Attention { s, dtype: DType::F32, .. } if s <= UNFUSED_MAX_S)
    }

    fn config_fits(&self, w: &Workload, hw: &HardwareFingerprint, c: &Config) -> bool {
        let (b, h, ..) = shape(w);
        c.0.len() == 3
            && c.str("ukernel").is_some_and(|u| {
                crate::cpu::gemm::ukernel::packed_offered(Isa::of(hw))
                    .iter()
                    .any(|o| o.name == u)
            })
            && par_threads_listed(c, hw, &["none", "heads", "gemm"])
            && serial_iff_one_thread(c)
            && heads_rule(b * h)(c)
    }

    fn space(&self, w: &Workload, hw: &HardwareFingerprint) -> Space {
        let (b, h, ..) = shape(w);
        let names: Vec<&str> = crate::cpu::gemm::ukernel::packed_offered(Isa::of(hw))
            .iter()
            .map(|u| u.name.as_str())
            .collect();
        Space::new()
            .knob("ukernel", names)
            .knob("par", par_values(hw, "gemm"))
            .knob("threads", thread_values(hw))
            .rule("serial_iff_one_thread", serial_iff_one_thread)
            .rule("heads_split_has_a_head_per_thread", heads_rule(b * h))
    }

    fn default_config(&self, w: &Workload, hw: &HardwareFingerprint) -> Config {
        let (b, h, s, d, _) = shape(w);
        let gemm = Workload::Gemm {
            m: s,
            n: s,
            k: d,
            dtype: DType::F32,
        };
        let uk = Packed.default_config(&gemm, hw);
        let cores = hw.cores.max(1);
        let (par, threads) = if cores == 1 || w.flops() < PARALLEL_MIN_FLOPS {
            ("none", 1)
        } else if b * h >= 2 * cores {
            ("heads", cores)
        } else {
            ("gemm", cores)
        };
        Config::from_pairs([
            (
                "ukernel",
                uk.get("ukernel").cloned().unwrap_or(Value::from("")),
            ),
            ("par", par.into()),
            ("threads", threads.into()),
        ])
    }

    fn build(&self, w: &Workload, c: &Config) -> Result<Box<dyn Executable>> {
        let name = self.name();
        let (b, h, s, d, causal) = match *w {
            Workload::Attention {
                b, h, s, d, causal, ..
            } if s <= UNFUSED_MAX_S => (b, h, s, d, causal),
            _ => return Err(unsupported(name, w)),
        };
        let uk = str_knob(name, c, "ukernel")?;
        let (par, threads) = par_from_config(name, c, "gemm")?;
        let gemm_threads = if par == "gemm" { threads } else { 1 };
        let head_tasks = if par == "heads" { threads } else { 1 };
        let hw = HardwareFingerprint::current().with_cores(gemm_threads);
        let gemm = |m: usize, n: usize, k: usize| -> Result<Box<dyn Executable>> {
            let gw = Workload::Gemm {
                m,
                n,
                k,
                dtype: DType::F32,
            };
            let mut gc = Packed.default_config(&gw, &hw);
            gc.set(crate::cpu::gemm::params::knob::UKERNEL, uk);
            Ok(Box::new(Packed.build_packed(&gw, &gc).map_err(|e| {
                invalid(name, c, format!("its GEMM does not build: {e}"))
            })?))
        };
        Ok(Box::new(UnfusedAttention::with_gemms(
            (b, h, s, d, causal),
            gemm(s, s, d)?,
            gemm(s, d, s)?,
            head_tasks,
        )))
    }
}
