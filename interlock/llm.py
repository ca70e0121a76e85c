"""The Python API: ``LLM(model=...).generate(prompts, sampling_params)``.

    from interlock import LLM, SamplingParams

    llm = LLM("demo")
    [out] = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=8))
    out.outputs[0].token_ids  # (8 token ids; out.token_ids is the same)

A model with a ``tokenizer.json`` also accepts text prompts and returns
text, and with a chat template (``tokenizer_config.json``) ``llm.chat(...)``
runs conversations:

    llm = LLM("smollm2")
    [out] = llm.chat([{"role": "user", "content": "What is the capital of France?"}])
    out.text  # 'The capital of France is Paris.'
 Without a ``decision`` the policy decides, exactly as
``policy run`` does (``interlock.app.query.decide_query``): for the model's architecture and
traits on the device's platform, under the layered policy (``policy=`` files,
else ``$INTERLOCK_POLICY``, else the shipped one), the process environment's
bindings and ``overrides``; ``llm.resolution`` keeps the full resolution and
one INFO line on the ``interlock`` logger names who chose the runner,
cudagraph mode and breakable, and ``decision_log=FILE`` (else
``$INTERLOCK_DECISION_LOG``) appends the decision record
(``interlock.decision_log``; no prompts, no outcome: an LLM runs many batches).
The runner is the one the decision names, created through the plugin that
registers it, or an object given as ``runner`` (which then needs an explicit
``decision``). Plugins' kernels are installed before it loads, whichever runner it is.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Generator, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from interlock.app.arguments import check_kv_cache_fits, check_llm_arguments
from interlock.app.decided_by import decided_by, given_by_caller
from interlock.app.outputs import (
    CompletionDelta,
    CompletionOutput,
    GenerationInterrupted,
    Logprob,
    Message,
    OnTokens,
    Prompt,
    RequestOutput,
    SentText,
    StreamOutput,
    as_prompt_list,
)
from interlock.app.query import Query, decide_query, detected_device
from interlock.app.runner_creation import install_plugin_kernels, runner_factory, runner_from_plugin
from interlock.app.timing import RequestTimes, tpot_s, ttft_s
from interlock.app.tokenizer import load_chat_template, load_tokenizer
from interlock.core.env import Settings
from interlock.core.errors import InputError
from interlock.core.heap import give_back_free_memory
from interlock.plugins import load_registry
from interlock.runners.batching.kv_cache import plan_kv_cache
from interlock.runners.batching.request import FinishReason, Request
from interlock.runners.batching.sampling import SEED_LIMIT, SamplingParams
from interlock.runners.batching.step_loop import StepLoop
from interlock.runners.contract import Decision, ModelSpec, Runner, RunnerReport, SampleLogprobs
from interlock.runners.model.checkpoint import ModelSource, resolve_dtype, resolve_model
from interlock.runners.model.sharding import plan_shards
from interlock.runners.model.sources import DEMO
from interlock.runners.parallel.distributed import ParallelSettings
from interlock.runners.parallel.executor import TensorParallelRunner

if TYPE_CHECKING:
    from interlock.policy.resolution import Resolution

__all__ = [
    "LLM", "CompletionDelta", "CompletionOutput", "GenerationInterrupted", "Logprob", "Message",
    "OnTokens", "Prompt", "RequestOutput", "StreamOutput", "install_plugin_kernels",
]

LOG = logging.getLogger("interlock")


class LLM:
    """A model loaded for offline generation, under the policy's decision for this machine.

    ``LLM(model)`` takes what ``policy run --model`` takes: ``demo`` (the built-in model),
    a named model (``smollm2``), a GGUF file, or a Hugging Face model directory (or its
    ``config.json``), or a ``ModelSource`` already resolved (``policy run`` resolves the
    model once, for its decision and its run). The policy decides the runner and the graph
    settings as ``policy run`` does (``policy=`` files, ``overrides``, the process
    environment's bindings); ``decision=`` (with ``runner=``, an object) bypasses it.
    ``device`` is a torch device string (None: detected); naming one this torch cannot use
    is an ``InputError`` saying so. The step loop's limits (``max_num_seqs``,
    ``max_num_batched_tokens``, ``max_model_len``, ``block_size``, ``num_blocks`` or
    ``kv_cache_memory``) and ``tensor_parallel_size`` size one run configuration. The
    ``INTERLOCK_*`` environment the run uses is read once, here (``settings``: read by the
    caller, as ``policy run`` does), never after the decision.

    ``generate(prompts, sampling_params)`` takes token-id lists or, with a tokenizer,
    text, and returns one vLLM-shaped ``RequestOutput`` per prompt (``outputs``: its
    ``n`` ``CompletionOutput``s); ``chat(messages)`` applies the model's chat
    template. ``stream(prompts)`` and ``stream_chat(messages)`` yield what is new after
    each step instead (vLLM's ``RequestOutputKind.DELTA``). Calls are serialised: one
    ``LLM`` is safe to share between threads, one call (or stream) at a time.
    ``llm.resolution`` is the decision with its trace.

    ``from interlock import LLM, SamplingParams`` imports both, as from vLLM.
    ``SamplingParams`` (``interlock.runners.batching.sampling``) has vLLM's common fields
    with vLLM's defaults and meaning (``temperature`` 1.0: pass 0 for greedy): ``n``,
    ``max_tokens``, ``temperature``, ``top_k``, ``top_p``, ``min_p``, the presence,
    frequency and repetition penalties, ``seed``, ``stop``, ``stop_token_ids``,
    ``include_stop_str_in_output``, ``ignore_eos`` and ``logprobs``; any other vLLM field
    is refused by name (docs/runners-and-graphs.md).
    """

    def __init__(
        self,
        model: str | Path | ModelSource = DEMO,
        *,
        dtype: str = "auto",
        load_format: str = "auto",
        weights: str = "auto",
        device: str | None = None,
        seed: int = 0,
        block_size: int = 16,
        num_blocks: int | None = None,
        kv_cache_memory: int | None = None,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 2048,
        max_model_len: int | None = None,
        runner: Runner | None = None,
        decision: Decision | None = None,
        policy: Sequence[str | os.PathLike[str]] | None = None,
        overrides: Mapping[str, Any] | None = None,
        tensor_parallel_size: int = 1,
        decision_log: str | os.PathLike[str] | None = None,
        debug_graphs: bool | None = None,
        settings: Settings | None = None,
    ) -> None:
        check_llm_arguments(
            {"dtype": dtype, "load_format": load_format, "weights": weights, "device": device,
             "seed": seed,
             "block_size": block_size, "num_blocks": num_blocks,
             "kv_cache_memory": kv_cache_memory, "max_num_seqs": max_num_seqs,
             "max_num_batched_tokens": max_num_batched_tokens, "max_model_len": max_model_len,
             "tensor_parallel_size": tensor_parallel_size}
        )
        # The environment the run uses, read here, once (or where the caller started: policy
        # run's): what runs after the decision is handed it (the runner and every
        # tensor-parallel rank in the ModelSpec), and the plugins discovered under it.
        settings = settings or Settings.read()
        plugins = load_registry(settings.environ)
        # One generate/chat at a time: the step loop's batch is not shared between threads.
        self._lock = threading.Lock()
        self._owner: int | None = None
        source = model if isinstance(model, ModelSource) else resolve_model(model)
        named = source.name if isinstance(model, ModelSource) else os.fspath(model)
        # A size the model cannot be split into is refused before anything is decided,
        # loaded or started.
        plan_shards(source.config, tensor_parallel_size)
        if tensor_parallel_size > 1 and runner is not None:
            raise InputError(
                f"runner={type(runner).__name__} object with tensor_parallel_size="
                f"{tensor_parallel_size}: every rank builds its own runner, so name it through "
                "a decision (Decision(runner=...)) instead"
            )
        if decision is None:
            if runner is not None:
                raise InputError(
                    f"runner={type(runner).__name__} object given without a decision: pass "
                    "decision=Decision(...) saying how to run it (the policy decides only "
                    "for the runners plugins register)"
                )
            from interlock.policy.loader import load_policy

            loaded = load_policy(policy)
            self.resolution: Resolution | None = decide_query(loaded, Query.for_device(
                loaded, source.name, device, overrides or {}, tensor_parallel_size))
            decision = self.resolution.decision
            decided = decided_by(self.resolution)
        else:
            if policy is not None or overrides or decision_log is not None:
                raise InputError(
                    "policy=, overrides= and decision_log= shape or record the policy's "
                    "decision; with an explicit decision= they would be ignored: give one or "
                    "the other"
                )
            self.resolution = None
            decided = given_by_caller(decision)
        LOG.info("LLM %s: %s", named, decided)
        if self.resolution is not None:
            from interlock import decision_log as records

            records.write(records.log_path(decision_log, settings), self.resolution, "LLM",
                          model=named, overrides=dict(overrides or {}),
                          runner=records.plugin_of(decision.runner, plugins))
        self.plugin_kernels = install_plugin_kernels(plugins, settings)
        config = source.config
        resolved_dtype = resolve_dtype(dtype, config)
        limit = config.max_position_embeddings
        if max_model_len is None:
            max_model_len = limit
        elif not 0 < max_model_len <= limit:
            raise InputError(
                f"max_model_len={max_model_len} is invalid; allowed: 1..{limit} "
                "(the model's max_position_embeddings)"
            )
        # The run's one configuration: the KV cache plan, the scheduler and the runner all
        # read their limits from it.
        spec = ModelSpec(
            name=source.name,
            config=config,
            dtype=resolved_dtype,
            device=device or detected_device(),
            load_format=load_format,
            weights=weights,
            seed=seed,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            tensor_parallel_size=tensor_parallel_size,
            debug_graphs=settings.debug_graphs if debug_graphs is None else debug_graphs,
            kernels=settings.kernels,
            fail_capture=settings.graphs_fail_capture,
        )
        kv_cache = plan_kv_cache(
            spec, block_size, num_blocks=num_blocks, kv_cache_memory=kv_cache_memory
        )
        check_kv_cache_fits(spec, kv_cache.num_blocks, kv_cache.block_size)
        self.tokenizer = load_tokenizer(source.directory)
        self.chat_template = load_chat_template(source.directory)
        if runner is None:
            runner = (
                runner_from_plugin(decision.runner, plugins) if tensor_parallel_size == 1
                else TensorParallelRunner(runner_factory(decision.runner, plugins),
                                          tensor_parallel_size,
                                          ParallelSettings.of(settings))
            )
        self.step_loop = StepLoop(spec, kv_cache, runner, decision)
        # The load's garbage (tokenizer.json's parse, the weights' repacking, the graphs'
        # activations before they shared a buffer) back to the system: see core.heap.
        give_back_free_memory()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        on_tokens: OnTokens | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs in prompt order.

        ``on_tokens(index, token_ids, finish_reason)`` is called after every step in
        which prompt ``index`` got a token (for streaming; with ``n`` 1).

        All requests are validated before any runs: one that cannot fit the
        step loop even alone raises ``RequestRejected`` and nothing is run.
        """
        with self._serialised():
            return self._generate(prompts, sampling_params, on_tokens)

    @contextmanager
    def _serialised(self) -> Iterator[None]:
        """generate/chat from several threads run one after another; from inside one (an
        on_tokens callback) it is refused, as it would corrupt the running batch."""
        if self._owner == threading.get_ident():
            raise InputError(
                "generate(), chat() or stream() called while this thread's generate() or "
                "stream() is running (from an on_tokens callback, or inside a stream's loop?); "
                "call it after that one returns or its stream is exhausted or closed"
            )
        with self._lock:
            self._owner = threading.get_ident()
            try:
                yield
            finally:
                self._owner = None

    def _generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
        on_tokens: OnTokens | None,
    ) -> list[RequestOutput]:
        batch, groups = self._requests(prompts, sampling_params, callback=on_tokens is not None)
        requests = [r for group in groups for r in group]
        try:
            with closing(self._steps(requests)) as steps:
                for advanced in steps:
                    if on_tokens is None:
                        continue
                    for index in advanced:
                        request = requests[index]
                        reason = request.finish_reason
                        on_tokens(index, tuple(request.output_token_ids),
                                  None if reason is None else reason.value)
        except KeyboardInterrupt as exc:
            raise GenerationInterrupted(self._outputs(batch, groups)) from exc
        return self._outputs(batch, groups)

    def stream(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> Iterator[StreamOutput]:
        """``generate``, yielding after each step one ``StreamOutput`` per prompt that
        advanced, with only what is new (vLLM's ``RequestOutputKind.DELTA``); ``n`` > 1
        streams each completion (``CompletionDelta.index``). Joined, a completion's
        deltas are ``generate``'s output. Text is held back while a stop string could
        still cut it, or a UTF-8 sequence is unfinished (``settled_text``).

        Nothing runs, and nothing is checked, before the first ``next()``. The ``LLM``
        is held until the stream is exhausted or closed (``break`` out of a ``for`` loop
        closes it once the iterator is dropped; ``close()`` at once), and closing it
        aborts the completions still running."""
        with self._serialised():
            batch, groups = self._requests(prompts, sampling_params, callback=False)
            requests = [r for group in groups for r in group]
            # Each request's prompt, its completion index in that prompt, what it has sent.
            where = [(p, c) for p, group in enumerate(groups) for c in range(len(group))]
            sent = [SentText() for _ in requests]
            with closing(self._steps(requests)) as steps:
                for advanced in steps:
                    deltas: dict[int, list[CompletionDelta]] = {}
                    for index in advanced:
                        prompt, completion = where[index]
                        deltas.setdefault(prompt, []).append(
                            self._delta(completion, requests[index], sent[index]))
                    for prompt, outputs in sorted(deltas.items()):
                        first = groups[prompt][0]
                        yield StreamOutput(
                            prompt_index=prompt,
                            request_id=first.request_id,
                            prompt=p if isinstance(p := batch[prompt], str) else None,
                            prompt_token_ids=first.prompt_token_ids,
                            outputs=outputs,
                            finished=all(r.finish_reason is not None for r in groups[prompt]),
                        )

    def stream_chat(
        self,
        conversations: Sequence[Message] | Sequence[Sequence[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> Iterator[StreamOutput]:
        """``stream`` for conversations, rendered as ``chat`` renders them."""
        yield from self.stream(self._chat_prompts(conversations), sampling_params)

    def _requests(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
        callback: bool,
    ) -> tuple[list[Prompt], list[list[Request]]]:
        """The prompts as a list and, per prompt, its ``n`` completions' requests, every one
        checked before any is added to the step loop (``callback``: an ``on_tokens`` will
        see them, which takes one completion per prompt)."""
        batch = as_prompt_list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(batch)
        else:
            params = list(sampling_params)
            if len(params) != len(batch):
                raise InputError(f"{len(params)} sampling params for {len(batch)} prompts")
        groups: list[list[Request]] = []
        for i, (prompt, p) in enumerate(zip(batch, params, strict=True)):
            try:  # errors name the caller's position, not the step loop's request id
                if not isinstance(p, SamplingParams):
                    raise InputError(f"expected SamplingParams, got {type(p).__name__}")
                if p.stop and self.tokenizer is None:
                    raise InputError(
                        f"stop={list(p.stop)!r}: stop strings are matched in the text, and "
                        "this model has no tokenizer.json; use stop_token_ids"
                    )
                if p.n > 1 and callback:
                    raise InputError(
                        f"n={p.n} with on_tokens: on_tokens reports one completion per "
                        "prompt; use n=1, or stream() (which streams every completion)"
                    )
                token_ids = self.encode(prompt)
                groups.append(
                    [self.step_loop.make_request(token_ids, c) for c in completion_params(p)]
                )
            except InputError as exc:
                raise type(exc)(f"prompts[{i}]: {_without_request_id(exc)}") from None
        return batch, groups

    def _steps(self, requests: list[Request]) -> Generator[list[int], None, None]:
        """Add ``requests`` and step the loop until none is unfinished, yielding after
        each step the positions (in ``requests``) of those that got a token. However it
        ends (an error, Ctrl-C, the iterator closed), none of them stays running."""
        for request in requests:
            self.step_loop.add_request(request)
        seen = [0] * len(requests)
        try:
            while self.step_loop.has_unfinished():
                self.step_loop.step()
                advanced = []
                for index, request in enumerate(requests):
                    if len(request.output_token_ids) == seen[index]:
                        continue
                    seen[index] = len(request.output_token_ids)
                    if request.params.stop:
                        self.check_stop_strings(request)
                    advanced.append(index)
                yield advanced
        except BaseException:
            self.step_loop.abort(requests)
            raise

    def _delta(self, completion: int, request: Request, sent: SentText) -> CompletionDelta:
        tokens = request.output_token_ids
        reason = request.finish_reason
        text, new = sent.advance(
            "" if self.tokenizer is None else self.settled_text(request, len(tokens)),
            len(tokens),
        )
        logprobs = None
        if request.params.logprobs is not None:
            logprobs = [self._logprobs(tokens[i], request.logprobs[i]) for i in new]
        return CompletionDelta(
            index=completion,
            text=None if self.tokenizer is None else text,
            token_ids=tuple(tokens[new.start:new.stop]),
            logprobs=logprobs,
            finish_reason=None if reason is None else reason.value,
            stop_reason=None if reason is None else request.stop_reason,
        )

    def settled_text(self, request: Request, num_tokens: int) -> str:
        """The text of ``request``'s first ``num_tokens`` tokens that later tokens cannot
        change: once it has finished, its answer as ``completion_output`` cuts it; while it
        runs, less an unfinished UTF-8 sequence and the last (longest stop string - 1)
        characters, which a stop string may yet cut from the answer."""
        if request.finish_reason is not None and num_tokens == len(request.output_token_ids):
            return self._text(request)
        text = self.decode(request.output_token_ids[:num_tokens]).rstrip("\ufffd")
        holdback = max((len(s) for s in request.params.stop), default=1) - 1
        return text[: max(len(text) - holdback, 0)]

    def check_stop_strings(self, request: Request) -> None:
        """Finish ``request`` if its text now holds one of its stop strings (vLLM's
        ``stop``); a request that just ended by length ends by the stop string instead.
        Called between steps, by whoever steps the loop."""
        found = _first_stop(self.decode(request.output_token_ids), request.params.stop)
        if found is None or request.stop_reason is not None:
            return
        if request.finish_reason is FinishReason.LENGTH:
            request.finish(FinishReason.STOP, request.finish_time or 0.0, found[1])
        elif request.finish_reason is None:
            self.step_loop.stop(request, found[1])

    def chat(
        self,
        conversations: Sequence[Message] | Sequence[Sequence[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        on_tokens: OnTokens | None = None,
    ) -> list[RequestOutput]:
        """``generate`` for one conversation (a list of messages) or several, each rendered
        with the model's chat template and an assistant turn to answer."""
        return self.generate(self._chat_prompts(conversations), sampling_params,
                             on_tokens=on_tokens)

    def _chat_prompts(
        self, conversations: Sequence[Message] | Sequence[Sequence[Message]]
    ) -> list[Prompt]:
        if not isinstance(conversations, (list, tuple)):
            raise InputError(
                f"chat() takes a list of messages or of conversations, got "
                f"{type(conversations).__name__}"
            )
        batch: Sequence[Sequence[Message]]
        if conversations and isinstance(conversations[0], Mapping):
            batch = [cast(Sequence[Message], conversations)]
        else:
            batch = cast(Sequence[Sequence[Message]], conversations)
        return [self.apply_chat_template(c) for c in batch]

    def apply_chat_template(self, messages: Sequence[Message]) -> list[int]:
        """The token ids of ``messages`` rendered by the chat template, ready for the reply."""
        if self.chat_template is None or self.tokenizer is None:
            raise InputError(
                "chat needs a tokenizer.json and a chat_template in tokenizer_config.json in "
                "the model directory; this model has none"
            )
        text = self.chat_template.render(messages)
        # The template writes every special token itself (BOS included, where it wants one).
        return self.tokenizer.encode(text, False, name="chat template output").ids

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of generated tokens (special tokens such as EOS left out)."""
        if self.tokenizer is None:
            raise InputError("decoding needs a tokenizer.json in the model directory")
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InputError(
                    "text prompts need a tokenizer.json in the model directory; pass token ids "
                    "instead"
                )
            return self.tokenizer.encode(prompt).ids
        # Typed as token ids from here: an isinstance check of ``prompt`` itself would widen it
        # back to the declared str | Sequence[int] (str is a Sequence too).
        token_ids: Sequence[int] = prompt
        if not isinstance(token_ids, Sequence) or isinstance(token_ids, bytes):
            raise InputError(
                f"a prompt is text or a list of token ids; got {type(token_ids).__name__}"
            )
        return list(token_ids)

    def report(self) -> RunnerReport:
        return self.step_loop.report()

    def close(self) -> None:
        """Stop the other tensor-parallel ranks, if any (also done at exit); the LLM cannot
        generate afterwards."""
        if isinstance(self.step_loop.runner, TensorParallelRunner):
            self.step_loop.runner.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _outputs(self, batch: list[Prompt], groups: list[list[Request]]) -> list[RequestOutput]:
        return [
            self._request_output(prompt, group) for prompt, group in zip(batch, groups, strict=True)
        ]

    def _request_output(self, prompt: Prompt, group: list[Request]) -> RequestOutput:
        first = group[0]
        outputs = [self.completion_output(index, r) for index, r in enumerate(group)]
        started = first.first_token_time
        times = None if started is None else RequestTimes(
            arrival=first.arrival_time, first_token=started,
            finish=first.finish_time or started, output_tokens=len(first.output_token_ids),
            prompt_tokens=len(first.prompt_token_ids))
        return RequestOutput(
            request_id=first.request_id,
            prompt=prompt if isinstance(prompt, str) else None,
            prompt_token_ids=first.prompt_token_ids,
            outputs=outputs,
            finished=all(o.finished() for o in outputs),
            ttft_s=0.0 if times is None else ttft_s(times),
            tpot_s=(0.0 if times is None else tpot_s(times)) or 0.0,
            times=times,
        )

    def completion_output(self, index: int, request: Request) -> CompletionOutput:
        """A finished ``request`` as completion ``index`` of its prompt (text as vLLM cuts it)."""
        if request.finish_reason is None:  # generate finishes or aborts each of its requests
            raise RuntimeError(f"request {request.request_id} has not finished")
        tokens = tuple(request.output_token_ids)
        params = request.params
        logprobs = None
        cumulative = None
        if params.logprobs is not None:
            logprobs = [self._logprobs(token, step) for token, step
                        in zip(tokens, request.logprobs, strict=True)]
            cumulative = sum(step.logprob for step in request.logprobs)
        return CompletionOutput(
            index=index,
            text=None if self.tokenizer is None else self._text(request),
            token_ids=tokens,
            cumulative_logprob=cumulative,
            logprobs=logprobs,
            finish_reason=request.finish_reason.value,
            stop_reason=request.stop_reason,
        )

    def _text(self, request: Request) -> str:
        """The completion's text as vLLM gives it: without the EOS or stop token that
        ended it, cut before the stop string that did, unless include_stop_str_in_output."""
        tokens = request.output_token_ids
        keep = request.params.include_stop_str_in_output
        stopped = request.finish_reason is FinishReason.STOP
        if stopped and not keep and not isinstance(request.stop_reason, str):
            tokens = tokens[:-1]
        text = self.decode(tokens)
        if stopped and isinstance(request.stop_reason, str):
            found = _first_stop(text, request.params.stop)
            if found is not None:
                at, stop = found
                text = text[: at + len(stop)] if keep else text[:at]
        return text

    def _logprobs(self, token: int, step: SampleLogprobs) -> dict[int, Logprob]:
        def entry(token_id: int, logprob: float, rank: int) -> Logprob:
            text = None if self.tokenizer is None else self.decode([token_id])
            return Logprob(logprob, rank, text)

        out = {t: entry(t, lp, rank) for rank, (t, lp) in enumerate(step.top, start=1)}
        out.setdefault(token, entry(token, step.logprob, step.rank))
        return out


def completion_params(params: SamplingParams) -> list[SamplingParams]:
    """One request's parameters per completion: ``n`` independent samples, completion
    ``i`` seeded ``seed + i`` where a seed is given (else each draws its own)."""
    if params.n == 1:
        return [params]
    return [
        replace(params, n=1, seed=None if params.seed is None else (params.seed + i) % SEED_LIMIT)
        for i in range(params.n)
    ]


def _first_stop(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    """The earliest stop string in ``text`` and where it starts."""
    hits = [(at, stop) for stop in stops if (at := text.find(stop)) >= 0]
    return min(hits) if hits else None


def _without_request_id(exc: Exception) -> str:
    text = str(exc)
    return text.split(": ", 1)[1] if text.startswith("request ") and ": " in text else text
