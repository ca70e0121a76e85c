/* Shared-memory collectives for the ranks of one host (interlock.runners.parallel.shm).
 *
 * A gloo all-reduce between two local processes costs 0.5-1.8 ms, against a ~50 us
 * socket round trip; a decode step makes ~18 of them. Here the ranks meet in one shared
 * segment instead: each copies its part into its own slot, raises its arrival flag, waits
 * for every other rank's, and sums the slots itself, in rank order 0 .. W-1, so that every
 * rank computes the same additions in the same order and sees a bitwise identical result.
 * A departure flag per rank says it has read every slot, so a slot is rewritten only once
 * all ranks are done with it.
 *
 * The segment (laid out by shm.py, which creates, maps and sizes it):
 *   header, HEADER bytes: for each rank, on a cache line of its own, its pid, its
 *   generation (collectives it has entered, counted by the C code so that a call's
 *   arguments stay the same from one call to the next), its arrival, its departure and
 *   the count of ranks asleep waiting on it; then one slot of slot_bytes per rank.
 *
 * Rank 0 also broadcasts its step messages through its slot (the control channel once the
 * segment exists): a gloo broadcast costs as much as a gloo all-reduce, and a worker that
 * gets its step late makes rank 0 wait at the step's first collective.
 *
 * Waiting spins with a pause, then yields the core (ranks may outnumber free cores), then,
 * after a few milliseconds, sleeps on the awaited field (a futex on Linux) until the rank
 * it waits for publishes it, so that a worker waiting for the next step of an idle engine
 * uses no CPU. Every millisecond or so it checks the clock against the timeout and whether
 * the rank it waits for still exists. A timeout or a dead peer returns which rank it was, so the
 * caller can name it; no collective ever waits without bound.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define LINE 64
#define MAX_RANKS 64
/* Per rank, five 8-byte fields on lines of their own; F_SLEEPERS counts the ranks asleep
 * on this rank's arrival or departure. */
#define FIELDS 5
#define HEADER (MAX_RANKS * FIELDS * LINE)
enum { F_PID, F_GEN, F_ARRIVE, F_DEPART, F_SLEEPERS };

static inline volatile int64_t *field(char *base, long rank, int which) {
    return (volatile int64_t *)(base + (rank * FIELDS + which) * LINE);
}

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Whether process `pid` has ended: gone, or (Linux) a zombie its parent has not reaped
 * yet, which kill() still finds. */
static int ended(int64_t pid) {
    if (kill((pid_t)pid, 0) != 0) return errno == ESRCH;
#if defined(__linux__)
    char path[64], stat[512];
    snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) return 0;
    size_t got = fread(stat, 1, sizeof stat - 1, f);
    fclose(f);
    stat[got] = 0;
    const char *close = strrchr(stat, ')'); /* the name may hold spaces and parentheses */
    return close != NULL && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
#else
    return 0;
#endif
}

/* Outcomes of a wait: 0, or the rank that timed out / died, encoded. */
#define TIMED_OUT(rank) (-(1 + 2 * (rank)))
#define DIED(rank) (-(2 + 2 * (rank)))

/* A wait spins (a peer a few microseconds behind is the common case), then yields the core
 * (ranks may outnumber free cores, and the rank being waited for may need this very
 * one), then, after YIELD_S, sleeps on the field until it is published: a worker waiting
 * for the next step of an idle engine uses no CPU. Sleeping or spinning longer costs more
 * than it saves: waking a sleeping rank took ~100 us here (an idle virtual CPU must be
 * woken), and a rank that spins on a core a runnable peer needs delays that peer (an
 * all-reduce under load took 110 us with a 50 us spin, 55 us with this one). */
#define SPINS 2000
#define YIELD_S 0.005

/* The futex word of a field: its low 32 bits, which change with every increment. */
static inline uint32_t *word(volatile int64_t *f) {
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return (uint32_t *)f + 1;
#else
    return (uint32_t *)f;
#endif
}

