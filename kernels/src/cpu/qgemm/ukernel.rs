//! The `u8 × s8 → i32` micro-kernels of the int8 GEMM: one `MR × NR` tile of exact integer
//! dot products over the whole (padded) depth, per ISA, and the safe, bounds-checked entry
//! point the driver calls. All `unsafe` code of the int8 family lives here.
//!
//! - `avx512vnni_*`: `vpdpbusd` (AVX512_VNNI): four `u8·s8` products summed into each i32 lane
//!   per instruction; activation codes use all 8 bits.
//! - `avxvnni_*`: `vpdpbusd` in its VEX form (AVX-VNNI: Intel client cores from Alder Lake,
//!   Sierra Forest), 8 lanes; 8-bit activation codes. Offered only where AVX512_VNNI is not
//!   ([`crate::hardware`] reports `avxvnni` only there): the 16-lane form is at least as
//!   fast where both exist, so Zen 5 and Sapphire Rapids run these only capped at AVX2.
//! - `avx2_*`: `vpmaddubsw` then `vpmaddwd` by ones. `vpmaddubsw` saturates its pair sums to
//!   i16; with activation codes kept below 128 (`max_code` 127) a pair sum is at most
//!   `2·127·127 = 32258 < 32767`, so nothing saturates and the result is exact — at the price
//!   of one bit of activation precision, which the accuracy check of every record measures.
//! - `amx_*`: `tdpbusd` on AMX tiles (Sapphire Rapids and later, where the OS granted the
//!   tile state), in several tile arrangements (`qgemm::amx`); 8-bit activation codes.
//! - `portable_*`: scalar, for every other CPU (and as the reference shape of the others).

#[cfg(target_arch = "x86_64")]
use super::amx;
#[cfg(target_arch = "x86_64")]
use crate::cpu::amx::AsmTiles;
use crate::cpu::Isa;

/// `(kp, a, lda, b_panel, acc, accumulate)`:
/// `acc[r·NR + c] (+)= Σ_{p<kp} a[r·lda + p] · b[(p/4·NR + c)·4 + p%4]`.
pub(super) type DotFn = unsafe fn(usize, *const u8, usize, *const i8, *mut i32, bool);

/// [`DotFn`] for `tiles` row tiles stacked (the last argument): tile `t`'s rows at
/// `a + t·MR·lda`, its sums at `acc + t·MR·NR`, against the same panel.
pub(super) type DotsFn = unsafe fn(usize, *const u8, usize, *const i8, *mut i32, bool, usize);

/// How a kernel is called.
#[derive(Debug, Clone, Copy)]
pub(super) enum Entry {
    /// A tile per call.
    One(DotFn),
    /// A run of row tiles per call, for kernels with a per-call cost worth sharing (AMX:
    /// `ldtilecfg` and `tilerelease` once per run instead of once per tile).
    Many(DotsFn),
}

/// One micro-kernel: its name (the `ukernel` knob's value), tile shape, the largest
/// activation code it is exact for, and the ISA it needs.
#[derive(Debug)]
pub struct DotKernel {
    /// The `ukernel` knob's value, e.g. `avx512vnni_8x48`.
    pub name: &'static str,
    /// Rows of the tile.
    pub mr: usize,
    /// Columns of the tile: the panel width of [`QuantB`](super::quant::QuantB).
    pub nr: usize,
    /// 255, or 127 for kernels that sum `u8·s8` pairs in i16.
    pub max_code: u8,
    /// The ISA level it needs (checked at run time).
    pub isa: Isa,
    /// The fingerprint flag it needs besides its ISA level (`avx512vnni`, `amx_int8`),
    /// checked at run time with the ISA.
    pub needs: Option<&'static str>,
    entry: Entry,
}

