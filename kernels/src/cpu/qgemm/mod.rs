//! int8 GEMM (`gemm:MxNxK:i8`): dynamic quantisation, exact `u8 × s8 → i32` products, f32
//! output — the `gemm_i8` family.
//!
//! ```
//! use kernels::{default_for, HardwareFingerprint, Problem, Workload};
//!
//! let w: Workload = "gemm:33x70x65:i8".parse()?;
//! let (kernel, config) = default_for(&w, HardwareFingerprint::current())?;
//! assert_eq!(kernel.name(), "gemm_i8");
//! let exe = kernel.prepare(&w, &config)?;
//! let p = Problem::random(&w, 3);
//! let mut c = p.output();
//! exe.run_f32(&p.input_slices(), &mut c)?;  // A, B in f32; C in f32
//! p.check(&c, &p.reference())?;             // within the quantisation bound of Problem
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Inputs and output are f32, as for the f32 GEMM: A (activations) is quantised per row on
//! every call ([`quant::quantize_rows`], `u8` asymmetric or `s8` symmetric: the `a_quant`
//! knob), B (weights) per output column, symmetric s8 ([`quant::QuantB`]); the integer
//! product is exact in i32 ([`ukernel`]: AMX `tdpbusd`, AVX512_VNNI, AVX-VNNI, AVX2, portable); the
//! store dequantises with the zero-point correction.
//!
//! AMX kernels (`amx_32x32`, `amx_16x64`, `amx_64x16`, `amx_8x64`: four accumulator tiles
//! in 2×2, 1×4 or 4×1, tile rows 16 or 8) are written once over a tile-unit trait
//! ([`crate::cpu::amx`]) and share B's packing with the others: a panel's group of 4 depths
//! is one AMX B-tile row. They are offered only where the fingerprint has `amx_int8` (the CPU
//! has it and Linux granted the tile state) and run only there; on every other CPU the tests
//! run the same kernel bodies, through this driver, on the emulated tile unit. Knobs: `ukernel` (tile shape and ISA), `a_quant`, `kc`
//! (depth per block), `par` (`none`; `m`: row blocks on `threads` tasks; `n`: column panels
//! on `threads` tasks, for few rows) and `threads`.

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
mod amx;
pub mod quant;
pub mod ukernel;

use std::cell::Cell;

use crate::cpu::gemm::epilogue::{gemm_operands, gemm_operands_prepared};
use crate::cpu::gemm::pack::with_taken;
use crate::cpu::gemm::ukernel::{bias_act_row, prefetch_lines, TileEpilogue};
use crate::cpu::knobs::{
    cap_rule, first_at_least, int_knob, int_listed, invalid, par_threads_listed,
    serial_iff_one_thread, str_knob, str_listed, thread_values, unsupported,
};
use crate::cpu::pool;
use crate::cpu::weights::WeightCache;
use crate::cpu::Isa;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::hardware::HardwareFingerprint;
use crate::kernel::{Executable, Kernel, PreparedWeight, WeightFormat};
use crate::operand::{Operand, OperandMut};
use crate::space::{Config, Space};
use crate::workload::{Act, Workload};

use quant::{AQuant, QuantA, QuantB};
use ukernel::{DotKernel, KERNELS};

/// The int8 GEMM family.
pub struct GemmI8;

const NAME: &str = "gemm_i8";

/// Values of the `par` knob.
const PAR_VALUES: &[&str] = &["none", "m", "n"];

/// Values of the `kc` knob: depth per block (a multiple of 4); capped by the depth.
const KC_VALUES: &[usize] = &[128, 256, 512, 1024, 4096];

/// The `kc` values that behave differently for depth `k` (larger ones all mean "all of K").
fn kc_cap(k: usize) -> usize {
    first_at_least(KC_VALUES, quant::padded_k(k)).unwrap_or(usize::MAX)
}

/// Below this many multiply-adds the default stays single-threaded. 256³ while a parallel
/// call handed the work to sleeping workers; with [`crate::cpu::pool::for_each`] the split
/// pays from 2²⁰: measured on the 2-vCPU Zen 4 VM, 2 threads against one, calls after the
/// caller's own work (`call_gaps`, `bench_results/8b4b41305960a7a6/parallel-defaults-*.md`):
/// 1×1536×768 1.35–1.7×, 1×2304×768 1.5–1.75×, 1×768×3072 1.3–1.6×, 16×768×768
/// 1.25–1.7×, 64×256×256 1.6–1.85×; 1×768×768 (2¹⁹ and a bit) gained 1.3× in one run and
/// lost in another, 1×512×512 lost.
const PARALLEL_MIN_MACS: f64 = (1u64 << 20) as f64;

