/* The native CPU kernels (backend "native"): float32, x86-64 with AVX2 and FMA.
 *
 * A decode step multiplies one or a few rows by every weight, so it is bound by how
 * fast the weights stream from memory; between the products, torch spends a few
 * microseconds of dispatch on each of ~180 small ops per layer. These kernels stream
 * the weights at the machine's read bandwidth and do each small op in one call.
 *
 * Every entry point takes raw addresses and sizes that interlock.kernels.native.ops
 * has checked against the tensors (dtype, device, shape, strides); what it cannot check
 * without reading tensor data (cache slots, block ids, positions) is checked here, and
 * an out-of-range value raises ValueError before anything is written.
 *
 * Built with -ffp-contract=off: the compiler fuses no multiply-add on its own. The
 * explicit ones are in the products, the sums of squares and the exp polynomial; rotary
 * rounds each operation as torch's reference does.
 *
 * The same entry point serves a call from Python and a record of a tape (see the end of
 * this file), which the native graph backend replays without Python in between.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define NATIVE_X86 1
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2,fma")))
#else
#define NATIVE_X86 0
#endif

#if NATIVE_X86

/* ---- products ------------------------------------------------------------------- */

AVX2 static inline float hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
    return _mm_cvtss_f32(a);
}

/* One row, W stored [K, N]: y = x @ W with y in L1, the weight streamed four rows at a
 * time. (The multi-row kernels below measured 5-13 % slower for a single row: their
 * scratch and register tiles buy nothing when each weight element meets one input.) */
AVX2 static void gemv_kn(const float *x, const float *w, const float *bias, float *y,
                         long K, long N) {
    long n8 = N & ~7L, k = 0;
    for (long n = 0; n < N; n++) y[n] = bias ? bias[n] : 0.0f;
    for (; k + 4 <= K; k += 4) {
        const float *w0 = w + k * N, *w1 = w0 + N, *w2 = w1 + N, *w3 = w2 + N;
        __m256 x0 = _mm256_set1_ps(x[k]), x1 = _mm256_set1_ps(x[k + 1]);
        __m256 x2 = _mm256_set1_ps(x[k + 2]), x3 = _mm256_set1_ps(x[k + 3]);
        for (long n = 0; n < n8; n += 8) {
            __m256 acc = _mm256_loadu_ps(y + n);
            acc = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w0 + n), acc);
            acc = _mm256_fmadd_ps(x1, _mm256_loadu_ps(w1 + n), acc);
            acc = _mm256_fmadd_ps(x2, _mm256_loadu_ps(w2 + n), acc);
            acc = _mm256_fmadd_ps(x3, _mm256_loadu_ps(w3 + n), acc);
            _mm256_storeu_ps(y + n, acc);
        }
        for (long n = n8; n < N; n++)
            y[n] = fmaf(x[k + 3], w3[n], fmaf(x[k + 2], w2[n], fmaf(x[k + 1], w1[n],
                   fmaf(x[k], w0[n], y[n]))));
    }
    for (; k < K; k++)
        for (long n = 0; n < N; n++) y[n] = fmaf(x[k], w[k * N + n], y[n]);
}

/* y[t, :] = x[t, :] @ W for W stored [K, N] (in x out), for a few rows t.
 *
 * The weight streams once, four of its rows at a time, front to back. Each 16-column
 * piece of those four rows is loaded into registers once and applied to every input row,
 * whose partial sums are read and written back from cache: the outputs are walked in
 * column chunks whose rows stay in L2 whatever the width (the LM head's 49,152 columns),
 * accumulated in a scratch whose row stride is not a multiple of 4 KiB (rows of y a
 * multiple of 4 KiB apart would share L1 sets and evict each other beyond eight rows).
 * Returns -1 when the scratch cannot be allocated. */
