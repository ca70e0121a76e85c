/* Quantized products (see native.h). */
#include "native.h"

#if NATIVE_X86

/* ---- quantized products --------------------------------------------------------- */

INTERNAL int use_avx512 = 0;

/* GGUF's block formats stay quantized in memory, repacked once at load
 * (interlock.kernels.quant.pack) into strips of 16 outputs, as the float32 weights are.
 * Strip s and block b (L inputs: 32, or 16 for Q6_K's sub-blocks) is one record; the
 * records of a strip follow each other, and the strips each other, so that a product
 * streams the weight once, front to back. A record is:
 *   16 scales d[c] (c: the strip's 16 outputs),
 *   with 4-bit quants (Q4_0, Q4_1, Q4_K): 16 offsets m[c], then L / 2 lines of 16
 *     bytes, byte c of line j holding q[c][j] (low nibble) and q[c][j + L / 2] (high);
 *   with 8-bit quants (Q8_0, Q6_K): L lines of 16 signed bytes, byte c of line k q[c][k].
 * The scales and offsets are the file's own float16 where the format has them so (Q4_1,
 * Q8_0: QBYTES_HALF; a product at one row streams its bytes, so these are 17 % and 6 %
 * fewer than with float32), float32 where they are computed at load (Q4_0's -8 d, the
 * K-quants' d times a sub-block scale); either way the kernels compute with their float32
 * values, exactly.
 * Weight (c, k) of the block is d[c] q[c][k] + m[c] (no m for 8-bit quants). Q4_0's
 * q - 8 is d q + (-8 d), and the K-quants' sub-block scales are folded into d and m, in
 * float32 as gguf dequantizes them (reference.dequantize_packed matches it bitwise).
 *
 * Accumulation order, for output n of row t: for each block b in order, a[b] is one FMA
 * chain over the block's k in order of q x (the quants converted to float in registers,
 * never stored); the block adds d a[b] + m s[b] (s[b]: the row's inputs over the block
 * summed left to right; the product m s first, then d a[b] fused onto it) to y, which
 * starts at 0; the bias is added last. Nothing in it depends on the other rows of the
 * batch or on the tile shape, so a row's result is bitwise the same in any batch. It
 * differs from the reference (dequantize, then a float product) in rounding only: the
 * scale multiplies a block's sum instead of each weight. */


#define QTILE_ROWS 4
/* How many blocks ahead a tile of several strips prefetches its own records (as the
 * AVX-512 tiles do, below). */
#define QPF_AHEAD 2
#define QTILE_R(X, s) X(0, s) X(1, s) X(2, s) X(3, s)
#define QTILE_RS(X) QTILE_R(X, 0) QTILE_R(X, 1) QTILE_R(X, 2)

/* y[0:mr, 0:16 ns] = x[0:mr, :] W^T for the ns strips from `w` (strip stride
 * `strip_bytes`), nb blocks of L. xsum[r * nb + b] is row r's s[b] (nibble kinds). One
 * block's share of `prefetch` (the next strip's records, `lines` of 64 bytes each) is
 * brought to L2 per block, as the float tiles do; a wide tile (1-2 rows, no `prefetch`)
 * brings its own records QPF_AHEAD blocks on instead (over SmolLM2's layers at 1-2 rows,
 * records streamed from memory: 0.8x the time without). */
AVX2 static inline __attribute__((always_inline)) void qtile(
        const int kind, const int L, const int mr, const int ns, const float *x, long xs,
        const float *xsum, long nb, const uint8_t *w, long strip_bytes, float *y, long ys,
        const uint8_t *prefetch, long lines) {
    const long rec = qrecord(kind, L), qs = qscales(kind);
    const __m256i low4 = _mm256_set1_epi32(0x0f);
#define QZERO(r, s) if (r < mr && s < ns) { \
        _mm256_storeu_ps(y + r * ys + s * STRIP, _mm256_setzero_ps()); \
        _mm256_storeu_ps(y + r * ys + s * STRIP + 8, _mm256_setzero_ps()); }
    QTILE_RS(QZERO)
    for (long b = 0; b < nb; b++) {
        const float *xb = x + b * L;
#define QACC(r, s) __m256 lo##r##s = _mm256_setzero_ps(), hi##r##s = lo##r##s;
        QTILE_RS(QACC)
        if (prefetch) {
            for (long l = 0; l < lines; l++)
                _mm_prefetch((const char *)prefetch + 64 * l, _MM_HINT_T1);
            prefetch += rec;
        } else {  /* a wide tile (no next strip to share out): its own records ahead */
#define QPF(s) if (s < ns) for (long l = 0; l < rec; l += 64) _mm_prefetch( \
                (const char *)w + s * strip_bytes + (b + QPF_AHEAD) * rec + l, _MM_HINT_T0);
            QPF(0) QPF(1) QPF(2)
        }
        /* Scales (or offsets) i .. i + 7 of a record from its head, as float32. */