/// The micro-kernels offered on `hw`: those of its ISA level (AVX2 ones on AVX-512 too), the
/// VNNI ones only where its flags have `avx512vnni` (or `avxvnni`), the AMX ones only where they have
/// `amx_int8` (reported only where the OS granted the tile state).
fn offered(hw: &HardwareFingerprint) -> Vec<&'static DotKernel> {
    let best = Isa::of(hw);
    KERNELS
        .iter()
        .filter(|k| {
            k.isa.offered_under(best) && k.needs.is_none_or(|f| hw.isa.iter().any(|x| x == f))
        })
        .collect()
}

fn dims(w: &Workload) -> (usize, usize, usize) {
    w.gemm_dims().unwrap_or((1, 1, 1))
}

impl Kernel for GemmI8 {
    fn name(&self) -> &'static str {
        NAME
    }

    fn version(&self) -> u32 {
        1
    }

    fn dtypes(&self) -> &'static [DType] {
        &[DType::I8]
    }

    fn supports(&self, w: &Workload) -> bool {
        matches!(w, Workload::Gemm { .. } | Workload::GemmBiasAct { .. })
            && w.dtype() == DType::I8
            && dims(w).2 <= crate::workload::MAX_I8_DEPTH
    }

    fn space(&self, w: &Workload, hw: &HardwareFingerprint) -> Space {
        let ukernels: Vec<&str> = offered(hw).iter().map(|k| k.name).collect();
        let par: &[&str] = if hw.cores > 1 { PAR_VALUES } else { &["none"] };
        let (_, _, k) = dims(w);
        Space::new()
            .knob("ukernel", ukernels)
            .knob("a_quant", AQuant::ALL.map(AQuant::name))
            .knob("kc", KC_VALUES.to_vec())
            .rule(
                "kc at most the depth",
                cap_rule("kc", KC_VALUES, quant::padded_k(k)),
            )
            .knob("par", par.to_vec())
            .knob("threads", thread_values(hw))
            .rule("serial iff one thread", serial_iff_one_thread)
    }

    fn config_fits(&self, w: &Workload, hw: &HardwareFingerprint, c: &Config) -> bool {
        let ukernels: Vec<&str> = offered(hw).iter().map(|k| k.name).collect();
        let (_, _, k) = dims(w);
        c.0.len() == 5
            && str_listed(c, "ukernel", &ukernels)
            && int_listed(c, "kc", KC_VALUES)
            && c.int("kc").is_some_and(|v| v as usize <= kc_cap(k))
            && str_listed(c, "a_quant", &AQuant::ALL.map(AQuant::name))
            && par_threads_listed(c, hw, PAR_VALUES)
            && serial_iff_one_thread(c)
    }

    fn default_config(&self, w: &Workload, hw: &HardwareFingerprint) -> Config {
        let (m, n, k) = dims(w);
        // The ISA's first kernel, or its first one of at most M rows when M is smaller than
        // that kernel's tile (no padded rows to compute).
        let offer = offered(hw);
        let first = offer
            .first()
            .copied()
            .unwrap_or(&KERNELS[KERNELS.len() - 1]);
        let uk = match offer.iter().find(|k| k.isa == first.isa && k.mr <= m) {
            Some(k) if m < first.mr => k,
            _ => first,
        };
        // Rows when there are enough row tiles for every thread, else columns.
        let big = hw.cores > 1 && (m * n * k) as f64 >= PARALLEL_MIN_MACS;
        let par = match () {
            _ if big && m >= 2 * uk.mr * hw.cores => "m",
            _ if big && n >= 2 * uk.nr * hw.cores => "n",
            _ => "none",
        };
        let threads = if par == "none" { 1 } else { hw.cores };
        let mut c = Config::default();
        c.set("ukernel", uk.name);
        c.set("a_quant", AQuant::U8.name());
        // The whole depth in one block (up to the largest `kc`): no i32 sums stored and
        // reloaded between blocks. Measured on Zen 3 (AVX2, `gemm_speed --vs`, 41 alternating pairs each)
        // against the former 256: 1.01–1.08× on the BERT shapes at M = 8, 128 and 1024 and
        // at 1024³, 2 threads; 1.02× and 1.07× at 128x768x{768,3072} on one thread — also
        // where a 3072-deep panel (48 KiB) outgrows L1 and streams from L2.
        c.set("kc", kc_cap(k).min(KC_VALUES[KC_VALUES.len() - 1]));
        c.set("par", par);
        c.set("threads", threads);
        c
    }

    fn build(&self, w: &Workload, c: &Config) -> Result<Box<dyn Executable>> {
        if !self.supports(w) {
            return Err(unsupported(NAME, w));
        }
        let name = str_knob(NAME, c, "ukernel")?;
        let uk = ukernel::DotKernel::by_name(name)
            .ok_or_else(|| invalid(NAME, c, format!("ukernel '{name}' does not run here")))?;
        Ok(Box::new(build_with(w, c, uk)?))
    }
}

