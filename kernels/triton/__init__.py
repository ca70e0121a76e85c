"""Triton kernels, registered as backend ``triton`` without importing triton.

The kernel modules are lazy registry targets: triton is imported only when
the registry loads one. On GPU platforms they compile for the device; on cpu
they are available only under Triton's interpreter (``TRITON_INTERPRET=1``,
set before any kernel module is imported), which tests use.

Each kernel takes its op's parameters and keeps its contract as the torch reference
(``kernels.reference``) states them; the registry checks the parameters when it loads one.
"""

from __future__ import annotations

import functools
import importlib
import sys

from interlock.core.platform import PLATFORM_NAMES
from interlock.kernels import reference  # noqa: F401  (the ops exist before Triton implements them)
from interlock.kernels.registry import DTYPES, REGISTRY, KernelImpl

BACKEND = "triton"

KERNELS = {
    "rms_norm": "interlock.kernels.triton.norm:rms_norm",
    "fused_add_rms_norm": "interlock.kernels.triton.norm:fused_add_rms_norm",
    "silu_and_mul": "interlock.kernels.triton.activation:silu_and_mul",
    "rotary_embedding": "interlock.kernels.triton.rotary:rotary_embedding",
    "store_kv_cache": "interlock.kernels.triton.kv_cache:store_kv_cache",
    "paged_attention": "interlock.kernels.triton.attention:paged_attention",
    "paged_decode_attention": "interlock.kernels.triton.attention:paged_decode_attention",
    "moe_route": "interlock.kernels.triton.moe:moe_route",
    "moe_experts": "interlock.kernels.triton.moe:moe_experts",
    "store_latent_cache": "interlock.kernels.triton.mla:store_latent_cache",
    "mla_decode_attention": "interlock.kernels.triton.mla:mla_decode_attention",
    "moe_grouped_route": "interlock.kernels.triton.mla:moe_grouped_route",
    "sample": "interlock.kernels.triton.sampling:sample",
    "dsa_index_topk": "interlock.kernels.triton.indexer:dsa_index_topk",
    "sparse_mla_attention": "interlock.kernels.triton.sparse_attention:sparse_mla_attention",
    "kda_recurrent": "interlock.kernels.triton.kda:kda_recurrent",
}
"""op -> lazy "module:function" target."""


@functools.cache
def _import_failure() -> str | None:
    try:
        importlib.import_module("triton")
    except ImportError as exc:
        return f"triton is not importable ({exc})"
    return None


def unavailable(platform: str) -> str | None:
    """Why the Triton kernels cannot run on ``platform`` now, or None."""
    failure = _import_failure()
    if failure is not None:
        return failure
    if platform != "cpu":
        return None
    import triton

    if not triton.knobs.runtime.interpret:
        return ("triton kernels need a GPU; on cpu they run only in Triton's interpreter "
                "(set TRITON_INTERPRET=1 before the kernels are imported)")
    runtime = sys.modules.get("interlock.kernels.triton.runtime")
    if runtime is not None and not runtime.INTERPRETED:
        return ("TRITON_INTERPRET=1 was set after the triton kernels were imported, so they were "
                "built for a GPU; set it before anything imports kernels.triton modules")
    return None


for _op, _target in KERNELS.items():
    REGISTRY.register(
        KernelImpl(_op, BACKEND, _target, frozenset(PLATFORM_NAMES), frozenset(DTYPES),
                   unavailable=unavailable)
    )
