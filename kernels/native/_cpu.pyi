# The C extension (kernels/native/_cpu.c). Every op takes raw addresses and sizes, checked
# by interlock.kernels.native.ops; the OP_* codes name them, in calls and in tape records.
UNSUPPORTED: str | None
OP_LINEAR: int
OP_DECODE_ATTENTION: int
OP_RMS_NORM: int
OP_SILU_AND_MUL: int
OP_ROTARY: int
OP_STORE_KV: int
OP_EMBEDDING: int
OP_SELECT_ROWS: int

def call(op: int, /, *args: int | float) -> None: ...
def record(op: int, /, *args: int | float) -> bytes: ...
def run_tape(records: bytes, /) -> None: ...