#define QSCALE8(d, i) (kind & QBYTES_HALF \
        ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d) + (i) / 8)) \
        : _mm256_loadu_ps((const float *)(d) + (i)))
#define QFMA(r, s, k) if (r < mr && s < ns) { \
        __m256 xv = _mm256_broadcast_ss(xb + r * xs + (k)); \
        lo##r##s = _mm256_fmadd_ps(xv, w0##s, lo##r##s); \
        hi##r##s = _mm256_fmadd_ps(xv, w1##s, hi##r##s); }
#define QSTEP(s, k) QFMA(0, s, k) QFMA(1, s, k) QFMA(2, s, k) QFMA(3, s, k)
        /* The 8 bytes at p, each widened to a lane (zero- or sign-extended from memory:
         * one port-5 instruction per 8 weights, no shuffle to reach the upper half). */
#define QWIDEN(ext, p) _mm256_##ext##_epi32(_mm_loadl_epi64((const __m128i *)(p)))
        if (!QSIGNED(kind)) {
            for (long j = 0; j < L / 2; j++) {
                /* each byte a lane: its low nibble q[c][j] (masked), its high q[c][j + L / 2]
                 * (shifted down); a strip's steps in order, each chain's as before */
#define QNIB(s) if (s < ns) { __m256 w0##s, w1##s; \
                const uint8_t *at = w + s * strip_bytes + b * rec + qs + 16 * j; \
                __m256i v0 = QWIDEN(cvtepu8, at), v1 = QWIDEN(cvtepu8, at + 8); \
                w0##s = _mm256_cvtepi32_ps(_mm256_and_si256(v0, low4)); \
                w1##s = _mm256_cvtepi32_ps(_mm256_and_si256(v1, low4)); QSTEP(s, j) \
                w0##s = _mm256_cvtepi32_ps(_mm256_srli_epi32(v0, 4)); \
                w1##s = _mm256_cvtepi32_ps(_mm256_srli_epi32(v1, 4)); QSTEP(s, j + L / 2) }
                QNIB(0) QNIB(1) QNIB(2)
            }
        } else {
            for (long k = 0; k < L; k++) {
#define QBYTE(s) if (s < ns) { __m256 w0##s, w1##s; \
                const uint8_t *at = w + s * strip_bytes + b * rec + qs + 16 * k; \
                w0##s = _mm256_cvtepi32_ps(QWIDEN(cvtepi8, at)); \
                w1##s = _mm256_cvtepi32_ps(QWIDEN(cvtepi8, at + 8)); QSTEP(s, k) }
                QBYTE(0) QBYTE(1) QBYTE(2)
            }
        }
