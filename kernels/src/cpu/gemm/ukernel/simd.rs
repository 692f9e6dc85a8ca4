//! The small SIMD vocabulary the micro-kernel bodies are written in, and the two generic
//! bodies (packed and direct) that every ISA instantiates.
//!
//! The bodies are `#[inline(always)]` and generic over [`Simd`] and the tile shape, so each
//! ISA module only wraps them in a `#[target_feature]` function: after inlining, the
//! intrinsics sit inside a function compiled for that ISA and the accumulator arrays, whose
//! sizes are compile-time constants, are promoted to registers.

/// One SIMD register type and the handful of operations a GEMM micro-kernel needs.
///
/// Implementations are zero-sized markers; every method is `#[inline(always)]` and must only
/// be called from code compiled with (or inlined into) the matching target features.
pub(crate) trait Simd {
    /// The register type.
    type V: Copy;
    /// Lanes per register.
    const W: usize;

    /// All lanes zero.
    ///
    /// # Safety
    /// The CPU supports the implementation's ISA.
    unsafe fn zero() -> Self::V;
    /// All lanes set to `*p`.
    ///
    /// # Safety
    /// The CPU supports the ISA; `p` is valid for reading one `f32`.
    unsafe fn splat(p: *const f32) -> Self::V;
    /// `W` lanes from `p` (no alignment needed).
    ///
    /// # Safety
    /// The CPU supports the ISA; `p` is valid for reading `W` `f32`s.
    unsafe fn load(p: *const f32) -> Self::V;
    /// Stores `W` lanes to `p` (no alignment needed).
    ///
    /// # Safety
    /// The CPU supports the ISA; `p` is valid for writing `W` `f32`s.
    unsafe fn store(p: *mut f32, v: Self::V);
    /// `a * b + c`, fused where the ISA has FMA.
    ///
    /// # Safety
    /// The CPU supports the ISA.
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `a + b`.
    ///
    /// # Safety
    /// The CPU supports the ISA.
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// Hints that the cache line holding `p` will be read soon (never faults).
    #[inline(always)]
    fn prefetch(p: *const f32) {
        let _ = p;
    }
}

/// Packed micro-kernel: `C[MR × NV·W] (+)= A_panel · B_panel`.
///
/// `a` is a packed A micro-panel (`k` groups of `MR` values, one per row), `b` a packed B
/// micro-panel (`k` groups of `NV·W` values). With `accumulate` the tile is added to C,
/// otherwise C is overwritten.
///
/// # Safety
/// The CPU supports `S`'s ISA; `a` is readable for `k·MR` values, `b` for `k·NV·W` values,
/// and `c + r·ldc + j` is writable for every `r < MR`, `j < NV·W`.
#[inline(always)]
pub(crate) unsafe fn packed_body<S: Simd, const MR: usize, const NV: usize>(
    k: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    let nr = NV * S::W;
    // SAFETY (whole body): the caller guarantees the ISA and the extents documented above;
    // every pointer below stays inside them (p < k, r < MR, v < NV).
    unsafe {
        // Fetch the C tile while the k loop runs: its rows are a whole row stride apart and
        // would otherwise miss in every cache at the final update.
        for r in 0..MR {
            S::prefetch(c.add(r * ldc));
            S::prefetch(c.add(r * ldc + nr - 1));
        }
        let mut acc = [[S::zero(); NV]; MR];
        let (mut a, mut b) = (a, b);
        for _ in 0..k / 4 {
            packed_step::<S, MR, NV>(&mut acc, a, b);
            packed_step::<S, MR, NV>(&mut acc, a.add(MR), b.add(nr));
            packed_step::<S, MR, NV>(&mut acc, a.add(2 * MR), b.add(2 * nr));
            packed_step::<S, MR, NV>(&mut acc, a.add(3 * MR), b.add(3 * nr));
            a = a.add(4 * MR);
            b = b.add(4 * nr);
        }
        for _ in 0..k % 4 {
            packed_step::<S, MR, NV>(&mut acc, a, b);
            a = a.add(MR);
            b = b.add(nr);
        }
        for (r, row) in acc.iter().enumerate() {
            let cr = c.add(r * ldc);
            for (v, x) in row.iter().enumerate() {
                let p = cr.add(v * S::W);
                let x = if accumulate {
                    S::add(S::load(p), *x)
                } else {
                    *x
                };
                S::store(p, x);
            }
        }
    }
}

/// One k step of [`packed_body`]: NV vectors of B, MR broadcasts of A, MR·NV FMAs.
///
/// # Safety
/// The CPU supports `S`'s ISA; `a` is readable for `MR` values and `b` for `NV·W` values.
#[inline(always)]
unsafe fn packed_step<S: Simd, const MR: usize, const NV: usize>(
    acc: &mut [[S::V; NV]; MR],
    a: *const f32,
    b: *const f32,
) {
    // SAFETY: the caller guarantees the ISA and the extents (r < MR, v < NV).
    unsafe {
        let mut bv = [S::zero(); NV];
        for (v, x) in bv.iter_mut().enumerate() {
            *x = S::load(b.add(v * S::W));
        }
        for (r, row) in acc.iter_mut().enumerate() {
            let ar = S::splat(a.add(r));
            for v in 0..NV {
                row[v] = S::fmadd(ar, bv[v], row[v]);
            }
        }
    }
}

/// Direct (unpacked) micro-kernel: `C[R × V·W] (+)= A[R × k] · B[k × V·W]`, reading row-major
/// A (row stride `lda`) and B (row stride `ldb`) in place.
///
/// # Safety
/// The CPU supports `S`'s ISA; `a + r·lda + p` is readable for `r < R`, `p < k`;
/// `b + p·ldb + j` is readable for `p < k`, `j < V·W`; `c + r·ldc + j` is writable for
/// `r < R`, `j < V·W`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn direct_body<S: Simd, const R: usize, const V: usize>(
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    // SAFETY (whole body): the caller guarantees the ISA and the extents documented above;
    // every pointer below stays inside them (p < k, r < R, v < V).
    unsafe {
        let mut acc = [[S::zero(); V]; R];
        let mut b = b;
        for p in 0..k {
            let mut bv = [S::zero(); V];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = S::load(b.add(v * S::W));
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let ar = S::splat(a.add(r * lda + p));
                for v in 0..V {
                    row[v] = S::fmadd(ar, bv[v], row[v]);
                }
            }
            b = b.add(ldb);
        }
        for (r, row) in acc.iter().enumerate() {
            let cr = c.add(r * ldc);
            for (v, x) in row.iter().enumerate() {
                let p = cr.add(v * S::W);
                let x = if accumulate {
                    S::add(S::load(p), *x)
                } else {
                    *x
                };
                S::store(p, x);
            }
        }
    }
}
