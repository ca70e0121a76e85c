"""A request's state as the scheduler moves it through waiting, running and finished."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.contract import SampleLogprobs


class RequestStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, Enum):
    LENGTH = "length"  # max_tokens reached
    STOP = "stop"  # EOS, a stop token or a stop string
    ABORTED = "aborted"  # the call failed or was interrupted before the request finished


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    seed: int
    eos_token_ids: frozenset[int]
    arrival_time: float
    output_token_ids: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    num_preemptions: int = 0
    state_slot: int = -1  # its recurrent-state pool slot while running (-1: none)
    #: Per output token, where ``params.logprobs`` asks for them.
    logprobs: list[SampleLogprobs] = field(default_factory=list)
    #: vLLM's: the stop token id or stop string that finished it (None: EOS, length).
    stop_reason: int | str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def max_kv_tokens(self) -> int:
        """Cache slots the request needs at its longest (the last token is never fed)."""
        return len(self.prompt_token_ids) + self.max_tokens - 1

    def token_ids(self, start: int, count: int) -> tuple[int, ...]:
        """Tokens [start, start + count) of prompt followed by output."""
        prompt = self.prompt_token_ids
        if start + count <= len(prompt):
            return prompt[start : start + count]
        if start >= len(prompt):
            offset = start - len(prompt)
            return tuple(self.output_token_ids[offset : offset + count])
        return (prompt + tuple(self.output_token_ids))[start : start + count]

    @property
    def max_tokens(self) -> int:
        """``params.max_tokens``, which the step loop resolves (None there) at admission."""
        assert self.params.max_tokens is not None
        return self.params.max_tokens

    def append_token(self, token: int, now: float,
                     logprobs: SampleLogprobs | None = None) -> None:
        """Record a sampled token and finish the request if it ends here."""
        self.output_token_ids.append(token)
        if logprobs is not None:
            self.logprobs.append(logprobs)
        if self.first_token_time is None:
            self.first_token_time = now
        params = self.params
        if token in params.stop_token_ids:
            self.finish(FinishReason.STOP, now, token)
        elif not params.ignore_eos and token in self.eos_token_ids:
            self.finish(FinishReason.STOP, now)
        elif len(self.output_token_ids) >= self.max_tokens:
            self.finish(FinishReason.LENGTH, now)

    def finish(self, reason: FinishReason, now: float,
               stop_reason: int | str | None = None) -> None:
        self.status = RequestStatus.FINISHED
        self.finish_reason = reason
        self.finish_time = now
        self.stop_reason = stop_reason