/* Sleep until the field's word is no longer `seen`, a wake, or at most `ns`. */
static void doze(volatile int64_t *f, uint32_t seen, long ns) {
    struct timespec pause = {0, ns};
#if defined(__linux__)
    syscall(SYS_futex, word(f), FUTEX_WAIT, seen, &pause, NULL, 0);
#else
    (void)f;
    (void)seen;
    nanosleep(&pause, NULL);
#endif
}

/* Publish `value` in field `which` of `rank`, waking whoever sleeps on that rank. The
 * store is a plain release: a full fence here (so that a sleeper's count and the store
 * could never miss each other) made every all-gather 4x slower, draining the copy into
 * the slot. A sleeper that counts itself just as the value lands may thus sleep through
 * it, but only until its sleep's bound (5 ms) and only after it already waited YIELD_S:
 * a late wake, never a lost collective. */
static void publish(char *base, long rank, int which, int64_t value) {
    __atomic_store_n(field(base, rank, which), value, __ATOMIC_RELEASE);
#if defined(__linux__)
    if (__atomic_load_n(field(base, rank, F_SLEEPERS), __ATOMIC_RELAXED) > 0)
        syscall(SYS_futex, word(field(base, rank, which)), FUTEX_WAKE, MAX_RANKS, NULL,
                NULL, 0);
#endif
}

/* Waits until field `which` of rank `r` is >= g: spins, yields, then sleeps on the field
 * (woken by `publish`, and every 5 ms); about every millisecond it checks the clock
 * against the timeout and whether rank r still exists. */
static int wait_rank(char *base, long r, int which, int64_t g, double timeout) {
    volatile int64_t *f = field(base, r, which);
    double start = 0.0, checked = 0.0;
    int sleeping = 0;
    for (long spins = 1;; spins++) {
        if (__atomic_load_n(f, __ATOMIC_ACQUIRE) >= g) return 0;
        if (spins < SPINS) {
            relax();
            continue;
        }
        if (!sleeping) {
            sched_yield();
            if (spins % 256) continue; /* the clock every 256 yields */
        } else {
            __atomic_add_fetch(field(base, r, F_SLEEPERS), 1, __ATOMIC_SEQ_CST);
            int64_t seen = __atomic_load_n(f, __ATOMIC_SEQ_CST);
            if (seen < g) doze(f, (uint32_t)seen, 5000000);
            __atomic_sub_fetch(field(base, r, F_SLEEPERS), 1, __ATOMIC_SEQ_CST);
        }
        double t = now_s();
        if (start == 0.0) start = checked = t;
        sleeping = t - start > YIELD_S;
        if (t - checked < 0.001) continue;
        checked = t;
        int64_t pid = __atomic_load_n(field(base, r, F_PID), __ATOMIC_RELAXED);
        if (pid > 0 && ended(pid)) return DIED(r);
        if (t - start > timeout) return TIMED_OUT(r);
    }
}

/* Waits until field `which` of every rank is >= g. */
static int wait_all(char *base, long world, int which, int64_t g, double timeout) {
    for (long r = 0; r < world; r++) {
        int rc = wait_rank(base, r, which, g, timeout);
        if (rc) return rc;
    }
    return 0;
}

/* One collective over n floats of x: a sum in place into x (out == NULL), or a gather of
 * every rank's x into out, rank-major (out[r * n + i] = x of rank r at i). */
