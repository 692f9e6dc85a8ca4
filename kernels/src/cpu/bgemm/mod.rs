//! bf16 GEMM on the CPU (`gemm:MxNxK:bf16`, `gemm_bias[_relu|_gelu]:MxNxK:bf16`): bf16
//! operands, f32 accumulation, f32 output — the `gemm_bf16` family.
//!
//! ```
//! use kernels::{default_for, HardwareFingerprint, Problem, Workload};
//!
//! let w: Workload = "gemm:33x70x65:bf16".parse()?;
//! let (kernel, config) = default_for(&w, HardwareFingerprint::current())?;
//! assert_eq!(kernel.name(), "gemm_bf16");
//! let exe = kernel.prepare(&w, &config)?;
//! let p = Problem::random(&w, 3);
//! let mut c = p.output();
//! exe.run_f32(&p.input_slices(), &mut c)?;  // A, B in f32; C in f32
//! p.check(&c, &p.reference())?;             // within the bf16 rounding bound of Problem
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Inputs and output are f32, as for the f32 GEMM. B (the weight) is converted to bf16 once
//! per weight buffer (round to nearest even, NaN kept) and packed in panels of NR columns
//! ([`convert::Bf16B`]) in the micro-kernel's [`layout`]: half the bytes of f32, which is
//! what bounds skinny and GEMV-like shapes. A is converted as it is packed per block, so the
//! products are those of bf16 operands, accumulated in f32.
//!
//! Micro-kernels ([`ukernel`]), one `ukernel` knob value each (`<isa>_<MR>x<NR>`):
//!
//! | values | needs | how |
//! |---|---|---|
//! | `amx_bf16_*` (32×32, 16×64, 64×16, 8×64) | AMX-BF16, tile state granted by the OS | `tdpbf16ps` on four 16×16 f32 accumulator tiles (2×2, 1×4, 4×1; 8-row tiles for 8×64), B in the same depth pairs (a pair row of 16 columns is a 64-byte B-tile row), A packed in rows of bf16 pairs, 32 depths per tile step |
//! | `avx512bf16_*` (12×32, 4×64, 2×64, 1×128, 1×64) | AVX512_BF16 | `vdpbf16ps`: B in depth pairs, A packed as bf16 pairs and broadcast, 2 depths × 16 columns per instruction |
//! | `avx512_*` (same shapes) | AVX-512F | bf16 widened to f32 in zmm registers, A as f32 rounded to bf16 values, f32 FMAs |
//! | `avx2_*` (6×16, 4×16, 2×32, 1×64, 1×32) | AVX2 + FMA | the same in ymm registers |
//! | `portable_*` | — | the same over 8-lane arrays |
//!
//! A space offers its fingerprint's ISA level and AVX2 under AVX-512; the `avx512bf16_*`
//! values only where the fingerprint has `avx512bf16` (and `avx512bw`), the `amx_bf16_*`
//! ones only where it has `amx_bf16` (reported only where Linux granted the tile state);
//! each kernel also checks the CPU (and OS) when it is built. The analytic default takes the
//! best tier offered: `vdpbf16ps` on AVX512_BF16, AVX-512F widening on other AVX-512
//! machines, AVX2 below; never AMX (unmeasured: tuning may pick it). The AVX-512 and AMX
//! kernels are tested on every CPU through emulated twins (same bodies and tile shapes over
//! a plain-Rust `vdpbf16ps` that follows the Intel SDM, or over the emulated tile unit
//! [`crate::cpu::amx::Emulated`]: [`ukernel`]), and on the real instructions only where the
//! CPU (and OS) has them: the AVX-512 and `vdpbf16ps` ones ran on an AMD Zen 4, the AMX
//! ones never on a real tile unit.
//!
//! AMX depth: a K block's pairs are stepped 16 pairs (32 bf16) per tile; a remainder (K
//! not a multiple of 32, odd K padded with a zero) is copied zero-padded into staging tiles
//! on the stack. The accumulators are loaded from C (later depth blocks) or zeroed, stored to
//! C, then the bias and activation run over the stored rows.
//!
//! Knobs: `ukernel` (tile shape and ISA), `mc` (rows of A per packed block, rounded up to
//! the tile), `kc` (depth per block; rounded up to whole pairs for `vdpbf16ps`), `par`
//! (`none`; `m`: row blocks on `threads` tasks; `n`: column panels on `threads` tasks, for
//! few rows) and `threads`.

pub mod convert;
mod driver;
pub mod layout;
pub mod ukernel;

