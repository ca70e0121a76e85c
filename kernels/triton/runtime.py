"""What every Triton kernel module shares: how it was built and small launch helpers.

Importing this module imports triton; only the kernel modules do, lazily, when
the registry loads a Triton implementation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Triton decides at decoration time whether a kernel is compiled or interpreted,
# so this records how the kernels imported alongside this module were built.
INTERPRETED: bool = bool(triton.knobs.runtime.interpret)

_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def dot_operands(dtype: torch.dtype) -> tuple[tl.dtype, str | None]:
    """(operand dtype, input precision or None for the default) for ``tl.dot`` over ``dtype``.

    float32 asks for IEEE products so results match torch's (non-TF32) matmul.
    Triton's interpreter computes bfloat16 dots on the raw bits, so there the
    operands are widened to float32 first: exact, since every bfloat16 is a
    float32 and the accumulation is float32 either way.
    """
    if dtype == torch.float32:
        return tl.float32, "ieee"
    if dtype == torch.bfloat16 and INTERPRETED:
        return tl.float32, "ieee"
    return _TL_DTYPES[dtype], None


def warps_for(elements: int, per_warp: int, most: int = 8) -> int:
    """Warps for a tile of ``elements``: one per ``per_warp`` elements, from 1 to ``most``."""
    return max(1, min(most, elements // per_warp))


def unit_stride(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """Check the innermost dimension is contiguous, which every kernel's vector loads assume."""
    if tensor.stride(-1) != 1:
        raise ValueError(
            f"{name} must be contiguous in its last dimension (strides {tuple(tensor.stride())})"
        )
    return tensor


def tile_groups(
    counts: torch.Tensor, block: int, max_tiles: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut each group's rows into tiles of ``block`` rows, numbered group after group.

    counts [G] -> (owner [max_tiles]: each tile's group, G for tiles past the last;
    first_tile [G]: each group's first tile). Device-side torch ops only, so
    grids sized by ``max_tiles`` (a bound known from shapes) need no host sync.
    """
    tiles = (counts + block - 1) // block
    tile_end = torch.cumsum(tiles, 0)
    owner = torch.searchsorted(
        tile_end, torch.arange(max_tiles, device=counts.device, dtype=tile_end.dtype), right=True
    )
    return owner, tile_end - tiles
