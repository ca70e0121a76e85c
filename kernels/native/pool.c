/* The thread pool (see native.h). */
#include "native.h"

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

#define PARTS_PER_THREAD 4
#define SPINS 20000 /* ~1 ms of pause instructions before a worker sleeps */

static atomic_int threads = 1; /* wanted, including the caller */
static int pool_size = 0;      /* workers running */
static pthread_t workers[MAX_THREADS];
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_wake = PTHREAD_COND_INITIALIZER;
static atomic_long generation; /* one more for each job, and for the stop */
static atomic_int sleeping;    /* workers waiting on pool_wake */
static atomic_flag busy = ATOMIC_FLAG_INIT;
static int stopping = 0;
static int last_error = 0;     /* pthread_create's error when the pool last failed to start */
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
INTERNAL void forget_pool(void) {
    pool_size = 0;
    pthread_mutex_init(&pool_lock, NULL);
    pthread_cond_init(&pool_wake, NULL);
    atomic_store(&sleeping, 0);
    atomic_flag_clear(&busy);
}

/* fn(ctx, lo, hi) over [0, units) in parts of whole runs of `align` units, shared by the
 * threads; 0, or POOL_FAILED. */
INTERNAL int parallel_for(RangeFn fn, const void *ctx, long units, long align) {
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
        last_error = rc;
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

int pool_threads(void) { return atomic_load(&threads); }

void pool_set_threads(int n) { atomic_store(&threads, n); }

int pool_error(void) { return last_error; }

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
INTERNAL int read_words(const uint64_t *x, long bytes, uint64_t *out) {
    if (bytes < 0 || bytes % 8) return -1;
    _Atomic uint64_t total = 0;
    StreamRead c = {x, bytes / 8, &total};
    int rc = parallel_for(read_part, &c, (bytes / 8 + READ_UNIT - 1) / READ_UNIT, 1);
    *out = atomic_load(&total);
    return rc;
}
