/* Attention (see native.h). */
#include "native.h"

#if NATIVE_X86

static float dot_tail(const float *a, const float *b, long from, long to) {
    float s = 0.0f;
    for (long i = from; i < to; i++) s = fmaf(a[i], b[i], s);
    return s;
}

/* ---- attention ------------------------------------------------------------------ */

/* A row of scores for keys start .. start + span - 1 (span a multiple of 8) becomes the
 * exponentials of scale * score less the row's largest, zero outside keys lowest .. pos;
 * returns their sum (a caller divides its output by it once, as a flash kernel does).
 * Only the 8-key pieces that hold an edge are masked. */
AVX2 static float softmax_row(float *row, long span, long start, long lowest, long pos,
                              float scale) {
    const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), sc = _mm256_set1_ps(scale);
    const __m256 from = _mm256_set1_ps((float)lowest), to = _mm256_set1_ps((float)pos);
    const __m256 none = _mm256_set1_ps(-INFINITY);
    long clear_from = lowest > start ? (lowest - start + 7) / 8 * 8 : 0;
    long clear_to = (pos - start + 1) / 8 * 8;
    __m256 best = none;
    for (long j = 0; j < span; j += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(row + j), sc);
        if (j < clear_from || j >= clear_to) {
            __m256 at = _mm256_add_ps(_mm256_set1_ps((float)(start + j)), lane);
            v = _mm256_blendv_ps(none, v, _mm256_and_ps(_mm256_cmp_ps(at, from, _CMP_GE_OQ),
                                                        _mm256_cmp_ps(at, to, _CMP_LE_OQ)));
        }
        _mm256_storeu_ps(row + j, v);
        best = _mm256_max_ps(best, v);
    }
    best = _mm256_max_ps(best, _mm256_permute2f128_ps(best, best, 1));
    best = _mm256_max_ps(best, _mm256_permute_ps(best, 0x4e));
    best = _mm256_max_ps(best, _mm256_permute_ps(best, 0xb1));
    __m256 total = _mm256_setzero_ps();
    for (long j = 0; j < span; j += 8) {
        __m256 v = _mm256_loadu_ps(row + j), e = exp8(_mm256_sub_ps(v, best));
        if (j < clear_from || j >= clear_to)
            e = _mm256_blendv_ps(_mm256_setzero_ps(), e, _mm256_cmp_ps(v, none, _CMP_NEQ_OQ));
        _mm256_storeu_ps(row + j, e);
        total = _mm256_add_ps(total, e);
    }
    return hsum8(total);
}

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

/* Whether a sequence's len tokens fit its block table row (width blocks of BS slots), -1
 * if not, and every block it names is one of the cache's NB, -2 if not: 0 when both hold. */
static int check_blocks(const int32_t *table, long len, long width, long BS, long NB) {
    long blocks = (len + BS - 1) / BS;
    if (blocks > width) return -1;
    for (long i = 0; i < blocks; i++)
        if (table[i] < 0 || table[i] >= NB) return -2;
    return 0;
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
 * float32, their exponentials less the largest (softmax_row), the weighted sum of the
 * values, divided by the exponentials' sum. The (sequence, head) pairs are shared by the
 * threads, each pair computed as on one thread; the caller's scores (the keys of the
 * longest sequence, rounded up to 8) serve a job on one thread, and each part of a shared
 * one takes its own. */
typedef struct {
    const float *q, *kc, *vc;
    const int32_t *tables, *lens;
    float *out, *scores;
    long qs, width, Hq, group, D, BS, slot_stride, block_stride, window, max_keys, whole;
    float scale;
    atomic_int failed;
} DecodeAttention;

AVX2 static void decode_pairs(const void *ctx, long lo, long hi) {
    DecodeAttention *c = (DecodeAttention *)ctx;
    float *scores = c->scores;
    if (hi - lo < c->whole) {  /* a part of a shared job */
        scores = malloc(sizeof(float) * (size_t)c->max_keys + 1);
        if (scores == NULL) {
            atomic_store(&c->failed, 1);
            return;
        }
    }
    for (long u = lo; u < hi; u++) {
        long b = u / c->Hq, h = u % c->Hq, len = c->lens[b];
        float *oh = c->out + (b * c->Hq + h) * c->D;
        if (len <= 0) {
            zero_floats(oh, c->D);
            continue;
        }
        const int32_t *table = c->tables + b * c->width;
        long first = (c->window > 0 && len > c->window) ? len - c->window : 0;
        long keys = len - first;
        Rows k_rows = {c->kc, table, c->BS, c->block_stride, c->slot_stride, h / c->group, c->D};
        Rows v_rows = {c->vc, table, c->BS, c->block_stride, c->slot_stride, h / c->group, c->D};
        score_keys(c->q + b * c->qs + h * c->D, &k_rows, first, keys, c->scale, scores);
        float total = softmax_row(scores, (keys + 7) / 8 * 8, first, first, len - 1, 1.0f);
        weigh_values(scores, &v_rows, first, keys, oh);
        for (long d = 0; d < c->D; d++) oh[d] /= total;
    }
    if (scores != c->scores) free(scores);
}