AVX2 static int linear_kn(const float *x, long xs, const float *w, const float *bias,
                          float *y, long T, long K, long N) {
    long chunk = (256 * 1024 / 4) / T;  /* columns whose T rows of sums fit in 256 KiB */
    chunk = chunk < 16 ? 16 : chunk & ~15L;
    long ld = (chunk < N ? chunk : (N + 15) & ~15L) + 16;
    float *acc = malloc(sizeof(float) * T * ld);
    if (acc == NULL) return -1;
    for (long c0 = 0; c0 < N; c0 += chunk) {
        long cols = c0 + chunk < N ? chunk : N - c0, c16 = cols & ~15L;
        for (long t = 0; t < T; t++)
            for (long n = 0; n < cols; n++) acc[t * ld + n] = bias ? bias[c0 + n] : 0.0f;
        long k = 0;
        for (; k + 4 <= K; k += 4) {
            const float *w0 = w + k * N + c0, *w1 = w0 + N, *w2 = w1 + N, *w3 = w2 + N;
            for (long n = 0; n < c16; n += 16) {
                __m256 a0 = _mm256_loadu_ps(w0 + n), b0 = _mm256_loadu_ps(w0 + n + 8);
                __m256 a1 = _mm256_loadu_ps(w1 + n), b1 = _mm256_loadu_ps(w1 + n + 8);
                __m256 a2 = _mm256_loadu_ps(w2 + n), b2 = _mm256_loadu_ps(w2 + n + 8);
                __m256 a3 = _mm256_loadu_ps(w3 + n), b3 = _mm256_loadu_ps(w3 + n + 8);
                for (long t = 0; t < T; t++) {
                    const float *xt = x + t * xs + k;
                    float *at = acc + t * ld + n;
                    __m256 lo = _mm256_loadu_ps(at), hi = _mm256_loadu_ps(at + 8);
                    __m256 v = _mm256_broadcast_ss(xt);
                    lo = _mm256_fmadd_ps(v, a0, lo);
                    hi = _mm256_fmadd_ps(v, b0, hi);
                    v = _mm256_broadcast_ss(xt + 1);
                    lo = _mm256_fmadd_ps(v, a1, lo);
                    hi = _mm256_fmadd_ps(v, b1, hi);
                    v = _mm256_broadcast_ss(xt + 2);
                    lo = _mm256_fmadd_ps(v, a2, lo);
                    hi = _mm256_fmadd_ps(v, b2, hi);
                    v = _mm256_broadcast_ss(xt + 3);
                    lo = _mm256_fmadd_ps(v, a3, lo);
                    hi = _mm256_fmadd_ps(v, b3, hi);
                    _mm256_storeu_ps(at, lo);
                    _mm256_storeu_ps(at + 8, hi);
                }
            }
            for (long t = 0; t < T; t++) {
                const float *xt = x + t * xs + k;
                float *at = acc + t * ld;
                for (long n = c16; n < cols; n++)
                    at[n] = fmaf(xt[3], w3[n], fmaf(xt[2], w2[n], fmaf(xt[1], w1[n],
                            fmaf(xt[0], w0[n], at[n]))));
            }
        }
        for (; k < K; k++) {
            const float *wk = w + k * N + c0;
            for (long t = 0; t < T; t++) {
                float xk = x[t * xs + k];
                float *at = acc + t * ld;
                for (long n = 0; n < cols; n++) at[n] = fmaf(xk, wk[n], at[n]);
            }
        }
        for (long t = 0; t < T; t++) memcpy(y + t * N + c0, acc + t * ld, sizeof(float) * cols);
    }
    free(acc);
    return 0;
}

static float dot_tail(const float *a, const float *b, long from, long to) {
    float s = 0.0f;
    for (long i = from; i < to; i++) s = fmaf(a[i], b[i], s);
    return s;
}