/// Every int8 micro-kernel of this build, best first within an ISA.
pub static KERNELS: &[DotKernel] = &[
    // 8×48 first (24 accumulators; 8 broadcasts and 3 loads per 24 `vpdpbusd`; 128-row and
    // 768-column BERT shapes split into whole tiles): against 8×32 on the Zen 4,
    // `gemm_speed --vs`, 41 alternating pairs each, 1 and 2 threads: 1.00–1.03× on the M = 128
    // BERT shapes, 1.03× at 1024³ one thread. 6×64 (1.04–1.07× at 1024³ one thread, 0.97–1.01×
    // at M = 128: a partial last row tile) is for tuning to pick.
    #[cfg(target_arch = "x86_64")]
    vnni("avx512vnni_8x48", 8, 48, x86::vnni::<8, 3>),
    #[cfg(target_arch = "x86_64")]
    vnni("avx512vnni_8x32", 8, 32, x86::vnni::<8, 2>),
    #[cfg(target_arch = "x86_64")]
    vnni("avx512vnni_6x64", 6, 64, x86::vnni::<6, 4>),
    #[cfg(target_arch = "x86_64")]
    vnni("avx512vnni_6x48", 6, 48, x86::vnni::<6, 3>),
    #[cfg(target_arch = "x86_64")]
    vnni("avx512vnni_4x64", 4, 64, x86::vnni::<4, 4>),
    // Few rows (decoding, GEMV): no padded rows in the tile.
    #[cfg(target_arch = "x86_64")]
    vnni("avx512vnni_2x64", 2, 64, x86::vnni::<2, 4>),
    #[cfg(target_arch = "x86_64")]
    vnni("avx512vnni_1x64", 1, 64, x86::vnni::<1, 4>),
    // AMX: after the VNNI kernels, so defaults stay on VNNI; tuning picks them.
    #[cfg(target_arch = "x86_64")]
    amx("amx_32x32", 32, 32, amx::dot::<AsmTiles, amx::Square, 16>),
    #[cfg(target_arch = "x86_64")]
    amx("amx_16x64", 16, 64, amx::dot::<AsmTiles, amx::Wide, 16>),
    #[cfg(target_arch = "x86_64")]
    amx("amx_64x16", 64, 16, amx::dot::<AsmTiles, amx::Tall, 16>),
    #[cfg(target_arch = "x86_64")]
    amx("amx_8x64", 8, 64, amx::dot::<AsmTiles, amx::Wide, 8>),
    // AVX-VNNI: before the AVX2 kernels of the same level, so defaults take it where it runs.
    #[cfg(target_arch = "x86_64")]
    avxvnni("avxvnni_4x16", 4, 16, x86::avxvnni::<4, 2>),
    #[cfg(target_arch = "x86_64")]
    avxvnni("avxvnni_6x16", 6, 16, x86::avxvnni::<6, 2>),
    #[cfg(target_arch = "x86_64")]
    avxvnni("avxvnni_2x32", 2, 32, x86::avxvnni::<2, 4>),
    #[cfg(target_arch = "x86_64")]
    avxvnni("avxvnni_1x32", 1, 32, x86::avxvnni::<1, 4>),
    #[cfg(target_arch = "x86_64")]
    avx2("avx2_4x16", 4, 16, x86::maddubs::<4, 2>),
    #[cfg(target_arch = "x86_64")]
    avx2("avx2_6x16", 6, 16, x86::maddubs::<6, 2>),
    #[cfg(target_arch = "x86_64")]
    avx2("avx2_2x32", 2, 32, x86::maddubs::<2, 4>),
    #[cfg(target_arch = "x86_64")]
    avx2("avx2_1x32", 1, 32, x86::maddubs::<1, 4>),
    DotKernel::new(
        "portable_4x8",
        4,
        8,
        255,
        Isa::Portable,
        None,
        Entry::One(portable::<4, 8>),
    ),
];

/// An AVX512_VNNI kernel (8-bit activation codes).
#[cfg(target_arch = "x86_64")]
const fn vnni(name: &'static str, mr: usize, nr: usize, f: DotFn) -> DotKernel {
    DotKernel::new(
        name,
        mr,
        nr,
        255,
        Isa::Avx512,
        Some("avx512vnni"),
        Entry::One(f),
    )
}

