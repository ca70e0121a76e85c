/* The native CPU kernels (backend "native"): float32, x86-64 with AVX2, FMA and F16C, with
 * products over weights kept in GGUF's quantized block formats (see "quantized products").
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

/* The machine, for the reason a portable build gives. */
#if defined(__x86_64__)
#define CPU_NAME "x86_64"
#elif defined(__aarch64__)
#define CPU_NAME "aarch64"
#elif defined(__arm__)
#define CPU_NAME "arm"
#elif defined(__i386__)
#define CPU_NAME "i386"
#elif defined(__powerpc64__)
#define CPU_NAME "ppc64"
#elif defined(__riscv)
#define CPU_NAME "riscv"
#elif defined(__s390x__)
#define CPU_NAME "s390x"
#else
#define CPU_NAME "unknown"
#endif

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

/* ---- threads -------------------------------------------------------------------- */

/* The products split their outputs' strips among `threads` threads: the caller's and
 * threads - 1 workers of a pool that the first product after threads(n) starts
 * (interlock.kernels.native.ops keeps n equal to torch's thread count). A strip's outputs
 * are computed as on one thread, in the same order, so the results are bitwise the same at
 * any thread count.
 *
 * A job is cut into up to 4 parts per thread, and every thread, the caller too, takes the
 * next part not yet taken until none is left: a worker that the machine's other load keeps
 * off a core leaves its share to the threads that run, instead of holding the caller at the
 * end of every product. A product is ~10-100 us at decode, so a worker spins for the next
 * job a while (the ops between two products take a few us) before it sleeps on a condition
 * variable. One job runs at a time: a product called from a second Python thread while the
 * pool is busy runs on its caller's thread alone. After a fork the child has no workers;
 * its next product starts them again. */

#define MAX_THREADS 256
#define PARTS_PER_THREAD 4
#define SPINS 20000 /* ~1 ms of pause instructions before a worker sleeps */

typedef void (*RangeFn)(const void *ctx, long lo, long hi);

static atomic_int threads = 1; /* wanted, including the caller */
static int pool_size = 0;      /* workers running */
static pthread_t workers[MAX_THREADS];
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_wake = PTHREAD_COND_INITIALIZER;
static atomic_long generation; /* one more for each job, and for the stop */
static atomic_int sleeping;    /* workers waiting on pool_wake */
static atomic_flag busy = ATOMIC_FLAG_INIT;
static int stopping = 0;
static int pool_error = 0;     /* pthread_create's error when the pool last failed to start */
static long born;              /* generation when the workers were started */
/* The job's parts: job << 32 | parts << 16 | the next part to take. A part is taken only
 * while the job's tag is current, and the caller changes the job only once every part is
 * done, so whoever holds a part reads the job it belongs to. */
static atomic_long claims;
static atomic_int finished;    /* parts of the current job done */
static long jobs = 0;          /* the caller's count of jobs: the tag */
static struct { RangeFn fn; const void *ctx; long units, per; } job;

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    atomic_signal_fence(memory_order_seq_cst);
#endif
}

/* Takes and runs parts of the current job until none is left. */
static void take_parts(void) {
    long c = atomic_load(&claims);
    for (;;) {
        long next = c & 0xffff, parts = (c >> 16) & 0xffff;
        if (next >= parts) return;
        if (!atomic_compare_exchange_weak(&claims, &c, c + 1)) continue;
        long lo = next * job.per, hi = lo + job.per < job.units ? lo + job.per : job.units;
        if (lo < hi) job.fn(job.ctx, lo, hi);
        atomic_fetch_add(&finished, 1);
        c = atomic_load(&claims);
    }
}

