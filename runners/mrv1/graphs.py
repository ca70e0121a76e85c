"""mrv1's capture plan: one ladder of token counts serves every batch.

A batch of T tokens and B <= T sequences pads both to S, the smallest capture
size >= T (so a padded decode batch keeps one token per sequence). Full
graphs, which contain attention, are keyed by batch kind as well; piecewise
and breakable graphs serve decode and mixed batches alike. Captured largest
first; at each size the decode graph, then the mixed one.
"""

from __future__ import annotations

from interlock.runners.graphs.modes import Strategy
from interlock.runners.graphs.plan import BATCH_KINDS, CapturePlan, GraphKey, Route
from interlock.runners.graphs.sizes import CaptureSizes


class MRV1Plan(CapturePlan):
    def __init__(self, mode: str, breakable: bool, sizes: CaptureSizes) -> None:
        super().__init__(mode, breakable)
        self.ladder = sizes

    def route(self, num_tokens: int, num_seqs: int, decode_only: bool) -> Route:
        strategy = self.strategy(decode_only)
        if strategy is Strategy.EAGER:
            return self.eager()
        size = self.ladder.pad(num_tokens)
        if size is None:
            if not self.ladder.sizes:
                return Route(None, "no capture size")
            return Route(
                None,
                f"batch of {num_tokens} tokens above the largest capture size "
                f"{self.ladder.largest}",
            )
        kind = ("decode" if decode_only else "mixed") if strategy is Strategy.FULL else "any"
        return Route(GraphKey(strategy, size, size, kind))

    def capture_order(self) -> list[GraphKey]:
        keys = self.keys_from((s, s, d) for s in self.ladder.sizes for d in (True, False))
        return sorted(keys, key=lambda k: (-k.tokens, BATCH_KINDS.index(k.batch)))

    def sizes(self) -> dict[str, CaptureSizes]:
        return {"tokens": self.ladder}
