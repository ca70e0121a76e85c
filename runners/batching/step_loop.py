"""The step loop: requests in, scheduled batches to the runner, sampled tokens back."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Sequence
from dataclasses import replace

from interlock.runners.batching.request import FinishReason, Request
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.batching.scheduler import RequestRejected, Scheduler
from interlock.runners.contract import Decision, KVCacheSpec, ModelSpec, Runner, RunnerReport


class StepLoop:
    """Owns the scheduler and one loaded runner; ``step()`` runs one batch.

    ``model`` is the run's one configuration: the scheduler schedules within its limits
    (``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len``) and the runner sizes
    its graphs and request state by the same object, so the two cannot disagree. Its
    ``seed`` seeds the per-request seeds of requests that bring none."""

    def __init__(
        self, model: ModelSpec, kv_cache: KVCacheSpec, runner: Runner, decision: Decision
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.runner = runner
        self.scheduler = Scheduler(model, kv_cache)
        self._seeds = random.Random(model.seed)
        self._ids = itertools.count()
        self._eos = frozenset(model.config.eos_token_ids)
        runner.load(model, kv_cache, decision)

    def make_request(
        self, prompt_token_ids: Sequence[int], params: SamplingParams, request_id: str | None = None
    ) -> Request:
        """A validated request (not yet queued): token ids in range, fits the step loop alone."""
        vocab = self.model.config.vocab_size
        if isinstance(prompt_token_ids, (str, bytes)) or not isinstance(
            prompt_token_ids, Sequence
        ):
            raise RequestRejected(
                f"a prompt must be a list of token ids (or text, with a tokenizer); got "
                f"{type(prompt_token_ids).__name__}"
            )
        odd = [t for t in prompt_token_ids if type(t) is not int]
        if odd:  # 2.5 or True would be truncated into a different token
            raise RequestRejected(f"prompt token ids must be integers; got {odd[0]!r}")
        tokens = tuple(prompt_token_ids)
        bad = [t for t in tokens if not 0 <= t < vocab]
        if bad:
            raise RequestRejected(
                f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})"
            )
        if params.max_tokens is None:  # vLLM's: as many as the model length leaves
            left = self.model.max_model_len - len(tokens)
            if left < 1:
                raise RequestRejected(
                    f"the prompt ({len(tokens)} tokens) leaves no room under max_model_len "
                    f"{self.model.max_model_len} for max_tokens=None"
                )
            params = replace(params, max_tokens=left)
        seed = params.seed if params.seed is not None else self._seeds.randrange(2**31)
        request = Request(
            request_id=request_id if request_id is not None else str(next(self._ids)),
            prompt_token_ids=tokens,
            params=params,
            seed=seed,
            eos_token_ids=self._eos,
            arrival_time=time.perf_counter(),
        )
        self.scheduler.check_fits(request)
        return request

    def add_request(self, request: Request) -> None:
        self.scheduler.add(request)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[Request]:
        """Run one batch; returns the requests that finished in it."""
        batch = self.scheduler.schedule()
        if not batch.sequences:
            if self.scheduler.has_unfinished():
                raise RuntimeError("scheduler produced an empty batch with requests pending")
            return []
        output = self.runner.execute(batch)
        return self.scheduler.update(output, time.perf_counter())

    def abort(self, requests: Sequence[Request]) -> None:
        """End the unfinished ``requests`` (finish reason ``aborted``), freeing their cache."""
        self.scheduler.abort(list(requests), time.perf_counter())

    def stop(self, request: Request, stop_reason: str) -> None:
        """Finish ``request`` between steps, as stopped by ``stop_reason`` (a stop string
        its text reached: the step loop sees tokens, its caller the text)."""
        self.scheduler.stop(request, FinishReason.STOP, time.perf_counter(), stop_reason)

    def report(self) -> RunnerReport:
        return self.runner.report()
