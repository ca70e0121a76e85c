"""The strip layout of packed weights, shared by the float references (``pack_weight``) and
the GGUF records (``kernels.quant.pack``)."""

from __future__ import annotations

#: Output features per strip of a packed linear weight.
PACK_STRIP = 16