/// The int8 GEMM of the supported workload `w` with the knobs of `c` on micro-kernel `uk`
/// (the `ukernel` knob, resolved by the caller).
fn build_with(w: &Workload, c: &Config, uk: &'static DotKernel) -> Result<QGemm> {
    let (m, n, k) = dims(w);
    let a_quant = match str_knob(NAME, c, "a_quant")? {
        "u8" => AQuant::U8,
        "s8" => AQuant::S8,
        other => return Err(invalid(NAME, c, format!("unknown a_quant '{other}'"))),
    };
    let split = match str_knob(NAME, c, "par")? {
        "none" => Split::None,
        "m" => Split::M,
        "n" => Split::N,
        other => return Err(invalid(NAME, c, format!("unknown par '{other}'"))),
    };
    let threads = match split {
        Split::None => 1,
        _ => int_knob(NAME, c, "threads")?.max(1),
    };
    let act = match w {
        Workload::GemmBiasAct { act, .. } => Some(*act),
        _ => None,
    };
    let kc = int_knob(NAME, c, "kc")?;
    if !kc.is_multiple_of(4) || kc == 0 {
        return Err(invalid(
            NAME,
            c,
            format!("kc {kc} is not a positive multiple of 4"),
        ));
    }
    Ok(QGemm {
        w: *w,
        m,
        n,
        k,
        kc,
        act,
        uk,
        a_quant,
        split,
        threads,
        l2: l2_bytes(),
        weights: WeightCache::default(),
    })
}

/// A built int8 GEMM.
struct QGemm {
    w: Workload,
    m: usize,
    n: usize,
    k: usize,
    /// Depth per block, a multiple of 4.
    kc: usize,
    /// The epilogue's activation, after the bias (`gemm_bias_*`); `None` for plain GEMM.
    act: Option<Act>,
    uk: &'static DotKernel,
    a_quant: AQuant,
    split: Split,
    threads: usize,
    /// L2 bytes per core, which sets the row blocks ([`row_block`]).
    l2: usize,
    /// B quantised and packed once per weight buffer.
    weights: WeightCache<QuantB>,
}

thread_local! {
    /// Quantised activations, reused across calls on this thread.
    static QA: Cell<QuantA> = Cell::new(QuantA::default());
}

/// Runs `f` on the rows of `a` (`k` values each) quantised into this thread's reusable
/// buffer, taken out of its slot for the call ([`with_taken`]: `par = n` waits inside `f`).
fn with_quantised<R>(
    a: &[f32],
    k: usize,
    scheme: AQuant,
    max_code: u8,
    f: impl FnOnce(&QuantA) -> R,
) -> R {
    with_taken(&QA, |qa| {
        ukernel::quantize_rows_fast(a, k, scheme, max_code, qa);
        f(qa)
    })
}

impl Executable for QGemm {
    fn run(&self, inputs: &[Operand<'_>], out: OperandMut<'_>) -> Result<()> {
        let (a, b, bias, c) = gemm_operands(&self.w, self.act, inputs, out)?;
        let qb = self
            .weights
            .get(b, || QuantB::new(b, self.k, self.n, self.uk.nr))?;
        self.compute(a, &qb, bias, c);
        Ok(())
    }

    fn weight_format(&self) -> Option<WeightFormat> {
        Some(self.format())
    }

    fn prepare_weight(&self, b: &[f32]) -> Result<PreparedWeight> {
        let want = self.k * self.n;
        if b.len() != want {
            return Err(Error::Operand {
                workload: self.w.key(),
                operand: "b".into(),
                reason: format!("{} elements, expected {want}", b.len()),
            });
        }
        let qb = QuantB::new(b, self.k, self.n, self.uk.nr)?;
        let bytes = qb.panels.len() + 8 * qb.scale.len();
        Ok(PreparedWeight::new(self.format(), bytes, qb))
    }

    fn run_prepared(
        &self,
        inputs: &[&[f32]],
        weight: &PreparedWeight,
        output: &mut [f32],
    ) -> Result<()> {
        let qb: &QuantB = weight.get(self.format(), &self.w)?;
        if (qb.k, qb.n) != (self.k, self.n) {
            return Err(Error::Operand {
                workload: self.w.key(),
                operand: "b".into(),
                reason: format!("prepared for K×N {}×{}", qb.k, qb.n),
            });
        }
        let (a, ep, c) = gemm_operands_prepared(&self.w, self.act, inputs, output)?;
        self.compute(a, qb, ep, c);
        Ok(())
    }
}

impl QGemm {
    fn format(&self) -> WeightFormat {
        WeightFormat {
            family: NAME,
            params: [self.uk.nr, 0],
        }
    }
}

impl QGemm {
    /// `c = ep(dequant(quant(a) · qb))`: row blocks split over `threads` tasks, each
    /// quantising its own rows (`par = m`), or column panels split over them (`par = n`,
    /// the only parallelism for a handful of rows), or one task.
    fn compute(&self, a: &[f32], qb: &QuantB, ep: Option<TileEpilogue<'_>>, c: &mut [f32]) {
        let (m, n, k, mr) = (self.m, self.n, self.k, self.uk.mr);
        let panels = n.div_ceil(self.uk.nr);
        let per_task = m.div_ceil(mr).div_ceil(self.threads).max(1) * mr;
        let whole = |(a, c): (&[f32], &mut [f32])| {
            with_quantised(a, k, self.a_quant, self.uk.max_code, |qa| {
                self.rows(qa, qb, ep, 0..panels, Out { c, ld: n, col0: 0 });
            })
        };
        match self.split {
            Split::M if self.threads > 1 && per_task < m => {
                let tasks = a.chunks(per_task * k).zip(c.chunks_mut(per_task * n));
                pool::for_each(self.threads, tasks.collect(), whole);
            }
            Split::N if self.threads > 1 && panels > 1 => {
                with_quantised(a, k, self.a_quant, self.uk.max_code, |qa| {
                    self.column_tasks(qa, qb, ep, c);
                })
            }
            _ => whole((a, c)),
        }
    }

