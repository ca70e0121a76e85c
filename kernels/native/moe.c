/* Mixture of experts (see native.h). */
#include "native.h"

#if NATIVE_X86

/* Routed SwiGLU experts: out [T, H] = sum over each token's k picks (ids [T, k], weights
 * [T, k]) of weight * w2[e] silu_and_mul(w13[e] x), w13 [E] packed [2I, H] and w2 [E]
 * packed [H, I]. Expert by expert in ascending order (as the reference): the expert's rows
 * are gathered into a scratch and streamed once through its weights, and each row's result
 * is added to the token's sum in that order. Which experts run is read from ids when the
 * op runs, so a tape replays it with the routing of the step. -1 for an id outside
 * 0..E-1 (checked before anything is written), -3 if the scratch cannot be allocated. */
INTERNAL AVX2 int moe_experts_packed(const float *x, long xs, const float *w13,
                                     const float *w2, const float *weights, const int64_t *ids,
                                     float *out, long T, long k, long E, long H, long I) {
    for (long i = 0; i < T * k; i++)
        if (ids[i] < 0 || ids[i] >= E) return -1;
    long picks = T * k;
    float *rows = malloc(sizeof(float) * (size_t)(picks * (H + 2 * I + I + H)) + 1);
    long *token = malloc(sizeof(long) * (size_t)picks + 1);
    float *scale = malloc(sizeof(float) * (size_t)picks + 1);
    if (rows == NULL || token == NULL || scale == NULL) {
        free(rows); free(token); free(scale);
        return -3;
    }
    float *gate_up = rows + picks * H, *hidden = gate_up + picks * 2 * I;
    float *y = hidden + picks * I;
    for (long i = 0; i < T * H; i++) out[i] = 0.0f;
    for (long e = 0; e < E; e++) {
        long n = 0;
        for (long t = 0; t < T; t++)
            for (long j = 0; j < k; j++)
                if (ids[t * k + j] == e) {
                    copy_floats(rows + n * H, x + t * xs, H);
                    token[n] = t;
                    scale[n++] = weights[t * k + j];
                }
        if (n == 0) continue;
        linear_packed(rows, H, w13 + e * 2 * I * H, NULL, gate_up, n, H, 2 * I);
        silu_and_mul_avx2(gate_up, 2 * I, hidden, n, I);
        linear_packed(hidden, I, w2 + e * H * I, NULL, y, n, I, H);
        for (long r = 0; r < n; r++) {
            float *o = out + token[r] * H;
            const float *yr = y + r * H;
            for (long c = 0; c < H; c++) o[c] += yr[c] * scale[r];
        }
    }
    free(rows); free(token); free(scale);
    return 0;
}

#endif /* NATIVE_X86 */

/* ---- DeepSeek's grouped routing -------------------------------------------------------- */

/* The index of the largest of v[0..n) (the first of equals), or -1 if none exceeds -inf. */
static long arg_best(const float *v, long n) {
    long best = -1;
    for (long i = 0; i < n; i++)
        if (v[i] > -INFINITY && (best < 0 || v[i] > v[best])) best = i;
    return best;
}

/* reference.moe_grouped_route, token by token: logits [T, E] (row stride ls) -> weights
 * [T, k] and ids [T, k]. Scores are the softmax or sigmoid of a token's logits; the k
 * picks are taken best first (the first of equal values), as torch.topk orders them, by
 * the score (greedy) or by the choice value (score, + the correction bias for noaux_tc)
 * among the experts of the topk_group best groups (a group scored by its best choice, or
 * for noaux_tc by its two best summed); the others count as -inf (noaux_tc) or 0
 * (group_limited_greedy). A pick's weight is its score, renormalised by the picks' sum
 * (+ 1e-20) if asked, then scaled. Scratch: 4 E floats. A token's result depends on its
 * own logits only. */
INTERNAL void grouped_route(const float *logits, long ls, const float *bias, float *weights,
                            int64_t *ids, long T, long E, long k, long scoring, long method,
                            long n_group, long topk_group, long renormalize, float scaling,
                            float *scratch) {
    float *scores = scratch, *choice = scratch + E, *groups = scratch + 2 * E;
    long size = E / n_group;
    for (long t = 0; t < T; t++) {
        const float *x = logits + t * ls;
        if (scoring == ROUTE_SOFTMAX) {
            float top = -INFINITY, total = 0.0f;
            for (long e = 0; e < E; e++) top = x[e] > top ? x[e] : top;
            for (long e = 0; e < E; e++) total += scores[e] = expf(x[e] - top);
            for (long e = 0; e < E; e++) scores[e] /= total;
        } else {
            for (long e = 0; e < E; e++) scores[e] = 1.0f / (1.0f + expf(-x[e]));
        }
        for (long e = 0; e < E; e++)
            choice[e] = method == ROUTE_NOAUX_TC && bias ? scores[e] + bias[e] : scores[e];
        if (method != ROUTE_GREEDY) {
            for (long g = 0; g < n_group; g++) {
                const float *member = choice + g * size;
                long first = arg_best(member, size);
                float best = first < 0 ? -INFINITY : member[first];
                if (method == ROUTE_NOAUX_TC) {
                    float second = -INFINITY;
                    for (long i = 0; i < size; i++)
                        if (i != first && member[i] > second) second = member[i];
                    best = best + second;
                }
                groups[g] = best;
            }
            float fill = method == ROUTE_NOAUX_TC ? -INFINITY : 0.0f;
            float *keep = groups + n_group;  /* 1 for a kept group */
            for (long g = 0; g < n_group; g++) keep[g] = 0.0f;
            for (long j = 0; j < topk_group; j++) {
                long g = arg_best(groups, n_group);
                if (g < 0) break;
                keep[g] = 1.0f;
                groups[g] = -INFINITY;
            }
            for (long e = 0; e < E; e++)
                if (keep[e / size] == 0.0f) choice[e] = fill;
        }
        float sum = 0.0f;
        for (long j = 0; j < k; j++) {
            long e = arg_best(choice, E);
            /* Only -inf left (k exceeds the kept experts): torch.topk picks among those
             * too; here the first expert not picked yet. */
            for (long i = 0; e < 0 && i < E; i++) {
                long seen = 0;
                for (long p = 0; p < j; p++) seen |= ids[t * k + p] == i;
                if (!seen) e = i;
            }
            ids[t * k + j] = e;
            weights[t * k + j] = scores[e];
            sum += scores[e];
            choice[e] = -INFINITY;
        }
        for (long j = 0; j < k; j++) {
            float w = weights[t * k + j];
            if (renormalize) w = w / (sum + 1e-20f);
            weights[t * k + j] = w * scaling;
        }
    }
}