static int collective(char *base, long rank, long world, long slot_bytes, float *x, long n,
                      float *out, double timeout) {
    long chunk = slot_bytes / (long)sizeof(float);
    char *slots = base + HEADER;
    for (long lo = 0; lo < n; lo += chunk) {
        long m = n - lo < chunk ? n - lo : chunk;
        int64_t g = __atomic_load_n(field(base, rank, F_GEN), __ATOMIC_RELAXED) + 1;
        __atomic_store_n(field(base, rank, F_GEN), g, __ATOMIC_RELAXED);
        /* my slot is free once every rank has read the previous round */
        int rc = wait_all(base, world, F_DEPART, g - 1, timeout);
        if (rc) return rc;
        float *mine = (float *)(slots + rank * slot_bytes);
        if (m > 0) memcpy(mine, x + lo, sizeof(float) * (size_t)m);
        publish(base, rank, F_ARRIVE, g);
        rc = wait_all(base, world, F_ARRIVE, g, timeout);
        if (rc) return rc;
        if (out == NULL) {
            const float *first = (const float *)slots;
            for (long i = 0; i < m; i++) {
                float s = first[i];
                for (long r = 1; r < world; r++) s += ((const float *)(slots + r * slot_bytes))[i];
                x[lo + i] = s;
            }
        } else if (m > 0) {
            for (long r = 0; r < world; r++)
                memcpy(out + r * n + lo, slots + r * slot_bytes, sizeof(float) * (size_t)m);
        }
        publish(base, rank, F_DEPART, g);
    }
    return 0;
}

/* One broadcast round of rank 0's slot, which holds an 8-byte length and that many bytes.
 * Rank 0 writes n bytes of x (n fits the slot: py_broadcast checks) once every rank has
 * read the previous round; another rank
 * waits for rank 0's arrival, copies what it wrote into x (at most n bytes) and returns
 * the count. A rank that times out waiting changes nothing, so it may simply wait again.
 * Only rank 0's arrival is awaited: the next round's wait for every departure keeps rank
 * 0 from rewriting its slot before all have read it. */
static long broadcast(char *base, long rank, long world, char *x, long n, double timeout) {
    int64_t g = __atomic_load_n(field(base, rank, F_GEN), __ATOMIC_RELAXED) + 1;
    char *slot = base + HEADER;
    int64_t length;
    if (rank == 0) {
        int rc = wait_all(base, world, F_DEPART, g - 1, timeout);
        if (rc) return rc;
        length = n;
        memcpy(slot, &length, sizeof length);
        if (n > 0) memcpy(slot + sizeof length, x, (size_t)n);
    } else {
        int rc = wait_rank(base, 0, F_ARRIVE, g, timeout);
        if (rc) return rc;
        memcpy(&length, slot, sizeof length);
        if (length > n) length = n;
        if (length > 0) memcpy(x, slot + sizeof length, (size_t)length);
    }
    __atomic_store_n(field(base, rank, F_GEN), g, __ATOMIC_RELAXED);
    publish(base, rank, F_ARRIVE, g);
    publish(base, rank, F_DEPART, g);
    return (long)length;
}

static int parse(PyObject *const *argv, Py_ssize_t argc, Py_ssize_t want, long long *v,
                 double *timeout) {
    if (argc != want) {
        PyErr_Format(PyExc_TypeError, "takes %zd arguments, got %zd", want, argc);
        return -1;
    }
    for (Py_ssize_t k = 0; k < want - 1; k++) {
        v[k] = PyLong_AsLongLong(argv[k]);
        if (v[k] == -1 && PyErr_Occurred()) return -1;
    }
    *timeout = PyFloat_AsDouble(argv[want - 1]);
    if (PyErr_Occurred()) return -1;
    long long rank = v[1], world = v[2], slot = v[3], n = v[5];
    if (world < 1 || world > MAX_RANKS || rank < 0 || rank >= world || slot < LINE ||
        slot % LINE || n < 0 || *timeout <= 0) {
        PyErr_Format(PyExc_ValueError,
                     "shared-memory collective: rank %lld of %lld (at most %d), slot %lld "
                     "bytes (a multiple of %d), %lld floats, timeout %g s",
                     rank, world, MAX_RANKS, slot, LINE, n, *timeout);
        return -1;
    }
    return 0;
}