/* The four sums of four accumulators, as one vector's low half. */
AVX2 static inline __m128 hsum4x(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
    __m256 abcd = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* y[t, :] = x[t, :] @ W^T for W stored [N, K] (out x in): four weight rows at a time
 * (they stay in L1), dotted with two input rows at once, so each load feeds two FMAs. */
AVX2 static void linear_nk(const float *x, long xs, const float *w, const float *bias,
                           float *y, long T, long K, long N) {
    long k8 = K & ~7L, n = 0;
    for (; n + 4 <= N; n += 4) {
        const float *w0 = w + n * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
        long t = 0;
        for (; t + 2 <= T; t += 2) {
            const float *x0 = x + t * xs, *x1 = x0 + xs;
            __m256 p0 = _mm256_setzero_ps(), p1 = p0, p2 = p0, p3 = p0;
            __m256 q0 = p0, q1 = p0, q2 = p0, q3 = p0;
            for (long k = 0; k < k8; k += 8) {
                __m256 u = _mm256_loadu_ps(x0 + k), v = _mm256_loadu_ps(x1 + k);
                __m256 c = _mm256_loadu_ps(w0 + k);
                p0 = _mm256_fmadd_ps(u, c, p0);
                q0 = _mm256_fmadd_ps(v, c, q0);
                c = _mm256_loadu_ps(w1 + k);
                p1 = _mm256_fmadd_ps(u, c, p1);
                q1 = _mm256_fmadd_ps(v, c, q1);
                c = _mm256_loadu_ps(w2 + k);
                p2 = _mm256_fmadd_ps(u, c, p2);
                q2 = _mm256_fmadd_ps(v, c, q2);
                c = _mm256_loadu_ps(w3 + k);
                p3 = _mm256_fmadd_ps(u, c, p3);
                q3 = _mm256_fmadd_ps(v, c, q3);
            }
            float s[8];
            _mm_storeu_ps(s, hsum4x(p0, p1, p2, p3));
            _mm_storeu_ps(s + 4, hsum4x(q0, q1, q2, q3));
            for (int r = 0; r < 4; r++) {
                const float *wr = w + (n + r) * K;
                float a = s[r] + dot_tail(x0, wr, k8, K), b = s[4 + r] + dot_tail(x1, wr, k8, K);
                y[t * N + n + r] = bias ? a + bias[n + r] : a;
                y[(t + 1) * N + n + r] = bias ? b + bias[n + r] : b;
            }
        }
        for (; t < T; t++) {
            const float *x0 = x + t * xs;
            __m256 p0 = _mm256_setzero_ps(), p1 = p0, p2 = p0, p3 = p0;
            for (long k = 0; k < k8; k += 8) {
                __m256 u = _mm256_loadu_ps(x0 + k);
                p0 = _mm256_fmadd_ps(u, _mm256_loadu_ps(w0 + k), p0);
                p1 = _mm256_fmadd_ps(u, _mm256_loadu_ps(w1 + k), p1);
                p2 = _mm256_fmadd_ps(u, _mm256_loadu_ps(w2 + k), p2);
                p3 = _mm256_fmadd_ps(u, _mm256_loadu_ps(w3 + k), p3);
            }
            float s[4];
            _mm_storeu_ps(s, hsum4x(p0, p1, p2, p3));
            for (int r = 0; r < 4; r++) {
                float a = s[r] + dot_tail(x0, w + (n + r) * K, k8, K);
                y[t * N + n + r] = bias ? a + bias[n + r] : a;
            }
        }
    }
    for (; n < N; n++) {
        const float *wn = w + n * K;
        for (long t = 0; t < T; t++) {
            const float *xt = x + t * xs;
            __m256 acc = _mm256_setzero_ps();
            for (long k = 0; k < k8; k += 8)
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(xt + k), _mm256_loadu_ps(wn + k), acc);
            float a = hsum8(acc) + dot_tail(xt, wn, k8, K);
            y[t * N + n] = bias ? a + bias[n] : a;
        }
    }
}

/* One row, W stored [N, K]: eight weight rows at a time, the eight sums reduced
 * together (measured faster than the two-row kernel above for a single row). */
AVX2 static void gemv_nk(const float *x, const float *w, const float *bias, float *y,
                         long K, long N) {
    long k8 = K & ~7L, n = 0;
    for (; n + 8 <= N; n += 8) {
        const float *wn = w + n * K;
        __m256 a[8];
        for (int r = 0; r < 8; r++) a[r] = _mm256_setzero_ps();
        for (long k = 0; k < k8; k += 8) {
            __m256 xv = _mm256_loadu_ps(x + k);
            for (int r = 0; r < 8; r++)
                a[r] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wn + r * K + k), a[r]);
        }
        float sums[8];
        _mm_storeu_ps(sums, hsum4x(a[0], a[1], a[2], a[3]));
        _mm_storeu_ps(sums + 4, hsum4x(a[4], a[5], a[6], a[7]));
        for (int r = 0; r < 8; r++) {
            float v = sums[r] + dot_tail(x, wn + r * K, k8, K);
            y[n + r] = bias ? v + bias[n + r] : v;
        }
    }
    linear_nk(x, 0, w + n * K, bias ? bias + n : NULL, y + n, 1, K, N - n);
}

