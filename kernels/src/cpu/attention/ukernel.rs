//! Attention micro-kernels: the flash step (scores tile, online softmax, `P·V` update) and
//! the row softmax of the unfused variant, written once over the GEMM micro-kernels' SIMD
//! vocabulary (`Simd`) and compiled per ISA.
//!
//! This is the only unsafe code of the attention families. Tiles are looked up by name and
//! only when [`Isa::available`] says the CPU runs their ISA; the safe entry points
//! ([`AttnTile::step`], [`softmax_row`]) check every extent before calling the kernels.

use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
use crate::cpu::gemm::ukernel::avx2::Avx2;
#[cfg(target_arch = "x86_64")]
use crate::cpu::gemm::ukernel::avx512::Avx512;
use crate::cpu::gemm::ukernel::portable::Portable;
use crate::cpu::gemm::ukernel::prefetch_lines;
use crate::cpu::gemm::ukernel::simd::{exp2_nonpos, packed_step_strided, Simd};
use crate::cpu::Isa;

/// Raw arguments of one flash step (see [`AttnTile::step`] for their meaning and extents).
struct Step {
    /// The group's first query row; row `r` at `q + r·ldq`, `d` values each.
    q: *const f32,
    ldq: usize,
    d: usize,
    /// Softmax scale in the log2 domain, applied to the scores inside the exponent.
    scale: f32,
    kp: *const f32,
    /// Packed values (`vrows` rows, see [`AttnTile::pack_values`]).
    v: *const f32,
    vrows: usize,
    j0: usize,
    dp: usize,
    kv: usize,
    bcp: usize,
    lim: *const usize,
    s: *mut f32,
    /// Running outputs: row `r` at `o + r·ldo`, `dp` values.
    o: *mut f32,
    ldo: usize,
    m: *mut f32,
    l: *mut f32,
    /// The group's first key block: `o` holds nothing yet (it is not read).
    first: bool,
    /// The group's last key block: `o` is divided by the running sum when stored.
    last: bool,
}

/// Values packed by [`AttnTile::pack_values`] for [`AttnTile::step`]: `(packed, rows, j0)`,
/// rows `j0..j0 + kv` of the `rows` packed ones being the block's.
#[derive(Clone, Copy)]
pub struct Values<'a>(pub &'a [f32], pub usize, pub usize);

/// The arguments of one [`AttnTile::step`] call.
pub struct StepArgs<'a, 'b> {
    /// The query rows, row-major: row `r` of the group at `q[r·ldq..]`, `d` values.
    pub q: &'a [f32],
    /// The query row stride, in values.
    pub ldq: usize,
    /// The head dimension, `1 ≤ d ≤ dp`.
    pub d: usize,
    /// The softmax scale in the log2 domain (`log2(e)/√D` for the usual softmax).
    pub scale: f32,
    /// The block's keys packed in panels of `dp × NR` (keys of a panel together, zero-padded).
    pub kp: &'a [f32],
    /// The packed values ([`AttnTile::pack_values`]) and the block's place in them.
    pub v: Values<'a>,
    /// `d` rounded up to the lanes.
    pub dp: usize,
    /// Keys in the block.
    pub kv: usize,
    /// Keys each row sees (`lim[r] ≤ kv`); the rest are masked.
    pub lim: &'a [usize],
    /// Scores scratch, `MR·⌈kv/NR⌉·NR` values.
    pub s: &'b mut [f32],
    /// Running outputs, row `r` at `o[r·ldo..]`, `dp` values.
    pub o: &'b mut [f32],
    /// The row stride of `o`, in values.
    pub ldo: usize,
    /// Running maxima (log2 domain, scaled) and sums, one per row.
    pub m: &'b mut [f32],
    /// Running sums of the weights, one per row.
    pub l: &'b mut [f32],
    /// The group's first key block: `o` holds nothing yet and is not read.
    pub first: bool,
    /// The group's last key block: `O / l` is stored into `o` instead of the running `O`.
    pub last: bool,
}

type StepFn = unsafe fn(&Step);
type SoftmaxFn = unsafe fn(*mut f32, usize, usize, f32);

/// One register-tile shape of the fused kernel: `MR` query rows × `NR` keys for the scores,
/// `MR` rows × `PV` vectors of the head dimension for the `P·V` update.
#[derive(Debug)]
pub struct AttnTile {
    /// Knob value, e.g. `avx2_6x16`.
    pub name: String,
    /// The ISA its kernels are compiled for; the tile is handed out only where the CPU runs it.
    pub isa: Isa,
    /// Query rows per tile.
    pub mr: usize,
    /// Keys per scores tile (a multiple of `lanes`).
    pub nr: usize,
    /// Vectors of the head dimension per `P·V` tile.
    pub pv: usize,
    /// f32 lanes per vector.
    pub lanes: usize,
    step: StepFn,
    /// Kernels of fewer rows (same NR), largest first, for a group's last `< MR` rows.
    tails: Vec<(usize, StepFn)>,
}

/// The best-ISA row softmax for the unfused variant.
fn softmax_fn() -> SoftmaxFn {
    match Isa::detect() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => softmax_avx512,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => softmax_avx2,
        _ => softmax_portable,
    }
}

