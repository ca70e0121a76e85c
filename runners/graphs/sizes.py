"""Capture sizes: which padded batch sizes get a graph, and how a batch is padded to one."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

#: Sizes below the first step; above it, every multiple of ``AUTO_STEP``.
AUTO_SMALL = (1, 2, 4, 8)
AUTO_STEP = 8


def auto_capture_sizes(max_size: int) -> tuple[int, ...]:
    """1, 2, 4, 8, then every multiple of 8 up to ``max_size``, and ``max_size`` itself."""
    if max_size < 1:
        raise ValueError(f"max_size={max_size} is invalid; allowed: an integer >= 1")
    sizes = {s for s in AUTO_SMALL if s <= max_size}
    sizes.update(range(AUTO_STEP * 2, max_size + 1, AUTO_STEP))
    sizes.add(max_size)
    return tuple(sorted(sizes))


@dataclass(frozen=True)
class CaptureSizes:
    """Ascending capture sizes; ``dropped`` were asked for but exceed what a batch can reach."""

    sizes: tuple[int, ...]
    dropped: tuple[int, ...] = ()

    @classmethod
    def choose(
        cls, requested: Iterable[int] | None, limit: int, auto_max: int | None = None
    ) -> CaptureSizes:
        """The decision's sizes that a batch of at most ``limit`` can use, or automatic ones
        up to ``auto_max`` (default: ``limit``)."""
        if requested is None:
            return cls(auto_capture_sizes(min(limit, auto_max or limit)))
        wanted = sorted(set(requested))
        bad = [s for s in wanted if not isinstance(s, int) or s < 1]
        if bad:
            raise ValueError(f"capture sizes {bad} are invalid; allowed: positive integers")
        return cls(
            tuple(s for s in wanted if s <= limit), tuple(s for s in wanted if s > limit)
        )

    @property
    def largest(self) -> int:
        return self.sizes[-1] if self.sizes else 0

    def pad(self, n: int) -> int | None:
        """The smallest size that holds ``n``, or None above the largest."""
        i = bisect.bisect_left(self.sizes, n)
        return self.sizes[i] if i < len(self.sizes) else None

    def up_to(self, limit: int) -> CaptureSizes:
        return CaptureSizes(
            tuple(s for s in self.sizes if s <= limit),
            self.dropped + tuple(s for s in self.sizes if s > limit),
        )