/// An AMX-INT8 kernel (8-bit activation codes; AMX CPUs all have AVX-512, whose ISA cap
/// turns AMX off too).
#[cfg(target_arch = "x86_64")]
const fn amx(name: &'static str, mr: usize, nr: usize, f: DotsFn) -> DotKernel {
    DotKernel::new(
        name,
        mr,
        nr,
        255,
        Isa::Avx512,
        Some("amx_int8"),
        Entry::Many(f),
    )
}

/// An AVX-VNNI kernel (VEX `vpdpbusd` on 256-bit vectors; 8-bit activation codes).
#[cfg(target_arch = "x86_64")]
const fn avxvnni(name: &'static str, mr: usize, nr: usize, f: DotFn) -> DotKernel {
    DotKernel::new(name, mr, nr, 255, Isa::Avx2, Some("avxvnni"), Entry::One(f))
}

/// An AVX2 kernel (7-bit activation codes: see the module docs).
#[cfg(target_arch = "x86_64")]
const fn avx2(name: &'static str, mr: usize, nr: usize, f: DotFn) -> DotKernel {
    DotKernel::new(name, mr, nr, 127, Isa::Avx2, None, Entry::One(f))
}

impl DotKernel {
    pub(super) const fn new(
        name: &'static str,
        mr: usize,
        nr: usize,
        max_code: u8,
        isa: Isa,
        needs: Option<&'static str>,
        entry: Entry,
    ) -> DotKernel {
        DotKernel {
            name,
            mr,
            nr,
            max_code,
            isa,
            needs,
            entry,
        }
    }

    /// Whether [`DotKernel::tiles`] does a run of row tiles in one call (else the driver
    /// keeps to one tile per call, each dequantised while its sums are in L1).
    pub fn batches(&self) -> bool {
        matches!(self.entry, Entry::Many(_))
    }

    /// Whether this CPU (and OS, for AMX) runs it.
    pub fn available(&self) -> bool {
        self.isa.available()
            && match self.needs {
                None => true,
                Some("avx512vnni") => has_vnni(),
                Some("avxvnni") => has_avxvnni(),
                Some("amx_int8") => has_amx_int8(),
                Some(_) => false,
            }
    }

    /// The kernel called `name`, if this CPU runs it.
    pub fn by_name(name: &str) -> Option<&'static DotKernel> {
        KERNELS
            .iter()
            .find(|k| k.name == name)
            .filter(|k| k.available())
    }

    /// One `mr × nr` tile: `acc[r·nr + c] = Σ_p a[r·lda + p] · (panel's code of depth p,
    /// column c)`, added to `acc`'s values when `accumulate` (a later depth block). Panics if
    /// an extent does not fit or a code exceeds [`DotKernel::max_code`] (the bound that keeps
    /// the result exact).
    pub fn tile(
        &self,
        kp: usize,
        a: &[u8],
        lda: usize,
        panel: &[i8],
        acc: &mut [i32],
        accumulate: bool,
    ) {
        self.tiles(kp, a, lda, panel, acc, accumulate, 1);
    }

    /// `tiles` row tiles against one panel: tile `t` is [`DotKernel::tile`] on rows
    /// `t·mr..(t+1)·mr` of `a` (`lda` apart) into `acc[t·mr·nr..]`. One call for kernels
    /// that [batch](DotKernel::batches), a call per tile otherwise. Panics as `tile` does.
    #[allow(clippy::too_many_arguments)]
    pub fn tiles(
        &self,
        kp: usize,
        a: &[u8],
        lda: usize,
        panel: &[i8],
        acc: &mut [i32],
        accumulate: bool,
        tiles: usize,
    ) {
        self.check(kp, (a, lda), panel, acc, tiles);
        let (mr, nr) = (self.mr, self.nr);
        let (a, b, acc) = (a.as_ptr(), panel.as_ptr(), acc.as_mut_ptr());
        // SAFETY: `check` asserted that this CPU runs the kernel (ISA, VNNI, AMX grant) and
        // the extents it reads (`tiles·mr` rows of `kp` codes `lda` apart, `kp·nr` panel
        // codes) and writes (`tiles·mr·nr` accumulators); tile `t` starts `t·mr` rows and
        // `t·mr·nr` accumulators in.
        unsafe {
            match self.entry {
                Entry::Many(f) => f(kp, a, lda, b, acc, accumulate, tiles),
                Entry::One(f) => {
                    for t in 0..tiles {
                        let (at, acc) = (a.add(t * mr * lda), acc.add(t * mr * nr));
                        f(kp, at, lda, b, acc, accumulate);
                    }
                }
            }
        }
    }

    /// Panics unless this CPU runs the kernel and `tiles` row tiles fit: the depth padded to
    /// 4 within the row stride, `tiles·mr` rows of `a`, `kp·nr` panel codes, `tiles·mr·nr`
    /// accumulators (and, in debug builds, every code within [`DotKernel::max_code`]).
    fn check(&self, kp: usize, (a, lda): (&[u8], usize), panel: &[i8], acc: &[i32], tiles: usize) {
        let (mr, nr) = (self.mr, self.nr);
        assert!(
            kp.is_multiple_of(4) && lda >= kp,
            "depth padded to 4, within the row stride"
        );
        assert!(
            a.len() >= (tiles * mr - 1) * lda + kp,
            "A tile out of bounds"
        );
        assert!(panel.len() >= kp * nr, "B panel out of bounds");
        assert!(
            acc.len() >= tiles * mr * nr,
            "accumulator tile out of bounds"
        );
        debug_assert!(a.iter().all(|&c| c <= self.max_code), "code above max_code");
        assert!(self.available(), "{} does not run on this CPU", self.name);
    }
}

