"""Model ops: torch references, Triton kernels, and the registry that picks between them."""

from __future__ import annotations

from kernels import reference as _reference  # noqa: F401  (registers the torch ops)
from kernels import triton as _triton  # noqa: F401  (registers the Triton ops, lazily)
from kernels.registry import REGISTRY, KernelChoice, KernelError, KernelImpl, KernelRegistry

__all__ = ["REGISTRY", "KernelChoice", "KernelError", "KernelImpl", "KernelRegistry"]