/// `row[..valid]` ← `softmax(row[..valid] · scale)` with `scale` in the log2 domain
/// (`log2(e)/√D` gives the usual softmax of `row/√D`), `row[valid..]` ← 0. Vectorised with
/// the best ISA of this CPU. Panics unless `1 ≤ valid ≤ row.len()`.
pub fn softmax_row(row: &mut [f32], valid: usize, scale: f32) {
    assert!(
        valid >= 1 && valid <= row.len(),
        "softmax needs 1..=len valid values"
    );
    let f = softmax_fn();
    // SAFETY: `softmax_fn` picks a kernel for an ISA `Isa::detect` reported; `row` is
    // writable for `row.len()` values and `valid ≤ row.len()` (asserted above).
    unsafe { f(row.as_mut_ptr(), row.len(), valid, scale) }
}

impl AttnTile {
    /// One flash step for a group of `rows ≤ MR` query rows against one block of `kv` keys:
    ///
    /// 1. `S = Q·Kᵀ` for the block (`⌈kv/NR⌉·NR` columns) into `s`; columns `lim[r]..` of
    ///    row `r` are masked to `-∞`;
    /// 2. online softmax: `m[r]` (running max of `scale·S`, log2 domain) and `l[r]` (running
    ///    sum) are updated and `s` becomes `P = 2^(scale·S - m)`;
    /// 3. `O = 2^(m_old - m_new)·O + P·V` for the `dp` columns of `o` (not read when
    ///    `first`); when `last`, `O / l` is stored instead.
    ///
    /// A group of fewer than MR rows runs smaller kernels of the same NR (no padding rows).
    /// Panics if any extent is too short, `kv == 0`, or a `lim` exceeds `kv`.
    pub fn step(&self, rows: usize, a: StepArgs<'_, '_>) {
        let (mr, nr, dp, kv) = (self.mr, self.nr, a.dp, a.kv);
        assert!(
            mr <= 16 && (1..=mr).contains(&rows),
            "1..=MR rows, tiles have at most 16 (the per-row arrays of the kernel)"
        );
        assert!(
            dp >= self.lanes && dp.is_multiple_of(self.lanes) && a.d <= dp && a.d >= 1,
            "dp {dp} not a multiple of the lanes"
        );
        assert!(kv >= 1, "empty key block");
        let bcp = kv.div_ceil(nr) * nr;
        assert!(a.q.len() >= (rows - 1) * a.ldq + a.d, "queries too short");
        assert!(a.kp.len() >= bcp * dp, "packed keys too short");
        let Values(v, vrows, j0) = a.v;
        assert!(
            v.len() >= vrows * dp && j0 + kv <= vrows,
            "packed values too short"
        );
        assert!(
            a.lim.len() >= rows && a.lim[..rows].iter().all(|&x| x <= kv),
            "bad key limits"
        );
        assert!(a.s.len() >= mr * bcp, "scores buffer too short");
        assert!(
            a.o.len() >= (rows - 1) * a.ldo + dp && a.m.len() >= rows && a.l.len() >= rows,
            "state too short"
        );
        // Whole tile, or the tail kernels, largest first (binary pieces of `rows`).
        let mut r0 = 0;
        while r0 < rows {
            let left = rows - r0;
            let (n, f) = if left == mr {
                (mr, self.step)
            } else {
                *self
                    .tails
                    .iter()
                    .find(|t| t.0 <= left)
                    .expect("a one-row tail kernel")
            };
            let st = Step {
                // SAFETY: r0 < rows; the offsets stay inside the slices asserted above.
                q: unsafe { a.q.as_ptr().add(r0 * a.ldq) },
                ldq: a.ldq,
                d: a.d,
                scale: a.scale,
                kp: a.kp.as_ptr(),
                v: v.as_ptr(),
                vrows,
                j0,
                dp,
                kv,
                bcp,
                lim: a.lim[r0..].as_ptr(),
                s: a.s.as_mut_ptr(),
                o: a.o[r0 * a.ldo..].as_mut_ptr(),
                ldo: a.ldo,
                m: a.m[r0..].as_mut_ptr(),
                l: a.l[r0..].as_mut_ptr(),
                first: a.first,
                last: a.last,
            };
            // SAFETY: `self` is only handed out (by `tiles_offered`/`tile`) when the CPU runs
            // `self.isa`, and its tails share it; the kernel runs n ≤ rows - r0 rows, and
            // every pointer is valid for the extents `step_body` reads and writes (asserted
            // above, with `bcp` computed from the tile's NR, shared by the tails).
            unsafe { f(&st) }
            r0 += n;
        }
    }
}

impl AttnTile {
    /// Columns per value stripe: the `P·V` tile's width.
    pub fn value_stripe(&self) -> usize {
        self.pv * self.lanes
    }