/* ---- attention ------------------------------------------------------------------ */

/* The keys (or values) first .. first + n - 1 of a sequence, for KV head g: each cache
 * block's run of rows, found with one division per block rather than per key. */
typedef struct {
    const float *cache;
    const int32_t *table;
    long BS, block_stride, slot_stride, g, D;
} Rows;

static inline const float *run_of(const Rows *r, long t, long end, long *count) {
    long in_block = t % r->BS;
    *count = r->BS - in_block < end - t ? r->BS - in_block : end - t;
    return r->cache + r->table[t / r->BS] * r->block_stride + in_block * r->slot_stride
           + r->g * r->D;
}

/* scores[i] = scale * q . k(first + i) for i < n: four keys at a time, four independent
 * accumulators (one dependent chain of FMAs would wait on its own latency). */
AVX2 static void score_keys(const float *q, const Rows *r, long first, long n, float scale,
                            float *scores) {
    long D = r->D, d8 = D & ~7L, step = r->slot_stride;
    for (long t = first; t < first + n;) {
        long count;
        const float *k = run_of(r, t, first + n, &count);
        float *out = scores + (t - first);
        long i = 0;
        for (; i + 4 <= count; i += 4, k += 4 * step) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (long d = 0; d < d8; d += 8) {
                __m256 qv = _mm256_loadu_ps(q + d);
                a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + d), a0);
                a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + step + d), a1);
                a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 2 * step + d), a2);
                a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 3 * step + d), a3);
            }
            out[i] = (hsum8(a0) + dot_tail(q, k, d8, D)) * scale;
            out[i + 1] = (hsum8(a1) + dot_tail(q, k + step, d8, D)) * scale;
            out[i + 2] = (hsum8(a2) + dot_tail(q, k + 2 * step, d8, D)) * scale;
            out[i + 3] = (hsum8(a3) + dot_tail(q, k + 3 * step, d8, D)) * scale;
        }
        for (; i < count; i++, k += step) {
            __m256 acc = _mm256_setzero_ps();
            for (long d = 0; d < d8; d += 8)
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), acc);
            out[i] = (hsum8(acc) + dot_tail(q, k, d8, D)) * scale;
        }
        t += count;
    }
}

/* out = sum_i p[i] v(first + i), the running sums kept in registers 64 features at a time. */
AVX2 static void weigh_values(const float *p, const Rows *r, long first, long n, float *out) {
    long D = r->D, step = r->slot_stride, d = 0;
    for (; d + 64 <= D; d += 64) {
        __m256 acc[8];
        for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
        for (long t = first; t < first + n;) {
            long count;
            const float *v = run_of(r, t, first + n, &count) + d;
            for (long i = 0; i < count; i++, v += step) {
                __m256 w = _mm256_set1_ps(p[t - first + i]);
                for (int j = 0; j < 8; j++)
                    acc[j] = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8 * j), acc[j]);
            }
            t += count;
        }
        for (int j = 0; j < 8; j++) _mm256_storeu_ps(out + d + 8 * j, acc[j]);
    }
    for (; d < D; d++) {
        float sum = 0.0f;
        for (long t = first; t < first + n;) {
            long count;
            const float *v = run_of(r, t, first + n, &count) + d;
            for (long i = 0; i < count; i++, v += step) sum = fmaf(p[t - first + i], *v, sum);
            t += count;
        }
        out[d] = sum;
    }
}

/* One query per sequence over its paged keys and values: per query head, the scores in
 * float32, softmax with the maximum subtracted, then the weighted sum of the values.
 * scores holds the keys of the longest sequence. */
