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


@torch_op("quantized_linear_int8")
def quantized_linear_int8(
    x: torch.Tensor, weight: torch.Tensor, ggml_type: str, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [T, in] -> [T, out] through a weight in ``ggml_type``'s records for int8
    activations (``kernels.quant.INT8_FORMATS``): x rounded to 8 bits per block of 32
    (``quant.quantize_rows``), then per block d_w (d_x sum of q x_q) + m s, summed over the
    blocks; the sums of q x_q are exact, so only the order of the float sums differs from
    the native kernels'."""
    q, scale, offset = quant.unpack(weight, ggml_type, int8=True)
    xq, d, sums = quant.quantize_rows(x)
    rows, inputs = x.shape
    outputs, blocks = scale.shape
    per_block = torch.einsum(  # [T, N, nb], exact: integers below 2^24
        "tbk,nbk->tnb", xq.to(torch.float32).view(rows, blocks, quant.INT8_BLOCK),
        q.view(outputs, blocks, quant.INT8_BLOCK))
    terms = scale * (d.unsqueeze(1) * per_block)
    if offset is not None:
        terms = terms + offset * sums.unsqueeze(1)
    y = terms.sum(dim=-1)
    return y if bias is None else y + bias


@torch_op("quantized_embedding")
def quantized_embedding(ids: torch.Tensor, table: torch.Tensor, ggml_type: str) -> torch.Tensor:
    """ids [T] int64 -> their rows, dequantized, of a table [V, H] kept in GGUF block
    format ``ggml_type`` and packed as ``quantized_linear`` takes it (a tied LM head): [T, H]."""
    rows = quant.dequantize(table[ids // PACK_STRIP], ggml_type)  # each id's strip
    return rows.view(ids.shape[0], PACK_STRIP, -1)[torch.arange(ids.shape[0]), ids % PACK_STRIP]
