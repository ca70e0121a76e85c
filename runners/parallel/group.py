"""The tensor-parallel group a process belongs to, and the two collectives the model uses.

The model code calls ``tp.all_reduce`` (after attention and after the MLP, and once for
the vocabulary-parallel embedding) and ``tp.all_gather`` (the LM head's logits). On one
rank both are the identity and torch.distributed is never touched. On GPUs they are
``torch.distributed`` (NCCL) calls, so CUDA graphs capture them like any other op. On the
CPU, ranks of one host sum float32 tensors in a shared segment (``shm``); anything else
goes through gloo. The debug graph backend replays either eagerly; a native tape records
them as Python calls between its runs of native kernels (``record_with``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from interlock.runners.parallel.shm import SharedMemoryCollectives


@dataclass
class CollectiveTimes:
    """Wall time spent inside collectives (host-synchronous backends only: gloo)."""

    seconds: float = 0.0
    calls: int = 0


@dataclass(eq=False)
class TensorParallel:
    """Rank ``rank`` of ``size``; ``group`` is the torch.distributed group (None on one rank)."""

    rank: int = 0
    size: int = 1
    group: dist.ProcessGroup | None = None
    #: Set to a CollectiveTimes to time every collective (adds a clock read per call).
    times: CollectiveTimes | None = field(default=None)
    #: The shared-memory collectives of a one-host CPU group (float32 tensors), or None.
    shm: SharedMemoryCollectives | None = None
    #: What carries the collectives, and why (the run report shows it).
    collectives: str = "none (one rank)"
    _reduce: Callable[[TensorParallel, torch.Tensor], None] = field(init=False, repr=False)
    _gather: Callable[[TensorParallel, torch.Tensor], torch.Tensor] = field(init=False,
                                                                            repr=False)

    def __post_init__(self) -> None:
        self.record_with(lambda fn: fn)

    def record_with(self, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        """Call the collectives through ``wrap``: a runner passes its kernel table's
        ``foreign``, so that a native tape records each collective as a Python call and a
        tensor-parallel forward replays like any other. The functions are wrapped
        unbound: a bound method kept on the group would make a reference cycle, and the
        group (its sockets, its process groups) would outlive its run until the cyclic
        garbage collector ran."""
        self._reduce = wrap(TensorParallel._all_reduce)
        self._gather = wrap(TensorParallel._all_gather)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place."""
        if self.size > 1:
            self._reduce(self, x)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """[N, S] per rank -> [N, size * S], rank order along the last dim."""
        if self.size == 1:
            return x
        return self._gather(self, x)

    def _all_reduce(self, x: torch.Tensor) -> None:
        start = time.perf_counter() if self.times is not None else 0.0
        if self.shm is not None and x.dtype == torch.float32 and x.device.type == "cpu":
            if x.is_contiguous():
                self.shm.all_reduce(x)
            else:
                whole = x.contiguous()
                self.shm.all_reduce(whole)
                x.copy_(whole)
        else:
            dist.all_reduce(x, group=self.group)
        self._count(start)

    def _all_gather(self, x: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter() if self.times is not None else 0.0
        rows, cols = x.shape
        if self.shm is not None and x.dtype == torch.float32 and x.device.type == "cpu":
            out = self.shm.all_gather(x.contiguous())
        else:
            out = torch.empty(self.size * rows, cols, dtype=x.dtype, device=x.device)
            dist.all_gather_single(out, x.contiguous(), group=self.group)
        self._count(start)
        return out.view(self.size, rows, cols).permute(1, 0, 2).reshape(rows, self.size * cols)

    def _count(self, start: float) -> None:
        if self.times is not None:
            self.times.seconds += time.perf_counter() - start
            self.times.calls += 1


SINGLE = TensorParallel()
_current: TensorParallel = SINGLE


def current() -> TensorParallel:
    """The group this process was started in (``SINGLE`` outside a tensor-parallel run)."""
    return _current


def set_current(tp: TensorParallel) -> None:
    """Called once by the process that joins a group, before its runner loads."""
    global _current
    _current = tp