AVX2 static int decode_attention(
    const float *q, long qs, const float *kc, const float *vc, const int32_t *tables,
    long width, const int32_t *lens, float *out, long B, long Hq, long Hk, long D,
    long BS, long NB, float scale, long window, float *scores, long max_keys) {
    long group = Hq / Hk, slot_stride = Hk * D, block_stride = BS * slot_stride;
    for (long b = 0; b < B; b++) {
        long len = lens[b];
        float *ob = out + b * Hq * D;
        if (len <= 0) {
            memset(ob, 0, sizeof(float) * Hq * D);
            continue;
        }
        if (len > max_keys || (len + BS - 1) / BS > width) return -1;
        const int32_t *table = tables + b * width;
        for (long i = 0; i < (len + BS - 1) / BS; i++)
            if (table[i] < 0 || table[i] >= NB) return -2;
        long first = (window > 0 && len > window) ? len - window : 0, keys = len - first;
        for (long h = 0; h < Hq; h++) {
            Rows k_rows = {kc, table, BS, block_stride, slot_stride, h / group, D};
            Rows v_rows = {vc, table, BS, block_stride, slot_stride, h / group, D};
            score_keys(q + b * qs + h * D, &k_rows, first, keys, scale, scores);
            float best = -INFINITY, total = 0.0f;
            for (long i = 0; i < keys; i++) best = scores[i] > best ? scores[i] : best;
            for (long i = 0; i < keys; i++) total += (scores[i] = expf(scores[i] - best));
            for (long i = 0; i < keys; i++) scores[i] /= total;
            weigh_values(scores, &v_rows, first, keys, ob + h * D);
        }
    }
    return 0;
}

/* ---- elementwise, vectorised ------------------------------------------------------- */

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

AVX2 static void silu_and_mul_avx2(const float *x, long xs, float *out, long T, long I) {
    long i8 = I & ~7L;
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (long t = 0; t < T; t++) {
        const float *gate = x + t * xs, *up = gate + I;
        float *ot = out + t * I;
        for (long i = 0; i < i8; i += 8) {
            __m256 g = _mm256_loadu_ps(gate + i);
            __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_xor_ps(g, sign))));
            _mm256_storeu_ps(ot + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
        }
        for (long i = i8; i < I; i++) ot[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
    }
}

/* Rows of x (plus residual, stored to summed) normalised by their root mean square, in
 * float32 as the reference, the squares summed in eight lanes. x is [T, heads, H] with
 * each row's heads back to back (heads 1: plain rows); out is [T * heads, H]. */