    /// Packs `rows` value rows (`src`: `d` columns, rows `ld` apart) for [`AttnTile::step`]:
    /// stripes of [`AttnTile::value_stripe`] columns (the last one narrower when `dp` is not
    /// a multiple), each holding its columns of every row contiguously (stripe at column
    /// `c0`, of width `w`, starts at `c0·rows`; row `j` at `+ j·w`), zero-padded past `d`.
    /// The `P·V` tile then streams one contiguous, aligned run per stripe.
    /// `out` needs `rows·dp` values; panics if `src` or `out` is too short.
    pub fn pack_values(
        &self,
        (src, ld): (&[f32], usize),
        d: usize,
        dp: usize,
        rows: usize,
        out: &mut [f32],
    ) {
        assert!(d >= 1 && dp >= d && ld >= d && out.len() >= rows * dp);
        assert!(
            rows == 0 || src.len() >= (rows - 1) * ld + d,
            "values too short"
        );
        let sw = self.value_stripe();
        let mut c0 = 0;
        while c0 < dp {
            let w = sw.min(dp - c0);
            let n = w.min(d.saturating_sub(c0));
            let stripe = &mut out[c0 * rows..(c0 + w) * rows];
            // Copies of a compile-time length for the usual widths: a short copy_from_slice
            // of run-time length is a memcpy call per row (measured: 4% of a 128-key head).
            match (w, n) {
                (8, 8) => copy_rows::<8>(stripe, src, (ld, d), c0, c0 == 0),
                (16, 16) => copy_rows::<16>(stripe, src, (ld, d), c0, c0 == 0),
                (24, 24) => copy_rows::<24>(stripe, src, (ld, d), c0, c0 == 0),
                (32, 32) => copy_rows::<32>(stripe, src, (ld, d), c0, c0 == 0),
                (48, 48) => copy_rows::<48>(stripe, src, (ld, d), c0, c0 == 0),
                (64, 64) => copy_rows::<64>(stripe, src, (ld, d), c0, c0 == 0),
                _ => {
                    for (j, dst) in stripe.chunks_exact_mut(w).enumerate() {
                        dst[..n].copy_from_slice(&src[j * ld + c0..][..n]);
                        dst[n..].fill(0.0);
                    }
                }
            }
            c0 += w;
        }
    }
}

/// `dst` row `j` (N values) ← `src[j·d + c0..][..N]`, for every N-value row of `dst`.
/// Rows 8 ahead are prefetched (whole rows of `d` values, with `ahead`: the first stripe).
fn copy_rows<const N: usize>(
    dst: &mut [f32],
    src: &[f32],
    (ld, d): (usize, usize),
    c0: usize,
    ahead: bool,
) {
    let rows = dst.len() / N;
    for (j, x) in dst.chunks_exact_mut(N).enumerate() {
        if ahead && j + 8 < rows {
            prefetch_lines(&src[(j + 8) * ld..][..d]);
        }
        let x: &mut [f32; N] = x.try_into().expect("N values");
        let y: &[f32; N] = src[j * ld + c0..][..N].try_into().expect("N values");
        *x = *y;
    }
}

/// Packs keys `j0..j0 + kv` of one head (`k`: `d` columns, rows `ld` apart) into `⌈kv/nr⌉` panels
/// of `dp × nr` values (the `nr` keys of column `c` together), zero-padded past key
/// `j0 + kv` and column `d`: the layout [`AttnTile::step`] reads keys in. With AVX2 and `nr` a
/// multiple of 8, whole 8 keys × 8 columns pieces are moved by an in-register transpose (a
/// scalar gather costs about a cycle per value: 5% of a 128-key head). Panics if `k` or
/// `out` is too short.
pub fn pack_keys(
    (k, ld): (&[f32], usize),
    d: usize,
    dp: usize,
    nr: usize,
    (j0, kv): (usize, usize),
    out: &mut [f32],
) {
    let panels = kv.div_ceil(nr);
    assert!(d >= 1 && dp >= d && ld >= d && nr >= 1);
    assert!(
        kv == 0 || k.len() >= (j0 + kv - 1) * ld + d,
        "keys too short"
    );
    assert!(out.len() >= panels * nr * dp, "key panels too short");
    #[cfg(target_arch = "x86_64")]
    let simd = nr.is_multiple_of(8) && Isa::Avx2.available();
    #[cfg(not(target_arch = "x86_64"))]
    let simd = false;
    for (t, panel) in out[..panels * nr * dp]
        .chunks_exact_mut(nr * dp)
        .enumerate()
    {
        let keys = nr.min(kv - t * nr);
        let first = j0 + t * nr;
        // Whole 8-key groups × whole 8-column blocks by transposes, the rest one by one.
        let (g8, c8) = if simd { (keys / 8, d / 8) } else { (0, 0) };
        #[cfg(target_arch = "x86_64")]
        for g in 0..g8 {
            // The rows two groups ahead, on their way from L3 while these are transposed.
            for r in first + (g + 2) * 8..(first + (g + 3) * 8).min(j0 + kv) {
                prefetch_lines(&k[r * ld..][..d]);
            }
            for cb in 0..c8 {
                let src = &k[(first + g * 8) * ld + cb * 8..];
                let dst = &mut panel[cb * 8 * nr + g * 8..];
                assert!(src.len() >= 7 * ld + 8 && dst.len() >= 7 * nr + 8);
                // SAFETY: AVX2 is available (checked above); the 8 source rows (stride ld)
                // and the 8 destination rows (stride nr) of 8 values each lie inside the
                // slices (asserted just above).
                unsafe { transpose8_avx2(src.as_ptr(), ld, dst.as_mut_ptr(), nr) };
            }
        }
        for r in 0..nr {
            let row = (r < keys).then(|| &k[(first + r) * ld..][..d]);
            // Columns the transposes did not cover for this key.
            let c_from = if r < g8 * 8 { c8 * 8 } else { 0 };
            for c in c_from..dp {
                panel[c * nr + r] = match row {
                    Some(row) if c < d => row[c],
                    _ => 0.0,
                };
            }
        }
    }
}

