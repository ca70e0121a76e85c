"""What a runner's graphs did: captured keys, failed captures, replays and eager steps.

Torch-free and JSON-ready, for ``RunnerReport.graphs`` and ``policy run``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CapturedGraph:
    key: str  # GraphKey.label
    strategy: str
    batch: str  # decode | mixed | any
    tokens: int
    seqs: int
    segments: int
    breaks: int


@dataclass(frozen=True)
class GraphReport:
    backend: str  # cuda | native | debug | none (nothing to capture)
    mode: str
    breakable: bool
    sizes: dict[str, tuple[int, ...]]  # each ladder of the runner's plan
    dropped_sizes: tuple[int, ...] = ()  # asked for, but larger than any batch can be
    captured: tuple[CapturedGraph, ...] = ()
    failed: dict[str, str] = field(default_factory=dict)  # key -> why its capture failed
    # Where piecewise and breakable programs run eagerly, per layer in order (what each
    # split point computes); empty when no program breaks.
    break_points: tuple[str, ...] = ()
    capture_s: float = 0.0
    # Where the captured programs' activations live (native: one shared buffer), or "".
    buffers: str = ""
    replays: dict[str, int] = field(default_factory=dict)  # key -> steps it served
    eager_steps: dict[str, int] = field(default_factory=dict)  # reason -> steps

    @property
    def captured_sizes(self) -> tuple[int, ...]:
        return tuple(sorted({g.tokens for g in self.captured}))

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "mode": self.mode,
            "breakable": self.breakable,
            "sizes": {name: list(sizes) for name, sizes in self.sizes.items()},
            "dropped_sizes": list(self.dropped_sizes),
            "captured_sizes": list(self.captured_sizes),
            "captured": [vars(g) for g in self.captured],
            "failed": dict(self.failed),
            "break_points": list(self.break_points),
            "capture_s": round(self.capture_s, 4),
            "buffers": self.buffers,
            "replays": dict(self.replays),
            "eager_steps": dict(self.eager_steps),
        }
