#!/usr/bin/env python3
"""Fits the polynomial of the vectorised exact GELU (kernels/src/cpu/gemm/ukernel/erf.rs, which
evaluates it in Estrin's order).

  erfc(t) = 2^(R(v) - t^2 * log2(e)),  v = (t - MID) / HALF in [-1, 1], for 0 <= t < TMAX
  (R: ERFC_DEG coefficients, fitted to log2(erfc(t)) + t^2 log2(e)); erfc(t) = 0 from TMAX on
  (erfc(4.5) = 2e-10). The GELU takes Phi(x) = erfc(|x|/sqrt 2)/2 for x < 0, 1 - that for x >= 0.

R is a near-minimax fit (Lawson's iteratively reweighted least squares on Chebyshev nodes, in
the Chebyshev basis, then converted to monomials), the error measured against mpmath's erfc at
40 digits, the coefficients rounded to f32. The script prints the Rust constants and the worst
relative erfc error of the f32-rounded polynomial (evaluated in f64).

Needs numpy and mpmath: pip install numpy mpmath
"""
import numpy as np
import mpmath as mp

mp.mp.dps = 40
TMAX = 4.5
ERFC_DEG = 13  # number of coefficients
MID, HALF = TMAX / 2, TMAX / 2


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


# erfc: R(v) ~ log2(erfc(t)) + t^2 log2(e) on [0, TMAX].
t = MID + HALF * nodes(3000)
y = np.array([float(mp.log(mp.erfc(v), 2) + v * v / mp.log(2)) for v in t])
erfc = np.float32(lawson((t - MID) / HALF, y, ERFC_DEG)).astype(np.float64)

ts = np.linspace(0, TMAX, 200001)[:-1]
erfc_want = np.array([float(mp.erfc(v)) for v in ts])
erfc_rel = np.max(np.abs(np.exp2(horner(erfc, (ts - MID) / HALF) - ts * ts / np.log(2)) / erfc_want - 1))
print(f"// worst relative erfc error over [0, TMAX) with f32 coefficients, f64 arithmetic: {erfc_rel:.3g}")
print(f"const TMAX: f32 = {TMAX};")
fmt = lambda c: ",\n".join(f"    {np.float32(v)!r}".replace("np.float32(", "").replace(")", "") for v in c)
print(f"const ERFC: [f32; {ERFC_DEG}] = [\n{fmt(erfc)},\n];")