    /// `par = n`: contiguous ranges of column panels on `threads` tasks, each into a buffer
    /// of its own (rows × its columns), copied into C once all are done.
    fn column_tasks(&self, qa: &QuantA, qb: &QuantB, ep: Option<TileEpilogue<'_>>, c: &mut [f32]) {
        let (m, n, nr) = (self.m, self.n, self.uk.nr);
        let panels = n.div_ceil(nr);
        let per_task = panels.div_ceil(self.threads);
        let mut blocks: Vec<(usize, usize, Vec<f32>)> = (0..panels)
            .step_by(per_task)
            .map(|p0| {
                let p1 = (p0 + per_task).min(panels);
                let width = (p1 * nr).min(n) - p0 * nr;
                (p0, p1, vec![0.0f32; m * width])
            })
            .collect();
        pool::for_each(
            self.threads,
            blocks.iter_mut().collect(),
            |(p0, p1, buf)| {
                let ld = buf.len() / m;
                let out = Out {
                    c: buf,
                    ld,
                    col0: *p0 * nr,
                };
                self.rows(qa, qb, ep, *p0..*p1, out);
            },
        );
        for (p0, _, buf) in blocks {
            let (col0, width) = (p0 * nr, buf.len() / m);
            for (row, src) in c.chunks_exact_mut(n).zip(buf.chunks_exact(width)) {
                row[col0..col0 + width].copy_from_slice(src);
            }
        }
    }

    /// The rows of C that `out` holds, from their quantised activations `qa`, for the column
    /// panels `panels`, in blocks of [`row_block`] rows whose codes stay in L2: per block and
    /// panel, the depth in blocks of `kc` (the panel's block stays in cache — L1 for short
    /// blocks — while every row tile of the block streams past it), the i32 sums of the
    /// block's row tiles kept across depth blocks, each tile dequantised into `out` as its
    /// last depth block is done, its C lines fetched while its sums are computed (measured on
    /// a Zen 4, `gemm:1024x1024x1024:i8` on 2 threads: the dequantisation 12.6% → ~5% of the
    /// time, from a pass over the whole panel after all its tiles, which waited on C's
    /// lines from memory), then the bias and activation applied to the tile's rows while
    /// they are in L1. Kernels that [batch](DotKernel::batches) (AMX: one tile configuration
    /// per call) take a block's whole row tiles in one call, each dequantised after it.
    fn rows(
        &self,
        qa: &QuantA,
        qb: &QuantB,
        ep: Option<TileEpilogue<'_>>,
        panels: std::ops::Range<usize>,
        out: Out<'_>,
    ) {
        let (kp, mr, nr) = (qa.kp, self.uk.mr, self.uk.nr);
        let (ld, col0) = (out.ld.max(1), out.col0);
        let rows = out.c.len() / ld;
        let kc = self.kc.clamp(4, kp.max(4));
        let tiles = rows.div_ceil(mr);
        let per_block = row_block(kp, mr, rows, self.l2);
        let mut acc = vec![0i32; per_block * nr];
        let edge = edge_tile(qa, rows, mr);
        for (b, c) in out.c.chunks_mut(per_block * ld).enumerate() {
            let (r0, t0) = (b * per_block, b * per_block / mr);
            let block_tiles = (c.len() / ld).div_ceil(mr);
            let mut out = Out { c, ld, col0 };
            for panel in panels.clone() {
                let bp = qb.panel(panel);
                for k0 in (0..kp).step_by(kc) {
                    let len = kc.min(kp - k0);
                    let chunk = &bp[k0 * nr..(k0 + len) * nr];
                    let last = k0 + len == kp;
                    // Kernels that batch (AMX) take the block's whole row tiles in one call,
                    // dequantised after it; the others a tile per call (see `batches`).
                    let has_edge = edge.is_some() && t0 + block_tiles == tiles;
                    let batched = match self.uk.batches() {
                        true => block_tiles - usize::from(has_edge),
                        false => 0,
                    };
                    if batched > 0 {
                        let a = &qa.codes[t0 * mr * kp + k0..];
                        let sums = &mut acc[..batched * mr * nr];
                        self.uk.tiles(len, a, kp, chunk, sums, k0 > 0, batched);
                        for t in (0..batched).filter(|_| last) {
                            let tile = &acc[t * mr * nr..(t + 1) * mr * nr];
                            self.store(qa, qb, (r0, t * mr, panel), tile, ep.as_ref(), &mut out);
                        }
                    }
                    for t in batched..block_tiles {
                        let a = match &edge {
                            Some(e) if t0 + t == tiles - 1 => &e[k0..],
                            _ => &qa.codes[(t0 + t) * mr * kp + k0..],
                        };
                        let tile = &mut acc[t * mr * nr..(t + 1) * mr * nr];
                        if last {
                            self.prefetch_out(t * mr, panel, &out);
                        }
                        self.uk.tile(len, a, kp, chunk, tile, k0 > 0);
                        if last {
                            // Dequantised (bias and activation too) while the sums are in
                            // L1, and the stores to C overlap the next tile's arithmetic.
                            let at = (r0, t * mr, panel);
                            self.store(qa, qb, at, tile, ep.as_ref(), &mut out);
                        }
                    }
                }
            }
        }
    }

