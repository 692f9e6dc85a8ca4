//! The bf16 flash step: one `MR`-row group of queries against one key block, written once
//! over the bf16 GEMM's `DotBf16` vocabulary (`vdpbf16ps`) and its `MR × 16·NV` pair tile
//! (`pair_body`), compiled for AVX512_BF16 and, in tests, over the plain-Rust emulation of
//! the instruction (`crate::cpu::bgemm::ukernel::emulate`), so the same body runs on every
//! CPU under test.
//!
//! Per step:
//!
//! 1. scores `S = Q·Kᵀ`: one `MR × NR` pair tile per key panel, Q as rows of bf16 pair
//!    words (`[row][depth pair]`: each row's values in order), K as panels of `NR` keys
//!    (`[depth pair][key][2]`);
//! 2. per row, in f32: scale into the log2 domain, running maximum, `p = 2^(x − m)`, the
//!    running sum `l` gains the f32 weights, and the weights are rounded to bf16 in order
//!    into the row's pair words (`[row][key pair]`), zero past the row's last visible key;
//! 3. `O = α·O + P·V`: the running outputs rescaled in f32, then `MR × 32` (and a last
//!    `MR × 16`) pair tiles accumulate `P·V` over the block's key pairs, V packed in column
//!    stripes of key pairs (`[key pair][column][2]`).
//!
//! This is the only `unsafe` code of the bf16 attention family: [`Bf16Tile::step`] checks
//! every extent before calling the kernel, and a tile is looked up by name only when the CPU
//! runs it.

use crate::cpu::bgemm::convert::{to_bf16_slice, to_bf16_wide};
use crate::cpu::bgemm::ukernel::body::{pair_body, DotBf16, PairsA};
use crate::cpu::bgemm::ukernel::{halves_mut, words_mut};
use crate::cpu::gemm::ukernel::prefetch_lines;
use crate::cpu::gemm::ukernel::simd::{exp2_nonpos, Epi, Simd};

/// Lanes of a `vdpbf16ps` accumulator (zmm, 16 f32).
pub const LANES: usize = 16;

/// Raw arguments of one step (see [`StepArgs`] for their meaning).
struct Step {
    qa: *const u32,
    dsteps: usize,
    kp: *const u32,
    vp: *const u32,
    spairs: usize,
    j0: usize,
    dp: usize,
    kv: usize,
    bcp: usize,
    lim: *const usize,
    scale: f32,
    s: *mut f32,
    pa: *mut u32,
    o: *mut f32,
    m: *mut f32,
    l: *mut f32,
    first: bool,
}

/// The arguments of one [`Bf16Tile::step`]: an `MR`-row group of queries against keys
/// `j0..j0 + kv` of one head.
pub struct StepArgs<'a, 'b> {
    /// The group's queries as rows of bf16 pair words, `[row][depth pair]`: `MR·dsteps`
    /// words ([`crate::cpu::bgemm::layout::pack_a_pair_rows`]).
    pub qa: &'a [u32],
    /// Depth pairs, `⌈D/2⌉`.
    pub dsteps: usize,
    /// The block's key panels, from its first key on: `⌈kv/NR⌉` panels of `dsteps·2·NR`
    /// values ([`pack_keys`]).
    pub kp: &'a [u32],
    /// The head's packed values ([`pack_values`]): `dp·2·spairs` values.
    pub vp: &'a [u32],
    /// Key pairs of the head, `⌈S/2⌉`.
    pub spairs: usize,
    /// The block's first key (a multiple of NR).
    pub j0: usize,
    /// D rounded up to [`LANES`].
    pub dp: usize,
    /// Keys of the block the rows see (the largest `lim`), at least 1.
    pub kv: usize,
    /// Keys each row sees in this block (0 for padding rows), `MR` values, each `≤ kv`.
    pub lim: &'a [usize],
    /// Softmax scale in the log2 domain (`log2(e)/√D`).
    pub scale: f32,
    /// Scores scratch: `MR·⌈kv/NR⌉·NR` values.
    pub s: &'b mut [f32],
    /// Weights scratch: `MR·⌈kv/2⌉` words.
    pub pa: &'b mut [u32],
    /// Running outputs, `MR` rows of `dp` (stride `dp`).
    pub o: &'b mut [f32],
    /// Running maxima (log2 domain) and sums, `MR` each.
    pub m: &'b mut [f32],
    /// Running sums of the unrounded f32 weights, `MR` values.
    pub l: &'b mut [f32],
    /// The group's first key block: `o` is zeroed instead of rescaled.
    pub first: bool,
}

