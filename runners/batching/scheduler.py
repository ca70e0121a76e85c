"""Continuous batching: which requests run this step, with how many tokens each.

Each step the running requests go first, oldest first: a decode feeds one
token, an unfinished prefill its next chunk. Then waiting requests are
admitted in arrival order while sequence slots, the token budget and free KV
blocks allow (a prompt longer than the budget is prefilled in chunks).
Prefill and decode share the step.

When a running request needs a block and none is free, the youngest running
request is preempted: its blocks are freed and it goes back to the front of
the queue, to be recomputed from its prompt and the tokens it already has.
The oldest request is never preempted by a younger one, and every admitted
request fits the cache alone, so every request finishes.

A model with linear-attention layers also keeps per-request recurrent state
(``cache_spec.state_spec``): a running request holds one slot of that pool, taken at
admission and given back when it finishes or is preempted (it then recomputes from its
prompt into whichever slot it gets next, starting from zeros). The pool has a slot per
``max_num_seqs``, so admission never waits on one, and its memory is taken off the KV
budget (``kv_cache.plan_kv_cache``).
"""

from __future__ import annotations

from collections import deque

from interlock.core.errors import InputError
from interlock.runners.batching.kv_cache import BlockAllocator, blocks_for
from interlock.runners.batching.request import FinishReason, Request, RequestStatus
from interlock.runners.contract import (
    KVCacheSpec,
    ModelSpec,
    RunnerOutput,
    Sampling,
    ScheduledBatch,
    ScheduledSequence,
)
from interlock.runners.model.cache_spec import state_spec


class RequestRejected(InputError):
    """A request that can never run within the step loop's limits."""