static void *worker(void *arg) {
    (void)arg;
    /* not generation now: the job that started the pool may have raised it already */
    long seen = born;
    for (;;) {
        long now;
        for (int spin = 0; (now = atomic_load(&generation)) == seen; spin++) {
            if (spin < SPINS) {
                relax();
                continue;
            }
            /* sleeping is raised before generation is read again, and a job raises
             * generation before it reads sleeping: one of the two sees the other */
            pthread_mutex_lock(&pool_lock);
            atomic_fetch_add(&sleeping, 1);
            while (atomic_load(&generation) == seen) pthread_cond_wait(&pool_wake, &pool_lock);
            atomic_fetch_sub(&sleeping, 1);
            pthread_mutex_unlock(&pool_lock);
            spin = 0;
        }
        seen = now;
        if (stopping) return NULL;
        take_parts();
    }
}

static void wake_workers(void) {
    atomic_fetch_add(&generation, 1);
    if (atomic_load(&sleeping) > 0) {
        pthread_mutex_lock(&pool_lock);
        pthread_cond_broadcast(&pool_wake);
        pthread_mutex_unlock(&pool_lock);
    }
}

static void stop_pool(void) {
    if (pool_size == 0) return;
    stopping = 1;
    wake_workers();
    for (int i = 0; i < pool_size; i++) pthread_join(workers[i], NULL);
    stopping = 0;
    pool_size = 0;
}

/* The pool sized for `want` threads: 0, or the error number of a thread that did not
 * start (the workers started are stopped again). */
static int start_pool(int want) {
    if (pool_size == want - 1) return 0;
    stop_pool();
    born = atomic_load(&generation);
    for (int i = 0; i < want - 1; i++) {
        int rc = pthread_create(&workers[i], NULL, worker, NULL);
        if (rc != 0) {
            stop_pool();
            return rc;
        }
        pool_size = i + 1;
    }
    return 0;
}

/* In a forked child the workers do not exist: forget them (the next job starts new ones). */
static void forget_pool(void) {
    pool_size = 0;
    pthread_mutex_init(&pool_lock, NULL);
    pthread_cond_init(&pool_wake, NULL);
    atomic_store(&sleeping, 0);
    atomic_flag_clear(&busy);
}

/* What parallel_for returns when the pool's threads cannot be started (pool_error says
 * why): a code no op returns for its own errors. */
#define POOL_FAILED -99

/* fn(ctx, lo, hi) over [0, units) in parts of whole runs of `align` units, shared by the
 * threads; 0, or POOL_FAILED. */
static int parallel_for(RangeFn fn, const void *ctx, long units, long align) {
    int want = atomic_load(&threads);
    long runs = (units + align - 1) / align;
    long parts = (long)want * PARTS_PER_THREAD < runs ? (long)want * PARTS_PER_THREAD : runs;
    if (want <= 1 || parts <= 1 || atomic_flag_test_and_set(&busy)) {
        /* one part, or another Python thread's job holds the pool: the caller runs it all */
        if (units > 0) fn(ctx, 0, units);
        return 0;
    }
    int rc = start_pool(want);
    if (rc != 0) {
        atomic_flag_clear(&busy);
        pool_error = rc;
        return POOL_FAILED;
    }
    job.fn = fn;
    job.ctx = ctx;
    job.units = units;
    job.per = (runs + parts - 1) / parts * align;
    atomic_store(&finished, 0);
    jobs = (jobs + 1) & 0x7fffffff;
    atomic_store(&claims, jobs << 32 | parts << 16);
    wake_workers();
    take_parts();
    while (atomic_load(&finished) < parts) relax();
    atomic_flag_clear(&busy);
    return 0;
}

/* ---- a streaming read ------------------------------------------------------------ */

/* The machine's read bandwidth, the roofline a decode step is held to (bench/
 * bench_cpu_engines.py): a buffer read once front to back, shared among the threads as the
 * products share their strips, its 64-bit words summed into a checksum so that nothing
 * can be left unread. Eight independent sums per 64-byte line: the adds keep up with any
 * memory. Portable C: the probe means the same on every build. */
typedef struct {
    const uint64_t *x;
    long words;
    _Atomic uint64_t *total;
} StreamRead;

#define READ_UNIT 512 /* words of a unit of work: 4 KiB */

