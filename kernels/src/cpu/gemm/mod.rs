//! f32 row-major GEMM (`C = A·B`): two kernel families, their search spaces and defaults.
//!
//! - `gemm_packed` ([`packed`]): BLIS-style blocking (`mc`, `kc`, `nc`), A and B packed into
//!   aligned micro-panels, an `MR × NR` register-blocked micro-kernel, threads splitting M or N.
//! - `gemm_direct` ([`direct`]): no packing; `R × V`-vector register tiles read A and B in
//!   place, for small M (≤ 32) where packing B would cost as much as the arithmetic.
//!
//! Their knobs, named once and typed, are in [`params`]: the families build from it, and the
//! other crates read and adjust GEMM configs through it.
//!
//! Micro-kernels live in [`ukernel`] (the only unsafe code, with [`view`] and [`pack`]); which
//! ones are offered depends on [`Isa::detect`]. Default configs come from the cache sizes in
//! the [`HardwareFingerprint`].

pub mod direct;
pub mod epilogue;
pub mod pack;
pub mod packed;
pub mod params;
pub mod ukernel;
pub mod view;

use crate::cpu::knobs::{
    cap_rule, int_listed, invalid, par_threads_listed, serial_iff_one_thread, snap, str_listed,
    thread_values, unsupported,
};
use crate::cpu::Isa;
use crate::dtype::DType;
use crate::error::Result;
use crate::hardware::HardwareFingerprint;
use crate::kernel::{Executable, Kernel};
use crate::space::{Config, Space, Value};
use crate::workload::Workload;

use direct::DirectGemm;
use packed::PackedGemm;
pub use params::Par;
use params::{knob, ALayout, BLayout, DirectParams, PackedParams, Split, PAR_VALUES};

/// The BLIS-style packed family.
pub struct Packed;

/// The direct (unpacked) family for small M.
pub struct Direct;

/// Every GEMM family, in priority order.
pub static FAMILIES: &[&dyn Kernel] = &[&Packed, &Direct];

/// Largest M the direct family supports.
pub const DIRECT_MAX_M: usize = 32;

/// Up to this M, [`default_family`] picks the direct family.
pub const DIRECT_DEFAULT_MAX_M: usize = 8;

/// Values of the packed `mc` knob (rounded up to a multiple of MR when built).
pub const MC_VALUES: &[usize] = &[24, 48, 96, 144, 192, 256, 384];
/// Values of the packed `kc` knob.
pub const KC_VALUES: &[usize] = &[64, 128, 192, 256, 384, 512];
/// Values of the packed `nc` knob (rounded up to a multiple of NR when built).
pub const NC_VALUES: &[usize] = &[512, 1024, 2048, 4096, 8192];
/// Values of the packed `a_layout` knob: A packed into micro-panels, or read in place.
pub const A_LAYOUT_VALUES: &[&str] = &[ALayout::Packed.name(), ALayout::InPlace.name()];
/// Values of the plain packed family's `b_layout` knob: B packed during the call, or read in
/// place.
pub const B_LAYOUT_VALUES: &[&str] = &[BLayout::RowMajor.name(), BLayout::InPlace.name()];
/// Values of the direct `kc` knob; 0 means the whole of K.
pub const DIRECT_KC_VALUES: &[usize] = &[0, 2, 4, 8, 16, 32, 64, 128, 256, 512];

/// Below this many flops (2·M·N·K, 2²⁰ multiply-adds) the packed defaults stay
/// single-threaded: a fork-join would cost more than it saves. 2·256³ while a parallel call
/// handed the work to sleeping workers; with [`crate::cpu::pool::for_each`] the split pays
/// well below: measured on the 2-vCPU Zen 4 VM, 2 threads against one, calls after the
/// caller's own work (`call_gaps`, `bench_results/8b4b41305960a7a6/parallel-defaults-*.md`):
/// 128×256×256 1.6–1.9×, 32×512×512 1.6×, 64×256×256 1.4–1.7×; at 64³ one run in two
/// gained 1.35× and the other lost 0.95×, so the bound stays above that.
const PARALLEL_MIN_FLOPS: f64 = 2.0 * (1u64 << 20) as f64;