    /// Fetches the C lines of one column panel of the row tile at row `i` of `out` into the
    /// cache while its sums are computed: the dequantised stores then hit L1 instead of
    /// waiting on lines from memory.
    fn prefetch_out(&self, i: usize, panel: usize, out: &Out<'_>) {
        let cols = self.panel_cols(panel);
        let cols = cols.start - out.col0..cols.end - out.col0;
        for row in out.c.chunks_exact(out.ld).skip(i).take(self.uk.mr) {
            prefetch_lines(&row[cols.clone()]);
        }
    }

    /// The columns of C that column panel `panel` covers.
    fn panel_cols(&self, panel: usize) -> std::ops::Range<usize> {
        let nr = self.uk.nr;
        panel * nr..(panel * nr + nr).min(self.n)
    }

    /// Dequantises one column panel of the row tile at row `i` of `out` (whose first row
    /// is row `r0` of `qa`) from its sums `acc`: the tile's rows that `out` has.
    fn store(
        &self,
        qa: &QuantA,
        qb: &QuantB,
        (r0, i, panel): (usize, usize, usize),
        acc: &[i32],
        ep: Option<&TileEpilogue<'_>>,
        out: &mut Out<'_>,
    ) {
        let (mr, nr, ld) = (self.uk.mr, self.uk.nr, out.ld);
        let cols = self.panel_cols(panel);
        let at = cols.start - out.col0;
        let rows = mr.min(out.c.len() / ld - i);
        let a = (&qa.scale[r0 + i..], &qa.zero[r0 + i..]);
        let b = (&qb.colsum[cols.clone()], &qb.scale[cols.clone()]);
        let c = &mut out.c[i * ld..(i + rows) * ld];
        ukernel::dequantize_fast(a, b, (acc, nr), c, (ld, at));
        if let Some(e) = ep {
            let bias = &e.bias[cols.clone()];
            for row in c.chunks_exact_mut(ld) {
                bias_act_row(&mut row[at..at + cols.len()], bias, e.act);
            }
        }
    }
}

/// Rows per block of a task's `rows` (depth `kp`, padded; tiles of `mr` rows) on a core with
/// `l2` bytes of L2: all of them (whole tiles) while their codes fit L2, which they then
/// stay in while every column panel passes; otherwise as many whole tiles as fill half of
/// it (at least one), each block taking every panel in turn — a task's codes beyond L2 would
/// come back from L3 once per panel. Blocks cost one more pass over B each, so they are not
/// smaller than they need to be (measured on Zen 3, alternating runs: 256-row blocks where a
/// task's 384 KiB of codes fit its L2, `gemm_bias:1024x2304x768:i8` on 2 threads, ran at
/// 0.8× the speed of one block; `gemm:1024x1024x1024:i8` on one thread, 1 MiB of codes, ran
/// 1.0–1.2× faster in blocks of half the L2).
fn row_block(kp: usize, mr: usize, rows: usize, l2: usize) -> usize {
    let all = rows.div_ceil(mr).max(1) * mr;
    if rows * kp <= l2 {
        return all;
    }
    ((l2 / 2 / (kp.max(1) * mr)).max(1) * mr).min(all)
}

/// L2 bytes per core as the fingerprint reports them (512 KiB where it reports none).
fn l2_bytes() -> usize {
    match HardwareFingerprint::current().l2_bytes {
        0 => 512 * 1024,
        b => b,
    }
}

/// Where a task's rows go: `c` with rows `ld` apart, holding the columns from `col0` on.
struct Out<'a> {
    c: &'a mut [f32],
    ld: usize,
    col0: usize,
}

