"""Native CPU kernels, registered as backend ``native`` without loading them.

A C extension (``_cpu``, built from the .c files here when interlock is installed): products
over weights packed in strips (the reference ``pack_weight``; a runner packs them after
loading), which stream each weight once at the machine's read bandwidth for a few rows and
near the core's FMA rate for many; prefill attention over keys gathered into strips; and the
small per-layer ops in one call each. ``tape`` records their calls for the native graph
backend to replay. The CPU's counterpart of the Triton kernels. float32 only, on x86-64 with
AVX2, FMA and F16C, checked when the module loads. The module builds on every CPU; off
x86-64 it has no kernels, and ``unavailable`` says so ("not built for this CPU (aarch64)"),
as it does on a CPU without AVX2/FMA/F16C or where no C compiler built it, and the registry
picks torch, with that reason. torch.compile cannot trace a call through raw addresses, so a
compiled forward gets the torch references instead, and the reason says that too. """

from __future__ import annotations

import functools
import importlib

from interlock.kernels import reference  # noqa: F401  (the ops exist before native implements them)
from interlock.kernels.registry import REGISTRY, KernelImpl

BACKEND = "native"

KERNELS = {
    "linear": "interlock.kernels.native.ops:linear",
    "rms_norm": "interlock.kernels.native.ops:rms_norm",
    "fused_add_rms_norm": "interlock.kernels.native.ops:fused_add_rms_norm",
    "silu_and_mul": "interlock.kernels.native.ops:silu_and_mul",
    "rotary_embedding": "interlock.kernels.native.ops:rotary_embedding",
    "store_kv_cache": "interlock.kernels.native.ops:store_kv_cache",
    "paged_decode_attention": "interlock.kernels.native.ops:paged_decode_attention",
    "paged_attention": "interlock.kernels.native.ops:paged_attention",
    "embedding": "interlock.kernels.native.ops:embedding",
    "select_rows": "interlock.kernels.native.ops:select_rows",
    "pack_weight": "interlock.kernels.native.ops:pack_weight",
    "moe_experts": "interlock.kernels.native.ops:moe_experts",
    "mla_decode_attention": "interlock.kernels.native.ops:mla_decode_attention",
    "store_latent_cache": "interlock.kernels.native.ops:store_latent_cache",
    "moe_grouped_route": "interlock.kernels.native.ops:moe_grouped_route",
    "add": "interlock.kernels.native.ops:add",
    "quantized_linear": "interlock.kernels.native.ops:quantized_linear",
    "quantized_embedding": "interlock.kernels.native.ops:quantized_embedding",
    "quantized_linear_int8": "interlock.kernels.native.ops:quantized_linear_int8",
}
"""op -> lazy "module:function" target."""


def int8_isa() -> str:
    """The instruction set the int8-activation products run on here ("vnni", "avx2" or
    "portable"): the module picks the widest this CPU has when it loads."""
    isa: str = importlib.import_module("interlock.kernels.native._cpu").int8_isa()
    return isa


def quantized_isa() -> str:
    """The instruction set the quantized products run on here ("avx512" or "avx2"): the
    module picks the widest this CPU has when it loads."""
    isa: str = importlib.import_module("interlock.kernels.native._cpu").quantized_isa()
    return isa


@functools.cache
def unavailable(platform: str) -> str | None:
    """Why the native kernels cannot run now, or None."""
    try:
        module = importlib.import_module("interlock.kernels.native._cpu")
    except ImportError as exc:
        return (f"not built ({exc}): the install compiles them where a C compiler is on "
                "PATH; `pip install -v -e .` shows why the build failed")
    unsupported: str | None = module.UNSUPPORTED
    return unsupported


for _op, _target in KERNELS.items():
    REGISTRY.register(
        KernelImpl(_op, BACKEND, _target, frozenset({"cpu"}), frozenset({"float32"}),
                   unavailable=unavailable, traceable=False,
                   packed_weights=_op in ("linear", "embedding"))
    )
