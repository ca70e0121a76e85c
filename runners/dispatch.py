"""Kernel dispatch: every op the model and sampler call, chosen once from ``kernels.REGISTRY``.

A runner builds one ``KernelTable`` at load time and hands it to the model;
model code calls ``ops.rms_norm(...)`` and never imports an implementation,
so the choice (and its reason) is made in one place and can be reported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from interlock.core.platform import platform_of_device
from interlock.kernels import MODEL_OPS, REGISTRY, KernelChoice
from interlock.kernels.native import BACKEND as NATIVE
from interlock.kernels.native import KERNELS as NATIVE_KERNELS
from interlock.kernels.native import unavailable as native_unavailable
from interlock.kernels.registry import REFERENCE_BACKEND


@dataclass(frozen=True)
class KernelTable:
    """The chosen implementation of each model op, callable as ``table.<op>(...)``.

    The ops are those ``kernels.reference`` defines (``kernels.MODEL_OPS``), so a new op
    needs no edit here.
    """

    choices: tuple[KernelChoice, ...]
    # Wrap the ops of other backends so that a native tape records them as Python calls
    # (``interlock.kernels.native.tape.foreign``): set for CPU tables where native is built.
    taped: bool = False
    _fns: dict[str, Callable[..., Any]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_fns", {
            c.op: c.fn if c.impl.backend == NATIVE else self.foreign(c.fn) for c in self.choices
        })

    def foreign(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, code outside the native kernels (another backend's op, a collective), as
        the forward calls it: recorded as a Python call by a native tape when this table
        can be taped, called as it is otherwise."""
        if not self.taped:
            return fn
        from interlock.kernels.native.tape import foreign

        return foreign(fn)

    def __getattr__(self, op: str) -> Callable[..., Any]:
        # Only called for names that are not attributes: the ops.
        try:
            return self.__dict__["_fns"][op]
        except KeyError:
            raise AttributeError(
                f"no kernel op {op!r}; ops: {', '.join(self.__dict__.get('_fns', {}))}"
            ) from None

    def choice(self, op: str) -> KernelChoice:
        """The implementation chosen for ``op``, with its reason."""
        return next(c for c in self.choices if c.op == op)

    @property
    def packs_weights(self) -> bool:
        """Whether the chosen ``linear`` wants its weights packed by ``pack_weight``."""
        return self.choice("linear").impl.packed_weights

    @property
    def packed_embedding(self) -> bool:
        """Whether the chosen ``embedding`` takes a table packed by ``pack_weight`` (the
        reference takes any layout)."""
        impl = self.choice("embedding").impl
        return impl.packed_weights or impl.backend == REFERENCE_BACKEND

    def all_native(self) -> bool:
        """Whether every op the native CPU kernels implement was chosen native (what the
        native graph backend can tape)."""
        return all(c.impl.backend == NATIVE for c in self.choices if c.op in NATIVE_KERNELS)

    def describe(self) -> dict[str, tuple[str, str]]:
        """op -> (implementation label, reason it was chosen)."""
        return {c.op: (c.label, c.reason) for c in self.choices}


def build_kernel_table(
    platform: str,
    dtype: str,
    preference: Sequence[str] | None = None,
    force: str | None = None,
    compiled: bool = False,
) -> KernelTable:
    """Select every model op for (platform, dtype), for a forward torch.compile traces if
    ``compiled``; a forced backend that cannot serve an op it implements is an error."""
    choices = tuple(
        REGISTRY.select(op, platform, dtype, preference, force, compiled) for op in MODEL_OPS
    )
    return KernelTable(choices, taped=platform == "cpu" and native_unavailable(platform) is None)


def platform_of(device: torch.device) -> str:
    """The kernel platform of a torch device: cpu, cuda, rocm (HIP builds of torch) or xpu."""
    return platform_of_device(device.type, hip=bool(torch.version.hip))