type StepFn = unsafe fn(&Step);

/// One bf16 attention tile: `MR` query rows, score panels of `NR` keys.
#[derive(Debug)]
pub struct Bf16Tile {
    /// The `tile` knob's value (`avx512bf16_<MR>x<NR>`; `emu_` first for an emulated twin).
    pub name: &'static str,
    /// Query rows per tile, at most [`MAX_MR`].
    pub mr: usize,
    /// Keys per score panel.
    pub nr: usize,
    /// Runs through the plain-Rust emulation (tests only; never offered).
    pub emulated: bool,
    f: StepFn,
}

/// Largest `MR` of any tile.
pub const MAX_MR: usize = 16;

impl Bf16Tile {
    /// Whether this process runs it: an emulated twin always; a real tile where the CPU has
    /// AVX-512F, AVX512BW and AVX512_BF16 and `AUTOKERNEL_ISA` does not cap AVX-512 off.
    pub fn available(&self) -> bool {
        self.emulated || (crate::cpu::Isa::Avx512.available() && has_avx512bf16())
    }

    /// One step (see the module docs). Panics if an extent is short, `kv` is 0 or beyond
    /// `lim`'s bound, or this process does not run the tile.
    pub fn step(&self, a: StepArgs<'_, '_>) {
        let (mr, nr) = (self.mr, self.nr);
        assert!(self.available(), "{} does not run here", self.name);
        let bcp = a.kv.div_ceil(nr) * nr;
        let kpairs = a.kv.div_ceil(2);
        assert!(a.kv >= 1 && a.dp.is_multiple_of(LANES) && a.j0.is_multiple_of(2));
        assert!(a.lim.len() == mr && a.lim.iter().all(|&x| x <= a.kv));
        assert!(a.qa.len() >= a.dsteps * mr, "queries too short");
        assert!(
            a.kp.len() >= bcp / nr * a.dsteps * nr,
            "key panels too short"
        );
        assert!(a.vp.len() >= a.dp * a.spairs && a.j0 / 2 + kpairs <= a.spairs);
        assert!(a.s.len() >= mr * bcp && a.pa.len() >= kpairs * mr);
        assert!(a.o.len() >= mr * a.dp && a.m.len() >= mr && a.l.len() >= mr);
        let st = Step {
            qa: a.qa.as_ptr(),
            dsteps: a.dsteps,
            kp: a.kp.as_ptr(),
            vp: a.vp.as_ptr(),
            spairs: a.spairs,
            j0: a.j0,
            dp: a.dp,
            kv: a.kv,
            bcp,
            lim: a.lim.as_ptr(),
            scale: a.scale,
            s: a.s.as_mut_ptr(),
            pa: a.pa.as_mut_ptr(),
            o: a.o.as_mut_ptr(),
            m: a.m.as_mut_ptr(),
            l: a.l.as_mut_ptr(),
            first: a.first,
        };
        // SAFETY: `available()` checked the CPU; every extent the body reads or writes was
        // asserted above.
        unsafe { (self.f)(&st) }
    }
}

/// Whether this CPU runs AVX512_BF16 code, detected once.
fn has_avx512bf16() -> bool {
    crate::cpu::bgemm::ukernel::has_avx512bf16()
}