/// `dst[i·ldd + j] = src[j·lds + i]` for `i, j < 8`: an 8×8 transpose in registers.
///
/// # Safety
/// The CPU supports AVX2; `src + j·lds` is readable and `dst + i·ldd` writable for 8 values
/// each, `i, j < 8`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn transpose8_avx2(src: *const f32, lds: usize, dst: *mut f32, ldd: usize) {
    use std::arch::x86_64::*;
    // SAFETY: the caller guarantees AVX2 and the extents of the 8 loads and 8 stores.
    unsafe {
        let r: [__m256; 8] = std::array::from_fn(|j| _mm256_loadu_ps(src.add(j * lds)));
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        let out = [
            _mm256_permute2f128_ps::<0x20>(u0, u4),
            _mm256_permute2f128_ps::<0x20>(u1, u5),
            _mm256_permute2f128_ps::<0x20>(u2, u6),
            _mm256_permute2f128_ps::<0x20>(u3, u7),
            _mm256_permute2f128_ps::<0x31>(u0, u4),
            _mm256_permute2f128_ps::<0x31>(u1, u5),
            _mm256_permute2f128_ps::<0x31>(u2, u6),
            _mm256_permute2f128_ps::<0x31>(u3, u7),
        ];
        for (i, v) in out.iter().enumerate() {
            _mm256_storeu_ps(dst.add(i * ldd), *v);
        }
    }
}

/// `2^x` lane-wise for `x ≤ 0` (or `-∞`, which gives 0): the softmax weights. As the
/// crate's `exp2_nonpos`, with a degree-5 polynomial on `[-½, ½]` (relative error ≤ 2.4e-7,
/// two f32 ulps; the attention reference allows tens) instead of degree 6: one FMA less
/// per 8 weights.
///
/// # Safety
/// The CPU supports `S`'s ISA.
#[inline(always)]
unsafe fn exp2_softmax<S: Simd>(x: S::V) -> S::V {
    // 1.5·2^23 + 127: adding it rounds x ∈ [-127, 0] to a whole number n and leaves n + 127
    // in the low mantissa bits, which `shl23` moves into the exponent field of 2^n.
    const MAGIC: f32 = 12_583_039.0;
    const P: [f32; 6] = [
        1.000_000_1,
        0.693_146_94,
        0.240_221_2,
        0.055_507_135,
        0.009_675_542,
        0.001_327_646_7,
    ];
    // SAFETY: the caller guarantees the ISA; only register operations follow.
    unsafe {
        // NaN stays NaN (`max` returns its second operand where either is NaN): a NaN score
        // must not come out as a weight of 2^-127.
        let x = S::max(S::set1(-127.0), x);
        let t = S::add(x, S::set1(MAGIC));
        let f = S::sub(x, S::sub(t, S::set1(MAGIC)));
        let mut p = S::set1(P[5]);
        for c in P[..5].iter().rev() {
            p = S::fmadd(p, f, S::set1(*c));
        }
        S::mul(p, S::shl23(t))
    }
}

/// The flash step body (see [`AttnTile::step`]), `NR = NV·W`.
///
/// The scores / weights buffer `st.s` holds chunks of W keys × MR rows: element (r, j) at
/// (j / W · MR + r) · W + j % W. Rows store and load whole vectors, and the P·V loop
/// broadcasts the MR weights of a key from one chunk at constant offsets (rows a full
/// stride apart would make it chain address adds and load from MR far-apart lines).
///
/// # Safety
/// The CPU supports `S`'s ISA and `st` satisfies the extents `AttnTile::step` asserts, with
/// `st.bcp = ⌈kv/NR⌉·NR`, `MR` rows and `dp` a multiple of `W`: q has MR rows of d values
/// (stride ldq), kp bcp·dp, s MR·bcp, o MR rows of dp (stride ldo), m and l MR, lim MR.
/// Every index in the steps stays inside them (t < bcp/NR, r < MR, j < bcp, c0 + V·W ≤ dp,
/// k < d ≤ dp).
#[inline(always)]
unsafe fn step_body<S: Simd, const MR: usize, const NV: usize, const PV: usize>(st: &Step) {
    // SAFETY (whole body): the caller's contract, passed on to each step.
    unsafe {
        let mut rowmax = scores::<S, MR, NV>(st);
        let (m_old, m_new) = running_maxima::<S, MR>(st, &mut rowmax);
        let (alpha, fin) = weights::<S, MR>(st, &m_old, &m_new);
        // 4. O = alpha·O + P·V, PV vectors of the head dimension at a time.
        let nvec = st.dp / S::W;
        let mut c0 = 0;
        for _ in 0..nvec / PV {
            pv_tile::<S, MR, PV>(st, &alpha, &fin, c0);
            c0 += PV * S::W;
        }
        match nvec % PV {
            1 => pv_tile::<S, MR, 1>(st, &alpha, &fin, c0),
            2 => pv_tile::<S, MR, 2>(st, &alpha, &fin, c0),
            3 => pv_tile::<S, MR, 3>(st, &alpha, &fin, c0),
            _ => {}
        }
    }
}

