"""Captured programs: graph segments and the eager attention breaks between them.

A program is what one graph key replays: a sequence of steps, each either a
graph segment (replayed from the backend) or an :class:`AttentionBreak` (run
eagerly). A ``full`` program is one segment; piecewise and breakable programs
alternate segments and breaks. Every tensor that crosses a step boundary is
static: a segment writes the ``q`` its break reads, the break writes the
``out`` the next segment reads, so replay moves data exactly as capture did.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from interlock.runners.model.attention import AttentionLayer, AttentionMetadata

Outputs = tuple[torch.Tensor, ...]
SegmentFn = Callable[[], Outputs]


class Segment(Protocol):
    """One captured graph (or its debug stand-in)."""

    def replay(self) -> None: ...


@dataclass(eq=False)
class AttentionBreak:
    """Eager attention between two segments: ``out <- layer.attend(q)``.

    The KV-cache store of this step happened in the segment before (it is part
    of the layer's forward ahead of the split point), so only the read of the
    paged cache runs outside the graph.
    """

    layer: AttentionLayer
    q: torch.Tensor
    out: torch.Tensor

    def run(self, metadata: AttentionMetadata) -> torch.Tensor:
        self.out.copy_(self.layer.attend(self.q, metadata))
        return self.out


class Program(Protocol):
    """A captured forward for one graph key."""

    # Read-only: the programs derive their counts from what they captured.
    @property
    def outputs(self) -> Outputs: ...

    @property
    def segments(self) -> int:
        """Graph segments."""
        ...

    @property
    def breaks(self) -> int:
        """Eager attention breaks between the segments."""
        ...

    def replay(self, metadata: AttentionMetadata) -> Outputs:
        """Run the program; breaks use ``metadata`` (same buffers, this step's batch kind)."""
        ...


@dataclass(eq=False)
class SegmentedProgram:
    """Segments and breaks replayed in capture order."""

    steps: Sequence[Segment | AttentionBreak]
    outputs: Outputs

    @property
    def segments(self) -> int:
        return sum(not isinstance(s, AttentionBreak) for s in self.steps)

    @property
    def breaks(self) -> int:
        return sum(isinstance(s, AttentionBreak) for s in self.steps)

    def replay(self, metadata: AttentionMetadata) -> Outputs:
        for step in self.steps:
            if isinstance(step, AttentionBreak):
                step.run(metadata)
            else:
                step.replay()
        return self.outputs


def as_outputs(value: torch.Tensor | Outputs) -> Outputs:
    return (value,) if isinstance(value, torch.Tensor) else tuple(value)
