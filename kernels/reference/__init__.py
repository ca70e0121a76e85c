"""Torch reference implementations: the contract of every op, on any device.

One module per op family; importing the package registers every op. Shapes: T tokens,
B sequences, H hidden, Hq/Hk query/KV heads, D head size, NB cache blocks of BS slots.
Numerics follow Hugging Face transformers (norms in float32 then cast back, softmax in
float32) so the models match it.
"""

from __future__ import annotations

# The import order is MODEL_OPS' order, the order a kernel table lists its ops in.
# isort: off
from interlock.kernels.reference import (  # noqa: F401  (each registers its family's ops)
    dense, norm, elementwise, rotary, attention, mla, moe, sampling, dsa, quantized, kda,
)
# isort: on
from interlock.kernels.reference.contract import MODEL_OPS, torch_op

__all__ = ["MODEL_OPS", "torch_op"]
