"""Per-request sampling and stopping parameters."""

from __future__ import annotations

import math
from dataclasses import dataclass

from interlock.core.errors import InputError

#: Seeds live in int64 tensors on the device.
SEED_LIMIT = 2**63
#: Below this, logits / temperature overflow float32 (1e-45 is 0 there): sampling would
#: be garbage, not near-greedy, so such a temperature is refused.
MIN_TEMPERATURE = 1e-4


def _int(name: str, value: object, allowed: str) -> int:
    if type(value) is not int:  # bool and float (2.5, 2.0) are refused, not truncated
        raise InputError(f"{name}={value!r} is invalid; allowed: {allowed}")
    return value


def _real(name: str, value: object, allowed: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{name}={value!r} is invalid; allowed: {allowed}")
    return float(value)


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
        if _int("max_tokens", self.max_tokens, "an integer >= 1") < 1:
            raise InputError(f"max_tokens={self.max_tokens} is invalid; allowed: an integer >= 1")
        allowed = f"a finite number >= 0 (0 = greedy; otherwise >= {MIN_TEMPERATURE})"
        temperature = _real("temperature", self.temperature, allowed)
        if temperature < 0 or 0 < temperature < MIN_TEMPERATURE:
            raise InputError(f"temperature={self.temperature} is invalid; allowed: {allowed}")
        if _int("top_k", self.top_k, "an integer >= 0 (0 = off)") < 0:
            raise InputError(f"top_k={self.top_k} is invalid; allowed: >= 0 (0 = off)")
        allowed = "a number with 0 < top_p <= 1 (1 = off)"
        if not 0 < _real("top_p", self.top_p, allowed) <= 1:
            raise InputError(f"top_p={self.top_p} is invalid; allowed: {allowed}")
        allowed = "an integer in [0, 2**63) or None"
        if self.seed is not None and not 0 <= _int("seed", self.seed, allowed) < SEED_LIMIT:
            raise InputError(f"seed={self.seed} is out of range; allowed: {allowed}")
        if type(self.ignore_eos) is not bool:
            raise InputError(f"ignore_eos={self.ignore_eos!r} is invalid; allowed: True, False")
        stops = self.stop_token_ids
        if not isinstance(stops, (tuple, list)):
            raise InputError(f"stop_token_ids={stops!r} is invalid; allowed: a list of token ids")
        for t in stops:
            if _int("stop_token_ids item", t, "an integer >= 0") < 0:
                raise InputError(f"stop_token_ids item {t} is invalid; allowed: an integer >= 0")
        object.__setattr__(self, "stop_token_ids", tuple(stops))