/// The step body (see the module docs), `NR = NV·16`.
///
/// # Safety
/// The CPU supports `D`'s ISA; `st` satisfies the extents [`Bf16Tile::step`] asserts, with
/// `D::S::W == LANES`.
#[inline(always)]
unsafe fn step_body<D: DotBf16, const MR: usize, const NV: usize>(st: &Step) {
    debug_assert_eq!(<D::S as Simd>::W, LANES);
    let nr = NV * LANES;
    let (bcp, dp, kpairs) = (st.bcp, st.dp, st.kv.div_ceil(2));
    // SAFETY (whole body): the caller guarantees the ISA and the extents (see
    // `Bf16Tile::step`); every index stays inside them (t < bcp/NR, r < MR, j < kv ≤ bcp,
    // pair < kpairs, c0 + 32 ≤ dp or c0 + 16 = dp).
    unsafe {
        // 1. Scores, one MR × NR tile per key panel.
        for t in 0..bcp / nr {
            let kp = st.kp.add(t * st.dsteps * nr).cast::<u16>();
            let s = st.s.add(t * nr);
            let qa = PairsA::rows(st.qa, st.dsteps, MR);
            pair_body::<D, MR, NV>(st.dsteps, qa, kp, s, bcp, 1, false, Epi::NONE);
        }
        // 2. Online softmax per row, weights to bf16 pairs; running outputs rescaled.
        for r in 0..MR {
            let alpha = softmax_row::<D::S, MR>(st, r);
            let o = st.o.add(r * dp);
            for c in 0..dp {
                *o.add(c) = if st.first { 0.0 } else { *o.add(c) * alpha };
            }
        }
        // 3. O += P·V, stripes of 32 columns, then one of 16 if D needs it.
        let pa = PairsA::rows(st.pa, kpairs, MR);
        let mut c0 = 0;
        while c0 < dp {
            let base = st.vp.add(c0 * st.spairs).cast::<u16>();
            let o = st.o.add(c0);
            if dp - c0 >= 32 {
                let v = base.add(st.j0 * 32);
                pair_body::<D, MR, 2>(kpairs, pa, v, o, dp, 1, true, Epi::NONE);
                c0 += 32;
            } else {
                let v = base.add(st.j0 * 16);
                pair_body::<D, MR, 1>(kpairs, pa, v, o, dp, 1, true, Epi::NONE);
                c0 += 16;
            }
        }
    }
}

/// Row `r` of step 2: the row's scores become f32 weights (summed into `l`) and bf16 pair
/// words in `pa`; returns the factor `α` the row's running outputs take.
///
/// # Safety
/// As [`step_body`].
#[inline(always)]
unsafe fn softmax_row<S: Simd, const MR: usize>(st: &Step, r: usize) -> f32 {
    let w = S::W;
    let kpairs = st.kv.div_ceil(2);
    // SAFETY: as `step_body`; vector accesses cover j..j+W ≤ vend ≤ lim ≤ kv ≤ bcp.
    unsafe {
        let lim = *st.lim.add(r);
        let row = st.s.add(r * st.bcp);
        let (m, l) = (st.m.add(r), st.l.add(r));
        // The row's weights as bf16 values in order: its `kpairs` pair words.
        let halves =
            std::slice::from_raw_parts_mut(st.pa.add(r * kpairs).cast::<u16>(), 2 * kpairs);
        if lim == 0 {
            halves.fill(0);
            return 1.0;
        }
        let vend = lim / w * w;
        let sc = S::set1(st.scale);
        let mut mx = S::set1(f32::NEG_INFINITY);
        for j in (0..vend).step_by(w) {
            let x = S::mul(S::load(row.add(j)), sc);
            S::store(row.add(j), x);
            mx = S::max(x, mx);
        }
        let mut blockmax = S::hmax(mx);
        for j in vend..lim {
            *row.add(j) *= st.scale;
            blockmax = blockmax.max(*row.add(j));
        }
        let m_new = (*m).max(blockmax);
        let alpha = (*m - m_new).exp2();
        let mv = S::set1(m_new);
        let mut sum = S::zero();
        for j in (0..vend).step_by(w) {
            let p = exp2_nonpos::<S>(S::sub(S::load(row.add(j)), mv));
            S::store(row.add(j), p);
            sum = S::add(sum, p);
        }
        let mut total = S::hsum(sum);
        for j in vend..lim {
            let p = (*row.add(j) - m_new).exp2();
            *row.add(j) = p;
            total += p;
        }
        *l = *l * alpha + total;
        *m = m_new;
        // The weights to bf16, zero past `lim`.
        to_bf16_slice(std::slice::from_raw_parts(row, lim), &mut halves[..lim]);
        halves[lim..].fill(0);
        alpha
    }
}

