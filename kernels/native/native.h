/* What the native kernels' files share (the .c files of kernels/native/, one extension module, _cpu):
 * the build's instruction-set switch, the quantized records' kinds, the thread pool's
 * entry points, and each file's functions that another file calls.
 *
 *   _cpu.c        the module: the op table, one entry point per op, tapes of them
 *   pool.c        the thread pool the products share their work through; a streaming read
 *   products.c    float32 products over weights packed in strips
 *   quantized.c   products over weights kept in GGUF's quantized block formats
 *   int8.c        Q4_1 products on int8 activations (integer dot products)
 *   elementwise.c SwiGLU, RMS norm, adds
 *   attention.c   paged decode and prefill attention, MLA decode, rotary, the KV store
 *   moe.c         routed experts and DeepSeek's grouped routing
 *   gather.c      embeddings (float32 and quantized) and row selection
 *
 * Built with -ffp-contract=off: the compiler fuses no multiply-add on its own. The
 * explicit ones are in the products, the sums of squares and the exp polynomial; rotary
 * rounds each operation as torch's reference does. */
#ifndef INTERLOCK_NATIVE_H
#define INTERLOCK_NATIVE_H

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The x86 kernels are compiled only where they apply; elsewhere the module still builds,
 * serves the portable ops, and says why the rest is missing (UNSUPPORTED). Defining
 * INTERLOCK_NATIVE_PORTABLE compiles an x86-64 machine as if it were not one: CI checks
 * the portable build that way (make native-check). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(INTERLOCK_NATIVE_PORTABLE)
#define NATIVE_X86 1
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define NATIVE_X86 0
#endif

/* A function one file defines and another calls: hidden, so that the module exports only
 * its init function. */
#define INTERNAL __attribute__((visibility("hidden")))

/* Copies n floats; n == 0 touches neither pointer (either may be NULL then). */
static inline void copy_floats(float *to, const float *from, long n) {
    if (n > 0) memcpy(to, from, sizeof(float) * (size_t)n);
}

static inline void zero_floats(float *to, long n) {
    if (n > 0) memset(to, 0, sizeof(float) * (size_t)n);
}

/* The quantized records' kinds (see "quantized products"): 4-bit quants with offsets or
 * signed bytes, and QBYTES_HALF where the scales (and offsets) are float16, not float32. */
#define QBYTES_NIBBLES 0
#define QBYTES_SIGNED 1
#define QBYTES_HALF 2
#define QBYTES_INT8 4 /* the quants regrouped for int8 activations (int8.c) */
#define QSIGNED(kind) ((kind) & QBYTES_SIGNED)

/* The bytes of a record's scales (and offsets) before its quants, and of one record of L
 * inputs for a strip of 16 outputs. */
static inline long qscales(int kind) {
    return (kind & QBYTES_HALF ? 32 : 64) * (QSIGNED(kind) ? 1 : 2);
}

static inline long qrecord(int kind, int L) {
    return qscales(kind) + (QSIGNED(kind) ? 16 : 8) * L;
}

/* The record kinds and block lengths the formats have (kernels.quant.FORMATS): Q4_0 and
 * Q4_K, Q4_1, Q8_0, Q6_K. run_op refuses any other. */
static inline int qkind_known(long kind, long L) {
    return (L == 32 && (kind == QBYTES_NIBBLES || kind == (QBYTES_NIBBLES | QBYTES_HALF)
                        || kind == (QBYTES_SIGNED | QBYTES_HALF)))
           || (L == 16 && kind == QBYTES_SIGNED);
}

/* A float16's value as a float32 (exact), for the portable code. */
static inline float half_value(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0) {  /* zero or subnormal: man 2^-24, exact in float32 */
        float f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    uint32_t bits = sign | (exp == 0x1f ? 0x7f800000u : (exp + 112) << 23) | man << 13;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}


/* Outputs per strip of a packed weight, float or quantized. */
#define STRIP 16

/* ---- the thread pool (pool.c) ----------------------------------------------------- */

#define MAX_THREADS 256

typedef void (*RangeFn)(const void *ctx, long lo, long hi);

/* What parallel_for returns when the pool's threads cannot be started (pool_error says
 * why): a code no op returns for its own errors. */
#define POOL_FAILED -99

INTERNAL int parallel_for(RangeFn fn, const void *ctx, long units, long align);
INTERNAL int pool_threads(void);
INTERNAL void pool_set_threads(int n);
INTERNAL int pool_error(void);
INTERNAL void forget_pool(void);
INTERNAL int read_words(const uint64_t *x, long bytes, uint64_t *out);

/* ---- portable C ------------------------------------------------------------------- */

INTERNAL int rotary_rows(const int64_t *positions, float *x, long xs, long T, long heads,
                         long D, const float *cos_sin, long max_positions);
INTERNAL int store_rows(const float *k, long ks, const float *v, long vs, float *k_cache,
                        float *v_cache, const int64_t *slots, long T, long row, long num_slots);
INTERNAL int store_latent_rows(const float *latent, long ls, const float *k_pe, long ps,
                               float *cache, const int64_t *slots, long T, long L, long R,
                               long num_slots);
