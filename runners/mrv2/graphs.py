"""mrv2's capture plan: decode graphs keyed by request count, mixed graphs by token count.

A pure-decode batch (one token per request) pads its B requests to the
smallest decode size >= B, on a ladder capped at ``max_num_seqs``. A mixed
batch pads its T tokens to the smallest mixed size >= T, on a ladder capped at
``max_num_batched_tokens``, and its requests to min(that size,
``max_num_seqs``), since a step never holds more requests than that. Decode
graphs, the steady state of generation, are captured first; each ladder
largest first.
"""

from __future__ import annotations

from interlock.runners.graphs.modes import Strategy
from interlock.runners.graphs.plan import CapturePlan, GraphKey, Route
from interlock.runners.graphs.sizes import CaptureSizes


class MRV2Plan(CapturePlan):
    def __init__(
        self,
        mode: str,
        breakable: bool,
        sizes: CaptureSizes,
        max_num_seqs: int,
        max_num_batched_tokens: int,
    ) -> None:
        super().__init__(mode, breakable)
        self.max_num_seqs = max_num_seqs
        self.decode = sizes.up_to(max_num_seqs)
        self.mixed = sizes.up_to(max_num_batched_tokens)

    def route(self, num_tokens: int, num_seqs: int, decode_only: bool) -> Route:
        strategy = self.strategy(decode_only)
        if strategy is Strategy.EAGER:
            return self.eager()
        full = strategy is Strategy.FULL
        if decode_only:
            size = self.decode.pad(num_seqs)
            if size is None:
                return Route(None, _above("decode", num_seqs, "requests", self.decode))
            return Route(GraphKey(strategy, size, size, "decode" if full else "any"))
        size = self.mixed.pad(num_tokens)
        if size is None:
            return Route(None, _above("mixed", num_tokens, "tokens", self.mixed))
        seqs = min(size, self.max_num_seqs)
        return Route(GraphKey(strategy, size, seqs, "mixed" if full else "any"))

    def capture_order(self) -> list[GraphKey]:
        decode = self.keys_from((s, s, True) for s in self.decode.sizes)
        mixed = self.keys_from((s, 1, False) for s in self.mixed.sizes) - decode
        by_size = lambda k: -k.tokens  # noqa: E731
        return sorted(decode, key=by_size) + sorted(mixed, key=by_size)

    def sizes(self) -> dict[str, CaptureSizes]:
        return {"decode_requests": self.decode, "mixed_tokens": self.mixed}


def _above(kind: str, count: int, unit: str, ladder: CaptureSizes) -> str:
    if not ladder.sizes:
        return f"no {kind} capture size"
    return f"{kind} batch of {count} {unit} above the largest capture size {ladder.largest}"
