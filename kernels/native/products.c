/* Float32 products (see native.h). */
#include "native.h"

#if NATIVE_X86

/* ---- products ------------------------------------------------------------------- */

/* Linear weights are packed once, after loading (interlock.kernels.reference.dense.pack_weight):
 * W [N, K] (out x in) as P[s][k][c] = W[16 s + c][k], strips of 16 outputs, so that the
 * 16 weights an input feature meets in a strip are one 64-byte line and a strip is one
 * contiguous run of K lines, which the prefetchers follow.
 *
 * A product keeps a tile of y in registers for all of K: up to 6 rows by one strip, or
 * (for 1-3 rows) 2-4 strips, so that each weight line loaded feeds 2 to 12 FMAs and 6 to
 * 12 independent chains run at once. Each output is one FMA chain over k = 0 .. K-1
 * whatever the number of rows: a row's result does not depend on the batch it is in.
 * Measured on one Zen 3 core over SmolLM2's 538 MB of weights against MKL through torch
 * 2.13 (bench/bench_cpu_products.py): 1 row 0.84x its time, 4-16 rows 0.4-0.5x, 512 rows
 * 0.9-1.06x. */

#define TILE_R(X, s) X(0, s) X(1, s) X(2, s) X(3, s) X(4, s) X(5, s)
#define TILE_RS(X) TILE_R(X, 0) TILE_R(X, 1) TILE_R(X, 2) TILE_R(X, 3)
#define TILE_S(X) X(0) X(1) X(2) X(3)

/* y[0:mr, 0:16 ns] = x[0:mr, :] W^T (+ bias) for the ns strips from `b` (strip stride
 * K * 16); mr and ns are constants where it is inlined, so only their registers exist.
 * One line from `prefetch` on (the next strip's share of this tile) is brought to L2 every
 * `every` steps of k: the tiles of a strip share out its successor's lines, so that the
 * next weight streams in while this one is multiplied, at a rate memory can follow
 * (prefetching a whole strip during the first tile measured 10-20 % slower at 8-32 rows). */
AVX2 static inline __attribute__((always_inline)) void tile(
        const int mr, const int ns, const float *x, long xs, const float *b, long K,
        const float *bias, float *y, long ys, const float *prefetch, int every) {
#define ACC(r, s) __m256 lo##r##s = _mm256_setzero_ps(), hi##r##s = lo##r##s;
    TILE_RS(ACC)
    int countdown = every;
    for (long k = 0; k < K; k++) {
#define LINE(s) __m256 b0##s = _mm256_setzero_ps(), b1##s = b0##s; if (s < ns) { \
        b0##s = _mm256_loadu_ps(b + s * K * STRIP + STRIP * k); \
        b1##s = _mm256_loadu_ps(b + s * K * STRIP + STRIP * k + 8); }
        TILE_S(LINE)
        if (prefetch && --countdown == 0) {
            _mm_prefetch((const char *)prefetch, _MM_HINT_T1);
            prefetch += STRIP;
            countdown = every;
        }
#define FMA(r, s) if (r < mr && s < ns) { \
        lo##r##s = _mm256_fmadd_ps(x##r, b0##s, lo##r##s); \
        hi##r##s = _mm256_fmadd_ps(x##r, b1##s, hi##r##s); }
#define ROW(r, _) if (r < mr) { __m256 x##r = _mm256_broadcast_ss(x + r * xs + k); \
        FMA(r, 0) FMA(r, 1) FMA(r, 2) FMA(r, 3) }
        TILE_R(ROW, 0)
    }
