# The C extension (kernels/native/*.c). Every op takes raw addresses and sizes, checked
# by interlock.kernels.native.ops; the OP_* codes name them, in calls and in tape records.
# tests/kernels/test_native_build.py holds this stub to the module and each call site in
# ops.py to SIGNATURES.

# Why the kernels cannot run here (a portable build, or a CPU without AVX2, FMA and F16C),
# or None.
UNSUPPORTED: str | None
# op name -> its argument kinds in order: "i" an int (address, size, stride), "d" a float.
SIGNATURES: dict[str, str]
# The argument slots of a tape record (after its op code), each 8 bytes.
MAX_SLOTS: int
# The most threads the products' pool takes (threads(n) refuses more).
MAX_THREADS: int
OP_LINEAR: int
OP_DECODE_ATTENTION: int
OP_RMS_NORM: int
OP_SILU_AND_MUL: int
OP_ROTARY: int
OP_STORE_KV: int
OP_EMBEDDING: int
OP_SELECT_ROWS: int
OP_PACK_WEIGHT: int
OP_PREFILL_ATTENTION: int
OP_QUANTIZED_LINEAR: int
OP_QUANTIZED_EMBEDDING: int
OP_MOE_EXPERTS: int
OP_MLA_DECODE: int
OP_STORE_LATENT: int
OP_ADD: int
OP_GROUPED_ROUTE: int
OP_READ_WORDS: int
OP_QUANTIZED_LINEAR_INT8: int

def call(op: int, /, *args: int | float) -> None: ...
def record(op: int, /, *args: int | float) -> bytes: ...
def run_tape(records: bytes, /) -> None: ...
# The quantized products' instruction set, "avx512" or "avx2"; given one, switches to it
# (ValueError where the CPU lacks it). Both give bitwise the same results.
def quantized_isa(name: str | None = None, /) -> str: ...
# The int8 products' instruction set, "vnni", "avx2" or "portable"; given one, switches to
# it (ValueError where the CPU lacks it). All give bitwise the same results.
def int8_isa(name: str | None = None, /) -> str: ...
# How many threads the products share their output strips among (ops.py keeps it equal to
# torch's thread count); given n (1..MAX_THREADS), from now on. The results are bitwise the same at
# any count.
def threads(n: int | None = None, /) -> int: ...
