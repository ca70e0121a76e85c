"""Shared helpers for the kernel tests: where they run, tolerances, op lookup."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from interlock.kernels import REGISTRY

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETED else "cuda"
PLATFORM = "cpu" if INTERPRETED else ("rocm" if torch.version.hip else "cuda")

DTYPES = [torch.float32, torch.bfloat16, torch.float16]

TOLERANCES: dict[torch.dtype, dict[str, float]] = {
    # Reductions run in a different order than torch's, so a few float32 ulps of the sum.
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    # Triton's interpreter truncates float32 -> bfloat16 where torch and the GPU round to
    # nearest, so results may sit one or two bfloat16 ulps (2**-8 relative) apart.
    torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2},
}
"""Elementwise ops and row norms, per dtype (atol relative to outputs of order 1)."""

ACCUMULATING_TOLERANCES: dict[torch.dtype, dict[str, float]] = {
    # Attention and GEMMs sum hundreds of products in another order (and the tensor-core
    # dots round probabilities to the activation dtype, as flash attention does).
    torch.float32: {"atol": 1e-4, "rtol": 1e-4},
    torch.float16: {"atol": 5e-3, "rtol": 5e-3},
    torch.bfloat16: {"atol": 4e-2, "rtol": 4e-2},
}
"""Attention and the expert GEMMs, per dtype."""


def triton_op(op: str, dtype: torch.dtype = torch.float32) -> Callable:
    return REGISTRY.select(op, PLATFORM, str(dtype).removeprefix("torch."), force="triton").fn


def torch_op(op: str, dtype: torch.dtype = torch.float32) -> Callable:
    return REGISTRY.select(op, PLATFORM, str(dtype).removeprefix("torch."), force="torch").fn


def randn(generator: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32,
          scale: float = 1.0) -> torch.Tensor:
    """Normal samples drawn on the CPU from ``generator`` (reproducible), moved to DEVICE."""
    return (torch.randn(*shape, generator=generator) * scale).to(dtype=dtype, device=DEVICE)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype,
                 table: dict[torch.dtype, dict[str, float]] = TOLERANCES) -> None:
    torch.testing.assert_close(actual.float(), expected.float(), **table[dtype])