INTERNAL AVX2 int decode_attention(
    const float *q, long qs, const float *kc, const float *vc, const int32_t *tables,
    long width, const int32_t *lens, float *out, long B, long Hq, long Hk, long D,
    long BS, long NB, float scale, long window, float *scores, long max_keys) {
    /* every sequence checked before any is computed */
    for (long b = 0; b < B; b++) {
        long len = lens[b];
        if (len <= 0) continue;
        if ((len + 7) / 8 * 8 > max_keys) return -1;
        int rc = check_blocks(tables + b * width, len, width, BS, NB);
        if (rc) return rc;
    }
    DecodeAttention c = {q, kc, vc, tables, lens, out, scores, qs, width, Hq, Hq / Hk, D, BS,
                         Hk * D, BS * Hk * D, window, max_keys, B * Hq, scale, 0};
    int rc = parallel_for(decode_pairs, &c, B * Hq, 1);
    return rc ? rc : atomic_load(&c.failed) ? -1 : 0;
}

/* ---- prefill attention ------------------------------------------------------------ */

/* Causal attention of a batch's new tokens (sequence b owns rows starts[b] .. starts[b+1]
 * - 1 of q, at the last positions of its lens[b] tokens) over the paged cache, which
 * holds their K/V already. For each sequence and query head, its KV head's keys are
 * gathered into strips, as a packed weight (K^T: [keys / 16][D][16]; V: [D / 16][keys]
 * [16]), once for the heads of a KV group that follow each other in a thread's run; then
 * six rows at a time, the scores are a packed product, the softmax two passes of exp8 per
 * row (softmax_row), and the output a packed product over the exponentials, divided by
 * their sum. The (sequence, head) pairs are shared among the threads (each pair's rows and
 * head are its own, computed as on one thread). Rows of no sequence are
 * zero. -1: a sequence's rows or length do not fit q or its block table; -2: a block table
 * names a block outside the cache; -3: a scratch cannot be allocated; POOL_FAILED. */
typedef struct {
    const float *q, *kc, *vc;
    const int32_t *tables, *lens, *starts;
    float *out, scale;
    long qs, width, Hq, Hk, D, BS, window;
    atomic_int failed; /* a pair whose scratch could not be allocated */
} PrefillAttention;

/* Pairs lo .. hi - 1 (sequence u / Hq, head u % Hq) of a PrefillAttention, in one
 * scratch sized for the run's longest sequence. */
