/* The native CPU kernels (backend "native"): float32, x86-64 with AVX2, FMA and F16C, with
 * products over weights kept in GGUF's quantized block formats (quantized.c). This file is
 * the module: the op table and its entry points; native.h says which file holds what.
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
 * The same entry point serves a call from Python and a record of a tape (below), which the native graph backend replays without Python in between.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "native.h"

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

/* The widest int8 path this CPU runs (INT8_*). */
static int int8_best(void) {
#if NATIVE_X86
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vnni")
            && __builtin_cpu_supports("avx512vbmi")) return INT8_VNNI;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
            && __builtin_cpu_supports("f16c")) return INT8_AVX2;
#endif
    return INT8_PORTABLE;
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
    X(READ_WORDS, "read_words", "iii")                                                     \
    /* quantized_linear_int8(x, x_row_stride, packed w, kind, L, bias|0, y, T, K, N) */   \
    X(QUANTIZED_LINEAR_INT8, "quantized_linear_int8", "iiiiiiiiii")

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
    case OP_QUANTIZED_LINEAR_INT8:
        if ((a[3].i != (QBYTES_NIBBLES | QBYTES_HALF | QBYTES_INT8)
             && a[3].i != (QBYTES_SIGNED | QBYTES_HALF)) || a[4].i != 32) return -2;
        return linear_int8(P(0), a[1].i, P(2), a[3].i == (QBYTES_SIGNED | QBYTES_HALF), P(5),
                           P(6), a[7].i, a[8].i, a[9].i);
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
                     NAMES[op], pool_threads(), strerror(pool_error()));
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
    case OP_QUANTIZED_LINEAR_INT8:
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

/* int8_isa(name=None) -> str: the instruction set the int8 products run with, "vnni"
 * (AVX-512 VNNI and VBMI), "avx2" or "portable" (import picks the widest this CPU has). Given a
 * name, they run with that one from now on: every path gives bitwise the same results, and
 * the tests and benchmarks compare them. ValueError for a path this CPU cannot run. */
static PyObject *py_int8_isa(PyObject *Py_UNUSED(self), PyObject *const *argv, Py_ssize_t argc) {
    static const char *const names[] = {"portable", "avx2", "vnni"};
    if (argc > 1 || (argc == 1 && argv[0] != Py_None && !PyUnicode_Check(argv[0]))) {
        PyErr_SetString(PyExc_TypeError, "int8_isa(name: str | None = None)");
        return NULL;
    }
    if (argc == 1 && argv[0] != Py_None) {
        const char *name = PyUnicode_AsUTF8(argv[0]);
        if (name == NULL) return NULL;
        int path = -1;
        for (int i = 0; i < 3; i++)
            if (strcmp(name, names[i]) == 0) path = i;
        if (path < 0 || path > int8_best()) {
            PyErr_Format(PyExc_ValueError, "int8_isa %R: this CPU runs %s", argv[0],
                         int8_best() == INT8_VNNI ? "'vnni', 'avx2' or 'portable'"
                         : int8_best() == INT8_AVX2 ? "'avx2' or 'portable'" : "'portable' only");
            return NULL;
        }
        int8_path = path;
    }
    return PyUnicode_FromString(names[int8_path]);
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
        pool_set_threads((int)n);
    }
    return PyLong_FromLong(pool_threads());
}

static PyMethodDef methods[] = {
    {"call", (PyCFunction)(void (*)(void))py_call, METH_FASTCALL, NULL},
    {"record", (PyCFunction)(void (*)(void))py_record, METH_FASTCALL, NULL},
    {"run_tape", (PyCFunction)(void (*)(void))py_run_tape, METH_FASTCALL, NULL},
    {"quantized_isa", (PyCFunction)(void (*)(void))py_quantized_isa, METH_FASTCALL, NULL},
    {"int8_isa", (PyCFunction)(void (*)(void))py_int8_isa, METH_FASTCALL, NULL},
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
    int8_path = int8_best();
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
