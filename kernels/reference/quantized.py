"""Products with GGUF block-quantized weights (``kernels.quant``), dequantized first."""

from __future__ import annotations

import torch

from interlock.kernels import quant
from interlock.kernels.packing import PACK_STRIP
from interlock.kernels.reference.contract import torch_op


@torch_op("quantized_linear")
def quantized_linear(
    x: torch.Tensor, weight: torch.Tensor, ggml_type: str, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [T, in] -> [T, out] through a weight kept in GGUF block format ``ggml_type``
    (``kernels.quant.FORMATS``), packed by ``kernels.quant.pack`` ([out / 16, in / block,
    record] bytes): dequantized (bitwise as gguf dequantizes), then the float product."""
    return torch.nn.functional.linear(x, quant.dequantize(weight, ggml_type), bias)


@torch_op("quantized_embedding")
def quantized_embedding(ids: torch.Tensor, table: torch.Tensor, ggml_type: str) -> torch.Tensor:
    """ids [T] int64 -> their rows, dequantized, of a table [V, H] kept in GGUF block
    format ``ggml_type`` and packed as ``quantized_linear`` takes it (a tied LM head): [T, H]."""
    rows = quant.dequantize(table[ids // PACK_STRIP], ggml_type)  # each id's strip
    return rows.view(ids.shape[0], PACK_STRIP, -1)[torch.arange(ids.shape[0]), ids % PACK_STRIP]
