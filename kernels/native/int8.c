/* Q4_1 and Q8_0 products on int8 activations (see native.h): integer dot products in place
 * of a float conversion and an FMA per weight.
 *
 * At one row the float path (quantized.c) spends its instructions widening every 4-bit
 * quant to a float and multiplying it in: on AVX2 more than the weight's bytes take to
 * stream. Here the row is rounded to 8 bits per block of 32 inputs instead (d_x = max|x| /
 * 127, x_q = rint(x / d_x) as x times 1 / d_x, the block's float sum s, in a fixed order,
 * kept for the offset term), and each block of an output is one integer dot product of its
 * quants with x_q, exact in int32:
 *   y[n] = sum over blocks b, in order, of  d_w[n][b] (d_x[b] isum[n][b]) + m[n][b] s[b]
 * (the product d_x isum first, then the FMA with d_w onto m s), y from 0, the bias last.
 * The paths differ only in how isum is computed, which is exact, so all three give bitwise
 * the same results: VNNI (vpdpbusd: four u8 x s8 products summed into each 32-bit lane),
 * AVX2 (vpmaddubsw: pairs summed into 16-bit lanes, a block's eight steps added in 16 bits,
 * which cannot overflow: 8 x 2 x 15 x 127 = 30480 < 2^15, then vpmaddwd into 32 bits), and
 * portable C, which every build has.
 *
 * Q8_0 (int8 x int8; d_w (d_x isum), no offset) keeps its own records (quantized.c: 16
 * float16 scales, then 32 lines of 16 signed bytes, byte c of line k q[c][k]), so that a
 * tied head's rows serve the embedding as they are: with VNNI, vpermb (AVX-512 VBMI, which
 * the VNNI path requires) gathers four lines into one output's four inputs a lane, and
 * vpdpbusd takes x_q + 128 as its unsigned operand, less 128 times the quants' sum (a second
 * vpdpbusd with ones); on AVX2, two lines' bytes interleaved into 16-bit pairs, vpmaddwd.
 *
 * The records (kernels.quant.pack of an int8 format) are Q4_1's, the quants regrouped so
 * that a 32-bit lane holds four consecutive inputs of one output: a record is 16 float16
 * scales d[c], 16 float16 offsets m[c], then 4 lines of 64 bytes, byte 4 c + i of line g
 * holding q[c][4 g + i] (low nibble) and q[c][16 + 4 g + i] (high nibble). */
#include "native.h"

/* The instruction set the int8 products run with: INT8_* (set at import, or forced). */
INTERNAL int int8_path = INT8_PORTABLE;

#define INT8_BLOCK 32
#define INT8_QUANTS 64     /* bytes of a record before its quants: 16 scales, 16 offsets */
#define INT8_RECORD 320    /* the scales, the offsets and 4 lines of 64 bytes */
#define Q8_QUANTS 32       /* bytes of a Q8_0 record before its quants: 16 scales */
#define Q8_RECORD 544      /* the scales and 32 lines of 16 bytes */
/* Rows of x a thread rounds at a time: fewer are not worth a second thread. */
#define ROUND_ROWS 16

/* The row quantized: x_q [K] (int8), and per block d_x and s. Shared by every strip. */
typedef struct {
    const uint8_t *w;
    const int8_t *xq;
    const float *dx, *xsum;
    float *y;
    long T, nb, N;
} Int8Product;

/* Scale (or offset) c of a record's 16 float16 values at `at`, as float32. */
static inline float half_at(const uint8_t *at, long c) {
    uint16_t h;
    memcpy(&h, at + 2 * c, sizeof h);
    return half_value(h);
}

/* Strips lo .. hi - 1 of an Int8Product, portable C. */
static void int8_strips_portable(const void *ctx, long lo, long hi) {
    const Int8Product *c = ctx;
    for (long s = lo; s < hi; s++) {
        const uint8_t *ws = c->w + s * c->nb * INT8_RECORD;
        for (long t = 0; t < c->T; t++) {
            const int8_t *xq = c->xq + t * c->nb * INT8_BLOCK;
            float y[STRIP] = {0};
            for (long b = 0; b < c->nb; b++) {
                const uint8_t *rec = ws + b * INT8_RECORD, *lines = rec + INT8_QUANTS;
                const int8_t *xb = xq + b * INT8_BLOCK;
                float dx = c->dx[t * c->nb + b], sum = c->xsum[t * c->nb + b];
                for (long o = 0; o < STRIP; o++) {
                    int32_t isum = 0;
                    for (long g = 0; g < 4; g++)
                        for (long i = 0; i < 4; i++) {
                            uint8_t q = lines[64 * g + 4 * o + i];
                            isum += (q & 15) * xb[4 * g + i] + (q >> 4) * xb[16 + 4 * g + i];
                        }
                    float dw = half_at(rec, o), m = half_at(rec + 32, o);
                    y[o] += fmaf(dw, dx * (float)isum, m * sum);
                }
            }
            copy_floats(c->y + t * c->N + s * STRIP, y, STRIP);
        }
    }
}