/// [`quantize_rows`](super::quant::quantize_rows), compiled for AVX-512 or AVX2 + FMA where
/// this CPU runs them (vector rounding, min/max and conversions, 16 or 8 lanes; the baseline
/// build has no vector rounding and calls libm per value).
pub fn quantize_rows_fast(
    a: &[f32],
    k: usize,
    scheme: super::quant::AQuant,
    max_code: u8,
    q: &mut super::quant::QuantA,
) {
    #[cfg(target_arch = "x86_64")]
    if Isa::Avx512.available() {
        // SAFETY: `available()` checked that this CPU runs AVX-512F and AVX512BW (and AVX2
        // and FMA, which the level includes).
        return unsafe { x86::quantize_rows_avx512(a, k, scheme, max_code, q) };
    }
    #[cfg(target_arch = "x86_64")]
    if Isa::Avx2.available() {
        // SAFETY: `available()` checked that this CPU runs AVX2 (and FMA, which the level
        // includes).
        return unsafe { x86::quantize_rows_avx2(a, k, scheme, max_code, q) };
    }
    super::quant::quantize_rows(a, k, scheme, max_code, q)
}

/// [`codes`](super::quant::codes) of a weight, compiled for AVX2 + FMA where this CPU runs
/// them (rounding in registers instead of a libm call per weight).
pub fn codes_fast(b: &[f32], inv: &[f32], q: &mut super::quant::QuantB) {
    #[cfg(target_arch = "x86_64")]
    if Isa::Avx2.available() {
        // SAFETY: `available()` checked that this CPU runs AVX2 (and FMA, which the level
        // includes).
        return unsafe { x86::codes_avx2(b, inv, q) };
    }
    super::quant::codes(b, inv, q)
}

/// [`dequantize`](super::quant::dequantize), compiled for AVX-512 or AVX2 where this CPU runs
/// them (the baseline build has no 32-bit vector multiply and a quarter of AVX-512's width).
pub fn dequantize_fast(
    a: (&[f32], &[i32]),
    b: (&[i32], &[f32]),
    acc: (&[i32], usize),
    c: &mut [f32],
    at: (usize, usize),
) {
    #[cfg(target_arch = "x86_64")]
    if Isa::Avx512.available() {
        // SAFETY: `available()` checked that this CPU runs AVX-512F and AVX512BW (and AVX2
        // and FMA, which the level includes).
        return unsafe { x86::dequantize_avx512(a, b, acc, c, at) };
    }
    #[cfg(target_arch = "x86_64")]
    if Isa::Avx2.available() {
        // SAFETY: `available()` checked that this CPU runs AVX2 (and FMA, which the level
        // includes).
        return unsafe { x86::dequantize_avx2(a, b, acc, c, at) };
    }
    super::quant::dequantize(a, b, acc, c, at)
}