#define QADD(r, s) if (r < mr && s < ns) { \
        const uint8_t *d = w + s * strip_bytes + b * rec; \
        __m256 tlo, thi; \
        if (!QSIGNED(kind)) { \
            __m256 sum = _mm256_broadcast_ss(xsum + r * nb + b); \
            tlo = _mm256_fmadd_ps(QSCALE8(d, 0), lo##r##s, _mm256_mul_ps(QSCALE8(d, 16), sum)); \
            thi = _mm256_fmadd_ps(QSCALE8(d, 8), hi##r##s, _mm256_mul_ps(QSCALE8(d, 24), sum)); \
        } else { \
            tlo = _mm256_mul_ps(QSCALE8(d, 0), lo##r##s); \
            thi = _mm256_mul_ps(QSCALE8(d, 8), hi##r##s); } \
        float *yo = y + r * ys + s * STRIP; \
        _mm256_storeu_ps(yo, _mm256_add_ps(_mm256_loadu_ps(yo), tlo)); \
        _mm256_storeu_ps(yo + 8, _mm256_add_ps(_mm256_loadu_ps(yo + 8), thi)); }
        QTILE_RS(QADD)
    }
}

/* The tile shapes quantized products use, each compiled with its constants. */
#define QTILE_CASES(kind, L) \
    switch (mr * 4 + ns) { \
    case 4 * 4 + 1: qtile(kind, L, 4, 1, x, xs, xsum, nb, w, sb, y, ys, pf, lines); break; \
    case 3 * 4 + 1: qtile(kind, L, 3, 1, x, xs, xsum, nb, w, sb, y, ys, pf, lines); break; \
    case 2 * 4 + 1: qtile(kind, L, 2, 1, x, xs, xsum, nb, w, sb, y, ys, pf, lines); break; \
    case 1 * 4 + 1: qtile(kind, L, 1, 1, x, xs, xsum, nb, w, sb, y, ys, pf, lines); break; \
    case 2 * 4 + 2: qtile(kind, L, 2, 2, x, xs, xsum, nb, w, sb, y, ys, pf, lines); break; \
    case 1 * 4 + 3: qtile(kind, L, 1, 3, x, xs, xsum, nb, w, sb, y, ys, pf, lines); break; \
    }

/* Compiled for each record kind and block length qkind_known takes. */
#define QKINDS(CASES) \
    if (kind == QBYTES_NIBBLES) { \
        CASES(QBYTES_NIBBLES, 32) \
    } else if (kind == (QBYTES_NIBBLES | QBYTES_HALF)) { \
        CASES(QBYTES_NIBBLES | QBYTES_HALF, 32) \
    } else if (kind == (QBYTES_SIGNED | QBYTES_HALF)) { \
        CASES(QBYTES_SIGNED | QBYTES_HALF, 32) \
    } else { \
        CASES(QBYTES_SIGNED, 16) \
    }

AVX2 static void qtile_of(int kind, int mr, int ns, const float *x, long xs,
                          const float *xsum, long nb, const uint8_t *w, long sb, float *y,
                          long ys, const uint8_t *pf, long lines) {
    QKINDS(QTILE_CASES)
}

/* The same products with AVX-512, taken where the CPU has AVX-512 F (quantized_isa says
 * which path runs): one 512-bit register holds a strip's 16 outputs, so a line of quants
 * is widened once and each weight costs one conversion and one FMA on 16 lanes instead of
 * two on 8 (a SmolLM2 decode step: 0.9x the AVX2 path's time, both streaming). The
 * arithmetic is the order above, operation for operation (each output's chains, the block
 * sums, d a[b] + m s[b] added to y from 0), so both paths give bitwise the same results;
 * y stays in registers across the blocks instead of in memory, which rounds nothing. */
#define AVX512 __attribute__((target("avx512f,avx2,fma")))
#define ZTILE_R(X, s) X(0, s) X(1, s) X(2, s) X(3, s)
#define ZTILE_RS(X) ZTILE_R(X, 0) ZTILE_R(X, 1) ZTILE_R(X, 2) ZTILE_R(X, 3)
#define ZTILE_S(X) X(0) X(1) X(2) X(3)
/* Each tile brings its strips' records ZPF_AHEAD blocks on into L1 as it goes (measured
 * on SmolLM2's layers, 1-4 rows: 15-25 % faster than none; 2, 3, 4, 8 ahead and hints to L2
 * alike within the noise of a shared machine). */
#define ZPF_AHEAD 2

AVX512 static inline __attribute__((always_inline)) void qtile512(
        const int kind, const int L, const int mr, const int ns, const float *x, long xs,
        const float *xsum, long nb, const uint8_t *w, long strip_bytes, float *y, long ys) {
    const long rec = qrecord(kind, L), qs = qscales(kind);
    const __m512i low4 = _mm512_set1_epi32(0x0f);
#define ZY(r, s) __m512 y##r##s = _mm512_setzero_ps();
    ZTILE_RS(ZY)
    for (long b = 0; b < nb; b++) {
        const float *xb = x + b * L;
        const uint8_t *wb = w + b * rec;
#define ZACC(r, s) __m512 a##r##s = _mm512_setzero_ps();
        ZTILE_RS(ZACC)
        {
#define ZPF(s) if (s < ns) for (long l = 0; l < rec; l += 64) \
                _mm_prefetch((const char *)wb + s * strip_bytes + ZPF_AHEAD * rec + l, _MM_HINT_T0);
            ZTILE_S(ZPF)
        }
#define ZFMA(r, s, k, v) if (r < mr && s < ns) \
        a##r##s = _mm512_fmadd_ps(_mm512_set1_ps(xb[r * xs + (k)]), v, a##r##s);
        if (!QSIGNED(kind)) {
            for (long j = 0; j < L / 2; j++) {
                /* each byte widened to a lane: its low nibble q[c][j], its high q[c][j + L/2] */
#define ZNIB(s) __m512 lo##s = _mm512_setzero_ps(), hi##s = lo##s; if (s < ns) { \
                __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128( \
                    (const __m128i *)(wb + s * strip_bytes + qs + 16 * j))); \
                lo##s = _mm512_cvtepi32_ps(_mm512_and_si512(v, low4)); \
                hi##s = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)); }
                ZTILE_S(ZNIB)
#define ZLOW(r, s) ZFMA(r, s, j, lo##s)
#define ZHIGH(r, s) ZFMA(r, s, j + L / 2, hi##s)
                ZTILE_RS(ZLOW)
                ZTILE_RS(ZHIGH)
            }
        } else {
            for (long k = 0; k < L; k++) {
#define ZBYTE(s) __m512 q##s = _mm512_setzero_ps(); if (s < ns) \
                q##s = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128( \
                    (const __m128i *)(wb + s * strip_bytes + qs + 16 * k))));
                ZTILE_S(ZBYTE)
#define ZQ(r, s) ZFMA(r, s, k, q##s)
                ZTILE_RS(ZQ)
            }
        }
        /* The record's 16 scales (i 0) or offsets (i 16), as float32. */
