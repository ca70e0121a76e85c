"""Graph keys and the capture-plan interface each runner implements its own way.

A plan answers two questions: which keys to capture, in which order; and
which key (or eager, and why) serves a batch of T tokens and B sequences.
Keys are derived from ``route`` itself, so capture and dispatch cannot
disagree. Plans are torch-free.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass

from interlock.runners.graphs.modes import Strategy, eager_reason, strategy_for
from interlock.runners.graphs.sizes import CaptureSizes

#: Which batches a key serves: pure decode, mixed, or both (attention eager between segments).
BATCH_KINDS = ("decode", "mixed", "any")


@dataclass(frozen=True)
class GraphKey:
    strategy: Strategy
    tokens: int  # padded token count
    seqs: int  # padded sequence count
    batch: str  # one of BATCH_KINDS

    @property
    def capture_decode_only(self) -> bool:
        """The batch kind the key is captured with (a full graph bakes it in)."""
        return self.batch == "decode" or (self.batch == "any" and self.tokens == self.seqs)

    @property
    def label(self) -> str:
        return f"{self.strategy.value}/{self.batch}/{self.tokens}t{self.seqs}s"


@dataclass(frozen=True)
class Route:
    """The key that serves a batch, or None with the reason it runs eagerly."""

    key: GraphKey | None
    reason: str = ""


class CapturePlan(ABC):
    """Which graphs a runner captures and how a batch is dispatched to one."""

    def __init__(self, mode: str, breakable: bool) -> None:
        self.mode = mode
        self.breakable = breakable

    def strategy(self, decode_only: bool) -> Strategy:
        return strategy_for(self.mode, self.breakable, decode_only)

    def eager(self) -> Route:
        return Route(None, eager_reason(self.mode, self.breakable))

    @abstractmethod
    def route(self, num_tokens: int, num_seqs: int, decode_only: bool) -> Route:
        """The key for a batch, padded up; None above the largest size or when the mode is eager."""

    @abstractmethod
    def capture_order(self) -> list[GraphKey]:
        """Every key ``route`` can return, in the order to capture them (largest first)."""

    @abstractmethod
    def sizes(self) -> dict[str, CaptureSizes]:
        """The size ladders, by what they count (for reports)."""

    def keys_from(self, probes: Iterable[tuple[int, int, bool]]) -> set[GraphKey]:
        """The keys ``route`` returns for (tokens, seqs, decode_only) probes."""
        return {k for k in (self.route(*probe).key for probe in probes) if k is not None}