#define OUT(r, s) if (r < mr && s < ns) { \
        if (bias) { lo##r##s = _mm256_add_ps(lo##r##s, _mm256_loadu_ps(bias + s * STRIP)); \
                    hi##r##s = _mm256_add_ps(hi##r##s, _mm256_loadu_ps(bias + s * STRIP + 8)); } \
        _mm256_storeu_ps(y + r * ys + s * STRIP, lo##r##s); \
        _mm256_storeu_ps(y + r * ys + s * STRIP + 8, hi##r##s); }
    TILE_RS(OUT)
}

/* The tile shapes the products and attention use, each compiled with its constants. */
INTERNAL AVX2 void tile_of(int mr, int ns, const float *x, long xs, const float *b, long K,
                           const float *bias, float *y, long ys, const float *prefetch,
                           int every) {
#define TILE_CASE(m, n) case m * 8 + n: \
    tile(m, n, x, xs, b, K, bias, y, ys, prefetch, every); break;
    switch (mr * 8 + ns) {
    TILE_CASE(6, 1) TILE_CASE(5, 1) TILE_CASE(4, 1) TILE_CASE(3, 1) TILE_CASE(2, 1)
    TILE_CASE(1, 1) TILE_CASE(3, 2) TILE_CASE(2, 2) TILE_CASE(1, 4)
    }
}

typedef struct {
    const float *x, *p, *bias;
    float *y;
    long xs, T, K, N;
} PackedProduct;

/* Strips lo .. hi - 1 of a PackedProduct. */
AVX2 static void packed_strips(const void *ctx, long lo, long hi) {
    const PackedProduct *c = ctx;
    const float *x = c->x, *p = c->p, *bias = c->bias;
    float *y = c->y;
    long xs = c->xs, T = c->T, K = c->K, N = c->N, strips = hi;
    for (long m0 = 0; m0 < T; m0 += ROW_BLOCK) {
        long rows = T - m0 < ROW_BLOCK ? T - m0 : ROW_BLOCK;
        /* The rows split evenly into tiles (8 = 4 + 4, not 6 + 2: a tile of two rows runs
         * four FMA chains, too few to hide their latency); fewer rows than four take more
         * strips per tile instead. */
        int tiles = (int)((rows + TILE_ROWS - 1) / TILE_ROWS), base = (int)(rows / tiles);
        int wide = rows >= 4 ? 1 : rows == 1 ? 4 : 2;
        for (long s = lo; s < strips;) {
            int ns = s + wide <= strips ? wide : 1;
            const float *b = p + s * K * STRIP;
            const float *next = ns == 1 && s + 1 < strips ? b + K * STRIP : NULL;
            for (int i = 0, t = 0; i < tiles; i++) {
                int mr = base + (i < rows % tiles);
                tile_of(mr, ns, x + (m0 + t) * xs, xs, b, K, bias ? bias + s * STRIP : NULL,
                        y + (m0 + t) * N + s * STRIP, N,
                        next ? next + STRIP * (i * K / tiles) : NULL, tiles);
                t += mr;
            }
            s += ns;
        }
    }
}

/* y [T, N] = x [T, K] W^T (+ bias) for W packed in strips (N a multiple of 16), its strips
 * shared among the threads (in runs of 4: the widest tile). 0, or POOL_FAILED. */
INTERNAL AVX2 int linear_packed(const float *x, long xs, const float *p, const float *bias,
                                float *y, long T, long K, long N) {
    PackedProduct c = {x, p, bias, y, xs, T, K, N};
    return parallel_for(packed_strips, &c, N / STRIP, 4);
}

/* W [N, K] packed in strips in place: strip s holds rows 16 s .. 16 s + 15 of W, which
 * are transposed through a scratch of one strip. -1 if the scratch cannot be allocated. */
INTERNAL int pack_strips(float *w, long K, long N) {
    float *strip = malloc(sizeof(float) * STRIP * K);
    if (strip == NULL) return -1;
    for (long s = 0; s < N / STRIP; s++) {
        float *ws = w + s * K * STRIP;
        copy_floats(strip, ws, STRIP * K);
        for (long k = 0; k < K; k++)  /* written in order: measured 1.9x the other way */
            for (long c = 0; c < STRIP; c++) ws[k * STRIP + c] = strip[c * K + k];
    }
    free(strip);
    return 0;
}

#endif /* NATIVE_X86 */
