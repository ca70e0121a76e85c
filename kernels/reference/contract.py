"""What adds an op: its torch reference, registered by ``torch_op``; the reference's
parameters are the op's signature, which every other backend's implementation takes."""

from __future__ import annotations

from collections.abc import Callable

from interlock.kernels.registry import REGISTRY, Kernel

#: The ops of the model contract, in definition order: what a runner's kernel table holds.
#: Defining a reference is what adds an op; other backends may then implement it.
MODEL_OPS: list[str] = []


def torch_op(op: str) -> Callable[[Kernel], Kernel]:
    """Register ``fn`` as the reference of ``op`` (backend torch, every platform and dtype)."""

    def wrap(fn: Kernel) -> Kernel:
        REGISTRY.implement(op, "torch")(fn)
        MODEL_OPS.append(op)
        return fn

    return wrap