static void read_part(const void *ctx, long lo, long hi) {
    const StreamRead *c = ctx;
    long i = lo * READ_UNIT, to = hi * READ_UNIT < c->words ? hi * READ_UNIT : c->words;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    for (; i + 8 <= to; i += 8) {
        const uint64_t *p = c->x + i;
        s0 += p[0]; s1 += p[1]; s2 += p[2]; s3 += p[3];
        s4 += p[4]; s5 += p[5]; s6 += p[6]; s7 += p[7];
    }
    for (; i < to; i++) s0 += c->x[i];
    atomic_fetch_add(c->total, s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7);
}

/* out[0] = the sum of the `bytes` / 8 words at x (bytes a multiple of 8: -1 if not), read
 * by the threads; 0, -1 or POOL_FAILED. */
static int read_words(const uint64_t *x, long bytes, uint64_t *out) {
    if (bytes < 0 || bytes % 8) return -1;
    _Atomic uint64_t total = 0;
    StreamRead c = {x, bytes / 8, &total};
    int rc = parallel_for(read_part, &c, (bytes / 8 + READ_UNIT - 1) / READ_UNIT, 1);
    *out = atomic_load(&total);
    return rc;
}

#if NATIVE_X86

/* Whether the quantized products take their AVX-512 path (set once, at import). */
static int use_avx512 = 0;

/* ---- sums ----------------------------------------------------------------------- */

AVX2 static inline float hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
    return _mm_cvtss_f32(a);
}

static float dot_tail(const float *a, const float *b, long from, long to) {
    float s = 0.0f;
    for (long i = from; i < to; i++) s = fmaf(a[i], b[i], s);
    return s;
}

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

#define STRIP 16
#define TILE_ROWS 6
/* Rows of x per pass over the weight: a block of them stays in L2 (48 x 1536 floats is
 * 288 KiB) while every strip passes through. */