#define ZSCALE(d, i) (kind & QBYTES_HALF \
        ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(d) + (i) / 16)) \
        : _mm512_loadu_ps((const float *)(d) + (i)))
#define ZADD(r, s) if (r < mr && s < ns) { \
        const uint8_t *d = wb + s * strip_bytes; \
        __m512 t = !QSIGNED(kind) \
            ? _mm512_fmadd_ps(ZSCALE(d, 0), a##r##s, _mm512_mul_ps( \
                  ZSCALE(d, 16), _mm512_set1_ps(xsum[r * nb + b]))) \
            : _mm512_mul_ps(ZSCALE(d, 0), a##r##s); \
        y##r##s = _mm512_add_ps(y##r##s, t); }
        ZTILE_RS(ZADD)
    }
#define ZOUT(r, s) if (r < mr && s < ns) _mm512_storeu_ps(y + r * ys + s * STRIP, y##r##s);
    ZTILE_RS(ZOUT)
}

#define ZTILE_CASES(kind, L) \
    switch (mr * 8 + ns) { \
    case 4 * 8 + 2: qtile512(kind, L, 4, 2, x, xs, xsum, nb, w, sb, y, ys); break; \
    case 3 * 8 + 2: qtile512(kind, L, 3, 2, x, xs, xsum, nb, w, sb, y, ys); break; \
    case 2 * 8 + 2: qtile512(kind, L, 2, 2, x, xs, xsum, nb, w, sb, y, ys); break; \
    case 1 * 8 + 4: qtile512(kind, L, 1, 4, x, xs, xsum, nb, w, sb, y, ys); break; \
    case 4 * 8 + 1: qtile512(kind, L, 4, 1, x, xs, xsum, nb, w, sb, y, ys); break; \
    case 3 * 8 + 1: qtile512(kind, L, 3, 1, x, xs, xsum, nb, w, sb, y, ys); break; \
    case 2 * 8 + 1: qtile512(kind, L, 2, 1, x, xs, xsum, nb, w, sb, y, ys); break; \
    case 1 * 8 + 1: qtile512(kind, L, 1, 1, x, xs, xsum, nb, w, sb, y, ys); break; \
    }

