/* float32 linear layer for a few rows on a CPU (specbench/models/small_linear.py builds and calls it).
 *
 * y[m, j] = sum_k x[m, k] * w[j, k] (+ bias[j]) for m < rows, j < outs. The weights are read once for all the
 * rows, as one sequential stream: each weight row is multiplied with every input row (held in L1) as it
 * arrives, so 2..12 rows cost about what one row costs (the product is memory-bound there). Reading several
 * weight rows at once, to reuse each input vector, was slower on AMD EPYC (1 row: 0.8 -> 1.0x F.linear's time).
 *
 * Every output is computed by the same arithmetic whatever the number of rows or how they are grouped, so a
 * row gets the same bits alone or among any other rows: 8 lanes over k, lane l summing x[m, k] * w[j, k] for
 * k = 8c + l in order of c, one fused multiply-add each where the CPU has FMA (else a multiply and an add);
 * then the lanes added by one fixed tree (l + l+4, then +2, +1), the k % 8 last products in order, and the
 * bias. (Two sums per lane, over even and odd c, to halve the chain of dependent additions, gained 6 % on
 * 1..2 rows of the 576 x 1536 projection and lost more at 7..12 rows, which then need two passes.) Compiled
 * with FMA contraction off, so nothing else is fused.
 */
#include <stdint.h>
#include <string.h>
#if defined(__FMA__)
#include <immintrin.h>
#endif

#define LANES 8
#define MAX_GROUP 12 /* rows per pass over the weights (one accumulator each) */
#define PREFETCH 512  /* floats ahead in the weight stream: 2 KiB, 10-20 % faster than the hardware's alone */
#define ALWAYS static inline __attribute__((always_inline))
typedef float vec __attribute__((vector_size(LANES * sizeof(float))));

ALWAYS vec madd(vec a, vec b, vec acc) {
#if defined(__FMA__)
    return (vec)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)acc);
#else
    return acc + a * b;
#endif
}

ALWAYS vec load(const float *at) {
    vec v;
    memcpy(&v, at, sizeof v);
    return v;
}

ALWAYS float finish(vec acc, const float *x, const float *w, int64_t done, int64_t k) {
    float four[4], two[2];
    for (int l = 0; l < 4; l++) four[l] = acc[l] + acc[l + 4];
    for (int l = 0; l < 2; l++) two[l] = four[l] + four[l + 2];
    float sum = two[0] + two[1];
    for (int64_t i = done; i < k; i++) sum += x[i] * w[i];
    return sum;
}

/* Output j of rows 0 .. MB-1 (MB is a constant at every call site: inlined and unrolled). */
ALWAYS void output(const float *x, int64_t xs, const float *w, const float *bias, float *y, int64_t ys,
                   int64_t k, int MB) {
    vec acc[MAX_GROUP];
    int64_t full = k - k % LANES;
#pragma GCC unroll 12
    for (int m = 0; m < MB; m++) acc[m] = (vec){0};
    for (int64_t c = 0; c < full; c += LANES) {
        __builtin_prefetch(w + c + PREFETCH);
        vec wv = load(w + c);
#pragma GCC unroll 12
        for (int m = 0; m < MB; m++) acc[m] = madd(wv, load(x + m * xs + c), acc[m]);
    }
    for (int m = 0; m < MB; m++) {
        float sum = finish(acc[m], x + m * xs, w, full, k);
        y[m * ys] = bias ? sum + *bias : sum;
    }
}

#define GROUP(MB) \
    case MB:      \
        for (int64_t j = 0; j < outs; j++) output(x, xs, w + j * ws, bias ? bias + j : 0, y + j, outs, k, MB); \
        break

/* x (rows, k) with row stride xs, w (outs, k) with row stride ws, bias (outs) or NULL, y (rows, outs) dense.
 * Rows go through the weights in groups of up to MAX_GROUP. */
int small_linear(const float *x, const float *w, const float *bias, float *y, int64_t rows, int64_t outs,
                 int64_t k, int64_t xs, int64_t ws) {
    if (rows < 0 || outs < 0 || k < 0) return 1;
    for (int64_t m = 0; m < rows; m += MAX_GROUP, x += MAX_GROUP * xs, y += MAX_GROUP * outs) {
        switch (rows - m < MAX_GROUP ? rows - m : MAX_GROUP) {
            GROUP(1); GROUP(2); GROUP(3); GROUP(4); GROUP(5); GROUP(6);
            GROUP(7); GROUP(8); GROUP(9); GROUP(10); GROUP(11); GROUP(12);
        }
    }
    return 0;
}
