/* Gathers (see native.h). */
#include "native.h"

/* ---- gathers ------------------------------------------------------------------------ */

/* out[i, :] = table[ids[i], :] for a table of V rows whose element (v, h) sits at
 * v * row_stride + h * col_stride (a transposed view works as it is). */
/* Row v of the table starts at (v / group) * group_stride + (v % group) * row_stride: group
 * 1 for a plain [V, H] table, 16 for one packed in strips (a tied LM head). */
INTERNAL int embedding_rows(const int64_t *ids, long n, const float *table, long group,
                            long group_stride, long row_stride, long col_stride, long V, long H,
                            float *out) {
    for (long i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V) return -1;
    for (long i = 0; i < n; i++) {
        const float *row = table + ids[i] / group * group_stride + ids[i] % group * row_stride;
        float *o = out + i * H;
        if (col_stride == 1) copy_floats(o, row, H);
        else for (long h = 0; h < H; h++) o[h] = row[h * col_stride];
    }
    return 0;
}

/* Scale (or offset) c of the 16 at `at`, float16 or float32, as float32. */
static inline float scale_at(const uint8_t *at, long c, long half) {
    if (half) {
        uint16_t h;
        memcpy(&h, at + 2 * c, sizeof h);
        return half_value(h);
    }
    float f;
    memcpy(&f, at + 4 * c, sizeof f);
    return f;
}

/* out[i, :] = row ids[i] of a quantized packed table of V rows and H columns (a tied LM
 * head kept quantized), each weight d q + m as reference.dequantize_packed computes it. */
INTERNAL int quantized_rows(const int64_t *ids, long n, const uint8_t *w, int kind, long L,
                            long V, long H, float *out) {
    for (long i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V) return -1;
    long nb = H / L, rec = qrecord(kind, (int)L);
    for (long i = 0; i < n; i++) {
        long c = ids[i] % 16;
        const uint8_t *strip = w + ids[i] / 16 * nb * rec;
        for (long b = 0; b < nb; b++) {
            const uint8_t *r = strip + b * rec;
            long qs = qscales(kind), half = kind & QBYTES_HALF;
            float d = scale_at(r, c, half), m = 0.0f;
            float *o = out + i * H + b * L;
            if (!QSIGNED(kind)) {
                m = scale_at(r + qs / 2, c, half);
                for (long j = 0; j < L / 2; j++) {
                    uint8_t q = r[qs + 16 * j + c];
                    o[j] = d * (float)(q & 15) + m;
                    o[j + L / 2] = d * (float)(q >> 4) + m;
                }
            } else {
                for (long k = 0; k < L; k++) o[k] = d * (float)(int8_t)r[qs + 16 * k + c];
            }
        }
    }
    return 0;
}

/* out[i, :] = x[indices[i], :] for x of `rows` rows (row stride xs). */
INTERNAL int select_rows(const float *x, long xs, long rows, long H, const int64_t *indices,
                         long n, float *out) {
    for (long i = 0; i < n; i++)
        if (indices[i] < 0 || indices[i] >= rows) return -1;
    for (long i = 0; i < n; i++) copy_floats(out + i * H, x + indices[i] * xs, H);
    return 0;
}
