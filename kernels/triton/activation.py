"""SwiGLU activation: silu(gate) * up over the two halves of each row."""

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


def _launch(intermediate: int) -> _Launch:
    # Columns are split across programs so wide MLPs still fill the machine at batch 1.
    block = min(triton.next_power_of_2(intermediate), 1024)
    return _Launch(block, num_warps=warps_for(block, 256))


@triton.jit
def _silu_and_mul_kernel(x_ptr, x_row_stride, out_ptr, intermediate, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < intermediate
    gate = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_row_stride + intermediate + cols, mask=mask, other=0.0)
    # torch rounds silu's result to the input dtype before the product.
    act = (gate * tl.sigmoid(gate)).to(x_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * intermediate + cols,
             (act * up.to(tl.float32)).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    rows = unit_stride("x", x.reshape(-1, x.shape[-1]))
    intermediate = rows.shape[1] // 2
    out = torch.empty((rows.shape[0], intermediate), dtype=x.dtype, device=x.device)
    launch = _launch(intermediate)
    grid = (rows.shape[0], triton.cdiv(intermediate, launch.block))
    _silu_and_mul_kernel[grid](rows, rows.stride(0), out, intermediate, BLOCK=launch.block,
                               num_warps=launch.num_warps)
    return out.view(*x.shape[:-1], intermediate)