AVX512 static void qtile512_of(int kind, int mr, int ns, const float *x, long xs,
                               const float *xsum, long nb, const uint8_t *w, long sb, float *y,
                               long ys) {
    QKINDS(ZTILE_CASES)
}

typedef struct {
    const float *x, *xsum;
    const uint8_t *w;
    float *y;
    long xs, T, nb, N;
    int kind, L;
} QuantizedProduct;

/* Strips lo .. hi - 1 of a QuantizedProduct. */
AVX2 static void quantized_strips(const void *ctx, long lo, long hi) {
    const QuantizedProduct *c = ctx;
    const float *x = c->x, *xsum = c->xsum;
    const uint8_t *w = c->w;
    float *y = c->y;
    const int kind = c->kind;
    long xs = c->xs, T = c->T, nb = c->nb, N = c->N, strips = hi;
    long rec = qrecord(kind, c->L), sb = nb * rec;
    for (long m0 = 0; m0 < T; m0 += ROW_BLOCK) {
        long rows = T - m0 < ROW_BLOCK ? T - m0 : ROW_BLOCK;
        /* Tiles of at most four rows (a fifth would spill: each row holds two accumulators
         * per strip, and the converted weights need registers too), split evenly; one row
         * takes three strips and two rows two, for six and eight FMA chains. With AVX-512 a
         * row holds one accumulator per strip: one row takes four strips, more rows two. */
        int tiles = (int)((rows + QTILE_ROWS - 1) / QTILE_ROWS), base = (int)(rows / tiles);
        int wide = use_avx512 ? (rows == 1 ? 4 : 2) : rows == 1 ? 3 : rows == 2 ? 2 : 1;
        long lines = (rec / 64 + tiles - 1) / tiles;
        for (long s = lo; s < strips;) {
            int ns = s + wide <= strips ? wide : 1;
            const uint8_t *ws = w + s * sb;
            const uint8_t *next = ns == 1 && s + 1 < strips ? ws + sb : NULL;
            for (int i = 0, t = 0; i < tiles; i++) {
                int mr = base + (i < rows % tiles);
                long first = i * lines * 64;  /* this tile's share of each next record */
                const uint8_t *pf = next && first < rec ? next + first : NULL;
                long count = pf ? (rec - first < lines * 64 ? (rec - first) / 64 : lines) : 0;
                const float *xt = x + (m0 + t) * xs, *st = xsum ? xsum + (m0 + t) * nb : NULL;
                float *yt = y + (m0 + t) * N + s * STRIP;
                if (use_avx512)  /* prefetches its own strips' records ahead */
                    qtile512_of(kind, mr, ns, xt, xs, st, nb, ws, sb, yt, N);
                else
                    qtile_of(kind, mr, ns, xt, xs, st, nb, ws, sb, yt, N, pf, count);
                t += mr;
            }
            s += ns;
        }
    }
}

/* y [T, N] = x [T, K] W^T (+ bias) for W quantized and packed (N a multiple of 16, K of
 * L; kind and L checked by the caller: qkind_known), its strips shared among the threads
 * (in runs of 4: the widest tile). -1 if the block sums' scratch cannot be allocated, or
 * POOL_FAILED. */
INTERNAL AVX2 int linear_quantized(const float *x, long xs, const uint8_t *w, int kind, long L,
                                   const float *bias, float *y, long T, long K, long N) {
    long nb = K / L;
    float *xsum = NULL;
    if (!QSIGNED(kind)) {
        xsum = malloc(sizeof(float) * (size_t)(T * nb > 0 ? T * nb : 1));
        if (xsum == NULL) return -1;
        for (long t = 0; t < T; t++)
            for (long b = 0; b < nb; b++) {
                float s = 0.0f;
                for (long k = 0; k < L; k++) s += x[t * xs + b * L + k];
                xsum[t * nb + b] = s;
            }
    }
    QuantizedProduct c = {x, xsum, w, y, xs, T, nb, N, kind, (int)L};
    int rc = parallel_for(quantized_strips, &c, N / STRIP, 4);
    if (rc == 0 && bias)
        for (long t = 0; t < T; t++)
            for (long n = 0; n < N; n++) y[t * N + n] += bias[n];
    free(xsum);
    return rc;
}


#endif /* NATIVE_X86 */
