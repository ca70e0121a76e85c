/* Elementwise ops (see native.h). */
#include "native.h"

#if NATIVE_X86

/* ---- elementwise, vectorised ------------------------------------------------------- */

INTERNAL AVX2 void silu_and_mul_avx2(const float *x, long xs, float *out, long T, long I) {
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
INTERNAL AVX2 void rms_norm_avx2(const float *x, long xs, long heads, const float *residual,
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

/* out [T, H] = x + y, rows of x and y at strides xs and ys: one rounding per element, as
 * torch's add. */
INTERNAL void add_rows(const float *x, long xs, const float *y, long ys, float *out, long T,
                       long H) {
    for (long t = 0; t < T; t++)
        for (long h = 0; h < H; h++) out[t * H + h] = x[t * xs + h] + y[t * ys + h];
}
