"""The native products' threads follow torch's: ``torch.set_num_threads`` (and
``OMP_NUM_THREADS``, which sets torch's at start) is the one knob for every op of a run, and a
tensor-parallel rank's share of the host's cores (``runners.parallel.distributed.set_threads``)
holds for its native products too."""

from __future__ import annotations

import torch

from interlock.kernels.native import _cpu


def follow_torch_threads() -> None:
    """Before native calls run: their products use torch's thread count from now on (at
    most the pool's ``_cpu.MAX_THREADS``)."""
    _cpu.threads(min(torch.get_num_threads(), _cpu.MAX_THREADS))
