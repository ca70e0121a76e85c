"""RMSNorm, alone or fused with the residual add: one program per token row.

The row lives in registers: one vectorised load over the hidden dimension, a
float32 sum of squares, one store. Rounding follows the torch reference
(normalise in float32, round to the input dtype, then scale by the weight).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from interlock.kernels.triton.runtime import unit_stride, warps_for


@dataclass(frozen=True)
class _Launch:
    block: int
    num_warps: int


def _launch(hidden: int) -> _Launch:
    block = triton.next_power_of_2(hidden)
    # About 8 elements per thread: 16-byte loads for 16-bit dtypes, no spills.
    return _Launch(block, num_warps=warps_for(block, 256, most=16))


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    x_row_stride,
    residual_ptr,
    residual_row_stride,
    summed_ptr,
    weight_ptr,
    out_ptr,
    hidden,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * residual_row_stride + cols, mask=mask, other=0.0)
        # The sum is rounded to the input dtype before it is normalised, as in torch.
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(summed_ptr + row * hidden + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(xf * xf, axis=0) / hidden + eps)
    normed = (xf * inv_rms).to(x_ptr.dtype.element_ty).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * hidden + cols, (normed * weight).to(out_ptr.dtype.element_ty),
             mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    return unit_stride("x", x.reshape(-1, x.shape[-1]))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    rows = _rows(x)
    out = torch.empty(rows.shape, dtype=torch.promote_types(weight.dtype, x.dtype),
                      device=x.device)
    launch = _launch(rows.shape[1])
    _rms_norm_kernel[(rows.shape[0],)](
        rows, rows.stride(0), rows, rows.stride(0), rows, weight.contiguous(), out,
        rows.shape[1], eps, HAS_RESIDUAL=False, BLOCK=launch.block, num_warps=launch.num_warps,
    )
    return out.view(x.shape)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    rows = _rows(x)
    residual_rows = unit_stride("residual", residual.reshape(rows.shape))
    summed = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    out = torch.empty(rows.shape, dtype=torch.promote_types(weight.dtype, x.dtype),
                      device=x.device)
    launch = _launch(rows.shape[1])
    _rms_norm_kernel[(rows.shape[0],)](
        rows, rows.stride(0), residual_rows, residual_rows.stride(0), summed,
        weight.contiguous(), out, rows.shape[1], eps,
        HAS_RESIDUAL=True, BLOCK=launch.block, num_warps=launch.num_warps,
    )
    return out.view(x.shape), summed.view(x.shape)