/// From this many multiply-adds the direct family's default splits the columns over the
/// cores even below [`PARALLEL_MIN_FLOPS`]: a few-row GEMM is bound by streaming B, which two
/// cores do faster than one. Measured on the Zen 4 VM, 2 threads, consecutive calls, with the
/// waking hand-over (which made it pay from 2¹⁹, down from 2²¹; [`crate::cpu::pool::for_each`]
/// has since replaced it):
/// 1×2304×768 1.7×, 1×768×768 and 2×512×512 1.2×, 4×512×256 1.06×, 8×256×256 0.98×; below
/// it 1×512×512 and 1×384×384 lose (0.6–0.85×).
const DIRECT_PARALLEL_MIN_MACS: f64 = (1u64 << 19) as f64;

/// The fallback for `w`: the direct family for small M, the packed family otherwise. The
/// config is valid (passes `prepare`) for every shape.
pub fn default_family(w: &Workload) -> &'static dyn Kernel {
    let (m, _, _) = gemm_dims(w);
    if m <= DIRECT_DEFAULT_MAX_M {
        &Direct
    } else {
        &Packed
    }
}

/// `(m, n, k)` of a GEMM-shaped workload; `(1, 1, 1)` for any other (the families only
/// describe spaces and defaults for workloads they support, and `build` refuses the rest).
pub(crate) fn gemm_dims(w: &Workload) -> (usize, usize, usize) {
    w.gemm_dims().unwrap_or((1, 1, 1))
}

fn par_values(hw: &HardwareFingerprint) -> Vec<&'static str> {
    if hw.cores > 1 {
        PAR_VALUES.to_vec()
    } else {
        vec![Split::None.name()]
    }
}

/// The knobs and rules of [`Packed`]'s space for `w` on `hw`, checked directly (extra knobs
/// are the caller's to count): what [`Kernel::config_fits`] of the packed families tests.
pub(crate) fn packed_knobs_fit(w: &Workload, hw: &HardwareFingerprint, c: &Config) -> bool {
    let (m, n, k) = gemm_dims(w);
    c.str(knob::UKERNEL).is_some_and(|u| {
        let offered = ukernel::packed_offered(Isa::of(hw));
        offered.iter().any(|o| o.name == u)
    }) && int_listed(c, knob::MC, MC_VALUES)
        && int_listed(c, knob::KC, KC_VALUES)
        && int_listed(c, knob::NC, NC_VALUES)
        && str_listed(c, knob::A_LAYOUT, A_LAYOUT_VALUES)
        && par_threads_listed(c, hw, PAR_VALUES)
        && serial_iff_one_thread(c)
        && cap_rule(knob::MC, MC_VALUES, m)(c)
        && cap_rule(knob::KC, KC_VALUES, k)(c)
        && cap_rule(knob::NC, NC_VALUES, n)(c)
}

/// The knobs and rules of [`Direct`]'s space for `w` on `hw`, checked directly.
pub(crate) fn direct_knobs_fit(w: &Workload, hw: &HardwareFingerprint, c: &Config) -> bool {
    let (m, n, k) = gemm_dims(w);
    let offered = ukernel::direct_offered(Isa::of(hw));
    let lanes = offered[0].lanes;
    c.str(knob::UKERNEL)
        .is_some_and(|u| offered.iter().any(|o| o.name == u))
        && int_listed(c, knob::KC, DIRECT_KC_VALUES)
        && par_threads_listed(c, hw, PAR_VALUES)
        && serial_iff_one_thread(c)
        && direct_kc_rule(k)(c)
        && direct_m_split_rule(m)(c)
        && direct_n_split_rule(n, lanes)(c)
}

/// Rule of the direct family: `kc` is below K, or 0 (the whole of K).
fn direct_kc_rule(k: usize) -> impl Fn(&Config) -> bool + Send + Sync + 'static {
    move |c: &Config| c.int(knob::KC).is_some_and(|v| v == 0 || (v as usize) < k)
}

/// Rule of the direct family: an M split has a row per thread.
fn direct_m_split_rule(m: usize) -> impl Fn(&Config) -> bool + Send + Sync + 'static {
    move |c: &Config| {
        Split::of(c) != Some(Split::M) || c.int(knob::THREADS).is_some_and(|t| t as usize <= m)
    }
}

/// Rule of the direct family: an N split has a vector of `lanes` columns per thread.
fn direct_n_split_rule(n: usize, lanes: usize) -> impl Fn(&Config) -> bool + Send + Sync + 'static {
    move |c: &Config| {
        Split::of(c) != Some(Split::N)
            || c.int(knob::THREADS)
                .is_some_and(|t| t as usize * lanes <= n)
    }
}

