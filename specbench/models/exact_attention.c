/* Row-invariant softmax attention on a CPU (specbench/models/exact_attention.py builds and calls it).
 *
 * Each output row is computed by the same code, in the same order, whatever else shares the call: its
 * scores are fp32 dot products with a fixed 16-lane split of the head dimension, masked keys score -inf
 * and weigh an exact 0, the denominator and the probability-value sum run over the keys in index order.
 * So a query's output has the same bits alone, among k queries, or with masked keys after it. Inputs are
 * bf16 (dtype 1) or float32 (dtype 0); the output is written as (B, Q, H, dv), the layout transformers'
 * attention returns, bf16 rounded to nearest even or float32. Compiled without fast-math: no reassociation.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float bf16_to_float(uint16_t x) {
    uint32_t bits = (uint32_t)x << 16;
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

static inline uint16_t float_to_bf16(float x) { /* round to nearest even, as torch does; NaN stays NaN */
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

/* exp(x) for x <= 0 (scores minus their maximum), branch-free so that loops over it vectorise. */
static inline float exp_nonpositive(float x) {
    float clamped = x < -87.0f ? -87.0f : x;
    float n = (clamped * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = clamped - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &e, sizeof scale);
    return x < -87.0f ? 0.0f : p * scale;
}

/* Keys go through the score product in blocks of BLOCK, transposed to (d, BLOCK) floats, so that each key's
 * dot product is one vector lane summing over the head dimension in index order; the last block is padded
 * with zero keys, so every key takes the same path. */
#define BLOCK 16
typedef float vec __attribute__((vector_size(BLOCK * sizeof(float))));

/* One score per (row, key) of a block of BLOCK keys: row r's dot products, scaled, or -inf where masked. */
static inline void put_scores(vec sum, float *scores, int r, int queries, int padded, int first, int keys,
                              float scale, const uint8_t *allowed, int64_t aq, int64_t ak) {
    int j = r % queries;
    for (int c = 0; c < BLOCK; c++) {
        int key = first + c;
        int seen = key < keys && (allowed ? allowed[j * aq + key * ak] != 0 : key <= keys - queries + j);
        scores[(int64_t)r * padded + key] = seen ? sum[c] * scale : -INFINITY;
    }
}

/* The scores of every row against one transposed key block. Rows go four at a time so that four independent
 * sums are in flight (one row's sum is a chain of d dependent adds); a last group of one to three rows
 * repeats its last row in the unused slots and stores only its own. Each row still adds its products over
 * the head dimension in index order, so its bits do not depend on which rows share its group. */
static void score_block(const float *qf, const vec *kt, float *scores, int rows, int queries, int d,
                        int padded, int first, int keys, float scale, const uint8_t *allowed, int64_t aq,
                        int64_t ak) {
    for (int r = 0; r < rows; r += 4) {
        int last = rows - 1;
        const float *q0 = qf + (int64_t)r * d;
        const float *q1 = qf + (int64_t)(r + 1 < last ? r + 1 : last) * d;
        const float *q2 = qf + (int64_t)(r + 2 < last ? r + 2 : last) * d;
        const float *q3 = qf + (int64_t)(r + 3 < last ? r + 3 : last) * d;
        vec s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
        for (int i = 0; i < d; i++) {
            vec key = kt[i];
            s0 += q0[i] * key;
            s1 += q1[i] * key;
            s2 += q2[i] * key;
            s3 += q3[i] * key;
        }
        put_scores(s0, scores, r, queries, padded, first, keys, scale, allowed, aq, ak);
        if (r + 1 < rows) put_scores(s1, scores, r + 1, queries, padded, first, keys, scale, allowed, aq, ak);
        if (r + 2 < rows) put_scores(s2, scores, r + 2, queries, padded, first, keys, scale, allowed, aq, ak);
        if (r + 3 < rows) put_scores(s3, scores, r + 3, queries, padded, first, keys, scale, allowed, aq, ak);
    }
}

