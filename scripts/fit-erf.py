#!/usr/bin/env python3
"""Fits the polynomials of the vectorised erf / exact GELU (kernels/src/cpu/gemm/ukernel/erf.rs,
which evaluates them in Estrin's order).

erf(z) is computed in two pieces, split at |z| = T:
  near, |z| < T:        erf(z) = z + z * P(z^2)                  (P: degree NEAR_DEG-1 in z^2)
  far,  T <= t < TMAX:  erfc(t) = 2^(R(v) - t^2 * log2(e)),  v = (t - MID) / HALF in [-1, 1]
                        (R: degree FAR_DEG-1, fitted to log2(erfc(t)) + t^2 log2(e))
  t >= TMAX:            erfc(t) = 0 (erfc(4.5) = 2e-10)
Each polynomial is a near-minimax fit (Lawson's iteratively reweighted least squares on
Chebyshev nodes, in the Chebyshev basis, then converted to monomials), the error measured
against mpmath's erf at 40 digits, the coefficients rounded to f32. The script prints the Rust
constants and the worst error of the f32-rounded polynomials (evaluated in f64).

Needs numpy and mpmath: pip install numpy mpmath
"""
import numpy as np
import mpmath as mp

mp.mp.dps = 40
T, TMAX = 0.9, 4.5
NEAR_DEG, FAR_DEG = 7, 11  # number of coefficients
MID, HALF = (T + TMAX) / 2, (TMAX - T) / 2


def lawson(x, y, n, iters=200):
    """Near-minimax polynomial (n coefficients, monomial basis in x) for y(x), x in [-1, 1]."""
    a = np.polynomial.chebyshev.chebvander(x, n - 1)
    w = np.full(len(x), 1.0 / len(x))
    for _ in range(iters):
        sw = np.sqrt(w)
        c, *_ = np.linalg.lstsq(a * sw[:, None], y * sw, rcond=None)
        e = np.abs(a @ c - y)
        w = w * e
        w /= w.sum()
    return np.polynomial.chebyshev.cheb2poly(c)


def nodes(n):
    return np.cos(np.pi * (np.arange(n) + 0.5) / n)


def horner(c, x):
    r = np.zeros_like(x) + c[-1]
    for k in reversed(c[:-1]):
        r = r * x + k
    return r


# near: P(s) ~ erf(sqrt s)/sqrt s - 1 for s in [0, T^2], fitted in x = 2 s / T^2 - 1, then
# re-expressed in s. (z + z*P rounds better than z * (1 + P): P is small.)
x = nodes(800)
s = (x + 1) / 2 * T * T
y = np.array([float(mp.erf(mp.sqrt(v)) / mp.sqrt(v) - 1) for v in s])
cx = lawson(x, y, NEAR_DEG)
near = np.polynomial.polynomial.Polynomial(cx)(np.polynomial.polynomial.Polynomial([-1, 2 / (T * T)])).coef
near = np.float32(near).astype(np.float64)
# far: R(v) ~ log2(erfc(t)) + t^2 log2(e).
t = MID + HALF * nodes(1200)
y = np.array([float(mp.log(mp.erfc(v), 2) + v * v / mp.log(2)) for v in t])
far = np.float32(lawson((t - MID) / HALF, y, FAR_DEG)).astype(np.float64)

zs = np.linspace(0, 6, 200001)[1:]
want = np.array([float(mp.erf(v)) for v in zs])
got = np.where(
    zs < T,
    zs + zs * horner(near, zs * zs),
    np.where(zs < TMAX, 1 - np.exp2(horner(far, (zs - MID) / HALF) - zs * zs / np.log(2)), 1.0),
)
err = np.abs(got - want)
near_rel = np.max(err[zs < T] / want[zs < T])
print(f"// worst |erf error| over (0, 6] with f32 coefficients, f64 arithmetic: {err.max():.3g}")
print(f"// worst relative error below T: {near_rel:.3g}")
print(f"const ERF_T: f32 = {T};")
print(f"const ERF_TMAX: f32 = {TMAX};")
print(f"const ERF_FAR_MID: f32 = {MID};")
print(f"const ERF_FAR_HALF: f32 = {HALF};")
fmt = lambda c: ",\n".join(f"    {np.float32(v)!r}".replace("np.float32(", "").replace(")", "") for v in c)
print(f"const ERF_NEAR: [f32; {NEAR_DEG}] = [\n{fmt(near)},\n];")
print(f"const ERFC_FAR: [f32; {FAR_DEG}] = [\n{fmt(far)},\n];")