AVX2 static void prefill_pairs(const void *ctx, long lo, long hi) {
    PrefillAttention *c = (PrefillAttention *)ctx;
    const float *q = c->q, *kc = c->kc, *vc = c->vc;
    const int32_t *tables = c->tables, *lens = c->lens, *starts = c->starts;
    float *out = c->out, scale = c->scale;
    long qs = c->qs, width = c->width, Hq = c->Hq, D = c->D, BS = c->BS, window = c->window;
    long group = Hq / c->Hk, slot_stride = c->Hk * D, block_stride = BS * slot_stride;
    long longest = 0;
    for (long b = lo / Hq; b <= (hi - 1) / Hq; b++)
        if (starts[b + 1] > starts[b] && lens[b] > longest) longest = lens[b];
    if (longest == 0) return;
    long L16 = (longest + STRIP - 1) / STRIP * STRIP;
    float *kp = malloc(sizeof(float) * (L16 * D * 2 + TILE_ROWS * L16 + 1));
    if (kp == NULL) {
        atomic_store(&c->failed, 1);
        return;
    }
    long gathered = -1;  /* the (sequence, KV head) whose keys kp and vp hold */
    for (long u = lo; u < hi; u++) {
        long b = u / Hq, h = u % Hq, g = h / group;
        long first_row = starts[b], n = starts[b + 1] - first_row, len = lens[b];
        long first = len - n;
        if (n == 0 || len <= 0) continue;
        const int32_t *table = tables + b * width;
        long keys16 = (len + STRIP - 1) / STRIP * STRIP;
        float *vp = kp + keys16 * D, *p = vp + keys16 * D;
        for (long j = 0; gathered != b * c->Hk + g && j < keys16; j++) {
            long at = j < len ? table[j / BS] * block_stride + j % BS * slot_stride + g * D : -1;
            for (long d = 0; d < D; d++) {
                float kv = at < 0 ? 0.0f : kc[at + d], vv = at < 0 ? 0.0f : vc[at + d];
                kp[(j / STRIP * D + d) * STRIP + j % STRIP] = kv;
                vp[(d / STRIP * keys16 + j) * STRIP + d % STRIP] = vv;
            }
        }
        gathered = b * c->Hk + g;
        for (long i0 = 0; i0 < n; i0 += TILE_ROWS) {
            int mr = n - i0 < TILE_ROWS ? (int)(n - i0) : TILE_ROWS;
            long top = first + i0 + mr - 1;  /* the block's last position */
            long start = window > 0 && first + i0 - window + 1 > 0
                         ? (first + i0 - window + 1) / STRIP * STRIP : 0;
            long stop = (top + 1 + STRIP - 1) / STRIP * STRIP, span = stop - start;
            float sums[TILE_ROWS];
            for (long s = start; s < stop; s += STRIP)
                tile_of(mr, 1, q + (first_row + i0) * qs + h * D, qs, kp + s * D, D, NULL,
                        p + s - start, keys16, NULL, 1);
            for (int r = 0; r < mr; r++) {
                long pos = first + i0 + r;
                sums[r] = softmax_row(p + r * keys16, span, start,
                                      window > 0 ? pos - window + 1 : 0, pos, scale);
            }
            /* as a flash kernel: the weighted sum of values, then divided once */
            for (long d0 = 0; d0 < D / STRIP; d0++)
                tile_of(mr, 1, p, keys16, vp + (d0 * keys16 + start) * STRIP, span, NULL,
                        out + (first_row + i0) * Hq * D + h * D + d0 * STRIP, Hq * D, NULL, 1);
            for (int r = 0; r < mr; r++) {
                float *o = out + (first_row + i0 + r) * Hq * D + h * D;
                __m256 sum = _mm256_set1_ps(sums[r]);
                for (long d = 0; d < D; d += 8)
                    _mm256_storeu_ps(o + d, _mm256_div_ps(_mm256_loadu_ps(o + d), sum));
            }
        }
    }
    free(kp);
}

INTERNAL AVX2 int prefill_attention(
    const float *q, long qs, const float *kc, const float *vc, const int32_t *tables,
    long width, const int32_t *lens, const int32_t *starts, long T, float *out, long B,
    long Hq, long Hk, long D, long BS, long NB, float scale, long window) {
    for (long b = 0; b < B; b++) {
        long lo = starts[b], hi = starts[b + 1], len = lens[b];
        if (lo < 0 || hi < lo || hi > T) return -1;
        if (hi == lo || len <= 0) continue;
        if (hi - lo > len) return -1;
        int rc = check_blocks(tables + b * width, len, width, BS, NB);
        if (rc) return rc;
    }
    zero_floats(out, T * Hq * D);
    PrefillAttention c = {q, kc, vc, tables, lens, starts, out, scale, qs, width, Hq, Hk, D,
                          BS, window, 0};
    int rc = parallel_for(prefill_pairs, &c, B * Hq, 1);
    return rc ? rc : atomic_load(&c.failed) ? -3 : 0;
}


/* ---- MLA decode attention (absorbed) ------------------------------------------------- */

AVX2 static float dot_avx2(const float *a, const float *b, long n) {
    __m256 acc = _mm256_setzero_ps();
    long n8 = n & ~7L;
    for (long i = 0; i < n8; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = hsum8(acc);
    for (long i = n8; i < n; i++) s += a[i] * b[i];
    return s;
}

/* y[0..n) += a * x[0..n) */
AVX2 static void axpy_avx2(float a, const float *x, float *y, long n) {
    __m256 va = _mm256_set1_ps(a);
    long n8 = n & ~7L;
    for (long i = 0; i < n8; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i),
                                                _mm256_loadu_ps(y + i)));
    for (long i = n8; i < n; i++) y[i] += a * x[i];
}