use crate::cpu::knobs::{
    cap_rule, first_at_least, int_knob, int_listed, invalid, par_threads_listed,
    serial_iff_one_thread, snap, str_knob, str_listed, thread_values, unsupported,
};
use crate::dtype::DType;
use crate::error::Result;
use crate::hardware::HardwareFingerprint;
use crate::kernel::{Executable, Kernel};
use crate::space::{Config, Space};
use crate::workload::Workload;

use driver::{BGemm, Split};
use ukernel::{Bf16Kernel, KERNELS};

/// The bf16 GEMM family.
pub struct GemmBf16;

const NAME: &str = "gemm_bf16";

/// Values of the `par` knob.
const PAR_VALUES: &[&str] = &["none", "m", "n"];

/// Values of the `mc` knob (rounded up to a multiple of MR when built); capped by M.
const MC_VALUES: &[usize] = &[24, 48, 96, 144, 192, 288, 384];

/// Values of the `kc` knob: depth per block; capped by K.
const KC_VALUES: &[usize] = &[64, 128, 192, 256, 384, 512, 1024, 4096];

/// Below this many multiply-adds the default stays single-threaded. 2²¹ while a parallel
/// call handed the work to workers that sleep between calls (a GPT-2 decoding step through
/// the drop-in did not gain from 2¹⁹ then); with [`crate::cpu::pool::for_each`] the split
/// pays from 2²⁰: measured on the 2-vCPU Zen 4 VM, 2 threads against one, calls after the
/// caller's own work (`call_gaps`, `bench_results/8b4b41305960a7a6/parallel-defaults-*.md`):
/// 1×1024×1024 1.4–1.7×, 1×1536×768 1.45–1.65×; below it 1×768×768 gained 1.3–1.6× but
/// 2×512×512 and 8×256×256 lost in one run of two (0.7–0.8×).
const PARALLEL_MIN_MACS: f64 = (1u64 << 20) as f64;

/// The micro-kernels offered on `hw`: those of its ISA level (AVX2 ones on AVX-512 too),
/// the `vdpbf16ps` ones only where its flags have AVX512_BF16.
fn offered(hw: &HardwareFingerprint) -> Vec<&'static Bf16Kernel> {
    KERNELS.iter().filter(|k| k.offered_on(hw)).collect()
}

fn dims(w: &Workload) -> (usize, usize, usize) {
    w.gemm_dims().unwrap_or((1, 1, 1))
}

