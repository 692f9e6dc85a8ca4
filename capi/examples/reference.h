/*
 * Naive references for the examples: GEMM, linear layers and attention accumulated in
 * double, each with the per-element tolerance autokernel verifies its own kernels with
 * (kernels/src/problem.rs), and a comparison that reports the first element outside it.
 */
#ifndef AUTOKERNEL_EXAMPLES_REFERENCE_H
#define AUTOKERNEL_EXAMPLES_REFERENCE_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Fills x[0..len) with values in [-1, 1) from a 64-bit LCG seeded by *state. */
static inline void ref_fill(float *x, size_t len, unsigned long long *state) {
    for (size_t i = 0; i < len; i++) {
        *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
        x[i] = (float)((double)(*state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
}

/* GELU in its tanh form, in double. */
static inline double ref_gelu(double x) {
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

/* act: 0 none, 1 relu, 2 gelu (the AUTOKERNEL_ACT_* codes). */
static inline double ref_act(int act, double z) {
    if (act == 1) return z > 0.0 ? z : 0.0;
    if (act == 2) return ref_gelu(z);
    return z;
}

/*
 * C = act(A·B + bias) in double (bias may be NULL: none, act 0: plain GEMM) with the
 * tolerance eps·(2√K + 4)·Σ|a·b| (+ 2eps·|bias|); GELU: 1.2× that plus 16eps·|z|.
 */
static inline void ref_linear(size_t m, size_t n, size_t k, int act, const float *a,
                              const float *b, const float *bias, double *out, double *tol) {
    const double eps = FLT_EPSILON;
    for (size_t i = 0; i < m; i++) {
        for (size_t j = 0; j < n; j++) {
            double z = 0.0, mag = 0.0;
            for (size_t p = 0; p < k; p++) {
                double t = (double)a[i * k + p] * (double)b[p * n + j];
                z += t;
                mag += fabs(t);
            }
            double t = eps * (2.0 * sqrt((double)k) + 4.0) * mag;
            if (bias) {
                z += bias[j];
                t += 2.0 * eps * fabs(bias[j]);
            }
            if (act == 2) t = 1.2 * t + 16.0 * eps * fabs(z);
            out[i * n + j] = ref_act(act, z);
            tol[i * n + j] = t;
        }
    }
}

/*
 * Softmax attention over [heads, s, d] tensors in double, with the tolerance of
 * kernels/src/problem.rs: Σ_j w_j·|v_jc| · (3E + eps·(2√S + 32)).
 */
static inline void ref_attention(size_t heads, size_t s, size_t d, int causal, const float *q,
                                 const float *k, const float *v, double *out, double *tol) {
    const double eps = FLT_EPSILON;
    const double scale = 1.0 / sqrt((double)d);
    const double score_eps = eps * (2.0 * sqrt((double)d) + 8.0);
    const double sum_eps = eps * (2.0 * sqrt((double)s) + 32.0);
    double *w = (double *)malloc(s * sizeof(double));
    if (!w) abort();
    for (size_t head = 0; head < heads; head++) {
        size_t base = head * s * d;
        for (size_t i = 0; i < s; i++) {
            size_t keys = causal ? i + 1 : s;
            double max = -INFINITY, big_e = 0.0, sum = 0.0;
            for (size_t j = 0; j < keys; j++) {
                double dot = 0.0, mag = 0.0;
                for (size_t c = 0; c < d; c++) {
                    double t = (double)q[base + i * d + c] * (double)k[base + j * d + c];
                    dot += t;
                    mag += fabs(t);
                }
                w[j] = dot * scale;
                if (w[j] > max) max = w[j];
                if (mag * scale * score_eps > big_e) big_e = mag * scale * score_eps;
            }
            for (size_t j = 0; j < keys; j++) {
                w[j] = exp(w[j] - max);
                sum += w[j];
            }
            double *o = out + base + i * d, *t = tol + base + i * d;
            for (size_t c = 0; c < d; c++) o[c] = t[c] = 0.0;
            for (size_t j = 0; j < keys; j++) {
                for (size_t c = 0; c < d; c++) {
                    double x = v[base + j * d + c];
                    o[c] += w[j] / sum * x;
                    t[c] += w[j] / sum * fabs(x);
                }
            }
            for (size_t c = 0; c < d; c++) t[c] *= 3.0 * big_e + sum_eps;
        }
    }
    free(w);
}

/* 0 if every got[i] is within tol[i] of want[i]; otherwise prints the first miss and
 * returns how many missed. */
static inline size_t ref_check(const char *what, const float *got, const double *want,
                               const double *tol, size_t len) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < len; i++) {
        if (!(fabs((double)got[i] - want[i]) <= tol[i])) {
            if (bad++ == 0) first = i;
        }
    }
    if (bad) {
        fprintf(stderr, "%s: %zu of %zu elements wrong, first at %zu: got %.9g, want %.9g +- %.3g\n",
                what, bad, len, first, (double)got[first], want[first], tol[first]);
    }
    return bad;
}

#ifdef __cplusplus
}
#endif

#endif /* AUTOKERNEL_EXAMPLES_REFERENCE_H */
