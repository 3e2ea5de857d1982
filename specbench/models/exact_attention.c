/* Row-invariant softmax attention on a CPU (specbench/models/exact_attention.py builds and calls it).
 *
 * Each output row is computed by the same code, in the same order, whatever else shares the call, so a query's
 * output has the same bits alone, among k queries, or with masked keys before, between or after its keys:
 * - a score is an fp32 dot product over the head dimension read as vectors of 16 lanes (bf16: each 32 values
 *   as the even and the odd dimensions, which is how bf16 widens to fp32 without a shuffle; float32: 16
 *   consecutive dimensions), each lane summed over the vectors in order, then its 16 lanes added by one fixed
 *   tree (lane l + lane l+8, then +4, +2, +1). Keys are read as stored, with no transposed copy: 16 keys' trees
 *   run together as one shuffle network whose result is a vector of their 16 scores;
 * - masked keys score -inf and weigh an exact 0; the maximum is exact in any order; exp is one branch-free
 *   polynomial; the denominator and the probability x value sums run over the keys in index order, skipping
 *   weights of 0 (so a masked key adds nothing, whatever its value holds).
 * Rows (query heads sharing a key head x queries) go through the keys GROUP at a time, which changes no row's
 * arithmetic. Inputs are bf16 (dtype 1) or float32 (dtype 0), head sizes multiples of 32 (d at most 256); the
 * output is written as (B, Q, H, dv), the layout transformers' attention returns, bf16 rounded to nearest
 * even or float32. Compiled without fast-math and with FMA contraction off: every operation rounds alone.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 16     /* floats in a vector; also the keys in a score block */
#define GROUP 4      /* rows that share a pass over the keys */
#define MAX_VECS 16  /* head dimension up to 256 */
#define ALWAYS static inline __attribute__((always_inline))
typedef float vec __attribute__((vector_size(LANES * sizeof(float))));
typedef int32_t ivec __attribute__((vector_size(LANES * sizeof(int32_t))));
typedef uint32_t uvec __attribute__((vector_size(LANES * sizeof(uint32_t))));

#if defined(__clang__) || __GNUC__ >= 12
#define SHUFFLE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define SHUFFLE(a, b, ...) __builtin_shuffle(a, b, (ivec){__VA_ARGS__})
#endif

ALWAYS vec pick(ivec mask, vec yes, vec no) { return (vec)(((ivec)yes & mask) | ((ivec)no & ~mask)); }