impl Kernel for GemmBf16 {
    fn name(&self) -> &'static str {
        NAME
    }

    fn version(&self) -> u32 {
        1
    }

    fn dtypes(&self) -> &'static [DType] {
        &[DType::Bf16]
    }

    fn supports(&self, w: &Workload) -> bool {
        matches!(w, Workload::Gemm { .. } | Workload::GemmBiasAct { .. })
            && w.dtype() == DType::Bf16
    }

    fn space(&self, w: &Workload, hw: &HardwareFingerprint) -> Space {
        let ukernels: Vec<&str> = offered(hw).iter().map(|k| k.name).collect();
        let par: &[&str] = if hw.cores > 1 { PAR_VALUES } else { &["none"] };
        let (m, _, k) = dims(w);
        Space::new()
            .knob("ukernel", ukernels)
            .knob("mc", MC_VALUES.to_vec())
            .knob("kc", KC_VALUES.to_vec())
            .rule("mc at most the rows", cap_rule("mc", MC_VALUES, m))
            .rule("kc at most the depth", cap_rule("kc", KC_VALUES, k))
            .knob("par", par.to_vec())
            .knob("threads", thread_values(hw))
            .rule("serial iff one thread", serial_iff_one_thread)
    }

    fn config_fits(&self, w: &Workload, hw: &HardwareFingerprint, c: &Config) -> bool {
        let ukernels: Vec<&str> = offered(hw).iter().map(|k| k.name).collect();
        let (m, _, k) = dims(w);
        c.0.len() == 5
            && str_listed(c, "ukernel", &ukernels)
            && int_listed(c, "mc", MC_VALUES)
            && int_listed(c, "kc", KC_VALUES)
            && cap_rule("mc", MC_VALUES, m)(c)
            && cap_rule("kc", KC_VALUES, k)(c)
            && par_threads_listed(c, hw, PAR_VALUES)
            && serial_iff_one_thread(c)
    }

    fn default_config(&self, w: &Workload, hw: &HardwareFingerprint) -> Config {
        let (m, n, k) = dims(w);
        let big = hw.cores > 1 && (m * n * k) as f64 >= PARALLEL_MIN_MACS;
        let uk = default_ukernel(&offered(hw), (m, n), if big { hw.cores } else { 1 });
        let f = uk.a_bytes_per_depth();
        // kc: an A micro-panel (MR×kc f32 or bf16) and a B one (kc×NR bf16) fill ~3/4 of L1.
        // For one or two rows nothing in B is reused: the whole depth at once (C stored once).
        // So too for the `vdpbf16ps` kernels: measured on a Zen 4, the whole depth (B's panel
        // streamed from L2) beat the L1 rule's kc = 192 by 1.27× at 1024³ on one thread and
        // was the best of every kc on the BERT shapes at 2 threads.
        let kc = if m <= 2 || (uk.bf16 && !uk.amx) {
            first_at_least(KC_VALUES, k).unwrap_or(KC_VALUES[KC_VALUES.len() - 1])
        } else {
            snap(KC_VALUES, hw.l1d_bytes * 3 / 4 / (uk.mr * f + uk.nr * 2), k)
        };
        // mc: the packed A block (mc×kc values) fills ~half of L2.
        let mc = snap(MC_VALUES, hw.l2_bytes / 2 / (kc.min(k) * f), m);
        // Rows when there are enough row tiles for every thread, else column panels.
        let par = match () {
            _ if big && m >= 2 * uk.mr * hw.cores => "m",
            _ if big && n >= 2 * uk.nr * hw.cores => "n",
            _ => "none",
        };
        let threads = if par == "none" { 1 } else { hw.cores };
        let mut c = Config::default();
        c.set("ukernel", uk.name);
        c.set("mc", mc);
        c.set("kc", kc);
        c.set("par", par);
        c.set("threads", threads);
        c
    }

    fn build(&self, w: &Workload, c: &Config) -> Result<Box<dyn Executable>> {
        if !self.supports(w) {
            return Err(unsupported(NAME, w));
        }
        let name = str_knob(NAME, c, "ukernel")?;
        let uk = Bf16Kernel::by_name(name)
            .ok_or_else(|| invalid(NAME, c, format!("ukernel '{name}' does not run here")))?;
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
        let (mc, kc) = (int_knob(NAME, c, "mc")?, int_knob(NAME, c, "kc")?);
        if mc == 0 || kc == 0 {
            return Err(invalid(NAME, c, "mc and kc must be positive".into()));
        }
        let act = match w {
            Workload::GemmBiasAct { act, .. } => Some(*act),
            _ => None,
        };
        Ok(Box::new(BGemm::new(
            *w,
            dims(w),
            uk,
            (mc, kc),
            act,
            split,
            threads,
        )))
    }
}

/// The default tile for `m × n` over `threads` row shares, among the best tier's kernels
/// (ISA level, then `vdpbf16ps` above widening): the fewest instructions per depth step in
/// one thread's share of C — per tile `MR·NV` multiply-adds, `MR` broadcasts of A and `NV`
/// loads of B (`NV` vectors across the tile), with padded rows and columns counted as work
/// and the row tiles split over the threads — then the first listed. So on AVX2 6×16 for
/// many rows, 4×16 at M = 7 or 8 (measured on a loaded Zen 3 at 8×768×768: 1.7× faster
/// than 6×16, whose second tile is mostly padding), and one row `1x64`, whose 8
/// accumulators keep both FMA pipes busy where `1x32`'s 4 wait on their latency. On
/// AVX512_BF16 4×64 for most shapes: measured on a Zen 4 (2 threads, 128×768×768: 1.4×
/// 12×32, whose 11 row tiles split 6 / 5 with a padded last one; one thread, 1024³: 1.07×),
/// and one row `1x128`. The AMX kernels are never a default: they have not been measured;
/// tuning may pick them where they are offered.
fn default_ukernel(
    offer: &[&'static Bf16Kernel],
    (m, n): (usize, usize),
    threads: usize,
) -> &'static Bf16Kernel {
    let tier = |k: &Bf16Kernel| (k.isa, k.bf16);
    let best = offer.iter().filter(|k| !k.amx).map(|k| tier(k)).max();
    offer
        .iter()
        .enumerate()
        .filter(|(_, k)| !k.amx && Some(tier(k)) == best)
        .min_by_key(|(i, k)| {
            let nv = k.nr / k.isa.f32_lanes();
            let tiles = m.div_ceil(k.mr).div_ceil(threads) * n.div_ceil(k.nr);
            (tiles * (k.mr * nv + k.mr + nv), *i)
        })
        .map(|(_, k)| *k)
        .unwrap_or(&KERNELS[KERNELS.len() - 1])
}

#[cfg(test)]
mod tests;