impl Kernel for Packed {
    fn name(&self) -> &'static str {
        "gemm_packed"
    }

    /// 2: the `a_layout` knob; 3: the `b_layout` knob.
    fn version(&self) -> u32 {
        3
    }

    /// v2 packed B on every call: its configs are v3's with `b_layout = rowmajor`.
    fn upgrade(&self, from: u32, c: &Config) -> Option<Config> {
        match from {
            3 => Some(c.clone()),
            2 if c.get(knob::B_LAYOUT).is_none() => {
                let mut c = c.clone();
                BLayout::RowMajor.set_in(&mut c);
                Some(c)
            }
            _ => None,
        }
    }

    fn supports(&self, w: &Workload) -> bool {
        matches!(w, Workload::Gemm { .. }) && w.dtype() == DType::F32
    }

    fn config_fits(&self, w: &Workload, hw: &HardwareFingerprint, c: &Config) -> bool {
        c.0.len() == 8
            && str_listed(c, knob::B_LAYOUT, B_LAYOUT_VALUES)
            && packed_knobs_fit(w, hw, c)
    }

    fn space(&self, w: &Workload, hw: &HardwareFingerprint) -> Space {
        packed_space(w, hw, B_LAYOUT_VALUES)
    }

    /// The analytic default, `b_layout` included (the epilogue family starts from it).
    fn default_config(&self, w: &Workload, hw: &HardwareFingerprint) -> Config {
        let (m, n, k) = gemm_dims(w);
        let uk = default_packed_ukernel(m, hw);
        let (mr, nr) = (uk.mr, uk.nr);
        let f = std::mem::size_of::<f32>();
        // kc: an A micro-panel (MR×kc) and a B micro-panel (kc×NR) fill ~3/4 of L1; with
        // AVX-512's wide panels B streams from L2 instead and only A's panel fills ~half of
        // L1 (measured on a Zen 4: kc = 512 over the L1 rule's 128 by 1.04–1.13× on the
        // BERT shapes and 1024³, and the pick of tuning there; on an Intel AVX-512 VM tuning
        // picked 128 to 512).
        let kc = match uk.isa {
            Isa::Avx512 => snap(KC_VALUES, hw.l1d_bytes / 2 / (mr * f), k),
            _ => snap(KC_VALUES, hw.l1d_bytes * 3 / 4 / ((mr + nr) * f), k),
        };
        // mc: the packed A block (mc×kc) fills ~half of L2.
        let mc = snap(MC_VALUES, hw.l2_bytes / 2 / (kc * f), m);
        // nc: the packed B block (kc×nc) fills ~a quarter of L3 (shared with other cores).
        let nc = snap(NC_VALUES, hw.l3_bytes / 4 / (kc * f), n);
        let par = default_par(w, hw, mr, nr);
        Config::from_pairs([
            (knob::UKERNEL, Value::from(uk.name.as_str())),
            (knob::MC, mc.into()),
            (knob::KC, kc.into()),
            (knob::NC, nc.into()),
            (knob::A_LAYOUT, default_a_layout(m, kc, hw).name().into()),
            (knob::B_LAYOUT, default_b_layout(m).name().into()),
            (knob::PAR, par.split().name().into()),
            (knob::THREADS, par.threads().into()),
        ])
    }

    fn build(&self, w: &Workload, c: &Config) -> Result<Box<dyn Executable>> {
        Ok(Box::new(self.build_packed(w, c)?))
    }
}

/// The knobs and rules the packed families share, with `b_values` for `b_layout` (the
/// epilogue family adds `prepacked`).
pub(crate) fn packed_space(w: &Workload, hw: &HardwareFingerprint, b_values: &[&str]) -> Space {
    let (m, n, k) = gemm_dims(w);
    let names: Vec<&str> = ukernel::packed_offered(Isa::of(hw))
        .iter()
        .map(|u| u.name.as_str())
        .collect();
    Space::new()
        .knob(knob::UKERNEL, names)
        .knob(knob::MC, MC_VALUES.iter().copied())
        .knob(knob::KC, KC_VALUES.iter().copied())
        .knob(knob::NC, NC_VALUES.iter().copied())
        .knob(knob::A_LAYOUT, A_LAYOUT_VALUES.iter().copied())
        .knob(knob::B_LAYOUT, b_values.iter().copied())
        .knob(knob::PAR, par_values(hw))
        .knob(knob::THREADS, thread_values(hw))
        .rule("serial_iff_one_thread", serial_iff_one_thread)
        .rule("mc_not_beyond_m", cap_rule(knob::MC, MC_VALUES, m))
        .rule("kc_not_beyond_k", cap_rule(knob::KC, KC_VALUES, k))
        .rule("nc_not_beyond_n", cap_rule(knob::NC, NC_VALUES, n))
}