AVX2 static void rms_norm_avx2(const float *x, long xs, long heads, const float *residual,
                               long rs, float *summed, const float *weight, float *out, long T,
                               long H, float eps) {
    long h8 = H & ~7L;
    for (long t = 0; t < T * heads; t++) {
        const float *xt = x + (t / heads) * xs + (t % heads) * H;
        float *ot = out + t * H;
        if (residual) {
            float *st = summed + t * H;
            const float *rt = residual + t * rs;
            for (long i = 0; i < h8; i += 8)
                _mm256_storeu_ps(st + i, _mm256_add_ps(_mm256_loadu_ps(xt + i),
                                                       _mm256_loadu_ps(rt + i)));
            for (long i = h8; i < H; i++) st[i] = xt[i] + rt[i];
            xt = st;
        }
        __m256 acc = _mm256_setzero_ps();
        for (long i = 0; i < h8; i += 8) {
            __m256 v = _mm256_loadu_ps(xt + i);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        float squares = hsum8(acc);
        for (long i = h8; i < H; i++) squares += xt[i] * xt[i];
        float inv = 1.0f / sqrtf(squares / H + eps);
        __m256 inv8 = _mm256_set1_ps(inv);
        for (long i = 0; i < h8; i += 8)
            _mm256_storeu_ps(ot + i, _mm256_mul_ps(_mm256_loadu_ps(weight + i),
                                                   _mm256_mul_ps(_mm256_loadu_ps(xt + i), inv8)));
        for (long i = h8; i < H; i++) ot[i] = weight[i] * (xt[i] * inv);
    }
}

#endif /* NATIVE_X86 */

/* ---- rotary and the KV store (portable C; rounding as the torch references) ------- */

/* Neox rotary in place on x [T, heads, D] (row stride xs, head stride D). */
static int rotary_rows(const int64_t *positions, float *x, long xs, long T, long heads,
                       long D, const float *cos_sin, long max_positions) {
    long half = D / 2;
    for (long t = 0; t < T; t++)
        if (positions[t] < 0 || positions[t] >= max_positions) return -1;
    for (long t = 0; t < T; t++) {
        const float *cos = cos_sin + positions[t] * D, *sin = cos + half;
        for (long h = 0; h < heads; h++) {
            float *x1 = x + t * xs + h * D, *x2 = x1 + half;
            for (long i = 0; i < half; i++) {
                float a = x1[i], b = x2[i];
                x1[i] = a * cos[i] - b * sin[i];
                x2[i] = b * cos[i] + a * sin[i];
            }
        }
    }
    return 0;
}

static int store_rows(const float *k, long ks, const float *v, long vs, float *k_cache,
                      float *v_cache, const int64_t *slots, long T, long row, long num_slots) {
    for (long t = 0; t < T; t++)
        if (slots[t] < -1 || slots[t] >= num_slots) return -1;
    for (long t = 0; t < T; t++) {
        if (slots[t] < 0) continue; /* padding */
        memcpy(k_cache + slots[t] * row, k + t * ks, sizeof(float) * row);
        memcpy(v_cache + slots[t] * row, v + t * vs, sizeof(float) * row);
    }
    return 0;
}

/* ---- gathers ------------------------------------------------------------------------ */

/* out[i, :] = table[ids[i], :] for a table of V rows whose element (v, h) sits at
 * v * row_stride + h * col_stride (a transposed view works as it is). */
static int embedding_rows(const int64_t *ids, long n, const float *table, long row_stride,
                          long col_stride, long V, long H, float *out) {
    for (long i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V) return -1;
    for (long i = 0; i < n; i++) {
        const float *row = table + ids[i] * row_stride;
        float *o = out + i * H;
        if (col_stride == 1) memcpy(o, row, sizeof(float) * H);
        else for (long h = 0; h < H; h++) o[h] = row[h * col_stride];
    }
    return 0;
}

/* out[i, :] = x[indices[i], :] for x of `rows` rows (row stride xs). */
static int select_rows(const float *x, long xs, long rows, long H, const int64_t *indices,
                     long n, float *out) {
    for (long i = 0; i < n; i++)
        if (indices[i] < 0 || indices[i] >= rows) return -1;
    for (long i = 0; i < n; i++) memcpy(out + i * H, x + indices[i] * xs, sizeof(float) * H);
    return 0;
}

/* ---- one entry point per op, and tapes of them -------------------------------------
 *
 * Every op is called with a code and a fixed list of integer ('i') and float ('d')
 * arguments, the same from Python (`call`) and from a tape (`run_tape`): a tape is an
 * array of records, each an op code and MAX_SLOTS argument slots, that the native graph
 * backend records while a forward is captured and replays without Python in between. */

#define MAX_SLOTS 20
typedef union { int64_t i; double d; } Slot;

enum {
    OP_LINEAR = 1, OP_DECODE_ATTENTION, OP_RMS_NORM, OP_SILU_AND_MUL, OP_ROTARY,
    OP_STORE_KV, OP_EMBEDDING, OP_SELECT_ROWS, OP_COUNT
};

static const char *const NAMES[OP_COUNT] = {
    NULL, "linear", "decode_attention", "rms_norm", "silu_and_mul", "rotary", "store_kv",
    "embedding", "select_rows",
};

/* Argument kinds, in order. */
static const char *const SIGNATURES[OP_COUNT] = {
    NULL,
    "iiiiiiiii",           /* linear(x, x_row_stride, w, bias|0, y, T, K, N, transposed) */
    "iiiiiiiiiiiiiidiii",  /* decode_attention(q, qs, kc, vc, tables, width, lens, out, B,
                              Hq, Hk, D, BS, NB, scale, window|0, scratch, scratch_len) */
    "iiiiiiiiiid",         /* rms_norm(x, xs, heads, residual|0, rs, summed|0, w, out, T, H,
                              eps) */
    "iiiii",               /* silu_and_mul(x, xs, out, T, I) */
    "iiiiiiii",            /* rotary(positions, x, xs, T, heads, D, cos_sin, max_positions) */
    "iiiiiiiiii",          /* store_kv(k, ks, v, vs, k_cache, v_cache, slots, T, row, slots_n) */
    "iiiiiiii",            /* embedding(ids, n, table, row_stride, col_stride, V, H, out) */
    "iiiiiii",             /* select_rows(x, xs, rows, H, indices, n, out) */
};

#define P(k) ((void *)(intptr_t)a[k].i)

/* Runs one op; 0, or an error code `describe` explains. */
static int run_op(int64_t op, const Slot *a) {
    switch (op) {
#if NATIVE_X86
    case OP_LINEAR: {
        long T = a[5].i, K = a[6].i, N = a[7].i;
        if (T == 1 && a[8].i) gemv_kn(P(0), P(2), P(3), P(4), K, N);
        else if (T == 1) gemv_nk(P(0), P(2), P(3), P(4), K, N);
        else if (a[8].i) return linear_kn(P(0), a[1].i, P(2), P(3), P(4), T, K, N);
        else linear_nk(P(0), a[1].i, P(2), P(3), P(4), T, K, N);
        return 0;
    }
    case OP_DECODE_ATTENTION:
        return decode_attention(P(0), a[1].i, P(2), P(3), P(4), a[5].i, P(6), P(7), a[8].i,
                                a[9].i, a[10].i, a[11].i, a[12].i, a[13].i, (float)a[14].d,
                                a[15].i, P(16), a[17].i);
    case OP_RMS_NORM:
        rms_norm_avx2(P(0), a[1].i, a[2].i, P(3), a[4].i, P(5), P(6), P(7), a[8].i, a[9].i,
                      (float)a[10].d);
        return 0;
    case OP_SILU_AND_MUL:
        silu_and_mul_avx2(P(0), a[1].i, P(2), a[3].i, a[4].i);
        return 0;
#endif
    case OP_ROTARY:
        return rotary_rows(P(0), P(1), a[2].i, a[3].i, a[4].i, a[5].i, P(6), a[7].i);
    case OP_STORE_KV:
        return store_rows(P(0), a[1].i, P(2), a[3].i, P(4), P(5), P(6), a[7].i, a[8].i,
                          a[9].i);
    case OP_EMBEDDING:
        return embedding_rows(P(0), a[1].i, P(2), a[3].i, a[4].i, a[5].i, a[6].i, P(7));
    case OP_SELECT_ROWS:
        return select_rows(P(0), a[1].i, a[2].i, a[3].i, P(4), a[5].i, P(6));
    }
    return -100;
}

/* The Python exception for run_op's error `rc` of `op`. */
static void describe(int64_t op, int rc, const Slot *a) {
    if (rc == -100) {
        PyErr_Format(PyExc_ValueError, "no native op %lld on this machine", (long long)op);
        return;
    }
    switch (op) {
    case OP_LINEAR:
        PyErr_NoMemory();
        return;
    case OP_DECODE_ATTENTION:
        if (rc == -1)
            PyErr_SetString(PyExc_ValueError,
                            "a sequence length exceeds its block table or the scratch scores");
        else
            PyErr_Format(PyExc_ValueError, "a block table names a block outside 0..%lld",
                         (long long)a[13].i - 1);
        return;
    case OP_ROTARY:
        PyErr_Format(PyExc_ValueError, "a position is outside the rotary table (0..%lld)",
                     (long long)a[7].i - 1);
        return;
    case OP_STORE_KV:
        PyErr_Format(PyExc_ValueError,
                     "a slot is outside the KV cache (-1 for padding, else 0..%lld)",
                     (long long)a[9].i - 1);
        return;
    case OP_EMBEDDING:
        PyErr_Format(PyExc_ValueError, "a token id is outside the vocabulary (0..%lld)",
                     (long long)a[5].i - 1);
        return;
    case OP_SELECT_ROWS:
        PyErr_Format(PyExc_ValueError, "a row index is outside 0..%lld", (long long)a[2].i - 1);
        return;
    }
    PyErr_Format(PyExc_ValueError, "native op %s failed (%d)", NAMES[op], rc);
}

/* Parses (op, *args): the op code, and its arguments into slots by the op's signature. */
static int parse(const char *usage, PyObject *const *argv, Py_ssize_t argc, int64_t *op,
                 Slot *a) {
    if (argc < 1) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    *op = PyLong_AsLongLong(argv[0]);
    if (*op == -1 && PyErr_Occurred()) return -1;
    if (*op <= 0 || *op >= OP_COUNT) {
        PyErr_Format(PyExc_ValueError, "unknown native op %lld", (long long)*op);
        return -1;
    }
    const char *kinds = SIGNATURES[*op];
    Py_ssize_t want = (Py_ssize_t)strlen(kinds);
    if (argc - 1 != want) {
        PyErr_Format(PyExc_TypeError, "native %s takes %zd arguments, got %zd", NAMES[*op],
                     want, argc - 1);
        return -1;
    }
    for (Py_ssize_t k = 0; k < want; k++) {
        if (kinds[k] == 'd') a[k].d = PyFloat_AsDouble(argv[k + 1]);
        else a[k].i = PyLong_AsLongLong(argv[k + 1]);
    }
    return PyErr_Occurred() ? -1 : 0;
}

/* call(op, *args): runs one op now. */
static PyObject *py_call(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    int64_t op;
    Slot a[MAX_SLOTS];
    if (parse("call(op, *args)", argv, argc, &op, a)) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = run_op(op, a);
    Py_END_ALLOW_THREADS
    if (rc) {
        describe(op, rc, a);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* record(op, *args) -> bytes: one tape record (op code, then MAX_SLOTS slots). */
static PyObject *py_record(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    int64_t record[1 + MAX_SLOTS] = {0};
    if (parse("record(op, *args)", argv, argc, record, (Slot *)(record + 1))) return NULL;
    return PyBytes_FromStringAndSize((const char *)record, sizeof record);
}

/* run_tape(records: bytes): runs every record in order; stops at the first error. */
static PyObject *py_run_tape(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 1 || !PyBytes_Check(argv[0])) {
        PyErr_SetString(PyExc_TypeError, "run_tape(records: bytes)");
        return NULL;
    }
    const int64_t *record = (const int64_t *)PyBytes_AS_STRING(argv[0]);
    Py_ssize_t size = PyBytes_GET_SIZE(argv[0]), width = (1 + MAX_SLOTS) * sizeof(int64_t);
    if (size % width) {
        PyErr_SetString(PyExc_ValueError, "a tape is whole records");
        return NULL;
    }
    Py_ssize_t count = size / width, done = 0;
    int rc = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; done < count; done++, record += 1 + MAX_SLOTS)
        if ((rc = run_op(record[0], (const Slot *)(record + 1))) != 0) break;
    Py_END_ALLOW_THREADS
    if (rc) {
        describe(record[0], rc, (const Slot *)(record + 1));
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"call", (PyCFunction)(void (*)(void))py_call, METH_FASTCALL, NULL},
    {"record", (PyCFunction)(void (*)(void))py_record, METH_FASTCALL, NULL},
    {"run_tape", (PyCFunction)(void (*)(void))py_run_tape, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cpu",
    "interlock's native CPU kernels (float32; x86-64 with AVX2 and FMA).", -1, methods,
};

PyMODINIT_FUNC PyInit__cpu(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    const char *unsupported = NULL;
#if NATIVE_X86
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
        unsupported = "this CPU has no AVX2 and FMA";
#else
    unsupported = "the native kernels are built for x86-64 only";
#endif
    PyObject *why = unsupported ? PyUnicode_FromString(unsupported) : Py_NewRef(Py_None);
    if (why == NULL || PyModule_AddObject(m, "UNSUPPORTED", why) < 0) {
        Py_XDECREF(why);
        Py_DECREF(m);
        return NULL;
    }
    for (int op = 1; op < OP_COUNT; op++) {
        char name[32];
        snprintf(name, sizeof name, "OP_%s", NAMES[op]);
        for (char *c = name; *c; c++) *c = (char)(*c >= 'a' && *c <= 'z' ? *c - 32 : *c);
        if (PyModule_AddIntConstant(m, name, op) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