/* Q8_0: strips lo .. hi - 1, portable C. */
static void q8_strips_portable(const void *ctx, long lo, long hi) {
    const Int8Product *c = ctx;
    for (long s = lo; s < hi; s++) {
        const uint8_t *ws = c->w + s * c->nb * Q8_RECORD;
        for (long t = 0; t < c->T; t++) {
            const int8_t *xq = c->xq + t * c->nb * INT8_BLOCK;
            float y[STRIP] = {0};
            for (long b = 0; b < c->nb; b++) {
                const uint8_t *rec = ws + b * Q8_RECORD;
                const int8_t *xb = xq + b * INT8_BLOCK, *lines = (const int8_t *)rec + Q8_QUANTS;
                float dx = c->dx[t * c->nb + b];
                for (long o = 0; o < STRIP; o++) {
                    int32_t isum = 0;
                    for (long k = 0; k < INT8_BLOCK; k++) isum += lines[16 * k + o] * xb[k];
                    y[o] += half_at(rec, o) * (dx * (float)isum);
                }
            }
            copy_floats(c->y + t * c->N + s * STRIP, y, STRIP);
        }
    }
}

#if NATIVE_X86

/* A block's four 32-bit words of x_q: word g holds x_q[4 g .. 4 g + 3]. */
static inline int32_t word_at(const int8_t *xb, long g) {
    int32_t v;
    memcpy(&v, xb + 4 * g, sizeof v);
    return v;
}

/* Rows of x the x86 paths take through a block at once: its quants are loaded and
 * unpacked once for all of them (a prefill's or a batch's rows), the rest one at a time.
 * Each row's arithmetic is the one-row path's, in the same order, so tiling changes no bit. */
#define ROWS 4

/* Rows t .. t + rows - 1 of strip s with AVX2: each strip's 16 outputs as two halves of 8
 * lanes (bytes 0..31 of a line are outputs 0..7, bytes 32..63 outputs 8..15). */
AVX2 static inline __attribute__((always_inline)) void int8_rows_avx2(
        const Int8Product *c, long s, long t, const int rows) {
    const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const uint8_t *ws = c->w + s * c->nb * INT8_RECORD;
    __m256 y0[ROWS], y1[ROWS];
    for (int r = 0; r < rows; r++) y0[r] = y1[r] = _mm256_setzero_ps();
    for (long b = 0; b < c->nb; b++) {
        const uint8_t *rec = ws + b * INT8_RECORD, *lines = rec + INT8_QUANTS;
        __m256i a0[ROWS], a1[ROWS];
        for (int r = 0; r < rows; r++) a0[r] = a1[r] = _mm256_setzero_si256();
        for (long g = 0; g < 4; g++) {
            __m256i v0 = _mm256_loadu_si256((const __m256i *)(lines + 64 * g));
            __m256i v1 = _mm256_loadu_si256((const __m256i *)(lines + 64 * g + 32));
            __m256i l0 = _mm256_and_si256(v0, low4), l1 = _mm256_and_si256(v1, low4);
            __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), low4);
            __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), low4);
            for (int r = 0; r < rows; r++) {
                const int8_t *xb = c->xq + ((t + r) * c->nb + b) * INT8_BLOCK;
                __m256i xl = _mm256_set1_epi32(word_at(xb, g));
                __m256i xh = _mm256_set1_epi32(word_at(xb, 4 + g));
                a0[r] = _mm256_add_epi16(a0[r], _mm256_maddubs_epi16(l0, xl));
                a1[r] = _mm256_add_epi16(a1[r], _mm256_maddubs_epi16(l1, xl));
                a0[r] = _mm256_add_epi16(a0[r], _mm256_maddubs_epi16(h0, xh));
                a1[r] = _mm256_add_epi16(a1[r], _mm256_maddubs_epi16(h1, xh));
            }
        }
        __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)rec));
        __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)rec + 1));
        __m256 m0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)rec + 2));
        __m256 m1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)rec + 3));
        for (int r = 0; r < rows; r++) {
            __m256 dx = _mm256_set1_ps(c->dx[(t + r) * c->nb + b]);
            __m256 sum = _mm256_set1_ps(c->xsum[(t + r) * c->nb + b]);
            __m256 i0 = _mm256_cvtepi32_ps(_mm256_madd_epi16(a0[r], ones));
            __m256 i1 = _mm256_cvtepi32_ps(_mm256_madd_epi16(a1[r], ones));
            y0[r] = _mm256_add_ps(y0[r], _mm256_fmadd_ps(d0, _mm256_mul_ps(dx, i0),
                                                         _mm256_mul_ps(m0, sum)));
            y1[r] = _mm256_add_ps(y1[r], _mm256_fmadd_ps(d1, _mm256_mul_ps(dx, i1),
                                                         _mm256_mul_ps(m1, sum)));
        }
    }
    for (int r = 0; r < rows; r++) {
        float *yo = c->y + (t + r) * c->N + s * STRIP;
        _mm256_storeu_ps(yo, y0[r]);
        _mm256_storeu_ps(yo + 8, y1[r]);
    }
}