/* The Python result of collective()'s rc: None, or (kind, rank) for the caller to name. */
static PyObject *outcome(int rc) {
    if (rc == 0) Py_RETURN_NONE;
    long code = -rc - 1;
    return Py_BuildValue("(sl)", code % 2 ? "died" : "timeout", code / 2);
}

/* all_reduce(base, rank, world, slot_bytes, x, n, timeout_s) -> None | (kind, rank) */
static PyObject *py_all_reduce(PyObject *Py_UNUSED(self), PyObject *const *argv,
                               Py_ssize_t argc) {
    long long v[6];
    double timeout;
    if (parse(argv, argc, 7, v, &timeout)) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = collective((char *)(intptr_t)v[0], (long)v[1], (long)v[2], (long)v[3],
                    (float *)(intptr_t)v[4], (long)v[5], NULL, timeout);
    Py_END_ALLOW_THREADS
    return outcome(rc);
}

/* all_gather(base, rank, world, slot_bytes, x, n, out, timeout_s) -> None | (kind, rank) */
static PyObject *py_all_gather(PyObject *Py_UNUSED(self), PyObject *const *argv,
                               Py_ssize_t argc) {
    long long v[7];
    double timeout;
    if (argc != 8) {
        PyErr_Format(PyExc_TypeError, "all_gather takes 8 arguments, got %zd", argc);
        return NULL;
    }
    /* the same checks as all_reduce, over (base .. n) and the timeout */
    PyObject *args[7] = {argv[0], argv[1], argv[2], argv[3], argv[4], argv[5], argv[7]};
    if (parse(args, 7, 7, v, &timeout)) return NULL;
    long long out = PyLong_AsLongLong(argv[6]);
    if (out == -1 && PyErr_Occurred()) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = collective((char *)(intptr_t)v[0], (long)v[1], (long)v[2], (long)v[3],
                    (float *)(intptr_t)v[4], (long)v[5], (float *)(intptr_t)out, timeout);
    Py_END_ALLOW_THREADS
    return outcome(rc);
}

/* broadcast(base, rank, world, slot_bytes, x, n, timeout_s) -> count | (kind, rank) */
static PyObject *py_broadcast(PyObject *Py_UNUSED(self), PyObject *const *argv,
                              Py_ssize_t argc) {
    long long v[6];
    double timeout;
    if (parse(argv, argc, 7, v, &timeout)) return NULL;
    if (v[1] == 0 && v[5] > v[3] - (long long)sizeof(int64_t)) { /* rank 0's length first */
        PyErr_Format(PyExc_ValueError, "broadcast: %lld bytes do not fit a slot of %lld",
                     v[5], v[3]);
        return NULL;
    }
    long rc;
    Py_BEGIN_ALLOW_THREADS
    rc = broadcast((char *)(intptr_t)v[0], (long)v[1], (long)v[2], (char *)(intptr_t)v[4],
                   (long)v[5], timeout);
    Py_END_ALLOW_THREADS
    if (rc < 0) return outcome((int)rc);
    return PyLong_FromLong(rc);
}

static PyMethodDef methods[] = {
    {"broadcast", (PyCFunction)(void (*)(void))py_broadcast, METH_FASTCALL, NULL},
    {"all_reduce", (PyCFunction)(void (*)(void))py_all_reduce, METH_FASTCALL, NULL},
    {"all_gather", (PyCFunction)(void (*)(void))py_all_gather, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_shm",
    "interlock's shared-memory collectives for the ranks of one host.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__shm(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "HEADER", HEADER) < 0 ||
        PyModule_AddIntConstant(m, "LINE", LINE) < 0 ||
        PyModule_AddIntConstant(m, "MAX_RANKS", MAX_RANKS) < 0 ||
        PyModule_AddIntConstant(m, "PID_OFFSET", F_PID * LINE) < 0 ||
        PyModule_AddIntConstant(m, "RANK_STRIDE", FIELDS * LINE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