/* MLA decode in the absorbed form, one query per sequence: q_nope [B, H, Dn] (row stride
 * qs, heads back to back), q_pe [B, H, R] (row stride ps), the latent cache [NB, BS, L + R],
 * kv_b [H, Dn + Dv, L] (W_UK rows, then W_UV rows) -> out [B, H, Dv]. Per head: the query
 * folded through W_UK onto the latent, scores over each cached latent and rotary key, the
 * softmax, the attended latent, and W_UV over it. A sequence of length 0 gives zeros.
 * -1: a length exceeds the block table; -2: a block outside the cache; -3: no scratch. */
INTERNAL AVX2 int mla_decode(const float *q_nope, long qs, const float *q_pe, long ps,
                             const float *cache, const float *kv_b, const int32_t *tables,
                             long width, const int32_t *lens, float *out, long B, long H,
                             long Dn, long R, long L, long Dv, long BS, long NB, float scale) {
    long row = L + R;
    for (long b = 0; b < B; b++) {
        int rc = lens[b] > 0 ? check_blocks(tables + b * width, lens[b], width, BS, NB) : 0;
        if (rc) return rc;
    }
    long longest = 0;
    for (long b = 0; b < B; b++) longest = lens[b] > longest ? lens[b] : longest;
    float *scratch = malloc(sizeof(float) * (size_t)(2 * L + longest) + 1);
    if (scratch == NULL) return -3;
    float *q_latent = scratch, *attended = scratch + L, *scores = scratch + 2 * L;
    /* Heads outside, sequences inside: a head's kv_b rows stay in cache for the batch. */
    for (long h = 0; h < H; h++) {
        const float *w = kv_b + h * (Dn + Dv) * L;
        for (long b = 0; b < B; b++) {
            long len = lens[b];
            const int32_t *table = tables + b * width;
            float *o = out + (b * H + h) * Dv;
            if (len <= 0) {
                zero_floats(o, Dv);
                continue;
            }
            const float *qn = q_nope + b * qs + h * Dn, *qp = q_pe + b * ps + h * R;
            zero_floats(q_latent, L);
            for (long d = 0; d < Dn; d++) axpy_avx2(qn[d], w + d * L, q_latent, L);
            float top = -INFINITY;
            for (long t = 0; t < len; t++) {
                const float *c = cache + ((long)table[t / BS] * BS + t % BS) * row;
                float score = (dot_avx2(q_latent, c, L) + dot_avx2(qp, c + L, R)) * scale;
                scores[t] = score;
                top = score > top ? score : top;
            }
            float total = 0.0f;
            zero_floats(attended, L);
            for (long t = 0; t < len; t++) {
                float p = expf(scores[t] - top);
                total += p;
                axpy_avx2(p, cache + ((long)table[t / BS] * BS + t % BS) * row, attended, L);
            }
            for (long i = 0; i < L; i++) attended[i] /= total;
            for (long v = 0; v < Dv; v++) o[v] = dot_avx2(w + (Dn + v) * L, attended, L);
        }
    }
    free(scratch);
    return 0;
}

#endif /* NATIVE_X86 */

/* ---- rotary and the KV store (portable C; rounding as the torch references) ------- */

/* Neox rotary in place on x [T, heads, D] (row stride xs, head stride D). */
INTERNAL int rotary_rows(const int64_t *positions, float *x, long xs, long T, long heads,
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

INTERNAL int store_rows(const float *k, long ks, const float *v, long vs, float *k_cache,
                        float *v_cache, const int64_t *slots, long T, long row, long num_slots) {
    for (long t = 0; t < T; t++)
        if (slots[t] < -1 || slots[t] >= num_slots) return -1;
    for (long t = 0; t < T; t++) {
        if (slots[t] < 0) continue; /* padding */
        copy_floats(k_cache + slots[t] * row, k + t * ks, row);
        copy_floats(v_cache + slots[t] * row, v + t * vs, row);
    }
    return 0;
}

/* MLA's per-token cache entries: latent [T, L] (row stride ls) then the rotary key [T, R]
 * (row stride ps) into row slots[t] of cache [slots, L + R]; slot -1 is padding. -1 for a
 * slot outside the cache (checked before anything is written). */
INTERNAL int store_latent_rows(const float *latent, long ls, const float *k_pe, long ps,
                               float *cache, const int64_t *slots, long T, long L, long R,
                               long num_slots) {
    for (long t = 0; t < T; t++)
        if (slots[t] < -1 || slots[t] >= num_slots) return -1;
    for (long t = 0; t < T; t++) {
        if (slots[t] < 0) continue;
        copy_floats(cache + slots[t] * (L + R), latent + t * ls, L);
        copy_floats(cache + slots[t] * (L + R) + L, k_pe + t * ps, R);
    }
    return 0;
}