AVX2 static void int8_strips_avx2(const void *ctx, long lo, long hi) {
    const Int8Product *c = ctx;
    for (long s = lo; s < hi; s++) {
        long t = 0;
        for (; t + ROWS <= c->T; t += ROWS) int8_rows_avx2(c, s, t, ROWS);
        for (; t < c->T; t++) int8_rows_avx2(c, s, t, 1);
    }
}

/* Q8_0: rows t .. t + rows - 1 of strip s with AVX2: lines k and k + 1 interleaved into
 * 16-bit pairs (q[c][k], q[c][k + 1]), multiplied with the pair (x_q[k], x_q[k + 1]) and
 * added in pairs into 32 bits (vpmaddwd): outputs 0..7 and 8..15 in two registers. */
AVX2 static inline __attribute__((always_inline)) void q8_rows_avx2(
        const Int8Product *c, long s, long t, const int rows) {
    const uint8_t *ws = c->w + s * c->nb * Q8_RECORD;
    __m256 y0[ROWS], y1[ROWS];
    for (int r = 0; r < rows; r++) y0[r] = y1[r] = _mm256_setzero_ps();
    for (long b = 0; b < c->nb; b++) {
        const uint8_t *rec = ws + b * Q8_RECORD, *lines = rec + Q8_QUANTS;
        /* each row's x_q widened to 16 bits: word j is the pair (x_q[2 j], x_q[2 j + 1]) */
        int32_t pairs[ROWS][INT8_BLOCK / 2];
        for (int r = 0; r < rows; r++) {
            const int8_t *xb = c->xq + ((t + r) * c->nb + b) * INT8_BLOCK;
            _mm256_storeu_si256((__m256i *)pairs[r], _mm256_cvtepi8_epi16(
                _mm_loadu_si128((const __m128i *)xb)));
            _mm256_storeu_si256((__m256i *)pairs[r] + 1, _mm256_cvtepi8_epi16(
                _mm_loadu_si128((const __m128i *)xb + 1)));
        }
        __m256i a0[ROWS], a1[ROWS];
        for (int r = 0; r < rows; r++) a0[r] = a1[r] = _mm256_setzero_si256();
        for (long k = 0; k < INT8_BLOCK; k += 2) {
            __m128i l0 = _mm_loadu_si128((const __m128i *)(lines + 16 * k));
            __m128i l1 = _mm_loadu_si128((const __m128i *)(lines + 16 * k + 16));
            __m256i w0 = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(l0, l1));
            __m256i w1 = _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(l0, l1));
            for (int r = 0; r < rows; r++) {
                __m256i xp = _mm256_set1_epi32(pairs[r][k / 2]);
                a0[r] = _mm256_add_epi32(a0[r], _mm256_madd_epi16(w0, xp));
                a1[r] = _mm256_add_epi32(a1[r], _mm256_madd_epi16(w1, xp));
            }
        }
        __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)rec));
        __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)rec + 1));
        for (int r = 0; r < rows; r++) {
            __m256 dx = _mm256_set1_ps(c->dx[(t + r) * c->nb + b]);
            y0[r] = _mm256_add_ps(y0[r], _mm256_mul_ps(d0, _mm256_mul_ps(
                dx, _mm256_cvtepi32_ps(a0[r]))));
            y1[r] = _mm256_add_ps(y1[r], _mm256_mul_ps(d1, _mm256_mul_ps(
                dx, _mm256_cvtepi32_ps(a1[r]))));
        }
    }
    for (int r = 0; r < rows; r++) {
        float *yo = c->y + (t + r) * c->N + s * STRIP;
        _mm256_storeu_ps(yo, y0[r]);
        _mm256_storeu_ps(yo + 8, y1[r]);
    }
}

