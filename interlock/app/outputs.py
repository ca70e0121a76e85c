"""What ``LLM.generate`` takes and returns: prompts, per-prompt outputs, and the Ctrl-C
that carries the partial outputs."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from interlock.app.timing import RequestTimes
from interlock.core.errors import InputError

Prompt = str | Sequence[int]
Message = Mapping[str, str]  # {"role": ..., "content": ...}
#: Called during generation with (prompt index, every token generated for it so far,
#: its finish reason: None until it has finished).
OnTokens = Callable[[int, tuple[int, ...], str | None], None]


@dataclass(frozen=True)
class Logprob:
    """vLLM's: a token's log-probability, its rank (1 = most likely), its text."""

    logprob: float
    rank: int
    decoded_token: str | None  # None without a tokenizer


@dataclass(frozen=True)
class CompletionOutput:
    """One completion of a prompt, as vLLM's ``CompletionOutput``."""

    index: int  # which of the prompt's ``n`` completions
    text: str | None  # None without a tokenizer
    token_ids: tuple[int, ...]
    #: The sum of the sampled tokens' logprobs; None unless ``logprobs`` was asked for.
    cumulative_logprob: float | None
    #: Per generated token: the sampled and the ``logprobs`` most likely tokens; None
    #: unless asked for.
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str  # "length" | "stop" | "aborted"
    stop_reason: int | str | None  # the stop token id or stop string; None: EOS or length

    def finished(self) -> bool:
        return self.finish_reason != "aborted"


@dataclass(frozen=True)
class RequestOutput:
    """One prompt's result, as vLLM's ``RequestOutput``: ``outputs`` holds its ``n``
    completions. ``token_ids``, ``text`` and ``finish_reason`` (of the first completion),
    ``ttft_s`` and ``tpot_s`` are interlock's own shorthands."""

    request_id: str
    prompt: str | None  # the prompt's text; None for a prompt given as token ids
    prompt_token_ids: tuple[int, ...]
    outputs: list[CompletionOutput]
    finished: bool
    ttft_s: float  # arrival to first token (of the first completion)
    tpot_s: float  # mean time per output token after the first (0 for one token)
    #: The first completion's clock readings, what ``ttft_s`` and ``tpot_s`` are computed
    #: from (:mod:`interlock.app.timing`); None when it produced no token.
    times: RequestTimes | None = None

    @property
    def token_ids(self) -> tuple[int, ...]:
        return self.outputs[0].token_ids

    @property
    def text(self) -> str | None:
        return self.outputs[0].text

    @property
    def finish_reason(self) -> str:
        return self.outputs[0].finish_reason


@dataclass(frozen=True)
class CompletionDelta:
    """What one completion gained in a step of ``LLM.stream``, as vLLM's
    ``CompletionOutput`` under ``RequestOutputKind.DELTA``: only the new text, token ids
    and logprobs. Joined, a completion's deltas are ``generate``'s ``CompletionOutput``."""

    index: int  # which of the prompt's ``n`` completions
    text: str | None  # the new text; None without a tokenizer
    token_ids: tuple[int, ...]  # the new tokens
    logprobs: list[dict[int, Logprob]] | None  # per new token; None unless asked for
    finish_reason: str | None  # None while the completion runs
    stop_reason: int | str | None


@dataclass(frozen=True)
class StreamOutput:
    """One prompt's progress in a step of ``LLM.stream``: a delta for each of its
    completions that advanced. ``finished``: every completion of the prompt has ended
    (its last ``StreamOutput``)."""

    prompt_index: int  # the prompt's position in the call
    request_id: str
    prompt: str | None  # the prompt's text; None for a prompt given as token ids
    prompt_token_ids: tuple[int, ...]
    outputs: list[CompletionDelta]
    finished: bool


class SentText:
    """What of one completion has been handed out already: its text and its number of
    tokens (``advance`` returns what is new)."""

    def __init__(self) -> None:
        self.text, self.tokens = "", 0

    def advance(self, text: str, num_tokens: int) -> tuple[str, range]:
        """The text and the token positions new since the last call, given the text that
        can be shown now (``LLM.settled_text``) and the number of tokens. Text that no
        longer extends what was sent (a tokenizer that rewrote earlier text) waits until
        it does."""
        delta = ""
        if text.startswith(self.text):
            delta, self.text = text[len(self.text):], text
        positions = range(self.tokens, num_tokens)
        self.tokens = num_tokens
        return delta, positions


class GenerationInterrupted(KeyboardInterrupt):
    """Ctrl-C during ``generate``: ``outputs`` holds what each prompt generated so far
    (unfinished ones with finish reason ``aborted``)."""

    def __init__(self, outputs: list[RequestOutput]) -> None:
        super().__init__()
        self.outputs = outputs


def as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """``prompts`` as a list of prompts (one text or one list of token ids is one prompt)."""
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, (bytes, bytearray, memoryview)) or not isinstance(prompts, Sequence):
        # bytes are a sequence of ints, but not token ids: b"abc" would run ids 97, 98, 99
        raise InputError(
            f"prompts must be text, a list of token ids, or a list of those; got "
            f"{type(prompts).__name__}"
        )
    items = list(prompts)
    if items and all(isinstance(p, int) for p in items):
        return [cast("list[int]", items)]  # one prompt given as token ids
    return cast("list[Prompt]", items)