#define ROW_BLOCK 48

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
AVX2 static void tile_of(int mr, int ns, const float *x, long xs, const float *b, long K,
                         const float *bias, float *y, long ys, const float *prefetch, int every) {
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
AVX2 static int linear_packed(const float *x, long xs, const float *p, const float *bias,
                              float *y, long T, long K, long N) {
    PackedProduct c = {x, p, bias, y, xs, T, K, N};
    return parallel_for(packed_strips, &c, N / STRIP, 4);
}

/* W [N, K] packed in strips in place: strip s holds rows 16 s .. 16 s + 15 of W, which
 * are transposed through a scratch of one strip. -1 if the scratch cannot be allocated. */
static int pack_strips(float *w, long K, long N) {
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

/* ---- quantized products --------------------------------------------------------- */

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
AVX2 static int linear_quantized(const float *x, long xs, const uint8_t *w, int kind, long L,
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
 * values, divided by the exponentials' sum. scores holds the keys of the longest sequence,
 * rounded up to 8. */
AVX2 static int decode_attention(
    const float *q, long qs, const float *kc, const float *vc, const int32_t *tables,
    long width, const int32_t *lens, float *out, long B, long Hq, long Hk, long D,
    long BS, long NB, float scale, long window, float *scores, long max_keys) {
    long group = Hq / Hk, slot_stride = Hk * D, block_stride = BS * slot_stride;
    for (long b = 0; b < B; b++) {
        long len = lens[b];
        float *ob = out + b * Hq * D;
        if (len <= 0) {
            zero_floats(ob, Hq * D);
            continue;
        }
        if ((len + 7) / 8 * 8 > max_keys) return -1;
        const int32_t *table = tables + b * width;
        int rc = check_blocks(table, len, width, BS, NB);
        if (rc) return rc;
        long first = (window > 0 && len > window) ? len - window : 0, keys = len - first;
        for (long h = 0; h < Hq; h++) {
            Rows k_rows = {kc, table, BS, block_stride, slot_stride, h / group, D};
            Rows v_rows = {vc, table, BS, block_stride, slot_stride, h / group, D};
            float *oh = ob + h * D;
            score_keys(q + b * qs + h * D, &k_rows, first, keys, scale, scores);
            float total = softmax_row(scores, (keys + 7) / 8 * 8, first, first, len - 1, 1.0f);
            weigh_values(scores, &v_rows, first, keys, oh);
            for (long d = 0; d < D; d++) oh[d] /= total;
        }
    }
    return 0;
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

AVX2 static int prefill_attention(
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

/* Routed SwiGLU experts: out [T, H] = sum over each token's k picks (ids [T, k], weights
 * [T, k]) of weight * w2[e] silu_and_mul(w13[e] x), w13 [E] packed [2I, H] and w2 [E]
 * packed [H, I]. Expert by expert in ascending order (as the reference): the expert's rows
 * are gathered into a scratch and streamed once through its weights, and each row's result
 * is added to the token's sum in that order. Which experts run is read from ids when the
 * op runs, so a tape replays it with the routing of the step. -1 for an id outside
 * 0..E-1 (checked before anything is written), -3 if the scratch cannot be allocated. */
AVX2 static int moe_experts_packed(const float *x, long xs, const float *w13, const float *w2,
                                   const float *weights, const int64_t *ids, float *out,
                                   long T, long k, long E, long H, long I) {
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
AVX2 static int mla_decode(const float *q_nope, long qs, const float *q_pe, long ps,
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
        copy_floats(k_cache + slots[t] * row, k + t * ks, row);
        copy_floats(v_cache + slots[t] * row, v + t * vs, row);
    }
    return 0;
}

/* MLA's per-token cache entries: latent [T, L] (row stride ls) then the rotary key [T, R]
 * (row stride ps) into row slots[t] of cache [slots, L + R]; slot -1 is padding. -1 for a
 * slot outside the cache (checked before anything is written). */
static int store_latent_rows(const float *latent, long ls, const float *k_pe, long ps,
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

/* out [T, H] = x + y, rows of x and y at strides xs and ys: one rounding per element, as
 * torch's add. */
static void add_rows(const float *x, long xs, const float *y, long ys, float *out, long T,
                     long H) {
    for (long t = 0; t < T; t++)
        for (long h = 0; h < H; h++) out[t * H + h] = x[t * xs + h] + y[t * ys + h];
}

/* ---- DeepSeek's grouped routing -------------------------------------------------------- */

#define ROUTE_SOFTMAX 0
#define ROUTE_SIGMOID 1
#define ROUTE_GREEDY 0
#define ROUTE_GROUP_LIMITED 1
#define ROUTE_NOAUX_TC 2

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
static void grouped_route(const float *logits, long ls, const float *bias, float *weights,
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

/* ---- gathers ------------------------------------------------------------------------ */

/* out[i, :] = table[ids[i], :] for a table of V rows whose element (v, h) sits at
 * v * row_stride + h * col_stride (a transposed view works as it is). */
/* Row v of the table starts at (v / group) * group_stride + (v % group) * row_stride: group
 * 1 for a plain [V, H] table, 16 for one packed in strips (a tied LM head). */
static int embedding_rows(const int64_t *ids, long n, const float *table, long group,
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
static int quantized_rows(const int64_t *ids, long n, const uint8_t *w, int kind, long L,
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
static int select_rows(const float *x, long xs, long rows, long H, const int64_t *indices,
                     long n, float *out) {
    for (long i = 0; i < n; i++)
        if (indices[i] < 0 || indices[i] >= rows) return -1;
    for (long i = 0; i < n; i++) copy_floats(out + i * H, x + indices[i] * xs, H);
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

/* Every op: its code's name, its name, and its argument kinds in order. The enum, the
 * names, the signatures Python sees (SIGNATURES) and the static checks below all come from
 * this one table; tests/kernels check each call site in ops.py against SIGNATURES. */
#define OP_TABLE(X)                                                                        \
    /* linear(x, x_row_stride, packed w, bias|0, y, T, K, N) */                            \
    X(LINEAR, "linear", "iiiiiiii")                                                        \
    /* decode_attention(q, qs, kc, vc, tables, width, lens, out, B, Hq, Hk, D, BS, NB,     \
       scale, window|0, scratch, scratch_len) */                                           \
    X(DECODE_ATTENTION, "decode_attention", "iiiiiiiiiiiiiidiii")                          \
    /* rms_norm(x, xs, heads, residual|0, rs, summed|0, w, out, T, H, eps) */              \
    X(RMS_NORM, "rms_norm", "iiiiiiiiiid")                                                 \
    /* silu_and_mul(x, xs, out, T, I) */                                                   \
    X(SILU_AND_MUL, "silu_and_mul", "iiiii")                                               \
    /* rotary(positions, x, xs, T, heads, D, cos_sin, max_positions) */                    \
    X(ROTARY, "rotary", "iiiiiiii")                                                        \
    /* store_kv(k, ks, v, vs, k_cache, v_cache, slots, T, row, slots_n) */                 \
    X(STORE_KV, "store_kv", "iiiiiiiiii")                                                  \
    /* embedding(ids, n, table, group, group_stride, row_stride, col_stride, V, H, out) */ \
    X(EMBEDDING, "embedding", "iiiiiiiiii")                                                \
    /* select_rows(x, xs, rows, H, indices, n, out) */                                     \
    X(SELECT_ROWS, "select_rows", "iiiiiii")                                               \
    /* pack_weight(w, K, N): in place */                                                   \
    X(PACK_WEIGHT, "pack_weight", "iii")                                                   \
    /* prefill_attention(q, qs, kc, vc, tables, width, lens, starts, T, out, B, Hq, Hk, D, \
       BS, NB, scale, window|0) */                                                         \
    X(PREFILL_ATTENTION, "prefill_attention", "iiiiiiiiiiiiiiiidi")                   \
    /* quantized_linear(x, x_row_stride, packed w, kind, L, bias|0, y, T, K, N) */        \
    X(QUANTIZED_LINEAR, "quantized_linear", "iiiiiiiiii")                                  \
    /* quantized_embedding(ids, n, packed table, kind, L, V, H, out) */                    \
    X(QUANTIZED_EMBEDDING, "quantized_embedding", "iiiiiiii")                              \
    /* moe_experts(x, xs, packed w13, packed w2, weights, ids, out, T, k, E, H, I) */     \
    X(MOE_EXPERTS, "moe_experts", "iiiiiiiiiiii")                                         \
    /* mla_decode(q_nope, qs, q_pe, ps, cache, kv_b, tables, width, lens, out, B, H, Dn, R,  \
       L, Dv, BS, NB, scale) */                                                            \
    X(MLA_DECODE, "mla_decode", "iiiiiiiiiiiiiiiiiid")                                   \
    /* store_latent(latent, ls, k_pe, ps, cache, slots, T, L, R, slots_n) */               \
    X(STORE_LATENT, "store_latent", "iiiiiiiiii")                                          \
    /* add(x, xs, y, ys, out, T, H) */                                                     \
    X(ADD, "add", "iiiiiii")                                                               \
    /* grouped_route(logits, ls, bias|0, weights, ids, T, E, k, scoring, method, groups,   \
       topk_group, renormalize, scaling, scratch) */                                       \
    X(GROUPED_ROUTE, "grouped_route", "iiiiiiiiiiiiidi")                                  \
    /* read_words(x, bytes, out): out[0] = the words' sum, read by the threads */          \
    X(READ_WORDS, "read_words", "iii")

#define AS_ENUM(code, name, kinds) OP_##code,
enum { OP_NONE, OP_TABLE(AS_ENUM) OP_COUNT };

#define AS_NAME(code, name, kinds) name,
static const char *const NAMES[OP_COUNT] = {NULL, OP_TABLE(AS_NAME)};

#define AS_KINDS(code, name, kinds) kinds,
static const char *const SIGNATURES[OP_COUNT] = {NULL, OP_TABLE(AS_KINDS)};

/* A signature fits a tape record's slots, and holds only ints and doubles. */
#define FITS(code, name, kinds) \
    _Static_assert(sizeof(kinds) - 1 <= MAX_SLOTS, name ": more arguments than MAX_SLOTS");
OP_TABLE(FITS)

#define P(k) ((void *)(intptr_t)a[k].i)

/* Runs one op; 0, or an error code `describe` explains. */
static int run_op(int64_t op, const Slot *a) {
    switch (op) {
#if NATIVE_X86
    case OP_LINEAR:
        return linear_packed(P(0), a[1].i, P(2), P(3), P(4), a[5].i, a[6].i, a[7].i);
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
    case OP_PACK_WEIGHT:
        return pack_strips(P(0), a[1].i, a[2].i);
    case OP_PREFILL_ATTENTION:
        return prefill_attention(P(0), a[1].i, P(2), P(3), P(4), a[5].i, P(6), P(7), a[8].i,
                                 P(9), a[10].i, a[11].i, a[12].i, a[13].i, a[14].i, a[15].i,
                                 (float)a[16].d, a[17].i);
    case OP_QUANTIZED_LINEAR:
        if (!qkind_known(a[3].i, a[4].i)) return -2;
        return linear_quantized(P(0), a[1].i, P(2), (int)a[3].i, a[4].i, P(5), P(6), a[7].i,
                                a[8].i, a[9].i);
    case OP_MLA_DECODE:
        return mla_decode(P(0), a[1].i, P(2), a[3].i, P(4), P(5), P(6), a[7].i, P(8), P(9),
                          a[10].i, a[11].i, a[12].i, a[13].i, a[14].i, a[15].i, a[16].i,
                          a[17].i, (float)a[18].d);
    case OP_MOE_EXPERTS:
        return moe_experts_packed(P(0), a[1].i, P(2), P(3), P(4), P(5), P(6), a[7].i, a[8].i,
                                  a[9].i, a[10].i, a[11].i);
#endif
    case OP_QUANTIZED_EMBEDDING:
        if (!qkind_known(a[3].i, a[4].i)) return -2;
        return quantized_rows(P(0), a[1].i, P(2), (int)a[3].i, a[4].i, a[5].i, a[6].i, P(7));
    case OP_ROTARY:
        return rotary_rows(P(0), P(1), a[2].i, a[3].i, a[4].i, a[5].i, P(6), a[7].i);
    case OP_STORE_KV:
        return store_rows(P(0), a[1].i, P(2), a[3].i, P(4), P(5), P(6), a[7].i, a[8].i,
                          a[9].i);
    case OP_EMBEDDING:
        return embedding_rows(P(0), a[1].i, P(2), a[3].i, a[4].i, a[5].i, a[6].i, a[7].i,
                              a[8].i, P(9));
    case OP_SELECT_ROWS:
        return select_rows(P(0), a[1].i, a[2].i, a[3].i, P(4), a[5].i, P(6));
    case OP_STORE_LATENT:
        return store_latent_rows(P(0), a[1].i, P(2), a[3].i, P(4), P(5), a[6].i, a[7].i,
                                 a[8].i, a[9].i);
    case OP_ADD:
        add_rows(P(0), a[1].i, P(2), a[3].i, P(4), a[5].i, a[6].i);
        return 0;
    case OP_READ_WORDS:
        return read_words(P(0), a[1].i, P(2));
    case OP_GROUPED_ROUTE:
        grouped_route(P(0), a[1].i, P(2), P(3), P(4), a[5].i, a[6].i, a[7].i, a[8].i, a[9].i,
                      a[10].i, a[11].i, a[12].i, (float)a[13].d, P(14));
        return 0;
    }
    return -100;
}

/* The Python exception for run_op's error `rc` of `op`. */
static void describe(int64_t op, int rc, const Slot *a) {
    if (rc == -100) {
        PyErr_Format(PyExc_ValueError, "no native op %lld on this machine", (long long)op);
        return;
    }
    if (rc == POOL_FAILED) {
        PyErr_Format(PyExc_OSError, "native op %s: cannot start its %d threads: %s",
                     NAMES[op], atomic_load(&threads), strerror(pool_error));
        return;
    }
    switch (op) {
    case OP_PACK_WEIGHT:
        PyErr_NoMemory();
        return;
    case OP_PREFILL_ATTENTION:
        if (rc == -1)
            PyErr_SetString(PyExc_ValueError,
                            "a sequence's new tokens exceed q, its length or its block table");
        else if (rc == -2)
            PyErr_Format(PyExc_ValueError, "a block table names a block outside 0..%lld",
                         (long long)a[15].i - 1);
        else
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
                     (long long)a[7].i - 1);
        return;
    case OP_SELECT_ROWS:
        PyErr_Format(PyExc_ValueError, "a row index is outside 0..%lld", (long long)a[2].i - 1);
        return;
    case OP_STORE_LATENT:
        PyErr_Format(PyExc_ValueError,
                     "a slot is outside the latent cache (-1 for padding, else 0..%lld)",
                     (long long)a[9].i - 1);
        return;
    case OP_MLA_DECODE:
        if (rc == -1)
            PyErr_SetString(PyExc_ValueError, "a sequence length exceeds its block table");
        else if (rc == -2)
            PyErr_Format(PyExc_ValueError, "a block table names a block outside 0..%lld",
                         (long long)a[17].i - 1);
        else
            PyErr_NoMemory();
        return;
    case OP_MOE_EXPERTS:
        if (rc == -1)
            PyErr_Format(PyExc_ValueError, "an expert id is outside 0..%lld",
                         (long long)a[9].i - 1);
        else
            PyErr_NoMemory();
        return;
    case OP_READ_WORDS:
        PyErr_Format(PyExc_ValueError, "read_words: %lld bytes is not a whole number of "
                     "64-bit words", (long long)a[1].i);
        return;
    case OP_QUANTIZED_LINEAR:
    case OP_QUANTIZED_EMBEDDING:
        if (rc == -2)
            PyErr_Format(PyExc_ValueError, "no quantized record of kind %lld with blocks of %lld",
                         (long long)a[3].i, (long long)a[4].i);
        else if (op == OP_QUANTIZED_EMBEDDING)
            PyErr_Format(PyExc_ValueError, "a token id is outside the vocabulary (0..%lld)",
                         (long long)a[5].i - 1);
        else
            PyErr_NoMemory();
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
static PyObject *py_call(PyObject *Py_UNUSED(self), PyObject *const *argv, Py_ssize_t argc) {
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
static PyObject *py_record(PyObject *Py_UNUSED(self), PyObject *const *argv, Py_ssize_t argc) {
    int64_t record[1 + MAX_SLOTS] = {0};
    if (parse("record(op, *args)", argv, argc, record, (Slot *)(record + 1))) return NULL;
    return PyBytes_FromStringAndSize((const char *)record, sizeof record);
}

/* run_tape(records: bytes): runs every record in order; stops at the first error. */
static PyObject *py_run_tape(PyObject *Py_UNUSED(self), PyObject *const *argv, Py_ssize_t argc) {
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

/* quantized_isa(name=None) -> str: the instruction set the quantized products run with,
 * "avx512" or "avx2" (import picks AVX-512 where the CPU has it). Given a name, they run
 * with that one from now on: both paths give bitwise the same results, and the tests and
 * benchmarks compare them. ValueError for AVX-512 on a CPU without it, or another name. */
static PyObject *py_quantized_isa(PyObject *Py_UNUSED(self), PyObject *const *argv,
                                  Py_ssize_t argc) {
    if (argc > 1 || (argc == 1 && argv[0] != Py_None && !PyUnicode_Check(argv[0]))) {
        PyErr_SetString(PyExc_TypeError, "quantized_isa(name: str | None = None)");
        return NULL;
    }
#if NATIVE_X86
    if (argc == 1 && argv[0] != Py_None) {
        const char *name = PyUnicode_AsUTF8(argv[0]);
        if (name == NULL) return NULL;
        if (strcmp(name, "avx2") == 0) {
            use_avx512 = 0;
        } else if (strcmp(name, "avx512") == 0 && __builtin_cpu_supports("avx512f")) {
            use_avx512 = 1;
        } else {
            PyErr_Format(PyExc_ValueError, "quantized_isa %R: this CPU runs %s", argv[0],
                         __builtin_cpu_supports("avx512f") ? "'avx512' or 'avx2'" : "'avx2' only");
            return NULL;
        }
    }
    return PyUnicode_FromString(use_avx512 ? "avx512" : "avx2");
#else
    PyErr_SetString(PyExc_ValueError, "no quantized products on this machine");
    return NULL;
#endif
}

/* threads(n=None) -> int: how many threads the products share their strips among (the
 * caller's and n - 1 workers, started by the next product), 1..MAX_THREADS; given n, from
 * now on. TypeError or ValueError for anything else. */
static PyObject *py_threads(PyObject *Py_UNUSED(self), PyObject *const *argv, Py_ssize_t argc) {
    if (argc > 1 || (argc == 1 && argv[0] != Py_None && !PyLong_Check(argv[0]))) {
        PyErr_SetString(PyExc_TypeError, "threads(n: int | None = None)");
        return NULL;
    }
    if (argc == 1 && argv[0] != Py_None) {
        long n = PyLong_AsLong(argv[0]);
        if (n == -1 && PyErr_Occurred()) return NULL;
        if (n < 1 || n > MAX_THREADS) {
            PyErr_Format(PyExc_ValueError, "threads(%ld): allowed 1..%d", n, MAX_THREADS);
            return NULL;
        }
        atomic_store(&threads, (int)n);
    }
    return PyLong_FromLong(atomic_load(&threads));
}

static PyMethodDef methods[] = {
    {"call", (PyCFunction)(void (*)(void))py_call, METH_FASTCALL, NULL},
    {"record", (PyCFunction)(void (*)(void))py_record, METH_FASTCALL, NULL},
    {"run_tape", (PyCFunction)(void (*)(void))py_run_tape, METH_FASTCALL, NULL},
    {"quantized_isa", (PyCFunction)(void (*)(void))py_quantized_isa, METH_FASTCALL, NULL},
    {"threads", (PyCFunction)(void (*)(void))py_threads, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cpu",
    "interlock's native CPU kernels (float32; x86-64 with AVX2, FMA and F16C).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__cpu(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    pthread_atfork(NULL, NULL, forget_pool);
    const char *unsupported = NULL;
#if NATIVE_X86
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")
            || !__builtin_cpu_supports("f16c"))
        unsupported = "this CPU has no AVX2, FMA and F16C (" CPU_NAME ")";
    use_avx512 = unsupported == NULL && __builtin_cpu_supports("avx512f");
#else
    unsupported = "not built for this CPU (" CPU_NAME ")";
#endif
    PyObject *why = unsupported ? PyUnicode_FromString(unsupported) : Py_NewRef(Py_None);
    if (why == NULL || PyModule_AddObject(m, "UNSUPPORTED", why) < 0) {
        Py_XDECREF(why);
        Py_DECREF(m);
        return NULL;
    }
    PyObject *signatures = PyDict_New();
    if (signatures == NULL || PyModule_AddObject(m, "SIGNATURES", signatures) < 0) {
        Py_XDECREF(signatures);
        Py_DECREF(m);
        return NULL;
    }
#define ADD(code, name, kinds)                                                             \
    if (PyModule_AddIntConstant(m, "OP_" #code, OP_##code) < 0) goto fail;                 \
    {                                                                                      \
        PyObject *k = PyUnicode_FromString(kinds);                                         \
        if (k == NULL || PyDict_SetItemString(signatures, name, k) < 0) {                  \
            Py_XDECREF(k);                                                                 \
            goto fail;                                                                     \
        }                                                                                  \
        Py_DECREF(k);                                                                      \
    }
    OP_TABLE(ADD)
    if (PyModule_AddIntConstant(m, "MAX_SLOTS", MAX_SLOTS) < 0) goto fail;
    if (PyModule_AddIntConstant(m, "MAX_THREADS", MAX_THREADS) < 0) goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