/// The step compiled for AVX-512F + AVX512BW + AVX512_BF16 (`vdpbf16ps`).
///
/// # Safety
/// The CPU has those features; `st` satisfies [`step_body`]'s contract.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn step_avx512bf16<const MR: usize, const NV: usize>(st: &Step) {
    use crate::cpu::bgemm::ukernel::x86::Vdpbf16ps;
    // SAFETY: forwarded caller contract; compiled with the features `Vdpbf16ps` needs.
    unsafe { step_body::<Vdpbf16ps, MR, NV>(st) }
}

/// The step over the plain-Rust emulation of `vdpbf16ps` (tests only).
///
/// # Safety
/// `st` satisfies [`step_body`]'s contract (the emulation needs no CPU feature).
#[cfg(test)]
unsafe fn step_emulated<const MR: usize, const NV: usize>(st: &Step) {
    use crate::cpu::bgemm::ukernel::emulate::EmuDp;
    // SAFETY: forwarded caller contract.
    unsafe { step_body::<EmuDp, MR, NV>(st) }
}

/// The AVX512_BF16 tiles, best first: `MR·NV` score accumulators and `MR·2` output ones
/// stay within the 32 zmm registers.
#[cfg(target_arch = "x86_64")]
pub static TILES: &[Bf16Tile] = &[
    real("avx512bf16_8x32", 8, 32, step_avx512bf16::<8, 2>),
    real("avx512bf16_4x64", 4, 64, step_avx512bf16::<4, 4>),
    real("avx512bf16_4x32", 4, 32, step_avx512bf16::<4, 2>),
];

/// No tile runs off x86-64.
#[cfg(not(target_arch = "x86_64"))]
pub static TILES: &[Bf16Tile] = &[];

#[cfg(target_arch = "x86_64")]
const fn real(name: &'static str, mr: usize, nr: usize, f: StepFn) -> Bf16Tile {
    assert!(mr <= MAX_MR && nr.is_multiple_of(LANES));
    Bf16Tile {
        name,
        mr,
        nr,
        emulated: false,
        f,
    }
}

/// The emulated twin of every tile of [`TILES`] (`emu_` and its name; same shapes, same
/// body): they run on every CPU and are never offered.
#[cfg(test)]
pub(crate) static EMULATED: &[Bf16Tile] = &[
    twin("emu_avx512bf16_8x32", 8, 32, step_emulated::<8, 2>),
    twin("emu_avx512bf16_4x64", 4, 64, step_emulated::<4, 4>),
    twin("emu_avx512bf16_4x32", 4, 32, step_emulated::<4, 2>),
];

#[cfg(test)]
const fn twin(name: &'static str, mr: usize, nr: usize, f: StepFn) -> Bf16Tile {
    Bf16Tile {
        name,
        mr,
        nr,
        emulated: true,
        f,
    }
}

/// The real tile called `name`, if this process runs it.
pub fn tile(name: &str) -> Option<&'static Bf16Tile> {
    TILES
        .iter()
        .find(|t| t.name == name)
        .filter(|t| t.available())
}