/// Step 1: the scores, one MR × NR tile per key panel, into `st.s`, and each row's maximum.
/// The queries are read in place (broadcasts need no packing); the key panels' columns past
/// d are zero and skipped.
///
/// # Safety
/// As [`step_body`].
#[inline(always)]
unsafe fn scores<S: Simd, const MR: usize, const NV: usize>(st: &Step) -> [S::V; MR] {
    let nr = NV * S::W;
    let (d, ldq, dp) = (st.d, st.ldq, st.dp);
    // SAFETY: the caller's ISA and extents (t < bcp/NR, k < d ≤ dp, rows < MR).
    unsafe {
        let mut rowmax = [S::set1(f32::NEG_INFINITY); MR];
        for t in 0..st.bcp / nr {
            let mut acc = [[S::zero(); NV]; MR];
            let (mut a, mut b) = (st.q, st.kp.add(t * nr * dp));
            for _ in 0..d / 4 {
                for u in 0..4 {
                    packed_step_strided::<S, MR, NV>(&mut acc, a.add(u), ldq, b.add(u * nr));
                }
                a = a.add(4);
                b = b.add(4 * nr);
            }
            for _ in 0..d % 4 {
                packed_step_strided::<S, MR, NV>(&mut acc, a, ldq, b);
                a = a.add(1);
                b = b.add(nr);
            }
            for (r, row) in acc.iter().enumerate() {
                for (v, x) in row.iter().enumerate() {
                    S::store(st.s.add(((t * NV + v) * MR + r) * S::W), *x);
                    rowmax[r] = S::max(*x, rowmax[r]);
                }
            }
        }
        rowmax
    }
}

/// Step 2: masks the rows that see fewer keys (block tails, the causal diagonal) and takes
/// their maxima again; the new running maxima of all rows (independent chains) go to `st.m`.
/// Returns the old and the new maxima (the new ones 0 where a row has seen no key yet).
///
/// # Safety
/// As [`step_body`].
#[inline(always)]
unsafe fn running_maxima<S: Simd, const MR: usize>(
    st: &Step,
    rowmax: &mut [S::V; MR],
) -> ([f32; 16], [f32; 16]) {
    let (bcp, chunk) = (st.bcp, MR * S::W);
    let mut m_new = [0.0f32; 16];
    let mut m_old = [0.0f32; 16];
    // SAFETY: the caller's extents (r < MR, j < bcp).
    unsafe {
        let ninf = S::set1(f32::NEG_INFINITY);
        for r in 0..MR {
            let row = st.s.add(r * S::W);
            let lim = *st.lim.add(r);
            if lim < bcp {
                let whole = lim.div_ceil(S::W);
                for j in lim..whole * S::W {
                    *row.add(j / S::W * chunk + j % S::W) = f32::NEG_INFINITY;
                }
                for c in whole..bcp / S::W {
                    S::store(row.add(c * chunk), ninf);
                }
                let mut mx = ninf;
                for c in 0..whole {
                    mx = S::max(S::load(row.add(c * chunk)), mx);
                }
                rowmax[r] = mx;
            }
            m_old[r] = *st.m.add(r);
            // Maxima of the raw scores; scale > 0 keeps them the maxima of the scaled ones.
            let m = m_old[r].max(S::hmax(rowmax[r]) * st.scale);
            *st.m.add(r) = m;
            // A row that has seen no key yet keeps m = -∞; subtracting 0 instead gives
            // P = 0 and alpha = 0 without an ∞ - ∞.
            m_new[r] = if m == f32::NEG_INFINITY { 0.0 } else { m };
        }
    }
    (m_old, m_new)
}

/// Step 3: alpha = 2^(m_old - m_new) for all rows at once (lanes past MR compute 2^0);
/// P = 2^(scale·S - m_new) in place in `st.s`, and the running sums in `st.l`; returns alpha
/// and the factors 1/l that finish the rows on the last block.
///
/// The product is rounded before the maximum is subtracted (not one FMA): rounding is
/// monotonic, so the row's largest score gives exactly 2^0 and no other more, however large
/// the scores (an FMA's unrounded product is off the rounded maximum by up to half an ulp:
/// ±2^10 at scores near 2^34, which zeroed or overflowed every weight of the row).
///
/// # Safety
/// As [`step_body`].
#[inline(always)]
unsafe fn weights<S: Simd, const MR: usize>(
    st: &Step,
    m_old: &[f32; 16],
    m_new: &[f32; 16],
) -> ([f32; 16], [f32; 16]) {
    let chunk = MR * S::W;
    let mut alpha = [1.0f32; 16];
    let mut fin = [0.0f32; 16];
    // SAFETY: the caller's extents (r < MR ≤ 16, c < bcp/W); m_old, m_new and alpha hold 16.
    unsafe {
        for c in (0..MR).step_by(S::W) {
            let x = S::sub(
                S::load(m_old.as_ptr().add(c)),
                S::load(m_new.as_ptr().add(c)),
            );
            S::store(alpha.as_mut_ptr().add(c), exp2_softmax::<S>(x));
        }
        let sc = S::set1(st.scale);
        for r in 0..MR {
            let row = st.s.add(r * S::W);
            let mv = S::set1(-m_new[r]);
            let mut sum = S::zero();
            for c in 0..st.bcp / S::W {
                let p = exp2_softmax::<S>(S::add(S::mul(S::load(row.add(c * chunk)), sc), mv));
                S::store(row.add(c * chunk), p);
                sum = S::add(sum, p);
            }
            let l = *st.l.add(r) * alpha[r] + S::hsum(sum);
            *st.l.add(r) = l;
            fin[r] = if l > 0.0 { 1.0 / l } else { 0.0 };
        }
    }
    (alpha, fin)
}