impl Packed {
    /// [`Kernel::build`], returning the concrete driver (the epilogue and attention
    /// families build on it).
    pub fn build_packed(&self, w: &Workload, c: &Config) -> Result<PackedGemm> {
        let Workload::Gemm { m, n, k, .. } = *w else {
            return Err(unsupported(self.name(), w));
        };
        let name = self.name();
        let p = PackedParams::try_from(c).map_err(|reason| invalid(name, c, reason))?;
        let uk = ukernel::packed(&p.ukernel.to_string())
            .ok_or_else(|| invalid(name, c, params::unsupported_ukernel(p.ukernel)))?;
        Ok(PackedGemm::new(
            (m, n, k),
            uk,
            p.mc,
            p.kc,
            p.nc,
            p.par,
            (
                p.a_layout == ALayout::Packed,
                p.b_layout == BLayout::InPlace,
            ),
        ))
    }
}

/// The default `a_layout`: A read in place when all of its rows for one depth block
/// (`m × kc`) fit in half of L1d, so the row tiles stay in L1 without the copy (measured on
/// Zen 3: +12–28% at 64³); packed otherwise (in place lost 6% at 256³, 13% at 1024³ and,
/// on a loaded machine, 5–7% on the M = 128 BERT shapes: strided rows cost more than the
/// copy once they spill out of L1).
fn default_a_layout(m: usize, kc: usize, hw: &HardwareFingerprint) -> ALayout {
    if m * kc * std::mem::size_of::<f32>() <= hw.l1d_bytes / 2 {
        ALayout::InPlace
    } else {
        ALayout::Packed
    }
}

/// The default `b_layout`: B read in place up to 512 rows of A, packed during the call
/// beyond. Packing costs a pass over K×N that only M/MR row tiles share; reading in place
/// costs strided panel rows, which alias in the caches when N is a large power of two.
/// Measured on a Zen 4 (A/B against the packed default, 41 alternating pairs): in place
/// 1.01–1.44× on one thread up to M = 256 (1.44× at 32×3072×768, 1.06× at 128×768×768),
/// 1.04–1.68× on two (1.2× on the M = 128 BERT shapes); even at 512×768×768 (0.99×, 1.04×);
/// behind at 1024³ (0.95×, 0.98×).
pub fn default_b_layout(m: usize) -> BLayout {
    if m <= 512 {
        BLayout::InPlace
    } else {
        BLayout::RowMajor
    }
}

/// The packed micro-kernel for `m` rows: the best ISA's first (largest) shape once M spans
/// several of its row tiles (a partial last row tile runs a direct kernel of exactly its rows,
/// so it costs little; measured on Zen 3: 6×16 +2–4% over 4×16 at M = 128); below 64 rows
/// the shape that pads M the least (ties: listed first).
fn default_packed_ukernel(m: usize, hw: &HardwareFingerprint) -> &'static ukernel::PackedUkernel {
    let offered = ukernel::packed_offered(Isa::of(hw));
    let best_isa = offered.iter().map(|u| u.isa).max().unwrap_or(Isa::Portable);
    let mut same_isa = offered.iter().copied().filter(|u| u.isa == best_isa);
    if m >= 64 {
        return same_isa.next().expect("at least one packed micro-kernel");
    }
    same_isa
        .enumerate()
        .min_by_key(|(i, u)| (m.div_ceil(u.mr) * u.mr, *i))
        .map(|(_, u)| u)
        .expect("at least one packed micro-kernel")
}

/// Threads for the defaults: all cores for big problems, split along the dimension with
/// more register tiles.
fn default_par(w: &Workload, hw: &HardwareFingerprint, mr: usize, nr: usize) -> Par {
    let (m, n, _) = gemm_dims(w);
    let cores = hw.cores.max(1);
    if cores == 1 || w.flops() < PARALLEL_MIN_FLOPS {
        return Par::None;
    }
    if m.div_ceil(mr) >= 2 * cores && m.div_ceil(mr) >= n.div_ceil(nr) / 2 {
        Par::M(cores)
    } else {
        Par::N(cores)
    }
}

