"""Products with dense weights and row lookups: ``linear``, ``embedding``, the strip
packing both take (``pack_weight``), ``select_rows``."""

from __future__ import annotations

import torch

from interlock.kernels.packing import PACK_STRIP
from interlock.kernels.reference.contract import torch_op


@torch_op("linear")
def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, transposed: bool
) -> torch.Tensor:
    """x [T, in] -> [T, out] through a weight stored [out, in], [in, out] (``transposed``)
    or packed by ``pack_weight`` ([out / 16, in, 16]), plus the bias [out] if any."""
    if weight.dim() == 3:
        y = torch.matmul(x, weight).transpose(0, 1).reshape(x.shape[0], -1)
        return y if bias is None else y + bias
    if not transposed:
        return torch.nn.functional.linear(x, weight, bias)
    if bias is None:
        return torch.mm(x, weight)
    return torch.addmm(bias, x, weight)


@torch_op("embedding")
def embedding(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """ids [T] int64 -> their rows of table [V, H] (any strides), or of a table packed by
    ``pack_weight`` ([V / 16, H, 16]: a tied LM head): [T, H]."""
    if table.dim() == 3:
        return table[ids // PACK_STRIP, :, ids % PACK_STRIP]
    return torch.nn.functional.embedding(ids, table)


@torch_op("pack_weight")
def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """A contiguous linear weight [out, in] packed in place in strips of ``PACK_STRIP``
    outputs, returned as [out / 16, in, 16] over the same memory: element [s, k, c] is
    W[16 s + c, k]. A strip's weights for one input feature are then adjacent, and a strip
    is one contiguous run: what a kernel multiplying a few rows streams (``linear`` and
    ``embedding`` take either form)."""
    outputs, inputs = weight.shape
    if outputs % PACK_STRIP or not weight.is_contiguous():
        raise ValueError(f"pack_weight: weight {tuple(weight.shape)} is not a contiguous "
                         f"[out, in] with a multiple of {PACK_STRIP} outputs")
    strips = weight.view(outputs // PACK_STRIP, PACK_STRIP, inputs)
    for strip in strips:  # one strip's copy at a time: no second weight in memory
        strip.view(inputs, PACK_STRIP).copy_(strip.t().clone())
    return weight.view(outputs // PACK_STRIP, inputs, PACK_STRIP)


@torch_op("select_rows")
def select_rows(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """x [N, H], indices [M] int64 -> x[indices]: [M, H]."""
    return x.index_select(0, indices)
