"""Model ops: torch references, Triton kernels, and the registry that picks between them."""

from __future__ import annotations

from interlock.kernels import reference as _reference  # noqa: F401  (registers the torch ops)
from interlock.kernels import triton as _triton  # noqa: F401  (registers the Triton ops, lazily)
from interlock.kernels.registry import (
    REGISTRY,
    KernelChoice,
    KernelError,
    KernelImpl,
    KernelRegistry,
)

__all__ = ["REGISTRY", "KernelChoice", "KernelError", "KernelImpl", "KernelRegistry"]