impl Kernel for Direct {
    fn name(&self) -> &'static str {
        "gemm_direct"
    }

    fn version(&self) -> u32 {
        1
    }

    fn supports(&self, w: &Workload) -> bool {
        matches!(*w, Workload::Gemm { m, dtype: DType::F32, .. } if m <= DIRECT_MAX_M)
    }

    fn config_fits(&self, w: &Workload, hw: &HardwareFingerprint, c: &Config) -> bool {
        c.0.len() == 4 && direct_knobs_fit(w, hw, c)
    }

    fn space(&self, w: &Workload, hw: &HardwareFingerprint) -> Space {
        let (m, n, k) = gemm_dims(w);
        let offered = ukernel::direct_offered(Isa::of(hw));
        let names: Vec<&str> = offered.iter().map(|u| u.name.as_str()).collect();
        let lanes = offered[0].lanes;
        Space::new()
            .knob(knob::UKERNEL, names)
            .knob(knob::KC, DIRECT_KC_VALUES.iter().copied())
            .knob(knob::PAR, par_values(hw))
            .knob(knob::THREADS, thread_values(hw))
            .rule("serial_iff_one_thread", serial_iff_one_thread)
            .rule("kc_below_k_or_whole", direct_kc_rule(k))
            .rule("m_split_has_rows_per_thread", direct_m_split_rule(m))
            .rule(
                "n_split_has_vectors_per_thread",
                direct_n_split_rule(n, lanes),
            )
    }

    fn default_config(&self, w: &Workload, hw: &HardwareFingerprint) -> Config {
        let (m, n, k) = gemm_dims(w);
        let offered = ukernel::direct_offered(Isa::of(hw));
        let uk = default_direct_ukernel(&offered, m);
        let f = std::mem::size_of::<f32>();
        // kc: the B slab (kc × V·lanes) reused by every row tile stays in half of L1. A single
        // row (GEMV) has no reuse and is bound by streaming B: passes over 4 rows of B at a
        // time (4 sequential streams, C in L1) measured best there.
        let kc = if m == 1 {
            if k > 4 {
                4
            } else {
                0
            }
        } else {
            let target = hw.l1d_bytes / 2 / (uk.v * uk.lanes * f);
            let v = DIRECT_KC_VALUES
                .iter()
                .copied()
                .filter(|&v| v > 0)
                .min_by_key(|&v| (v.abs_diff(target), v))
                .expect("listed");
            if v < k {
                v
            } else {
                0
            }
        };
        let cores = hw.cores.max(1);
        let big = w.flops() / 2.0 >= DIRECT_PARALLEL_MIN_MACS;
        let par = if cores > 1 && big && n >= cores * uk.lanes {
            Par::N(cores)
        } else {
            Par::None
        };
        Config::from_pairs([
            (knob::UKERNEL, Value::from(uk.name.as_str())),
            (knob::KC, kc.into()),
            (knob::PAR, par.split().name().into()),
            (knob::THREADS, par.threads().into()),
        ])
    }

    fn build(&self, w: &Workload, c: &Config) -> Result<Box<dyn Executable>> {
        Ok(Box::new(self.build_direct(w, c)?))
    }
}

impl Direct {
    /// [`Kernel::build`], returning the concrete driver.
    pub fn build_direct(&self, w: &Workload, c: &Config) -> Result<DirectGemm> {
        let name = self.name();
        let (m, n, k) = match *w {
            Workload::Gemm { m, n, k, .. } if m <= DIRECT_MAX_M => (m, n, k),
            _ => return Err(unsupported(name, w)),
        };
        let p = DirectParams::try_from(c).map_err(|reason| invalid(name, c, reason))?;
        let uk = ukernel::direct(&p.ukernel.to_string())
            .ok_or_else(|| invalid(name, c, params::unsupported_ukernel(p.ukernel)))?;
        Ok(DirectGemm::new((m, n, k), uk, p.kc, p.par))
    }
}

/// The direct tile for `m` rows (measured on Zen 3, AVX2): one row of the most vectors for
/// GEMV-like shapes, two rows below 4, four rows otherwise (fewer vectors first).
fn default_direct_ukernel(
    offered: &[&'static ukernel::DirectUkernel],
    m: usize,
) -> &'static ukernel::DirectUkernel {
    let best_isa = offered.iter().map(|u| u.isa).max().unwrap_or(Isa::Portable);
    let rows = match m {
        1 => 1,
        2 | 3 => 2,
        _ => 4,
    };
    let same_isa = || offered.iter().copied().filter(|u| u.isa == best_isa);
    same_isa()
        .filter(|u| u.r == rows)
        .min_by_key(|u| if rows == 1 { usize::MAX - u.v } else { u.v })
        .or_else(|| same_isa().filter(|u| u.r <= m).max_by_key(|u| (u.r, u.v)))
        .or_else(|| same_isa().min_by_key(|u| u.r))
        .expect("at least one direct micro-kernel")
}