INTERNAL void add_rows(const float *x, long xs, const float *y, long ys, float *out, long T,
                       long H);
#define ROUTE_SOFTMAX 0
#define ROUTE_SIGMOID 1
#define ROUTE_GREEDY 0
#define ROUTE_GROUP_LIMITED 1
#define ROUTE_NOAUX_TC 2
INTERNAL void grouped_route(const float *logits, long ls, const float *bias, float *weights,
                            int64_t *ids, long T, long E, long k, long scoring, long method,
                            long n_group, long topk_group, long renormalize, float scaling,
                            float *scratch);
INTERNAL int embedding_rows(const int64_t *ids, long n, const float *table, long group,
                            long group_stride, long row_stride, long col_stride, long V, long H,
                            float *out);
INTERNAL int quantized_rows(const int64_t *ids, long n, const uint8_t *w, int kind, long L,
                            long V, long H, float *out);
INTERNAL int select_rows(const float *x, long xs, long rows, long H, const int64_t *indices,
                         long n, float *out);

/* The int8 products (int8.c): the instruction set they run with (int8_path), and y [T, N] =
 * x [T, K] W^T (+ bias) for W in Q4_1's int8 records, or Q8_0's own (q8), K a multiple of 32
 * and N of 16; 0, -1 if a scratch cannot be allocated, or POOL_FAILED. */
#define INT8_PORTABLE 0
#define INT8_AVX2 1
#define INT8_VNNI 2
INTERNAL extern int int8_path;
INTERNAL int linear_int8(const float *x, long xs, const uint8_t *w, int q8, const float *bias,
                         float *y, long T, long K, long N);

#if NATIVE_X86

/* ---- x86-64 (AVX2, FMA, F16C) ----------------------------------------------------- */

/* Whether the quantized products take their AVX-512 path (quantized.c; set at import). */
INTERNAL extern int use_avx512;

/* Rows per tile of the float products (products.c). */
#define TILE_ROWS 6
/* Rows of x per pass over the weight: a block of them stays in L2 (48 x 1536 floats is
 * 288 KiB) while every strip passes through. */
#define ROW_BLOCK 48

/* ---- sums ----------------------------------------------------------------------- */

AVX2 static inline float hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
    return _mm_cvtss_f32(a);
}

/* e^x for eight floats: x = n ln 2 + r with |r| <= ln 2 / 2, e^r by its degree-6 Taylor
 * polynomial (Horner), times 2^n built in the exponent bits, x clamped to +-88.38. The
 * SwiGLU built on it stays within 3.8 ulp of the float64 value over [-87, 87] (measured;
 * torch's own: 2.2). */
AVX2 static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f)),
                      _mm256_set1_ps(88.3762626647949f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* ln 2 in two parts, so that n * ln2_hi is exact */
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    /* n = -128 at the low clamp: 2^n split in two halves keeps the exponent field valid */
    __m256i half = _mm256_srai_epi32(_mm256_cvtps_epi32(n), 1);
    __m256i rest = _mm256_sub_epi32(_mm256_cvtps_epi32(n), half);
    __m256 a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
    __m256 b = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(rest, _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, a), b);
}

INTERNAL AVX2 void tile_of(int mr, int ns, const float *x, long xs, const float *b, long K,
                           const float *bias, float *y, long ys, const float *prefetch,
                           int every);
INTERNAL AVX2 int linear_packed(const float *x, long xs, const float *p, const float *bias,
                                float *y, long T, long K, long N);
INTERNAL int pack_strips(float *w, long K, long N);
INTERNAL AVX2 int linear_quantized(const float *x, long xs, const uint8_t *w, int kind, long L,
                                   const float *bias, float *y, long T, long K, long N);
INTERNAL AVX2 void silu_and_mul_avx2(const float *x, long xs, float *out, long T, long I);
INTERNAL AVX2 void rms_norm_avx2(const float *x, long xs, long heads, const float *residual,
                                 long rs, float *summed, const float *weight, float *out,
                                 long T, long H, float eps);
INTERNAL AVX2 int decode_attention(
    const float *q, long qs, const float *kc, const float *vc, const int32_t *tables,
    long width, const int32_t *lens, float *out, long B, long Hq, long Hk, long D,
    long BS, long NB, float scale, long window, float *scores, long max_keys);
INTERNAL AVX2 int prefill_attention(
    const float *q, long qs, const float *kc, const float *vc, const int32_t *tables,
    long width, const int32_t *lens, const int32_t *starts, long T, float *out, long B,
    long Hq, long Hk, long D, long BS, long NB, float scale, long window);
INTERNAL AVX2 int moe_experts_packed(const float *x, long xs, const float *w13,
                                     const float *w2, const float *weights, const int64_t *ids,
                                     float *out, long T, long k, long E, long H, long I);
INTERNAL AVX2 int mla_decode(const float *q_nope, long qs, const float *q_pe, long ps,
                             const float *cache, const float *kv_b, const int32_t *tables,
                             long width, const int32_t *lens, float *out, long B, long H,
                             long Dn, long R, long L, long Dv, long BS, long NB, float scale);

#endif /* NATIVE_X86 */

#endif /* INTERLOCK_NATIVE_H */
