"""Kernel dispatch: every op the model and sampler call, chosen once from ``kernels.REGISTRY``.

A runner builds one ``KernelTable`` at load time and hands it to the model;
model code calls ``ops.rms_norm(...)`` and never imports an implementation,
so the choice (and its reason) is made in one place and can be reported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import torch

from interlock.kernels import REGISTRY, KernelChoice


@dataclass(frozen=True)
class KernelTable:
    """The chosen implementation of each op, callable as ``table.<op>(...)``."""

    rms_norm: Callable
    fused_add_rms_norm: Callable
    silu_and_mul: Callable
    rotary_embedding: Callable
    store_kv_cache: Callable
    paged_attention: Callable
    paged_decode_attention: Callable
    moe_route: Callable
    moe_experts: Callable
    sample: Callable
    choices: tuple[KernelChoice, ...]

    def describe(self) -> dict[str, tuple[str, str]]:
        """op -> (implementation label, reason it was chosen)."""
        return {c.op: (c.label, c.reason) for c in self.choices}


OPS: tuple[str, ...] = tuple(f.name for f in fields(KernelTable) if f.name != "choices")


def build_kernel_table(
    platform: str,
    dtype: str,
    preference: Sequence[str] | None = None,
    force: str | None = None,
) -> KernelTable:
    """Select every op for (platform, dtype); a forced backend that cannot serve is an error."""
    choices = tuple(REGISTRY.select(op, platform, dtype, preference, force) for op in OPS)
    return KernelTable(**{c.op: c.fn for c in choices}, choices=choices)


def platform_of(device: torch.device) -> str:
    """The kernel platform of a torch device: cpu, cuda, rocm (HIP builds of torch) or xpu."""
    if device.type == "cuda":
        return "rocm" if torch.version.hip else "cuda"
    if device.type in ("cpu", "xpu"):
        return device.type
    raise ValueError(f"device {device} is not supported; allowed device types: cpu, cuda, xpu")