AVX2 static void q8_strips_avx2(const void *ctx, long lo, long hi) {
    const Int8Product *c = ctx;
    for (long s = lo; s < hi; s++) {
        long t = 0;
        for (; t + ROWS <= c->T; t += ROWS) q8_rows_avx2(c, s, t, ROWS);
        for (; t < c->T; t++) q8_rows_avx2(c, s, t, 1);
    }
}

#define VNNI __attribute__((target("avx512f,avx512vnni,avx512vbmi,avx2,fma,f16c")))

/* Q8_0: rows t .. t + rows - 1 of strip s with AVX-512 VNNI and VBMI: each group of four
 * lines gathered once (and its quants' sum taken once) for all the rows. */
VNNI static inline __attribute__((always_inline)) void q8_rows_vnni(
        const Int8Product *c, long s, long t, const int rows, __m512i gather) {
    const __m512i ones = _mm512_set1_epi8(1), flip = _mm512_set1_epi32((int)0x80808080u);
    const uint8_t *ws = c->w + s * c->nb * Q8_RECORD;
    __m512 y[ROWS];
    for (int r = 0; r < rows; r++) y[r] = _mm512_setzero_ps();
    for (long b = 0; b < c->nb; b++) {
        const uint8_t *rec = ws + b * Q8_RECORD, *lines = rec + Q8_QUANTS;
        __m512i v[8], q = _mm512_setzero_si512();
        for (long g = 0; g < 8; g++) {
            v[g] = _mm512_permutexvar_epi8(
                gather, _mm512_loadu_si512((const void *)(lines + 64 * g)));
            q = _mm512_dpbusd_epi32(q, ones, v[g]);
        }
        __m512i offset = _mm512_slli_epi32(q, 7);
        __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rec));
        for (int r = 0; r < rows; r++) {
            const int8_t *xb = c->xq + ((t + r) * c->nb + b) * INT8_BLOCK;
            __m512i a = _mm512_setzero_si512();
            for (long g = 0; g < 8; g++) {
                /* x_q + 128 as unsigned bytes: the sign bit of each byte flipped */
                __m512i xu = _mm512_xor_si512(_mm512_set1_epi32(word_at(xb, g)), flip);
                a = _mm512_dpbusd_epi32(a, xu, v[g]);
            }
            __m512 isum = _mm512_cvtepi32_ps(_mm512_sub_epi32(a, offset));
            y[r] = _mm512_add_ps(y[r], _mm512_mul_ps(
                dw, _mm512_mul_ps(_mm512_set1_ps(c->dx[(t + r) * c->nb + b]), isum)));
        }
    }
    for (int r = 0; r < rows; r++) _mm512_storeu_ps(c->y + (t + r) * c->N + s * STRIP, y[r]);
}

VNNI static void q8_strips_vnni(const void *ctx, long lo, long hi) {
    const Int8Product *c = ctx;
    /* byte 4 c + i of a group <- byte 16 i + c of its four lines: q[c][4 g + i] */
    uint8_t order[64];
    for (int o = 0; o < 16; o++)
        for (int i = 0; i < 4; i++) order[4 * o + i] = (uint8_t)(16 * i + o);
    const __m512i gather = _mm512_loadu_si512((const void *)order);
    for (long s = lo; s < hi; s++) {
        long t = 0;
        for (; t + ROWS <= c->T; t += ROWS) q8_rows_vnni(c, s, t, ROWS, gather);
        for (; t < c->T; t++) q8_rows_vnni(c, s, t, 1, gather);
    }
}

