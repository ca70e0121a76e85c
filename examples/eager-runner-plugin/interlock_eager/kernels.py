"""The plugin's kernel: silu_and_mul by slicing (the reference splits with chunk)."""

from __future__ import annotations

import torch


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """[T, 2I] -> [T, I]: silu(gate) * up, as the op contract in kernels.reference says."""
    half = x.shape[-1] // 2
    return torch.nn.functional.silu(x[..., :half]) * x[..., half:]