#define DEFINE_ATTENTION(NAME, TYPE, LOAD, STORE)                                                             \
    static int NAME(const TYPE *q, const TYPE *k, const TYPE *v, const uint8_t *allowed, TYPE *out, int batch,  \
                    int heads, int key_heads, int queries, int keys, int d, int dv, float scale, int64_t kb,    \
                    int64_t kh, int64_t kk, int64_t vb, int64_t vh, int64_t vk, int64_t ab, int64_t aq,         \
                    int64_t ak) {                                                                               \
        int group = heads / key_heads, rows = group * queries, padded = (keys + BLOCK - 1) / BLOCK * BLOCK;     \
        float *qf = malloc(sizeof(float) * (size_t)rows * d);                                                   \
        float *scores = malloc(sizeof(float) * (size_t)rows * padded);                                          \
        int lanes = dv / BLOCK; /* dv is a multiple of BLOCK (the caller checks) */                             \
        vec *acc = aligned_alloc(sizeof(vec), sizeof(vec) * (size_t)rows * lanes);                              \
        vec *kt = aligned_alloc(sizeof(vec), sizeof(vec) * (size_t)d);                                          \
        vec *vf = aligned_alloc(sizeof(vec), sizeof(vec) * (size_t)lanes);                                      \
        float *line = malloc(sizeof(float) * (size_t)(d > dv ? d : dv));                                        \
        if (!qf || !scores || !acc || !kt || !vf || !line) {                                                             \
            free(qf), free(scores), free(acc), free(kt), free(vf), free(line);                                              \
            return 1;                                                                                           \
        }                                                                                                       \
        for (int b = 0; b < batch; b++) {                                                                       \
            for (int hk = 0; hk < key_heads; hk++) {                                                            \
                /* row r = g * queries + j: query j of head hk * group + g */                                   \
                for (int r = 0; r < rows; r++) {                                                                \
                    int64_t q0 = (((int64_t)b * heads + hk * group + r / queries) * queries + r % queries) * d; \
                    for (int i = 0; i < d; i++) qf[(int64_t)r * d + i] = LOAD(q[q0 + i]);                       \
                }                                                                                               \
                for (int first = 0; first < padded; first += BLOCK) {                                           \
                    int filled = keys - first < BLOCK ? keys - first : BLOCK;                                   \
                    if (filled < BLOCK) memset(kt, 0, sizeof(vec) * (size_t)d);                                 \
                    for (int c = 0; c < filled; c++) {                                                          \
                        const TYPE *row = k + b * kb + hk * kh + (int64_t)(first + c) * kk;                     \
                        for (int i = 0; i < d; i++) line[i] = LOAD(row[i]);                                     \
                        for (int i = 0; i < d; i++) kt[i][c] = line[i];                                         \
                    }                                                                                           \
                    score_block(qf, kt, scores, rows, queries, d, padded, first, keys, scale,                   \
                                allowed ? allowed + b * ab : NULL, aq, ak);                                     \
                }                                                                                               \
                for (int r = 0; r < rows; r++) {                                                                \
                    float *s = scores + (int64_t)r * padded, top = -INFINITY;                                   \
                    for (int key = 0; key < padded; key++) top = s[key] > top ? s[key] : top;                   \
                    if (top == -INFINITY) top = 0.0f; /* a fully masked (padding) row: all weights 0 */         \
                    for (int key = 0; key < padded; key++) s[key] = exp_nonpositive(s[key] - top);              \
                }                                                                                               \
                memset(acc, 0, sizeof(vec) * (size_t)rows * lanes);                                             \
                for (int key = 0; key < keys; key++) {                                                          \
                    int64_t v0 = b * vb + hk * vh + key * vk;                                                   \
                    for (int i = 0; i < dv; i++) line[i] = LOAD(v[v0 + i]);                                     \
                    memcpy(vf, line, sizeof(float) * (size_t)dv);                                               \
                    for (int r = 0; r < rows; r++) {                                                            \
                        float w = scores[(int64_t)r * padded + key];                                            \
                        if (w == 0.0f) continue; /* masked: adds nothing, whatever the value holds */           \
                        vec *a = acc + (int64_t)r * lanes;                                                      \
                        for (int i = 0; i < lanes; i++) a[i] += w * vf[i];                                      \
                    }                                                                                           \
                }                                                                                               \
                for (int r = 0; r < rows; r++) {                                                                \
                    float *s = scores + (int64_t)r * padded, total = 0.0f;                                      \
                    for (int key = 0; key < keys; key++) total += s[key];                                       \
                    float inverse = total > 0.0f ? 1.0f / total : 0.0f;                                         \
                    int64_t o0 = (((int64_t)b * queries + r % queries) * heads + hk * group + r / queries) * dv; \
                    const vec *a = acc + (int64_t)r * lanes;                                                    \
                    for (int i = 0; i < dv; i++) STORE(out[o0 + i], a[i / BLOCK][i % BLOCK] * inverse);         \
                }                                                                                               \
            }                                                                                                   \
        }                                                                                                       \
        free(qf), free(scores), free(acc), free(kt), free(vf), free(line);                                                  \
        return 0;                                                                                               \
    }

#define LOAD_F32(x) (x)
#define STORE_F32(slot, x) ((slot) = (x))
#define LOAD_BF16(x) bf16_to_float(x)
#define STORE_BF16(slot, x) ((slot) = float_to_bf16(x))
DEFINE_ATTENTION(attend_f32, float, LOAD_F32, STORE_F32)
DEFINE_ATTENTION(attend_bf16, uint16_t, LOAD_BF16, STORE_BF16)

/* q: (B, H, Q, d) contiguous. k, v: strides (batch, head, key) in elements, last dim contiguous.
 * allowed: (B, Q, K) bytes with strides (batch, query, key), or NULL for causal over the last Q keys.
 * out: (B, Q, H, dv) contiguous. dtype 1: bf16, 0: float32. Returns 0, or 1 when memory ran out. */
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