/// `O[.., c0..c0+V·W] = alpha·O + P·V[.., c0..]` for the MR rows (`O` taken as zero on the
/// first block, stored times `fin` on the last).
///
/// # Safety
/// As [`step_body`], with `c0 + V·W ≤ dp`.
#[inline(always)]
unsafe fn pv_tile<S: Simd, const MR: usize, const V: usize>(
    st: &Step,
    alpha: &[f32; 16],
    fin: &[f32; 16],
    c0: usize,
) {
    let ldo = st.ldo;
    // SAFETY: the caller guarantees the ISA and the extents (r < MR, j < kv ≤ bcp; the
    // stripe at c0 holds rows j0..j0 + kv of V·W values; o rows of dp values).
    unsafe {
        let mut acc = [[S::zero(); V]; MR];
        if !st.first {
            for (r, row) in acc.iter_mut().enumerate() {
                let a = S::set1(alpha[r]);
                for (v, x) in row.iter_mut().enumerate() {
                    *x = S::mul(S::load(st.o.add(r * ldo + c0 + v * S::W)), a);
                }
            }
        }
        // This stripe of the packed values: V·W columns of every row, contiguous.
        let ldv = V * S::W;
        let mut vrow = st.v.add(c0 * st.vrows + st.j0 * ldv);
        // Four keys per iteration (W is a multiple of 4, so they share a chunk): a longer
        // body lets the compiler hoist value loads past the register file and spill an
        // accumulator (seen with 6x16).
        let chunk = MR * S::W;
        let at = |j: usize| st.s.add(j / S::W * chunk + j % S::W).cast_const();
        let quads = st.kv / 4;
        for q in 0..quads {
            let pc = at(4 * q);
            for u in 0..4 {
                pv_key::<S, MR, V>(&mut acc, pc.add(u), vrow);
                vrow = vrow.add(ldv);
            }
        }
        for j in 4 * quads..st.kv {
            pv_key::<S, MR, V>(&mut acc, at(j), vrow);
            vrow = vrow.add(ldv);
        }
        if st.last {
            for (r, row) in acc.iter_mut().enumerate() {
                let f = S::set1(fin[r]);
                for x in row.iter_mut() {
                    *x = S::mul(*x, f);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            for (v, x) in row.iter().enumerate() {
                S::store(st.o.add(r * ldo + c0 + v * S::W), *x);
            }
        }
    }
}

/// One key of the `P·V` tile: `acc[r] += P[r, key] · V[key, stripe]`, the MR weights at
/// `pc + r·W`, the stripe's V·W values at `vrow`.
///
/// # Safety
/// The CPU supports `S`'s ISA; `pc + r·W` is readable for `r < MR`, `vrow` for `V·W` values.
#[inline(always)]
unsafe fn pv_key<S: Simd, const MR: usize, const V: usize>(
    acc: &mut [[S::V; V]; MR],
    pc: *const f32,
    vrow: *const f32,
) {
    // SAFETY: the caller guarantees the ISA and the extents.
    unsafe {
        let mut bv = [S::zero(); V];
        for (v, x) in bv.iter_mut().enumerate() {
            *x = S::load(vrow.add(v * S::W));
        }
        for (r, row) in acc.iter_mut().enumerate() {
            let p = S::splat(pc.add(r * S::W));
            for v in 0..V {
                row[v] = S::fmadd(p, bv[v], row[v]);
            }
        }
    }
}

/// The row softmax (see [`softmax_row`]).
///
/// # Safety
/// The CPU supports `S`'s ISA; `row` is writable for `n` values; `1 ≤ valid ≤ n`.
#[inline(always)]
unsafe fn softmax_body<S: Simd>(row: *mut f32, n: usize, valid: usize, scale: f32) {
    // SAFETY: the caller guarantees the ISA and the extent; vector accesses cover
    // j..j+W ≤ valid ≤ n, scalar ones j < valid or j < n.
    unsafe {
        let vend = valid / S::W * S::W;
        let sc = S::set1(scale);
        let mut mx = S::set1(f32::NEG_INFINITY);
        for j in (0..vend).step_by(S::W) {
            let x = S::mul(S::load(row.add(j)), sc);
            S::store(row.add(j), x);
            mx = S::max(x, mx);
        }
        let mut m = S::hmax(mx);
        for j in vend..valid {
            *row.add(j) *= scale;
            m = m.max(*row.add(j));
        }
        let mv = S::set1(m);
        let mut sum = S::zero();
        for j in (0..vend).step_by(S::W) {
            let p = exp2_nonpos::<S>(S::sub(S::load(row.add(j)), mv));
            S::store(row.add(j), p);
            sum = S::add(sum, p);
        }
        let mut total = S::hsum(sum);
        for j in vend..valid {
            let p = (*row.add(j) - m).exp2();
            *row.add(j) = p;
            total += p;
        }
        let inv = 1.0 / total;
        let iv = S::set1(inv);
        for j in (0..vend).step_by(S::W) {
            S::store(row.add(j), S::mul(S::load(row.add(j)), iv));
        }
        for j in vend..valid {
            *row.add(j) *= inv;
        }
        for j in valid..n {
            *row.add(j) = 0.0;
        }
    }
}

macro_rules! isa_kernels {
    ($isa:ident, $feat:literal, $step:ident, $softmax:ident) => {
        /// The flash step compiled for this ISA.
        ///
        /// # Safety
        /// The CPU supports the ISA, and `st` satisfies [`step_body`]'s contract.
        #[target_feature(enable = $feat)]
        unsafe fn $step<const MR: usize, const NV: usize, const PV: usize>(st: &Step) {
            // SAFETY: forwarded caller contract; compiled with the features `$isa` needs.
            unsafe { step_body::<$isa, MR, NV, PV>(st) }
        }

        /// The row softmax compiled for this ISA.
        ///
        /// # Safety
        /// The CPU supports the ISA, and the arguments satisfy [`softmax_body`]'s contract.
        #[target_feature(enable = $feat)]
        unsafe fn $softmax(row: *mut f32, n: usize, valid: usize, scale: f32) {
            // SAFETY: forwarded caller contract; compiled with the features `$isa` needs.
            unsafe { softmax_body::<$isa>(row, n, valid, scale) }
        }
    };
}

#[cfg(target_arch = "x86_64")]
isa_kernels!(Avx2, "avx2,fma", step_avx2, softmax_avx2);
#[cfg(target_arch = "x86_64")]
isa_kernels!(Avx512, "avx512f", step_avx512, softmax_avx512);

/// The flash step in plain Rust.
///
/// # Safety
/// `st` satisfies [`step_body`]'s contract.
unsafe fn step_portable<const MR: usize, const NV: usize, const PV: usize>(st: &Step) {
    // SAFETY: forwarded caller contract; `Portable` needs no CPU feature.
    unsafe { step_body::<Portable, MR, NV, PV>(st) }
}

/// The row softmax in plain Rust.
///
/// # Safety
/// The arguments satisfy [`softmax_body`]'s contract.
unsafe fn softmax_portable(row: *mut f32, n: usize, valid: usize, scale: f32) {
    // SAFETY: forwarded caller contract; `Portable` needs no CPU feature.
    unsafe { softmax_body::<Portable>(row, n, valid, scale) }
}

fn tables() -> &'static [AttnTile] {
    static T: OnceLock<Vec<AttnTile>> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = Vec::new();
        // `tails`: kernels of fewer rows with the same NV and PV (the packed value stripes
        // are PV vectors wide), largest first; a tile keeps those below its MR (1 row always
        // among them). Fewer rows always fit the registers the tile's shape fits.
        let mut add = |isa: Isa,
                       lanes: usize,
                       list: &[(usize, usize, usize, StepFn)],
                       tails: &[(usize, usize, usize, StepFn)]| {
            for &(mr, nv, pv, step) in list {
                t.push(AttnTile {
                    name: format!("{}_{mr}x{}", isa.name(), nv * lanes),
                    isa,
                    mr,
                    nr: nv * lanes,
                    pv,
                    lanes,
                    step,
                    tails: tails
                        .iter()
                        .filter(|x| x.1 == nv && x.2 == pv && x.0 < mr)
                        .map(|x| (x.0, x.3))
                        .collect(),
                });
            }
        };
        // Shapes keep the scores tile (MR·NV accumulators + NV key vectors + a broadcast)
        // and the P·V tile (MR·PV accumulators + PV value vectors + a broadcast) within the
        // register file: 16 ymm for AVX2, 32 zmm for AVX-512.
        #[cfg(target_arch = "x86_64")]
        {
            add(
                Isa::Avx512,
                16,
                &[
                    (6, 2, 4, step_avx512::<6, 2, 4>),
                    (8, 2, 3, step_avx512::<8, 2, 3>),
                    (12, 2, 2, step_avx512::<12, 2, 2>),
                    (4, 4, 4, step_avx512::<4, 4, 4>),
                ],
                &[
                    (4, 2, 4, step_avx512::<4, 2, 4>),
                    (2, 2, 4, step_avx512::<2, 2, 4>),
                    (1, 2, 4, step_avx512::<1, 2, 4>),
                    (4, 2, 3, step_avx512::<4, 2, 3>),
                    (2, 2, 3, step_avx512::<2, 2, 3>),
                    (1, 2, 3, step_avx512::<1, 2, 3>),
                    (8, 2, 2, step_avx512::<8, 2, 2>),
                    (4, 2, 2, step_avx512::<4, 2, 2>),
                    (2, 2, 2, step_avx512::<2, 2, 2>),
                    (1, 2, 2, step_avx512::<1, 2, 2>),
                    (2, 4, 4, step_avx512::<2, 4, 4>),
                    (1, 4, 4, step_avx512::<1, 4, 4>),
                ],
            );
            add(
                Isa::Avx2,
                8,
                &[
                    (6, 2, 2, step_avx2::<6, 2, 2>),
                    (4, 2, 3, step_avx2::<4, 2, 3>),
                    (5, 2, 2, step_avx2::<5, 2, 2>),
                    (8, 1, 1, step_avx2::<8, 1, 1>),
                ],
                &[
                    (5, 2, 2, step_avx2::<5, 2, 2>),
                    (4, 2, 2, step_avx2::<4, 2, 2>),
                    (2, 2, 2, step_avx2::<2, 2, 2>),
                    (1, 2, 2, step_avx2::<1, 2, 2>),
                    (2, 2, 3, step_avx2::<2, 2, 3>),
                    (1, 2, 3, step_avx2::<1, 2, 3>),
                    (4, 1, 1, step_avx2::<4, 1, 1>),
                    (2, 1, 1, step_avx2::<2, 1, 1>),
                    (1, 1, 1, step_avx2::<1, 1, 1>),
                ],
            );
        }
        add(
            Isa::Portable,
            8,
            &[
                (4, 2, 2, step_portable::<4, 2, 2>),
                (4, 1, 2, step_portable::<4, 1, 2>),
            ],
            &[
                (2, 2, 2, step_portable::<2, 2, 2>),
                (1, 2, 2, step_portable::<1, 2, 2>),
                (2, 1, 2, step_portable::<2, 1, 2>),
                (1, 1, 2, step_portable::<1, 1, 2>),
            ],
        );
        t
    })
}