/// Packs keys `0..klen` of one head (`k`: rows of `D` values, `ld` apart) as bf16 pair
/// words into panels of `nr` keys, `[depth pair][key]` each (word: depths `2s`, `2s + 1` of
/// one key; `⌈D/2⌉·nr` words per panel, `⌈S/nr⌉` panels); `out` must be zero (keys past
/// `klen` and the odd depth past `D` stay zero). With AVX2, `nr` a multiple of 8 and
/// `D ≤ 128`, whole groups of 8 keys are converted into a row-major block and moved by 8×8
/// transposes of pair words (one word per store, scattered `nr` apart, took 7.5% of
/// `attention:8x12x128x64:bf16`).
pub fn pack_keys((k, ld): (&[f32], usize), d: usize, nr: usize, klen: usize, out: &mut [u32]) {
    let dsteps = d.div_ceil(2);
    let panel = dsteps * nr;
    assert!(
        klen == 0 || k.len() >= (klen - 1) * ld + d,
        "keys too short"
    );
    assert!(
        out.len() >= klen.div_ceil(nr) * panel,
        "key panels too short"
    );
    #[cfg(target_arch = "x86_64")]
    let groups = if nr.is_multiple_of(8) && dsteps <= 64 && crate::cpu::Isa::Avx2.available() {
        klen / 8
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let groups = 0;
    // 8 keys' pair words, `dsteps` per key (held as f32, the bf16 helpers' buffer type).
    let mut block = [0f32; 8 * 64];
    for g in 0..groups {
        let j0 = 8 * g;
        for r in 0..8 {
            if j0 + r + 8 < klen {
                prefetch_lines(&k[(j0 + r + 8) * ld..][..d]);
            }
            let halves = halves_mut(&mut block[r * dsteps..(r + 1) * dsteps]);
            to_bf16_wide(&k[(j0 + r) * ld..][..d], &mut halves[..d]);
            halves[d..].fill(0);
        }
        // Groups of 8 never cross a panel (`nr` is a multiple of 8).
        let at = j0 / nr * panel + j0 % nr;
        let whole = dsteps / 8 * 8;
        #[cfg(target_arch = "x86_64")]
        for s0 in (0..whole).step_by(8) {
            let dst = &mut out[at + s0 * nr..];
            assert!(dst.len() >= 7 * nr + 8 && s0 + 8 <= dsteps);
            // SAFETY: AVX2 runs here (checked with `groups`); the 8 source rows of 8 words
            // (`dsteps` apart, from `s0`) lie in `block`, and the 8 destination rows of 8
            // words (`nr` apart) in `dst` (asserted just above). Words move bit for bit.
            unsafe {
                super::super::ukernel::transpose8_avx2(
                    block.as_ptr().add(s0),
                    dsteps,
                    dst.as_mut_ptr().cast(),
                    nr,
                )
            };
        }
        let words = words_mut(&mut block);
        for s in whole..dsteps {
            for r in 0..8 {
                out[at + s * nr + r] = words[r * dsteps + s];
            }
        }
    }
    let mut h = [0u16; 64];
    for j in 8 * groups..klen {
        if j + 8 < klen {
            prefetch_lines(&k[(j + 8) * ld..][..d]);
        }
        let at = &mut out[j / nr * panel + j % nr..];
        for (piece, part) in k[j * ld..][..d].chunks(64).enumerate() {
            to_bf16_wide(part, &mut h);
            h[part.len()..].fill(0);
            for (t, p) in h.chunks_exact(2).take(part.len().div_ceil(2)).enumerate() {
                at[(piece * 32 + t) * nr] = u32::from(p[0]) | u32::from(p[1]) << 16;
            }
        }
    }
}

/// Packs values `0..klen` of one head (`v`: rows of `D` values, `ld` apart) as bf16 pair
/// words into column stripes of 32 (the last one 16 if `dp` needs it), `[key pair][column]`
/// each (word: keys `2p`, `2p + 1` of one column); stripe at column `c0` starts at word
/// `c0·spairs` (`dp·spairs` words in all, `spairs = ⌈S/2⌉` for the head's `S` keys). `out`
/// must be zero (rows past `klen` and columns past `D` stay zero).
pub fn pack_values(
    (v, ld): (&[f32], usize),
    (d, dp): (usize, usize),
    spairs: usize,
    klen: usize,
    out: &mut [u32],
) {
    // Both rows of a key pair converted whole, then interleaved stripe by stripe.
    let (mut lo, mut hi) = ([0u16; 64], [0u16; 64]);
    for jp in 0..klen.div_ceil(2) {
        let even = &v[2 * jp * ld..][..d];
        let odd = (2 * jp + 1 < klen).then(|| &v[(2 * jp + 1) * ld..][..d]);
        for ahead in [2 * jp + 8, 2 * jp + 9].into_iter().filter(|&r| r < klen) {
            prefetch_lines(&v[ahead * ld..][..d]);
        }
        for c0 in (0..d).step_by(64) {
            let cols = 64.min(d - c0);
            to_bf16_wide(&even[c0..c0 + cols], &mut lo);
            match odd {
                Some(odd) => to_bf16_wide(&odd[c0..c0 + cols], &mut hi),
                None => hi.fill(0),
            }
            for s0 in (c0..c0 + cols).step_by(32) {
                let (width, n) = (32.min(dp - s0), 32.min(d - s0));
                let dst = &mut out[s0 * spairs + jp * width..][..n];
                let (lo, hi) = (&lo[s0 - c0..][..n], &hi[s0 - c0..][..n]);
                for (o, (&a, &b)) in dst.iter_mut().zip(lo.iter().zip(hi)) {
                    *o = u32::from(a) | u32::from(b) << 16;
                }
            }
        }
    }
}
