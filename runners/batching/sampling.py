"""Per-request sampling and stopping parameters, as vLLM's ``SamplingParams`` names them.

The fields interlock implements keep vLLM's names, defaults and meaning (``temperature``
defaults to 1.0: pass ``temperature=0`` for greedy). Every other vLLM field is refused by
name unless it is given at vLLM's default value, which asks for nothing interlock does not
do; a keyword vLLM does not know either is refused as unknown.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from interlock.core.errors import InputError

#: Seeds live in int64 tensors on the device.
SEED_LIMIT = 2**63
#: Below this, logits / temperature overflow float32 (1e-45 is 0 there): sampling would
#: be garbage, not near-greedy, so such a temperature is refused.
MIN_TEMPERATURE = 1e-4
#: vLLM's bound on presence_penalty and frequency_penalty (either sign).
PENALTY_LIMIT = 2.0

#: vLLM ``SamplingParams`` fields interlock does not implement, with vLLM's default: that
#: value is accepted (it changes nothing), any other is refused by name.
UNSUPPORTED_VLLM_FIELDS: dict[str, object] = {
    "best_of": None,
    "use_beam_search": False,
    "length_penalty": 1.0,
    "early_stopping": False,
    "min_tokens": 0,
    "prompt_logprobs": None,
    "detokenize": True,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "logits_processors": None,
    "truncate_prompt_tokens": None,
    "guided_decoding": None,
    "structured_outputs": None,
    "logit_bias": None,
    "allowed_token_ids": None,
    "bad_words": None,
    "extra_args": None,
    "output_kind": None,
    "flat_logprobs": False,
}


def _int(name: str, value: object, allowed: str) -> int:
    if type(value) is not int:  # bool and float (2.5, 2.0) are refused, not truncated
        raise InputError(f"{name}={value!r} is invalid; allowed: {allowed}")
    return value


def _real(name: str, value: object, allowed: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{name}={value!r} is invalid; allowed: {allowed}")
    return float(value)


def _bool(name: str, value: object) -> bool:
    if type(value) is not bool:
        raise InputError(f"{name}={value!r} is invalid; allowed: True, False")
    return value


def _refuse_others(others: dict[str, object]) -> None:
    for name, value in others.items():
        if name not in UNSUPPORTED_VLLM_FIELDS:
            raise InputError(
                f"SamplingParams has no field {name!r} (neither interlock nor vLLM knows it); "
                f"interlock supports: {', '.join(SUPPORTED_FIELDS)}"
            )
        default = UNSUPPORTED_VLLM_FIELDS[name]
        if value is not default and value != default:
            raise InputError(
                f"SamplingParams({name}={value!r}): interlock does not support vLLM's "
                f"{name!r} (only its default, {default!r}); interlock supports: "
                f"{', '.join(SUPPORTED_FIELDS)}"
            )


@dataclass(frozen=True, init=False)
class SamplingParams:
    """How one request samples and when it stops; vLLM's fields, defaults and meaning.

    ``n`` completions per prompt (independent samples; with a ``seed``, completion ``i``
    uses ``seed + i``). ``temperature`` 1.0 by default, 0 is greedy. ``top_k`` 0 or -1
    and ``top_p`` 1.0 and ``min_p`` 0.0 are off; ``min_p`` drops tokens whose probability
    is below ``min_p`` times the most likely one's. ``repetition_penalty`` (1.0 off)
    divides the positive logits and multiplies the negative ones of every token of the
    prompt and the output so far; ``frequency_penalty`` subtracts itself times a token's
    count in the output, ``presence_penalty`` itself once for a token the output has
    (both 0.0 off, in [-2, 2]). Penalties apply to greedy requests too. ``seed`` makes
    sampling reproducible per request (None: the step loop draws one from its own seeded
    generator). ``logprobs=N`` returns, per generated token, the ``N`` most likely
    tokens' log-probabilities and the sampled one's, of the model's raw distribution.

    A request stops after ``max_tokens`` tokens (None: as many as ``max_model_len``
    leaves), at an EOS token unless ``ignore_eos``, at any of ``stop_token_ids``, or
    when its text contains one of ``stop`` (text is cut before it unless
    ``include_stop_str_in_output``).
    """

    n: int
    max_tokens: int | None
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    seed: int | None
    stop: tuple[str, ...]
    stop_token_ids: tuple[int, ...]
    include_stop_str_in_output: bool
    ignore_eos: bool
    logprobs: int | None

    def __init__(
        self,
        n: int = 1,
        max_tokens: int | None = 16,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repetition_penalty: float = 1.0,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        stop_token_ids: Sequence[int] | None = None,
        include_stop_str_in_output: bool = False,
        ignore_eos: bool = False,
        logprobs: int | None = None,
        **others: object,
    ) -> None:
        _refuse_others(others)
        values = dict(locals())
        del values["self"], values["others"]
        for name, value in values.items():
            object.__setattr__(self, name, value)
        self._check()

    def _check(self) -> None:
        if _int("n", self.n, "an integer >= 1") < 1:
            raise InputError(f"n={self.n} is invalid; allowed: an integer >= 1")
        allowed = "an integer >= 1 or None (as many as max_model_len leaves)"
        if self.max_tokens is not None and _int("max_tokens", self.max_tokens, allowed) < 1:
            raise InputError(f"max_tokens={self.max_tokens} is invalid; allowed: {allowed}")
        allowed = f"a finite number >= 0 (0 = greedy; otherwise >= {MIN_TEMPERATURE})"
        temperature = _real("temperature", self.temperature, allowed)
        if temperature < 0 or 0 < temperature < MIN_TEMPERATURE:
            raise InputError(f"temperature={self.temperature} is invalid; allowed: {allowed}")
        allowed = "an integer >= 1, or 0 or -1 (off)"
        top_k = _int("top_k", self.top_k, allowed)
        if top_k < -1:
            raise InputError(f"top_k={self.top_k} is invalid; allowed: {allowed}")
        object.__setattr__(self, "top_k", max(top_k, 0))  # -1 is vLLM's other spelling of off
        allowed = "a number with 0 < top_p <= 1 (1 = off)"
        if not 0 < _real("top_p", self.top_p, allowed) <= 1:
            raise InputError(f"top_p={self.top_p} is invalid; allowed: {allowed}")
        allowed = "a number in [0, 1] (0 = off)"
        if not 0 <= _real("min_p", self.min_p, allowed) <= 1:
            raise InputError(f"min_p={self.min_p} is invalid; allowed: {allowed}")
        for name in ("presence_penalty", "frequency_penalty"):
            allowed = f"a number in [-{PENALTY_LIMIT:g}, {PENALTY_LIMIT:g}] (0 = off)"
            value = _real(name, getattr(self, name), allowed)
            if not -PENALTY_LIMIT <= value <= PENALTY_LIMIT:
                raise InputError(f"{name}={value} is invalid; allowed: {allowed}")
        allowed = "a number > 0 (1 = off; above 1 discourages repeats)"
        if not _real("repetition_penalty", self.repetition_penalty, allowed) > 0:
            raise InputError(
                f"repetition_penalty={self.repetition_penalty} is invalid; allowed: {allowed}"
            )
        allowed = "an integer in [0, 2**63) or None"
        if self.seed is not None and not 0 <= _int("seed", self.seed, allowed) < SEED_LIMIT:
            raise InputError(f"seed={self.seed} is out of range; allowed: {allowed}")
        allowed = "an integer >= 0 or None"
        if self.logprobs is not None and _int("logprobs", self.logprobs, allowed) < 0:
            raise InputError(f"logprobs={self.logprobs} is invalid; allowed: {allowed}")
        _bool("ignore_eos", self.ignore_eos)
        _bool("include_stop_str_in_output", self.include_stop_str_in_output)
        object.__setattr__(self, "stop", _stop_strings(self.stop))
        stops = self.stop_token_ids
        if stops is None:
            stops = ()
        if not isinstance(stops, (tuple, list)):
            raise InputError(f"stop_token_ids={stops!r} is invalid; allowed: a list of token ids")
        for t in stops:
            if _int("stop_token_ids item", t, "an integer >= 0") < 0:
                raise InputError(f"stop_token_ids item {t} is invalid; allowed: an integer >= 0")
        object.__setattr__(self, "stop_token_ids", tuple(stops))

    @property
    def penalised(self) -> bool:
        """Whether any penalty changes the logits."""
        return (self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1)


#: The fields interlock implements (every keyword of SamplingParams).
SUPPORTED_FIELDS = tuple(SamplingParams.__dataclass_fields__)


def _stop_strings(stop: object) -> tuple[str, ...]:
    allowed = "a string, a list of non-empty strings, or None"
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise InputError(f"stop={stop!r} is invalid; allowed: {allowed}")
    return tuple(stop)