/* Rows t .. t + rows - 1 of strip s with AVX-512 VNNI: a strip's 16 outputs in one
 * register; a block's quants unpacked once for all the rows; the low and high nibbles'
 * dot products in two chains. */
VNNI static inline __attribute__((always_inline)) void int8_rows_vnni(
        const Int8Product *c, long s, long t, const int rows) {
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const uint8_t *ws = c->w + s * c->nb * INT8_RECORD;
    __m512 y[ROWS];
    for (int r = 0; r < rows; r++) y[r] = _mm512_setzero_ps();
    for (long b = 0; b < c->nb; b++) {
        const uint8_t *rec = ws + b * INT8_RECORD, *lines = rec + INT8_QUANTS;
        __m512i lo4[4], hi4[4];
        for (long g = 0; g < 4; g++) {
            __m512i v = _mm512_loadu_si512((const void *)(lines + 64 * g));
            lo4[g] = _mm512_and_si512(v, low4);
            hi4[g] = _mm512_and_si512(_mm512_srli_epi32(v, 4), low4);
        }
        __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rec));
        __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + 32)));
        for (int r = 0; r < rows; r++) {
            const int8_t *xb = c->xq + ((t + r) * c->nb + b) * INT8_BLOCK;
            __m512i a0 = _mm512_setzero_si512(), a1 = a0;
            for (long g = 0; g < 4; g++) {
                a0 = _mm512_dpbusd_epi32(a0, lo4[g], _mm512_set1_epi32(word_at(xb, g)));
                a1 = _mm512_dpbusd_epi32(a1, hi4[g], _mm512_set1_epi32(word_at(xb, 4 + g)));
            }
            __m512 isum = _mm512_cvtepi32_ps(_mm512_add_epi32(a0, a1));
            long at = (t + r) * c->nb + b;
            y[r] = _mm512_add_ps(y[r], _mm512_fmadd_ps(
                dw, _mm512_mul_ps(_mm512_set1_ps(c->dx[at]), isum),
                _mm512_mul_ps(m, _mm512_set1_ps(c->xsum[at]))));
        }
    }
    for (int r = 0; r < rows; r++) _mm512_storeu_ps(c->y + (t + r) * c->N + s * STRIP, y[r]);
}

VNNI static void int8_strips_vnni(const void *ctx, long lo, long hi) {
    const Int8Product *c = ctx;
    for (long s = lo; s < hi; s++) {
        long t = 0;
        for (; t + ROWS <= c->T; t += ROWS) int8_rows_vnni(c, s, t, ROWS);
        for (; t < c->T; t++) int8_rows_vnni(c, s, t, 1);
    }
}

#endif /* NATIVE_X86 */

/* Rows of x rounded to int8 per block, x_q, d_x and each block's float sum, for every path
 * alike: the sum in a fixed order (eight lanes, lane j adding x[j], x[8 + j], x[16 + j],
 * x[24 + j] in turn; then lanes j and j + 4, j and j + 2, 0 and 1: hsum8's order), so that
 * the AVX2 rounding below gives the portable one's bits. */
typedef struct {
    const float *x;
    long xs, nb, K;
    int8_t *xq;
    float *dx, *xsum;
} Rounding;

static float block_sum(const float *xb) {
    float l[8];
    for (int j = 0; j < 8; j++) l[j] = ((xb[j] + xb[8 + j]) + xb[16 + j]) + xb[24 + j];
    for (int j = 0; j < 4; j++) l[j] = l[j] + l[j + 4];
    for (int j = 0; j < 2; j++) l[j] = l[j] + l[j + 2];
    return l[0] + l[1];
}

/* Block b of a row, portable C. */
static void round_block(const float *xb, int8_t *q, float *dx, float *xsum) {
    float top = 0.0f;
    for (long k = 0; k < INT8_BLOCK; k++) {
        float a = fabsf(xb[k]);
        top = a > top || a != a ? a : top;  /* a NaN wins, and reaches d_x */
    }
    float d = top / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
    for (long k = 0; k < INT8_BLOCK; k++) {
        float v = xb[k] * inv;
        /* |v| rounds to 127 at most (the largest is 127 within a rounding), unless x
         * holds a NaN or an infinity: those give 0, and d_x carries them to y */
        q[k] = (int8_t)(fabsf(v) < 128.0f ? lrintf(v) : 0);
    }
    *dx = d;
    *xsum = block_sum(xb);
}

