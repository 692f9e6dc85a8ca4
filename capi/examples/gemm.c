/*
 * autokernel from C: open a tuning database, run a GEMM through the runtime, check it
 * against a naive loop, ask which variant served it (JSON), and see the error model.
 *
 *   cargo build -p autokernel_capi
 *   cc -O2 -I capi/include capi/examples/gemm.c -o gemm \
 *      -L target/debug -lautokernel -Wl,-rpath,$PWD/target/debug -lm
 *   ./gemm tuning.db        # or without an argument: kernel defaults, no database
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autokernel.h"
#include "reference.h"

static int fail(const char *what, int status) {
    fprintf(stderr, "%s: %s: %s\n", what, autokernel_status_name(status), autokernel_last_error());
    return 1;
}

int main(int argc, char **argv) {
    const char *db = argc > 1 ? argv[1] : NULL;
    printf("autokernel %s\n", autokernel_version());

    AutokernelRuntime *rt = NULL;
    int st = autokernel_runtime_open(db, 0, NULL, &rt);
    if (st != AUTOKERNEL_OK) return fail("open", st);
    char *load_error = NULL;
    if (autokernel_runtime_load_error(rt, &load_error) == AUTOKERNEL_OK && load_error) {
        printf("database not loaded, serving defaults: %s\n", load_error);
        autokernel_string_free(load_error);
    }

    const size_t m = 64, n = 48, k = 80;
    float *a = malloc(m * k * sizeof *a), *b = malloc(k * n * sizeof *b);
    float *c = malloc(m * n * sizeof *c);
    double *want = malloc(m * n * sizeof *want), *tol = malloc(m * n * sizeof *tol);
    if (!a || !b || !c || !want || !tol) return 1;
    unsigned long long seed = 42;
    ref_fill(a, m * k, &seed);
    ref_fill(b, k * n, &seed);

    int level = -1;
    st = autokernel_runtime_gemm(rt, m, n, k, a, m * k, b, k * n, c, m * n, &level);
    if (st != AUTOKERNEL_OK) return fail("gemm", st);
    ref_linear(m, n, k, 0, a, b, NULL, want, tol);
    if (ref_check("gemm", c, want, tol, m * n)) return 1;
    printf("gemm %zux%zux%zu ok (level %d)\n", m, n, k, level);

    char *json = NULL;
    st = autokernel_runtime_lookup(rt, "gemm:64x48x80", &json);
    if (st != AUTOKERNEL_OK) return fail("lookup", st);
    printf("lookup: %s\n", json);
    autokernel_string_free(json);

    /* Errors are status codes with a message for this thread; nothing is written. */
    st = autokernel_runtime_gemm(rt, m, n, k, a, m * k, b, k * n, c, m * n - 1, NULL);
    printf("short output: %s: %s\n", autokernel_status_name(st), autokernel_last_error());
    if (st != AUTOKERNEL_SHAPE) return 1;
    st = autokernel_runtime_lookup(rt, "gemm:0x1x1", &json);
    printf("bad workload: %s: %s\n", autokernel_status_name(st), autokernel_last_error());
    if (st != AUTOKERNEL_INVALID_ARGUMENT || json != NULL) return 1;

    AutokernelLookupCounts counts;
    st = autokernel_runtime_lookups(rt, &counts);
    if (st != AUTOKERNEL_OK) return fail("lookups", st);
    printf("lookups: exact %llu, same_arch %llu, nearest_shape %llu, default %llu\n",
           (unsigned long long)counts.exact, (unsigned long long)counts.same_arch,
           (unsigned long long)counts.nearest_shape, (unsigned long long)counts.defaults);

    autokernel_runtime_free(rt);
    free(a), free(b), free(c), free(want), free(tol);
    return 0;
}