class Scheduler:
    """Schedules within ``model``'s limits (the run's configuration, which the runner reads
    too) and ``kv_cache``'s blocks."""

    def __init__(self, model: ModelSpec, kv_cache: KVCacheSpec) -> None:
        self.model, self.kv_cache = model, kv_cache
        self.allocator = BlockAllocator(kv_cache.num_blocks)
        self.has_state = state_spec(model.config) is not None
        self.free_state_slots: deque[int] = deque(
            range(model.max_num_seqs) if self.has_state else ()
        )
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._scheduled: list[tuple[Request, int]] = []
        self._released: list[str] = []  # finished or preempted since the last batch

    def add(self, request: Request) -> None:
        """Queue a request, or reject it if it could not run even alone."""
        self.check_fits(request)
        self.waiting.append(request)

    def check_fits(self, request: Request) -> None:
        model, cache = self.model, self.kv_cache
        prompt_len, max_tokens = len(request.prompt_token_ids), request.max_tokens
        if prompt_len == 0:
            raise RequestRejected(f"request {request.request_id}: the prompt is empty")
        if prompt_len + max_tokens > model.max_model_len:
            raise RequestRejected(
                f"request {request.request_id}: prompt ({prompt_len} tokens) + max_tokens "
                f"({max_tokens}) = {prompt_len + max_tokens} exceeds max_model_len "
                f"{model.max_model_len}; shorten the prompt or lower max_tokens"
            )
        needed = blocks_for(request.max_kv_tokens, cache.block_size)
        if needed > cache.num_blocks:
            raise RequestRejected(
                f"request {request.request_id}: needs {needed} KV blocks (prompt {prompt_len} + "
                f"max_tokens {max_tokens} tokens, block size {cache.block_size}) but the cache "
                f"has only {cache.num_blocks}; raise num_blocks / kv_cache_memory or lower "
                "max_tokens"
            )

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        """Pick this step's work; the batch is empty only when nothing is queued."""
        budget = self.model.max_num_batched_tokens
        scheduled: list[tuple[Request, int]] = []
        preempted = False
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            count = min(request.num_tokens - request.num_computed_tokens, budget)
            while not self._reserve(request, request.num_computed_tokens + count):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is request:
                    break
            if request.status is not RequestStatus.RUNNING:
                break
            scheduled.append((request, count))
            budget -= count
            index += 1
        # Admitting while others were just preempted would only preempt again.
        while (
            not preempted and self.waiting and budget > 0
            and len(self.running) < self.model.max_num_seqs
        ):
            request = self.waiting[0]
            count = min(request.num_tokens - request.num_computed_tokens, budget)
            if not self._reserve(request, request.num_computed_tokens + count):
                break
            self.waiting.popleft()
            if self.has_state:
                request.state_slot = self.free_state_slots.popleft()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            scheduled.append((request, count))
            budget -= count
        self._scheduled = scheduled
        released, self._released = tuple(self._released), []
        return ScheduledBatch(tuple(self._describe(r, n) for r, n in scheduled), released)

    def _describe(self, request: Request, count: int) -> ScheduledSequence:
        start = request.num_computed_tokens
        params = request.params
        sampling = Sampling(
            params.temperature, params.top_k, params.top_p, request.seed, params.min_p,
            params.presence_penalty, params.frequency_penalty, params.repetition_penalty,
            -1 if params.logprobs is None else params.logprobs,
        )
        sample = start + count == request.num_tokens
        history = sample and sampling.penalised  # what the penalties count, when they apply
        return ScheduledSequence(
            request_id=request.request_id,
            token_ids=request.token_ids(start, count),
            start_position=start,
            block_table=tuple(request.block_table),
            sampling=sampling,
            step=len(request.output_token_ids),
            sample=sample,
            state_slot=request.state_slot,
            prompt_token_ids=request.prompt_token_ids if history else (),
            output_token_ids=tuple(request.output_token_ids) if history else (),
        )

    def update(self, output: RunnerOutput, now: float) -> list[Request]:
        """Apply the runner's tokens to the last scheduled batch; returns requests that finished."""
        if len(output.token_ids) != len(self._scheduled):
            raise RuntimeError(
                f"runner returned {len(output.token_ids)} tokens for "
                f"{len(self._scheduled)} scheduled sequences"
            )
        logprobs = output.logprobs or (None,) * len(self._scheduled)
        if len(logprobs) != len(self._scheduled):
            raise RuntimeError(
                f"runner returned {len(logprobs)} logprobs entries for "
                f"{len(self._scheduled)} scheduled sequences"
            )
        finished = []
        for (request, count), token, logprob in zip(
            self._scheduled, output.token_ids, logprobs, strict=True
        ):
            request.num_computed_tokens += count
            if request.num_computed_tokens < request.num_tokens:
                continue  # a prefill chunk short of the prompt's end
            if token is None:
                raise RuntimeError(f"runner sampled no token for request {request.request_id}")
            if request.params.logprobs is not None and logprob is None:
                raise RuntimeError(
                    f"runner returned no logprobs for request {request.request_id}, which asks "
                    f"for logprobs={request.params.logprobs}"
                )
            request.append_token(token, now, logprob)
            if request.status is RequestStatus.FINISHED:
                self._release(request)
                self.running.remove(request)
                finished.append(request)
        self._scheduled = []
        return finished

    def _reserve(self, request: Request, num_tokens: int) -> bool:
        """Grow the request's block table to hold ``num_tokens``; False if blocks are short."""
        missing = blocks_for(num_tokens, self.kv_cache.block_size) - len(request.block_table)
        if missing <= 0:
            return True
        if missing > self.allocator.num_free:
            return False
        request.block_table.extend(self.allocator.allocate(missing))
        return True

    def abort(self, requests: list[Request], now: float) -> None:
        """Finish unfinished ``requests`` as aborted and free their blocks; the batch in
        flight (if a step failed) is forgotten, so the step loop is clean for the next call."""
        for request in requests:
            self.stop(request, FinishReason.ABORTED, now)
        self._scheduled = []

    def stop(self, request: Request, reason: FinishReason, now: float,
             stop_reason: str | None = None) -> None:
        """Finish ``request`` between steps (a stop string its text reached, an abort)."""
        if request.status is RequestStatus.FINISHED:
            return
        if request in self.running:
            self.running.remove(request)
            self._release(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.finish(reason, now, stop_reason)

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self._release(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.WAITING
        request.num_preemptions += 1
        self.waiting.appendleft(request)

    def _release(self, request: Request) -> None:
        self.allocator.free(request.block_table)
        request.block_table = []
        if request.state_slot >= 0:
            self.free_state_slots.append(request.state_slot)
            request.state_slot = -1
        self._released.append(request.request_id)