static void round_rows_portable(const void *ctx, long lo, long hi) {
    const Rounding *r = ctx;
    for (long t = lo; t < hi; t++)
        for (long b = 0; b < r->nb; b++)
            round_block(r->x + t * r->xs + b * INT8_BLOCK, r->xq + t * r->K + b * INT8_BLOCK,
                        r->dx + t * r->nb + b, r->xsum + t * r->nb + b);
}

#if NATIVE_X86
/* The same rounding with AVX2: four vectors of eight a block (cvtps rounds to nearest even,
 * as lrintf does in the default mode). A block holding a NaN takes the portable code, which
 * says how its NaN reaches d_x. */
AVX2 static void round_rows_avx2(const void *ctx, long lo, long hi) {
    const Rounding *r = ctx;
    const __m256 sign = _mm256_set1_ps(-0.0f), limit = _mm256_set1_ps(128.0f);
    /* packs interleave the 128-bit halves: this puts the 32 bytes back in order */
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (long t = lo; t < hi; t++)
        for (long b = 0; b < r->nb; b++) {
            const float *xb = r->x + t * r->xs + b * INT8_BLOCK;
            int8_t *q = r->xq + t * r->K + b * INT8_BLOCK;
            __m256 v[4], top = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
            for (int i = 0; i < 4; i++) {
                v[i] = _mm256_loadu_ps(xb + 8 * i);
                top = _mm256_max_ps(top, _mm256_andnot_ps(sign, v[i]));
                nan = _mm256_or_ps(nan, _mm256_cmp_ps(v[i], v[i], _CMP_UNORD_Q));
            }
            if (_mm256_movemask_ps(nan)) {
                round_block(xb, q, r->dx + t * r->nb + b, r->xsum + t * r->nb + b);
                continue;
            }
            __m128 m = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
            m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
            float d = _mm_cvtss_f32(m) / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
            __m256i w[4];
            for (int i = 0; i < 4; i++) {
                __m256 s = _mm256_mul_ps(v[i], _mm256_set1_ps(inv));
                __m256 in = _mm256_cmp_ps(_mm256_andnot_ps(sign, s), limit, _CMP_LT_OQ);
                w[i] = _mm256_and_si256(_mm256_cvtps_epi32(s), _mm256_castps_si256(in));
            }
            __m256i h = _mm256_packs_epi16(_mm256_packs_epi32(w[0], w[1]),
                                           _mm256_packs_epi32(w[2], w[3]));
            _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(h, order));
            __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(v[0], v[1]), v[2]), v[3]);
            r->dx[t * r->nb + b] = d;
            r->xsum[t * r->nb + b] = hsum8(sum);
        }
}
#endif

INTERNAL int linear_int8(const float *x, long xs, const uint8_t *w, int q8, const float *bias,
                         float *y, long T, long K, long N) {
    long nb = K / INT8_BLOCK;
    size_t rows = (size_t)(T > 0 ? T : 1);
    int8_t *xq = malloc(rows * (size_t)K + 1);
    float *scales = malloc(sizeof(float) * rows * (size_t)(2 * nb) + 1);
    if (xq == NULL || scales == NULL) {
        free(xq);
        free(scales);
        return -1;
    }
    float *dx = scales, *xsum = scales + T * nb;
    Rounding rounding = {x, xs, nb, K, xq, dx, xsum};
    RangeFn round = round_rows_portable;
    RangeFn fn = q8 ? q8_strips_portable : int8_strips_portable;
#if NATIVE_X86
    if (int8_path != INT8_PORTABLE) round = round_rows_avx2;
    if (int8_path == INT8_VNNI) fn = q8 ? q8_strips_vnni : int8_strips_vnni;
    else if (int8_path == INT8_AVX2) fn = q8 ? q8_strips_avx2 : int8_strips_avx2;
#endif
    /* a prefill's rows are rounded by the threads too (a row's rounding is its own) */
    int rc = parallel_for(round, &rounding, T, ROUND_ROWS);
    if (rc == 0) {
        Int8Product c = {w, xq, dx, xsum, y, T, nb, N};
        rc = parallel_for(fn, &c, N / STRIP, 1);
    }
    if (rc == 0 && bias)
        for (long t = 0; t < T; t++)
            for (long n = 0; n < N; n++) y[t * N + n] += bias[n];
    free(xq);
    free(scales);
    return rc;
}
