"""Per-request sampling and stopping parameters."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples and when it stops.

    ``temperature=0`` (the default) is greedy. ``top_k=0`` and ``top_p=1.0``
    disable those filters. ``seed`` makes sampling reproducible per request
    (None: the engine draws one from its own seeded generator). A request stops
    after ``max_tokens`` tokens, or at an EOS token unless ``ignore_eos``, or
    at any of ``stop_token_ids``.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens} is invalid; allowed: an integer >= 1")
        if self.temperature < 0:
            raise ValueError(
                f"temperature={self.temperature} is invalid; allowed: >= 0 (0 = greedy)"
            )
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} is invalid; allowed: >= 0 (0 = off)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} is invalid; allowed: 0 < top_p <= 1 (1 = off)")
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"seed={self.seed} is invalid; allowed: an integer >= 0 or None")
