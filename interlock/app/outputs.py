"""What ``LLM.generate`` takes and returns: prompts, per-prompt outputs, and the Ctrl-C
that carries the partial outputs."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from interlock.core.errors import InputError

Prompt = str | Sequence[int]
Message = Mapping[str, str]  # {"role": ..., "content": ...}
#: Called during generation with (prompt index, every token generated for it so far,
#: its finish reason: None until it has finished).
OnTokens = Callable[[int, tuple[int, ...], str | None], None]


@dataclass(frozen=True)
class CompletionOutput:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    text: str | None  # None without a tokenizer
    finish_reason: str  # "length" | "stop" | "aborted"
    ttft_s: float  # arrival to first token
    tpot_s: float  # mean time per output token after the first (0 for one token)


class GenerationInterrupted(KeyboardInterrupt):
    """Ctrl-C during ``generate``: ``outputs`` holds what each prompt generated so far
    (unfinished ones with finish reason ``aborted``)."""

    def __init__(self, outputs: list[CompletionOutput]) -> None:
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
