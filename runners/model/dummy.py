"""Seeded random weights for a model layout (``load_format="dummy"`` and the demo model).

Each tensor is drawn from its own generator seeded by (seed, tensor name), so
a tensor's values do not depend on load order or on which other tensors exist.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

import torch

from interlock.runners.model.sharding import Shard


class DummyTensors:
    """A tensor source: normal(0, std) matrices, ones for norm weights, zeros for biases
    (float32, on the CPU)."""

    def __init__(self, shapes: Mapping[str, tuple[int, ...]], seed: int, std: float) -> None:
        self.shapes = dict(shapes)
        self.seed = seed
        self.std = std
        self.origin = f"dummy weights (seed {seed})"

    def names(self) -> set[str]:
        return set(self.shapes)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.shapes[name]

    def get(self, name: str, shard: Shard | None = None) -> torch.Tensor:
        """The whole tensor drawn, then only the shard's rows kept: every rank of a
        tensor-parallel run sees the same values as one rank."""
        whole = self._whole(name)
        if shard is None:
            return whole
        return whole.narrow(shard.dim, shard.start, min(shard.stop, shard.full) - shard.start)

    def copy_into(self, name: str, out: torch.Tensor) -> None:
        out.copy_(self._whole(name))

    def _whole(self, name: str) -> torch.Tensor:
        shape = self.shapes[name]
        if name.endswith("norm.weight"):
            return torch.ones(shape, dtype=torch.float32)
        if name.endswith(".bias"):
            return torch.zeros(shape, dtype=torch.float32)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + zlib.crc32(name.encode()))
        return torch.empty(shape, dtype=torch.float32).normal_(0.0, self.std, generator=generator)