/// The tiles offered as knob values where `best` is the best ISA level, best first (as for
/// the GEMM micro-kernels: [`Isa::offered_under`]).
pub fn tiles_offered(best: Isa) -> Vec<&'static AttnTile> {
    tables()
        .iter()
        .filter(|t| t.isa.offered_under(best))
        .collect()
}

/// The tile called `name`, if this CPU can run it (offered or not).
pub fn tile(name: &str) -> Option<&'static AttnTile> {
    tables()
        .iter()
        .find(|t| t.name == name && t.isa.available())
}

/// Every tile this CPU can run.
pub fn tiles_available() -> Vec<&'static AttnTile> {
    tables().iter().filter(|t| t.isa.available()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_row_matches_f64_and_zeroes_the_rest() {
        for (n, valid) in [(1, 1), (7, 3), (8, 8), (37, 37), (100, 61)] {
            let mut row: Vec<f32> = (0..n).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.7).collect();
            let orig = row.clone();
            softmax_row(&mut row, valid, 1.3);
            let m = orig[..valid]
                .iter()
                .map(|x| *x as f64 * 1.3)
                .fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = orig[..valid]
                .iter()
                .map(|x| (*x as f64 * 1.3 - m).exp2())
                .sum();
            for j in 0..valid {
                let want = (orig[j] as f64 * 1.3 - m).exp2() / sum;
                assert!(
                    (row[j] as f64 - want).abs() <= 1e-6 * want + 1e-12,
                    "{n} {valid} {j}"
                );
            }
            assert!(row[valid..].iter().all(|&x| x == 0.0));
        }
    }

    #[test]
    fn key_and_value_packing_match_their_layouts() {
        // Row strides: packed rows (`ld = d`) and rows of a wider matrix (a fused QKV row).
        for (rows, d, j0, kv, nr) in [
            (1usize, 1usize, 0usize, 1usize, 8usize),
            (40, 64, 3, 37, 16),
            (17, 7, 0, 17, 8),
            (33, 80, 8, 25, 16),
            (20, 128, 1, 19, 32),
            (9, 9, 0, 9, 4),
        ] {
            for ld in [d, 3 * d + 5] {
                // Only the last row's end: a strided source need not hold a full last row.
                let k: Vec<f32> = (0..(rows - 1) * ld + d)
                    .map(|i| i as f32 * 0.5 - 3.0)
                    .collect();
                let dp = d.div_ceil(8) * 8;
                let panels = kv.div_ceil(nr);
                let mut out = vec![f32::NAN; panels * nr * dp];
                pack_keys((&k, ld), d, dp, nr, (j0, kv), &mut out);
                for t in 0..panels {
                    for c in 0..dp {
                        for r in 0..nr {
                            let key = t * nr + r;
                            let want = if key < kv && c < d {
                                k[(j0 + key) * ld + c]
                            } else {
                                0.0
                            };
                            let got = out[t * nr * dp + c * nr + r];
                            assert_eq!(got, want, "{rows} {d} {ld} {j0} {kv} {nr}: {t} {c} {r}");
                        }
                    }
                }
            }
        }
        for tile in tiles_available() {
            for (rows, d) in [(5usize, 64usize), (3, 7), (4, 80), (2, 128)] {
                for ld in [d, 2 * d + 3] {
                    let dp = d.div_ceil(tile.lanes) * tile.lanes;
                    let v: Vec<f32> = (0..(rows - 1) * ld + d).map(|i| i as f32).collect();
                    let mut out = vec![f32::NAN; rows * dp];
                    tile.pack_values((&v, ld), d, dp, rows, &mut out);
                    let sw = tile.value_stripe();
                    for j in 0..rows {
                        for c in 0..dp {
                            let (c0, w) = (c / sw * sw, sw.min(dp - c / sw * sw));
                            let want = if c < d { v[j * ld + c] } else { 0.0 };
                            let got = out[c0 * rows + j * w + c - c0];
                            assert_eq!(got, want, "{} {d} {ld}", tile.name);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn tile_names_are_unique_and_lookups_respect_the_cpu() {
        let all = tables();
        for (i, t) in all.iter().enumerate() {
            assert!(all[i + 1..].iter().all(|u| u.name != t.name), "{}", t.name);
            assert_eq!(t.nr % t.lanes, 0);
            // The tails cover any row count (down to 1), largest first.
            assert!(
                t.tails.last().is_some_and(|x| x.0 == 1) || t.mr == 1,
                "{}",
                t.name
            );
            assert!(t.tails.windows(2).all(|w| w[0].0 > w[1].0), "{}", t.name);
        }
        assert!(!tiles_offered(Isa::detect()).is_empty());
        for t in tiles_available() {
            assert!(std::ptr::eq(tile(&t.name).unwrap(), t));
        }
        assert!(tile("avx2_7x7").is_none());
    }
}