static inline uint16_t float_to_bf16(float x) { /* round to nearest even, as torch does; NaN stays NaN */
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

/* Dimensions 32m .. 32m+31 of a row as two vectors: bf16 the even and the odd ones, float32 the two halves. */
ALWAYS void load_pair(const void *base, int64_t at, int m, int bf16, vec *a, vec *b) {
    if (bf16) {
        uvec u;
        memcpy(&u, (const uint16_t *)base + at + 32 * m, sizeof u);
        *a = (vec)(u << 16), *b = (vec)(u & 0xffff0000u);
    } else {
        memcpy(a, (const float *)base + at + 32 * m, sizeof *a);
        memcpy(b, (const float *)base + at + 32 * m + LANES, sizeof *b);
    }
}

/* exp(x) for x <= 0 (scores minus their maximum), -inf to 0. */
ALWAYS vec exp_nonpositive(vec x) {
    ivec low = x < -87.0f;
    vec clamped = pick(low, (vec){0} - 87.0f, x);
    vec n = (clamped * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    vec r = clamped - n * 0.693359375f + n * 2.12194440e-4f;
    vec p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    vec scale = (vec)((__builtin_convertvector(n, ivec) + 127) << 23);
    return pick(low, (vec){0}, p * scale);
}

/* One level of the lane tree for two vectors of partial sums: lanes l and l+h of each added, a's results in
 * the low h of every 2h lanes, b's in the high h. Four levels take 16 keys' vectors to one vector of 16 sums. */
ALWAYS vec fold8(vec a, vec b) {
    return SHUFFLE(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           SHUFFLE(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
}
ALWAYS vec fold4(vec a, vec b) {
    return SHUFFLE(a, b, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) +
           SHUFFLE(a, b, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
}
ALWAYS vec fold2(vec a, vec b) {
    return SHUFFLE(a, b, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
           SHUFFLE(a, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
}
ALWAYS vec fold1(vec a, vec b) {
    return SHUFFLE(a, b, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30) +
           SHUFFLE(a, b, 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
}

/* The dot products of R rows (q: nv vectors each) with 16 keys (key c at k + c * kk), one vector of 16 sums
 * per row in key order. Slot s takes key bitreverse(s): the tree leaves the sum of slot s in lane
 * bitreverse(s). Each row's lanes and each key's tree are the same whatever R is or which slot a key takes. */
ALWAYS void dots16(const vec *q, int R, int nv, const void *k, int64_t kk, int bf16, vec *sums) {
    vec t0[GROUP], t1[GROUP], t2[GROUP], t3[GROUP];
#pragma GCC unroll 16
    for (int s = 0; s < LANES; s++) {
        int c = (s & 1) << 3 | (s & 2) << 1 | (s & 4) >> 1 | (s & 8) >> 3;
        vec kv[MAX_VECS];
        load_pair(k, c * kk, 0, bf16, &kv[0], &kv[1]);
        for (int m = 1; m < nv / 2 && m < MAX_VECS / 2; m++)
            load_pair(k, c * kk, m, bf16, &kv[2 * m], &kv[2 * m + 1]);
        for (int r = 0; r < R; r++) {
            const vec *qr = q + r * nv;
            vec p = qr[0] * kv[0];
            for (int j = 1; j < nv; j++) p += qr[j] * kv[j];
            if (!(s & 1)) { t0[r] = p; continue; }
            p = fold8(t0[r], p);
            if (!(s & 2)) { t1[r] = p; continue; }
            p = fold4(t1[r], p);
            if (!(s & 4)) { t2[r] = p; continue; }
            p = fold2(t2[r], p);
            if (!(s & 8)) { t3[r] = p; continue; }
            sums[r] = fold1(t3[r], p);
        }
    }
}

typedef struct {
    int bf16, heads, key_heads, queries, keys, d, dv, nv, rows, padded;
    float scale;
    int64_t kk, vk;
    vec *qv, *top;      /* rows x nv query vectors; rows running maxima */
    float *scores;      /* rows x padded */
    ivec *seen;         /* queries x padded / LANES: -1 where the key is attended */
    void *tail;         /* the last, partial key block, zero-padded to LANES keys */
} job;

/* dots16 compiled for each dtype, head size 64 or 128 (nv 4, 8) and group size, and once for any: each is a
 * function of its own (one function holding them all takes GCC ten times as long to compile). */
typedef void dots_fn(const vec *q, int R, int nv, const void *k, int64_t kk, vec *sums);
#define DOTS(NAME, BF16, RR, NV)                                                                              \
    static void NAME(const vec *q, int R, int nv, const void *k, int64_t kk, vec *sums) {                     \
        (void)R, (void)nv;                                                                                    \
        dots16(q, RR, NV, k, kk, BF16, sums);                                                                 \
    }
#define DOTS_NV(BF16, NV) DOTS(dots_##BF16##_##NV##_1, BF16, 1, NV) DOTS(dots_##BF16##_##NV##_2, BF16, 2, NV) \
    DOTS(dots_##BF16##_##NV##_3, BF16, 3, NV) DOTS(dots_##BF16##_##NV##_4, BF16, 4, NV)
DOTS_NV(0, 4) DOTS_NV(0, 8) DOTS_NV(1, 4) DOTS_NV(1, 8) DOTS(dots_0_any, 0, R, nv) DOTS(dots_1_any, 1, R, nv)
static dots_fn *const DOTS_TABLE[2][3][GROUP] = {
    {{dots_0_4_1, dots_0_4_2, dots_0_4_3, dots_0_4_4}, {dots_0_8_1, dots_0_8_2, dots_0_8_3, dots_0_8_4},
     {dots_0_any, dots_0_any, dots_0_any, dots_0_any}},
    {{dots_1_4_1, dots_1_4_2, dots_1_4_3, dots_1_4_4}, {dots_1_8_1, dots_1_8_2, dots_1_8_3, dots_1_8_4},
     {dots_1_any, dots_1_any, dots_1_any, dots_1_any}},
};

/* Scores of the rows r0 .. r0+R-1 (row r = g * queries + j) against the key block at first. */
static void score_group(job *t, int r0, int R, const void *k, int64_t kk, int first) {
    vec sums[GROUP];
    DOTS_TABLE[t->bf16][t->nv == 4 ? 0 : t->nv == 8 ? 1 : 2][R - 1](t->qv + (int64_t)r0 * t->nv, R, t->nv, k,
                                                                      kk, sums);
    for (int i = 0; i < R; i++) {
        int r = r0 + i;
        ivec seen = t->seen[((int64_t)(r % t->queries) * t->padded + first) / LANES];
        vec s = pick(seen, sums[i] * t->scale, (vec){0} - INFINITY);
        *(vec *)(t->scores + (int64_t)r * t->padded + first) = s;
        t->top[r] = pick(s > t->top[r], s, t->top[r]);
    }
}

static void score_all(job *t, const void *kh) {
    size_t size = t->bf16 ? 2 : 4;
    for (int r = 0; r < t->rows; r++) t->top[r] = (vec){0} - INFINITY;
    for (int first = 0; first < t->padded; first += LANES) {
        const void *k = (const char *)kh + (size_t)first * t->kk * size;
        int64_t kk = t->kk;
        if (t->keys - first < LANES) {
            for (int c = 0; c < t->keys - first; c++)
                memcpy((char *)t->tail + (size_t)c * t->d * size, (const char *)k + (size_t)c * kk * size,
                       (size_t)t->d * size);
            k = t->tail, kk = t->d;
        }
        for (int r0 = 0; r0 < t->rows; r0 += GROUP)
            score_group(t, r0, t->rows - r0 < GROUP ? t->rows - r0 : GROUP, k, kk, first);
    }
}

/* Each row's scores become exp(score - its maximum). */
static void softmax_numerators(job *t) {
    for (int r = 0; r < t->rows; r++) {
        float top = -INFINITY;
        for (int l = 0; l < LANES; l++) top = t->top[r][l] > top ? t->top[r][l] : top;
        if (top == -INFINITY) top = 0.0f; /* a fully masked (padding) row: all weights 0 */
        vec *s = (vec *)(t->scores + (int64_t)r * t->padded);
        for (int i = 0; i < t->padded / LANES; i++) s[i] = exp_nonpositive(s[i] - top);
    }
}

/* Sum over the keys, in index order, of weight x value pair m for R rows, into lines (row i at i * dv, natural
 * dimension order), and for m = 0 of the weights, into totals. */
ALWAYS void values_group(job *t, int r0, int R, const void *vh, int m, int bf16, float *lines, float *totals) {
    vec a[GROUP] = {0}, b[GROUP] = {0};
    float total[GROUP] = {0};
    const float *w = t->scores + (int64_t)r0 * t->padded;
    for (int key = 0; key < t->keys; key++) {
        vec x, y;
        load_pair(vh, key * t->vk, m, bf16, &x, &y);
        for (int i = 0; i < R; i++) {
            float p = w[(int64_t)i * t->padded + key];
            if (p == 0.0f) continue; /* masked: adds nothing, whatever the value holds */
            a[i] += p * x, b[i] += p * y;
            if (m == 0) total[i] += p;
        }
    }
    for (int i = 0; i < R; i++) {
        float *line = lines + (int64_t)i * t->dv + 32 * m;
        if (m == 0) totals[i] = total[i];
        for (int l = 0; l < LANES; l++) {
            if (bf16) line[2 * l] = a[i][l], line[2 * l + 1] = b[i][l];
            else line[l] = a[i][l], line[LANES + l] = b[i][l];
        }
    }
}

ALWAYS void values_all(job *t, const void *vh, int bf16, float *lines, float *totals) {
    for (int m = 0; m < t->dv / 32; m++) {
        int r0 = 0;
        for (; r0 + GROUP <= t->rows; r0 += GROUP)
            values_group(t, r0, GROUP, vh, m, bf16, lines + (int64_t)r0 * t->dv, totals + r0);
        switch (t->rows - r0) {
        case 1: values_group(t, r0, 1, vh, m, bf16, lines + (int64_t)r0 * t->dv, totals + r0); break;
        case 2: values_group(t, r0, 2, vh, m, bf16, lines + (int64_t)r0 * t->dv, totals + r0); break;
        case 3: values_group(t, r0, 3, vh, m, bf16, lines + (int64_t)r0 * t->dv, totals + r0); break;
        }
    }
}

/* Fills seen (queries x padded, -1 where attended) for batch entry b's mask, or causal over the last keys. */
static void fill_seen(job *t, const uint8_t *allowed, int64_t aq, int64_t ak) {
    int32_t *seen = (int32_t *)t->seen;
    for (int j = 0; j < t->queries; j++) {
        int32_t *row = seen + (int64_t)j * t->padded;
        int last = t->keys - t->queries + j;
        if (allowed)
            for (int key = 0; key < t->keys; key++) row[key] = -(allowed[j * aq + key * ak] != 0);
        else
            for (int key = 0; key < t->keys; key++) row[key] = -(key <= last);
        for (int key = t->keys; key < t->padded; key++) row[key] = 0;
    }
}

ALWAYS int attend(const void *q, const void *k, const void *v, const uint8_t *allowed, void *out, int bf16,
                  int batch, int heads, int key_heads, int queries, int keys, int d, int dv, float scale,
                  int64_t kb, int64_t kh, int64_t kk, int64_t vb, int64_t vh, int64_t vk, int64_t ab,
                  int64_t aq, int64_t ak) {
    if (d < 32 || d % 32 || d > 2 * LANES * (MAX_VECS / 2) || dv < 32 || dv % 32) return 2;
    int group = heads / key_heads, rows = group * queries, padded = (keys + LANES - 1) / LANES * LANES;
    size_t size = bf16 ? 2 : 4, nv = (size_t)d / LANES;
    job t = {.bf16 = bf16, .heads = heads, .key_heads = key_heads, .queries = queries, .keys = keys, .d = d,
             .dv = dv, .nv = (int)nv, .rows = rows, .padded = padded, .scale = scale, .kk = kk, .vk = vk};
    t.qv = aligned_alloc(64, sizeof(vec) * (size_t)rows * nv);
    t.top = aligned_alloc(64, sizeof(vec) * (size_t)rows);
    t.scores = aligned_alloc(64, sizeof(float) * (size_t)rows * padded);
    t.seen = aligned_alloc(64, sizeof(int32_t) * (size_t)queries * padded);
    t.tail = calloc((size_t)LANES * d, size);
    float *lines = malloc(sizeof(float) * (size_t)rows * dv), *totals = malloc(sizeof(float) * (size_t)rows);
    int failed = !t.qv || !t.top || !t.scores || !t.seen || !t.tail || !lines || !totals;
    for (int b = 0; b < batch && !failed; b++) {
        fill_seen(&t, allowed ? allowed + b * ab : NULL, aq, ak);
        for (int h = 0; h < key_heads; h++) {
            for (int r = 0; r < rows; r++) { /* row r = g * queries + j: query j of head h * group + g */
                int64_t q0 = (((int64_t)b * heads + h * group + r / queries) * queries + r % queries) * d;
                for (size_t m = 0; m < nv / 2; m++)
                    load_pair(q, q0, (int)m, bf16, &t.qv[r * nv + 2 * m], &t.qv[r * nv + 2 * m + 1]);
            }
            score_all(&t, (const char *)k + (size_t)(b * kb + h * kh) * size);
            softmax_numerators(&t);
            values_all(&t, (const char *)v + (size_t)(b * vb + h * vh) * size, bf16, lines, totals);
            for (int r = 0; r < rows; r++) {
                float inverse = totals[r] > 0.0f ? 1.0f / totals[r] : 0.0f;
                int64_t o0 = (((int64_t)b * queries + r % queries) * heads + h * group + r / queries) * dv;
                const float *line = lines + (int64_t)r * dv;
                if (bf16)
                    for (int i = 0; i < dv; i++) ((uint16_t *)out)[o0 + i] = float_to_bf16(line[i] * inverse);
                else
                    for (int i = 0; i < dv; i++) ((float *)out)[o0 + i] = line[i] * inverse;
            }
        }
    }
    free(t.qv), free(t.top), free(t.scores), free(t.seen), free(t.tail), free(lines), free(totals);
    return failed;
}

static int attend_bf16(const void *q, const void *k, const void *v, const uint8_t *allowed, void *out, int batch,
                       int heads, int key_heads, int queries, int keys, int d, int dv, float scale, int64_t kb,
                       int64_t kh, int64_t kk, int64_t vb, int64_t vh, int64_t vk, int64_t ab, int64_t aq,
                       int64_t ak) {
    return attend(q, k, v, allowed, out, 1, batch, heads, key_heads, queries, keys, d, dv, scale, kb, kh, kk, vb,
                  vh, vk, ab, aq, ak);
}

static int attend_f32(const void *q, const void *k, const void *v, const uint8_t *allowed, void *out, int batch,
                      int heads, int key_heads, int queries, int keys, int d, int dv, float scale, int64_t kb,
                      int64_t kh, int64_t kk, int64_t vb, int64_t vh, int64_t vk, int64_t ab, int64_t aq,
                      int64_t ak) {
    return attend(q, k, v, allowed, out, 0, batch, heads, key_heads, queries, keys, d, dv, scale, kb, kh, kk, vb,
                  vh, vk, ab, aq, ak);
}

/* q: (B, H, Q, d) contiguous. k, v: strides (batch, head, key) in elements, last dim contiguous; d and dv are
 * multiples of 32, d at most 256. allowed: (B, Q, K) bytes with strides (batch, query, key), or NULL for
 * causal over the last Q keys. out: (B, Q, H, dv) contiguous. dtype 1: bf16, 0: float32. Returns 0, 1
 * when memory ran out, or 2 for head sizes it does not take. */
int exact_attention(const void *q, const void *k, const void *v, const uint8_t *allowed, void *out, int dtype,
                    int batch, int heads, int key_heads, int queries, int keys, int d, int dv, float scale,
                    int64_t kb, int64_t kh, int64_t kk, int64_t vb, int64_t vh, int64_t vk, int64_t ab,
                    int64_t aq, int64_t ak) {
    if (dtype == 1)
        return attend_bf16(q, k, v, allowed, out, batch, heads, key_heads, queries, keys, d, dv, scale, kb, kh,
                           kk, vb, vh, vk, ab, aq, ak);
    return attend_f32(q, k, v, allowed, out, batch, heads, key_heads, queries, keys, d, dv, scale, kb, kh, kk,
                      vb, vh, vk, ab, aq, ak);
}
