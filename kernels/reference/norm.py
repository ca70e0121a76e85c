"""The norms: RMS (plain, after a residual add, gated) and layer norm."""

from __future__ import annotations

import torch

from interlock.kernels.reference.contract import torch_op


@torch_op("rms_norm")
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """[T, H] -> [T, H]: weight * (x / sqrt(mean(x^2) + eps)), computed in float32. Also
    [T, heads, H] -> [T, heads, H] (the per-head q/k norms)."""
    xf = x.float()
    # mean(x^2) as |x|^2 / H: one vector_norm is several times cheaper than pow + mean on
    # the CPU for decode-sized rows, and equal up to float rounding.
    inv = torch.linalg.vector_norm(xf, dim=-1, keepdim=True).square_()
    inv = inv.div_(x.shape[-1]).add_(eps).rsqrt_()
    return weight * (xf * inv).to(x.dtype)


@torch_op("fused_add_rms_norm")
def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (rms_norm(x + residual), x + residual)."""
    summed = x + residual
    return rms_norm(summed, weight, eps), summed


@torch_op("layer_norm")
def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
               ) -> torch.Tensor:
    """[T, D] -> [T, D]: (x - mean) / sqrt(var + eps) * weight + bias over the last
    dimension (the DSA indexer's key norm)."""
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)


@torch_op("gated_rms_norm")
def gated_rms_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """[T, H, D] -> [T, H, D]: RMS norm over D, times weight [D], times sigmoid(gate), all
    in float32 (weight too), cast back (KDA's output norm)."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return (normed * torch.sigmoid(gate.float())).to(x.dtype)