/// How the work is split across tasks (the `par` knob).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Split {
    None,
    M,
    N,
}

/// The last row tile's codes padded to `mr` rows with zeros, when `rows` is not a multiple
/// of `mr` (the kernels always compute whole tiles).
fn edge_tile(qa: &QuantA, rows: usize, mr: usize) -> Option<Vec<u8>> {
    let live = rows % mr;
    (live != 0).then(|| {
        let kp = qa.kp;
        let first = (rows - live) * kp;
        let mut e = vec![0u8; mr * kp];
        e[..live * kp].copy_from_slice(&qa.codes[first..first + live * kp]);
        e
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::Problem;

    #[test]
    fn every_offered_config_matches_the_reference_on_awkward_shapes() {
        let hw = HardwareFingerprint::current();
        for text in [
            "gemm:1x1x1:i8",
            "gemm:1x67x65:i8",
            "gemm:5x7x9:i8",
            "gemm:63x65x67:i8",
            "gemm:17x3x130:i8",
            "gemm:128x96x768:i8",
            "gemm_bias_gelu:13x67x65:i8",
            "gemm_bias_gelu_erf:13x67x65:i8",
            "gemm_bias_relu:9x33x7:i8",
            "gemm_bias:65x50x31:i8",
        ] {
            let w: Workload = text.parse().unwrap();
            let space = GemmI8.space(&w, hw);
            assert!(GemmI8.config_fits(&w, hw, &GemmI8.default_config(&w, hw)));
            let p = Problem::random(&w, 5);
            let r = p.reference();
            // The exact result depends only on how the operands are quantised: once per
            // (activation scheme, largest code).
            let mut exact = std::collections::HashMap::new();
            for c in space.iter_valid() {
                assert!(GemmI8.config_fits(&w, hw, &c));
                let exe = GemmI8.prepare(&w, &c).unwrap();
                let mut out = vec![f32::NAN; w.output_len()];
                exe.run_f32(&p.input_slices(), &mut out).unwrap();
                p.check(&out, &r).unwrap_or_else(|e| panic!("{w} {c}: {e}"));
                let uk = DotKernel::by_name(c.str("ukernel").unwrap()).unwrap();
                let key = (c.str("a_quant").unwrap().to_string(), uk.max_code);
                let want = exact
                    .entry(key)
                    .or_insert_with(|| integer_reference(&p, &c, uk));
                assert!(out == *want, "{w} {c}: not the exact integer product");
            }
        }
    }

    /// A row of A holding NaN or ±∞ gives a NaN row of C (the f32 product is not finite
    /// there either); the other rows are exactly those of the same A without it.
    #[test]
    fn non_finite_activations_give_nan_rows_and_leave_the_others_alone() {
        let hw = HardwareFingerprint::current();
        let w: Workload = "gemm_bias:5x20x37:i8".parse().unwrap();
        let p = Problem::random(&w, 8);
        for a_quant in ["u8", "s8"] {
            let mut c = GemmI8.default_config(&w, hw);
            c.set("a_quant", a_quant);
            let exe = GemmI8.build(&w, &c).unwrap();
            let mut clean = p.output();
            exe.run_f32(&p.input_slices(), &mut clean).unwrap();
            let mut bad = p.clone();
            bad.inputs[0][37 + 3] = f32::NAN; // row 1
            bad.inputs[0][3 * 37 + 36] = f32::INFINITY; // row 3
            bad.inputs[0][4 * 37] = f32::NEG_INFINITY; // row 4
            let mut out = p.output();
            exe.run_f32(&bad.input_slices(), &mut out).unwrap();
            for (r, (got, want)) in out.chunks(20).zip(clean.chunks(20)).enumerate() {
                if [1, 3, 4].contains(&r) {
                    assert!(got.iter().all(|x| x.is_nan()), "{a_quant} row {r}: {got:?}");
                } else {
                    assert_eq!(got, want, "{a_quant} row {r}");
                }
            }
        }
    }

    /// A column of B (the weights) holding NaN or ±∞ gives a NaN column of C, as the f32
    /// product would (its codes would otherwise be clamped into finite values); the other
    /// columns are exactly those of the same B without it.
    #[test]
    fn non_finite_weights_give_nan_columns_and_leave_the_others_alone() {
        let hw = HardwareFingerprint::current();
        let w: Workload = "gemm_bias:5x20x37:i8".parse().unwrap();
        let p = Problem::random(&w, 9);
        let exe = GemmI8.build(&w, &GemmI8.default_config(&w, hw)).unwrap();
        let mut clean = p.output();
        exe.run_f32(&p.input_slices(), &mut clean).unwrap();
        let mut bad = p.clone();
        bad.inputs[1][4 * 20 + 2] = f32::NAN; // column 2
        bad.inputs[1][36 * 20 + 7] = f32::INFINITY; // column 7
        bad.inputs[1][19] = f32::NEG_INFINITY; // column 19
        let mut out = p.output();
        exe.run_f32(&bad.input_slices(), &mut out).unwrap();
        for (i, (got, want)) in out.iter().zip(&clean).enumerate() {
            if [2, 7, 19].contains(&(i % 20)) {
                assert!(got.is_nan(), "C[{}][{}] = {got}", i / 20, i % 20);
            } else {
                assert_eq!(got, want, "C[{}][{}]", i / 20, i % 20);
            }
        }
    }

    /// On a core with a small L2 (set here, so that the test means the same everywhere) a
    /// task's rows span several row blocks ([`row_block`]), the last one ending in a partial
    /// tile: every micro-kernel, serial and split by rows, still gives the exact integer
    /// product.
    #[test]
    fn row_blocks_with_an_edge_tile_are_exact() {
        let w: Workload = "gemm_bias_gelu_erf:133x21x301:i8".parse().unwrap();
        let hw = HardwareFingerprint::current();
        let p = Problem::random(&w, 8);
        let l2 = 8 * 1024;
        for uk in offered(hw) {
            let kp = quant::padded_k(301);
            let block = row_block(kp, uk.mr, 66, l2);
            assert!(
                block < 66 && block.is_multiple_of(uk.mr),
                "{}: {block}",
                uk.name
            );
            for (par, threads) in [("none", 1usize), ("m", 2)] {
                let mut c = GemmI8.default_config(&w, hw);
                c.set("ukernel", uk.name);
                c.set("par", par);
                c.set("threads", threads);
                let mut exe = build_with(&w, &c, uk).unwrap();
                exe.l2 = l2;
                let mut out = vec![f32::NAN; w.output_len()];
                exe.run_f32(&p.input_slices(), &mut out).unwrap();
                assert!(out == integer_reference(&p, &c, uk), "{c}");
            }
        }
        assert_eq!(
            row_block(768, 4, 128, 512 * 1024),
            128,
            "fits L2: one block"
        );
        assert_eq!(row_block(1024, 4, 1024, 512 * 1024), 256);
        assert_eq!(row_block(1 << 20, 4, 9, 1024), 4, "at least one tile");
    }

    /// Many int8 GEMMs at once on rayon's workers (as a serving process, or an encoder layer
    /// entered into the pool, runs them): a worker waiting inside one call's parallel region
    /// runs another call's tasks, so per-thread buffers must not stay borrowed across it.
    #[test]
    fn concurrent_calls_on_the_workers_give_the_same_bits() {
        let w: Workload = "gemm_bias_gelu:64x512x1024:i8".parse().unwrap();
        let hw = HardwareFingerprint::current();
        let p = Problem::random(&w, 4);
        let exes: Vec<_> = ["m", "n"]
            .iter()
            .map(|par| {
                let mut c = GemmI8.default_config(&w, hw);
                c.set("par", *par);
                c.set("threads", 2usize);
                GemmI8.build(&w, &c).unwrap()
            })
            .collect();
        let mut want = vec![0.0; w.output_len()];
        exes[0].run_f32(&p.input_slices(), &mut want).unwrap();
        rayon::scope(|s| {
            for t in 0..16 {
                let (exe, p, want) = (&exes[t % 2], &p, &want);
                s.spawn(move |_| {
                    for _ in 0..8 {
                        let mut out = vec![f32::NAN; w.output_len()];
                        exe.run_f32(&p.input_slices(), &mut out).unwrap();
                        assert!(out == *want, "task {t}: not the serial result");
                    }
                });
            }
        });
    }

    #[test]
    fn a_prepared_weight_gives_the_same_bits_and_wrong_ones_are_refused() {
        let hw = HardwareFingerprint::current();
        for text in ["gemm:7x67x65:i8", "gemm_bias_gelu:13x40x33:i8"] {
            let w: Workload = text.parse().unwrap();
            let c = GemmI8.default_config(&w, hw);
            let exe = GemmI8.prepare(&w, &c).unwrap();
            let p = Problem::random(&w, 9);
            let ins = p.input_slices();
            let mut want = vec![0f32; w.output_len()];
            exe.run_f32(&ins, &mut want).unwrap();
            let weight = exe.prepare_weight(ins[1]).unwrap();
            assert_eq!(Some(weight.format()), exe.weight_format());
            let rest: Vec<&[f32]> = ins
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != 1)
                .map(|(_, x)| *x)
                .collect();
            let mut got = vec![f32::NAN; w.output_len()];
            exe.run_prepared(&rest, &weight, &mut got).unwrap();
            assert!(got == want, "{w}");
            // Wrong operands are errors naming them, never a panic.
            let e = exe.run_prepared(&rest[..1], &weight, &mut got);
            if rest.len() > 1 {
                assert!(e.unwrap_err().to_string().contains("without B"));
            }
            let short = &rest[0][1..];
            let mut bad = rest.clone();
            bad[0] = short;
            let e = exe.run_prepared(&bad, &weight, &mut got).unwrap_err();
            assert!(e.to_string().contains("operand 'a'"), "{e}");
            assert!(exe.prepare_weight(&ins[1][1..]).is_err());
            // A weight of another shape is refused.
            let other: Workload = "gemm:7x66x65:i8".parse().unwrap();
            let other_exe = GemmI8
                .prepare(&other, &GemmI8.default_config(&other, hw))
                .unwrap();
            let ow = other_exe.prepare_weight(&vec![0.5; 66 * 65]).unwrap();
            assert!(exe.run_prepared(&rest, &ow, &mut got).is_err());
        }
    }

    /// The AMX kernel bodies on the emulated tile unit, through the whole driver (row and
    /// column edges, depth blocks, K remainders, both splits, bias + activation), on every
    /// CPU: the outputs equal the exact integer product's to the bit, extreme codes too.
    #[test]
    fn emulated_amx_kernels_through_the_driver_equal_the_integer_product() {
        for text in [
            "gemm:1x1x1:i8",
            "gemm:1x67x65:i8",
            "gemm:63x65x67:i8",
            "gemm:67x63x130:i8",
            "gemm:65x97x64:i8",
            "gemm:31x17x251:i8",
            "gemm_bias_gelu:13x67x200:i8",
        ] {
            let w: Workload = text.parse().unwrap();
            let (m, n, k) = w.gemm_dims().unwrap();
            for extreme in [false, true] {
                let mut p = Problem::random(&w, 11);
                if extreme {
                    // u8 codes 255 everywhere (zero point 0); s8 weights ±127 by column.
                    p.inputs[0] = vec![1.0; m * k];
                    p.inputs[1] = (0..k * n)
                        .map(|i| if i % n % 2 == 0 { 1.0 } else { -1.0 })
                        .collect();
                }
                for uk in amx::EMULATED {
                    for (a_quant, kc, par) in
                        [("u8", 128usize, "none"), ("s8", 256, "m"), ("u8", 64, "n")]
                    {
                        let mut c = Config::default();
                        c.set("ukernel", uk.name);
                        c.set("a_quant", a_quant);
                        c.set("kc", kc);
                        c.set("par", par);
                        c.set("threads", if par == "none" { 1usize } else { 2 });
                        let exe = build_with(&w, &c, uk).unwrap();
                        let mut out = vec![f32::NAN; w.output_len()];
                        exe.run_f32(&p.input_slices(), &mut out).unwrap();
                        let want = integer_reference(&p, &c, uk);
                        assert!(
                            out == want,
                            "{w} {c} extreme {extreme}: not the exact product"
                        );
                        if extreme && a_quant == "u8" {
                            let qa = quantize(&p, &c, uk);
                            assert!(qa.codes[..k].iter().all(|&x| x == 255), "{w}: codes 255");
                        }
                    }
                }
            }
        }
    }

    /// A's codes as configuration `c` on kernel `uk` quantises them.
    fn quantize(p: &Problem, c: &Config, uk: &DotKernel) -> QuantA {
        let k = p.workload.gemm_dims().unwrap().2;
        let scheme = if c.str("a_quant") == Some("s8") {
            AQuant::S8
        } else {
            AQuant::U8
        };
        let mut qa = QuantA::default();
        quant::quantize_rows(&p.inputs[0], k, scheme, uk.max_code, &mut qa);
        qa
    }

    /// The output computed from the exact integer product of the operands quantised as `c`
    /// quantises them for kernel `uk` (i64 sums, no SIMD), then the same bias + activation:
    /// the kernels' i32 products must equal it exactly, so the outputs agree to the bit.
    fn integer_reference(p: &Problem, c: &Config, uk: &DotKernel) -> Vec<f32> {
        let (m, n, k) = p.workload.gemm_dims().unwrap();
        let qa = quantize(p, c, uk);
        let qb = QuantB::new(&p.inputs[1], k, n, uk.nr).unwrap();
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let dot: i64 = (0..k)
                    .map(|l| qa.codes[i * qa.kp + l] as i64 * qb.code(l, j) as i64)
                    .sum();
                let q = dot - qa.zero[i] as i64 * qb.colsum[j] as i64;
                out[i * n + j] = qa.scale[i] * qb.scale[j] * q as i32 as f32;
            }
            if let Workload::GemmBiasAct { act, .. } = p.workload {
                bias_act_row(&mut out[i * n..(i + 1) * n], &p.inputs[2], act);
            }
        }
        out
    }
}