/// Whether this process may run AMX-INT8 (the CPU has it, Linux granted the tile data
/// state, the ISA cap allows AVX-512): [`crate::cpu::amx::granted`].
pub fn has_amx_int8() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::cpu::amx::granted("amx_int8")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the CPU has AVX512_VNNI (and the ISA cap allows AVX-512), detected once.
pub fn has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static VNNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *VNNI.get_or_init(|| {
            Isa::Avx512.available() && std::arch::is_x86_feature_detected!("avx512vnni")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the CPU has AVX-VNNI (and the ISA cap allows AVX2), detected once.
pub fn has_avxvnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AVXVNNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVXVNNI
            .get_or_init(|| Isa::Avx2.available() && std::arch::is_x86_feature_detected!("avxvnni"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The scalar kernel.
///
/// # Safety
/// `a` is readable for `MR` rows of `kp` values `lda` apart, `b` for `kp·NR` values, `acc`
/// readable and writable for `MR·NR` values.
unsafe fn portable<const MR: usize, const NR: usize>(
    kp: usize,
    a: *const u8,
    lda: usize,
    b: *const i8,
    acc: *mut i32,
    accumulate: bool,
) {
    // SAFETY: the extents are the caller's contract (see above).
    let (a, b, acc) = unsafe {
        (
            std::slice::from_raw_parts(a, (MR - 1) * lda + kp),
            std::slice::from_raw_parts(b, kp * NR),
            std::slice::from_raw_parts_mut(acc, MR * NR),
        )
    };
    let mut t = [[0i32; NR]; MR];
    if accumulate {
        for (r, row) in t.iter_mut().enumerate() {
            row.copy_from_slice(&acc[r * NR..(r + 1) * NR]);
        }
    }
    for g in 0..kp / 4 {
        let bg = &b[g * NR * 4..(g + 1) * NR * 4];
        for (r, row) in t.iter_mut().enumerate() {
            let a4 = &a[r * lda + 4 * g..r * lda + 4 * g + 4];
            for (c, x) in row.iter_mut().enumerate() {
                let b4 = &bg[c * 4..c * 4 + 4];
                *x += (0..4).map(|i| a4[i] as i32 * b4[i] as i32).sum::<i32>();
            }
        }
    }
    for (r, row) in t.iter().enumerate() {
        acc[r * NR..(r + 1) * NR].copy_from_slice(row);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::quant::{quantize_rows, AQuant, QuantA};

    /// [`quantize_rows`] with AVX2 + FMA enabled (it is `#[inline(always)]`, so its body is
    /// compiled here, vectorised).
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn quantize_rows_avx2(
        a: &[f32],
        k: usize,
        scheme: AQuant,
        max_code: u8,
        q: &mut QuantA,
    ) {
        quantize_rows(a, k, scheme, max_code, q)
    }

    /// [`quantize_rows`] with AVX-512F/BW (and AVX2 + FMA) enabled: 16 lanes.
    ///
    /// # Safety
    /// The CPU has AVX-512F, AVX512BW, AVX2 and FMA.
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
    pub(super) unsafe fn quantize_rows_avx512(
        a: &[f32],
        k: usize,
        scheme: AQuant,
        max_code: u8,
        q: &mut QuantA,
    ) {
        quantize_rows(a, k, scheme, max_code, q)
    }

    /// [`codes`](super::super::quant::codes) with AVX2 + FMA enabled (it is
    /// `#[inline(always)]`, so its body is compiled here).
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn codes_avx2(b: &[f32], inv: &[f32], q: &mut super::super::quant::QuantB) {
        super::super::quant::codes(b, inv, q)
    }

    /// [`dequantize`](super::super::quant::dequantize) with AVX2 + FMA enabled (it is
    /// `#[inline(always)]`, so its body is compiled here, vectorised).
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dequantize_avx2(
        a: (&[f32], &[i32]),
        b: (&[i32], &[f32]),
        acc: (&[i32], usize),
        c: &mut [f32],
        at: (usize, usize),
    ) {
        super::super::quant::dequantize(a, b, acc, c, at)
    }

    /// [`dequantize`](super::super::quant::dequantize) with AVX-512F/BW (and AVX2 + FMA)
    /// enabled: 16 lanes.
    ///
    /// # Safety
    /// The CPU has AVX-512F, AVX512BW, AVX2 and FMA.
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
    pub(super) unsafe fn dequantize_avx512(
        a: (&[f32], &[i32]),
        b: (&[i32], &[f32]),
        acc: (&[i32], usize),
        c: &mut [f32],
        at: (usize, usize),
    ) {
        super::super::quant::dequantize(a, b, acc, c, at)
    }

    /// The vector width a kernel works in: loads, stores and broadcasts of i32 lanes.
    trait Lanes {
        type V: Copy;
        /// i32 lanes per vector.
        const LANES: usize;
        unsafe fn zero() -> Self::V;
        unsafe fn load(p: *const i32) -> Self::V;
        unsafe fn load_b(p: *const i8) -> Self::V;
        /// The 4 bytes at `p` in every lane.
        unsafe fn splat4(p: *const u8) -> Self::V;
        unsafe fn store(p: *mut i32, v: Self::V);
    }

    /// One `u8·s8` dot step of an ISA: every i32 lane of `acc` gains the sum of four
    /// products of the 4 bytes of `a` (the same in every lane) and the lane's 4 bytes of `b`.
    trait Dot4 {
        type L: Lanes;
        unsafe fn dot(acc: Dv<Self>, a: Dv<Self>, b: Dv<Self>) -> Dv<Self>;
    }

    /// The vector type of a [`Dot4`].
    type Dv<D> = <<D as Dot4>::L as Lanes>::V;

    /// 256-bit vectors (AVX2), 8 lanes.
    struct Ymm;

    impl Lanes for Ymm {
        type V = __m256i;
        const LANES: usize = 8;
        #[inline(always)]
        unsafe fn zero() -> __m256i {
            // SAFETY: AVX2 is available (caller contract).
            unsafe { _mm256_setzero_si256() }
        }
        #[inline(always)]
        unsafe fn load(p: *const i32) -> __m256i {
            // SAFETY: AVX2; `p` readable for 8 i32 (caller contract).
            unsafe { _mm256_loadu_si256(p.cast()) }
        }
        #[inline(always)]
        unsafe fn load_b(p: *const i8) -> __m256i {
            // SAFETY: AVX2; `p` readable for 32 bytes (caller contract).
            unsafe { _mm256_loadu_si256(p.cast()) }
        }
        #[inline(always)]
        unsafe fn splat4(p: *const u8) -> __m256i {
            // SAFETY: AVX2; `p` readable for 4 bytes (caller contract).
            unsafe { _mm256_set1_epi32(p.cast::<i32>().read_unaligned()) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut i32, v: __m256i) {
            // SAFETY: AVX2; `p` writable for 8 i32 (caller contract).
            unsafe { _mm256_storeu_si256(p.cast(), v) }
        }
    }

    /// 512-bit vectors (AVX-512F), 16 lanes.
    struct Zmm;

    impl Lanes for Zmm {
        type V = __m512i;
        const LANES: usize = 16;
        #[inline(always)]
        unsafe fn zero() -> __m512i {
            // SAFETY: AVX-512F is available (caller contract).
            unsafe { _mm512_setzero_si512() }
        }
        #[inline(always)]
        unsafe fn load(p: *const i32) -> __m512i {
            // SAFETY: AVX-512F; `p` readable for 16 i32 (caller contract).
            unsafe { _mm512_loadu_si512(p.cast()) }
        }
        #[inline(always)]
        unsafe fn load_b(p: *const i8) -> __m512i {
            // SAFETY: AVX-512F; `p` readable for 64 bytes (caller contract).
            unsafe { _mm512_loadu_si512(p.cast()) }
        }
        #[inline(always)]
        unsafe fn splat4(p: *const u8) -> __m512i {
            // SAFETY: AVX-512F; `p` readable for 4 bytes (caller contract).
            unsafe { _mm512_set1_epi32(p.cast::<i32>().read_unaligned()) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut i32, v: __m512i) {
            // SAFETY: AVX-512F; `p` writable for 16 i32 (caller contract).
            unsafe { _mm512_storeu_si512(p.cast(), v) }
        }
    }

    /// `vpdpbusd` (AVX512_VNNI), 16 lanes.
    struct Vnni;

    impl Dot4 for Vnni {
        type L = Zmm;
        #[inline(always)]
        unsafe fn dot(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
            // SAFETY: AVX-512F and AVX512_VNNI are available (caller contract).
            unsafe { _mm512_dpbusd_epi32(acc, a, b) }
        }
    }

    /// `vpdpbusd` in its VEX form (AVX-VNNI), 8 lanes.
    struct AvxVnni;

    impl Dot4 for AvxVnni {
        type L = Ymm;
        #[inline(always)]
        unsafe fn dot(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: AVX-VNNI is available (caller contract).
            unsafe { _mm256_dpbusd_avx_epi32(acc, a, b) }
        }
    }

    /// `vpmaddubsw` + `vpmaddwd` by ones (AVX2), 8 lanes: exact while activation codes stay
    /// below 128 (see the module docs).
    struct Maddubs;

    impl Dot4 for Maddubs {
        type L = Ymm;
        #[inline(always)]
        unsafe fn dot(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: AVX2 is available (caller contract).
            unsafe {
                let pairs = _mm256_maddubs_epi16(a, b);
                _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
            }
        }
    }

    /// The `MR × LANES·NV` tile of any [`Dot4`] on its vectors `L`: per group of 4 depths, `NV` vectors of B,
    /// `MR` broadcasts of A, `MR·NV` dot steps.
    ///
    /// # Safety
    /// The CPU runs `D`'s ISA; extents as for [`super::portable`] with `NR = LANES·NV`.
    #[inline(always)]
    unsafe fn body<D: Dot4<L = L>, L: Lanes, const MR: usize, const NV: usize>(
        kp: usize,
        a: *const u8,
        lda: usize,
        b: *const i8,
        acc: *mut i32,
        accumulate: bool,
    ) {
        let nr = L::LANES * NV;
        // SAFETY (whole body): the ISA and the extents are the caller's contract; every read
        // is at `a + r·lda + 4g` (4 bytes, g < kp/4, r < MR) or `b + (g·nr + LANES·v)·4`
        // (one vector, v < NV), every read (when accumulating) and write at
        // `acc + r·nr + LANES·v` (one vector of i32).
        unsafe {
            let mut t = [[L::zero(); NV]; MR];
            if accumulate {
                for (r, row) in t.iter_mut().enumerate() {
                    for (v, x) in row.iter_mut().enumerate() {
                        *x = L::load(acc.add(r * nr + L::LANES * v));
                    }
                }
            }
            for g in 0..kp / 4 {
                let bg = b.add(g * nr * 4);
                let bv: [L::V; NV] = std::array::from_fn(|v| L::load_b(bg.add(v * L::LANES * 4)));
                for (r, row) in t.iter_mut().enumerate() {
                    let a4 = L::splat4(a.add(r * lda + 4 * g));
                    for (x, bv) in row.iter_mut().zip(&bv) {
                        *x = D::dot(*x, a4, *bv);
                    }
                }
            }
            for (r, row) in t.iter().enumerate() {
                for (v, x) in row.iter().enumerate() {
                    L::store(acc.add(r * nr + L::LANES * v), *x);
                }
            }
        }
    }

    /// `MR × 16·NV` tile with `vpdpbusd`.
    ///
    /// # Safety
    /// The CPU has AVX-512F and AVX512_VNNI; extents as for [`super::portable`] with
    /// `NR = 16·NV`.
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub(super) unsafe fn vnni<const MR: usize, const NV: usize>(
        kp: usize,
        a: *const u8,
        lda: usize,
        b: *const i8,
        acc: *mut i32,
        accumulate: bool,
    ) {
        // SAFETY: this function's contract, with the ISA enabled here.
        unsafe { body::<Vnni, Zmm, MR, NV>(kp, a, lda, b, acc, accumulate) }
    }

    /// `MR × 8·NV` tile with VEX `vpdpbusd`.
    ///
    /// # Safety
    /// The CPU has AVX2 and AVX-VNNI; extents as for [`super::portable`] with `NR = 8·NV`.
    #[target_feature(enable = "avx2,avxvnni")]
    pub(super) unsafe fn avxvnni<const MR: usize, const NV: usize>(
        kp: usize,
        a: *const u8,
        lda: usize,
        b: *const i8,
        acc: *mut i32,
        accumulate: bool,
    ) {
        // SAFETY: this function's contract, with the ISA enabled here.
        unsafe { body::<AvxVnni, Ymm, MR, NV>(kp, a, lda, b, acc, accumulate) }
    }

    /// `MR × 8·NV` tile with `vpmaddubsw` + `vpmaddwd` (activation codes ≤ 127: exact).
    ///
    /// # Safety
    /// The CPU has AVX2; extents as for [`super::portable`] with `NR = 8·NV`; every activation
    /// code is at most 127.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn maddubs<const MR: usize, const NV: usize>(
        kp: usize,
        a: *const u8,
        lda: usize,
        b: *const i8,
        acc: *mut i32,
        accumulate: bool,
    ) {
        // SAFETY: this function's contract, with the ISA enabled here.
        unsafe { body::<Maddubs, Ymm, MR, NV>(kp, a, lda, b, acc, accumulate) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// Every kernel this CPU runs equals the exact integer product, including the extreme
    /// codes that would saturate a careless `vpmaddubsw` (255 · 127 pairs).
    #[test]
    fn every_available_kernel_is_exact() {
        let mut rng = Rng::new(9);
        for k in KERNELS {
            if !k.available() {
                let feature = k.needs.unwrap_or(k.isa.name());
                let why = format!("no {feature} on this CPU");
                crate::testing::skipped(k.name, feature, &why);
                continue;
            }
            for kp in [4, 8, 64, 772] {
                let lda = kp + 4;
                for extreme in [false, true] {
                    let top = k.max_code as u64;
                    let a: Vec<u8> = (0..k.mr * lda)
                        .map(|_| {
                            if extreme {
                                top as u8
                            } else {
                                rng.below(top + 1) as u8
                            }
                        })
                        .collect();
                    // Extreme: ±127 by column, so whole pairs saturate both ways.
                    let b: Vec<i8> = (0..kp * k.nr)
                        .map(|i| match (extreme, i / 4 % 2) {
                            (true, 0) => 127,
                            (true, _) => -127,
                            (false, _) => (rng.below(255) as i32 - 127) as i8,
                        })
                        .collect();
                    let mut acc = vec![0i32; k.mr * k.nr];
                    k.tile(kp, &a, lda, &b, &mut acc, false);
                    // A second pass accumulates: twice the product.
                    let once = acc.clone();
                    k.tile(kp, &a, lda, &b, &mut acc, true);
                    assert!(
                        acc.iter().zip(&once).all(|(x, y)| *x == 2 * y),
                        "{}",
                        k.name
                    );
                    k.tile(kp, &a, lda, &b, &mut acc, false);
                    for r in 0..k.mr {
                        for c in 0..k.nr {
                            let want: i32 = (0..kp)
                                .map(|p| {
                                    a[r * lda + p] as i32 * b[(p / 4 * k.nr + c) * 4 + p % 4] as i32
                                })
                                .sum();
                            assert_eq!(acc[r * k.nr + c], want, "{} kp {kp} ({r}, {c})", k.name);
                        }
                    }
                }
            }
        }
    }
}
