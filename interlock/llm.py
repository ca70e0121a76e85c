"""The Python API: ``LLM(model=...).generate(prompts, sampling_params)``.

    from interlock.llm import LLM
    from interlock.runners.engine.sampling import SamplingParams

    llm = LLM("demo")
    [out] = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=8))
    out.token_ids  # (8 token ids)

A model with a ``tokenizer.json`` also accepts text prompts and returns
text, and with a chat template (``tokenizer_config.json``) ``llm.chat(...)``
runs conversations:

    llm = LLM("smollm2")
    [out] = llm.chat([{"role": "user", "content": "What is the capital of France?"}])
    out.text  # 'The capital of France is Paris.'
 Without a ``decision`` the policy decides, exactly as
``policy run`` does (``interlock.model_run``): for the model's architecture and
traits on the device's platform, under the layered policy (``policy=`` files,
else ``$INTERLOCK_POLICY``, else the shipped one), the process environment's
bindings and ``overrides``; ``llm.resolution`` keeps the full resolution and
one INFO line on the ``interlock`` logger names who chose the runner,
cudagraph mode and breakable. The runner is the one the decision names,
created through the plugin that registers it, or an object given as
``runner`` (which then needs an explicit ``decision``). Plugins' kernels are
installed before it loads, whichever runner it is.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tokenizers import Tokenizer

from interlock.core.errors import InputError, ModelError
from interlock.core.files import FileProblem, decode_utf8, read_json, read_regular
from interlock.core.platform import detect_platform
from interlock.model_run import (
    GIVEN_BY_CALLER,
    LOGGED_FIELDS,
    decided_by,
    decision_line,
    device_for,
    process_env,
    resolve_model_run,
)
from interlock.plugins.capabilities import TENSOR_PARALLEL
from interlock.policy.context import has_triton_fact
from interlock.policy.loader import load_policy
from interlock.runners.contract import Decision, ModelSpec, Runner, RunnerReport
from interlock.runners.engine.engine import Engine, EngineConfig
from interlock.runners.engine.kv_cache import plan_kv_cache
from interlock.runners.engine.request import Request
from interlock.runners.engine.sampling import SamplingParams
from interlock.runners.model.checkpoint import resolve_dtype, resolve_model
from interlock.runners.model.sharding import plan_shards
from interlock.runners.parallel.executor import TensorParallelRunner

if TYPE_CHECKING:
    from interlock.plugins.kernels import KernelInstall
    from interlock.policy.resolution import Resolution

Prompt = str | Sequence[int]
Message = Mapping[str, str]  # {"role": ..., "content": ...}
#: Called during generation with (prompt index, every token generated for it so far,
#: its finish reason: None until it has finished).
OnTokens = Callable[[int, tuple[int, ...], str | None], None]
LOG = logging.getLogger("interlock")


@dataclass(frozen=True)
class CompletionOutput:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    text: str | None  # None without a tokenizer
    finish_reason: str  # "length" | "stop" | "aborted"
    ttft_s: float  # arrival to first token
    tpot_s: float  # mean time per output token after the first (0 for one token)


class LLM:
    def __init__(
        self,
        model: str | Path = "demo",
        *,
        dtype: str = "auto",
        load_format: str = "auto",
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
    ) -> None:
        source = resolve_model(model)
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
            self.resolution: Resolution | None = _resolve(
                source.name, device, policy, overrides, tensor_parallel_size
            )
            decision = self.resolution.decision
            decided = decided_by(self.resolution)
        else:
            if policy is not None or overrides:
                raise InputError(
                    "policy= and overrides= shape the policy's decision; with an explicit "
                    "decision= they would be ignored: give one or the other"
                )
            self.resolution = None
            decided = _given_by_caller(decision)
        LOG.info("LLM %s: %s", os.fspath(model), decided)
        self.plugin_kernels = install_plugin_kernels()
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
        spec = ModelSpec(
            name=source.name,
            config=config,
            dtype=resolved_dtype,
            device=device or _detected_device(),
            load_format=load_format,
            seed=seed,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            tensor_parallel_size=tensor_parallel_size,
        )
        kv_cache = plan_kv_cache(
            config, resolved_dtype, block_size, max_model_len, max_num_seqs,
            num_blocks=num_blocks, kv_cache_memory=kv_cache_memory,
            tensor_parallel_size=tensor_parallel_size,
        )
        self.tokenizer = _load_tokenizer(source.directory)
        self.chat_template = _load_chat_template(source.directory)
        if runner is None:
            runner = (
                runner_from_plugin(decision.runner) if tensor_parallel_size == 1
                else TensorParallelRunner(runner_factory(decision.runner), tensor_parallel_size)
            )
        self.engine = Engine(
            spec,
            kv_cache,
            runner,
            decision,
            EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                         seed=seed),
        )

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        on_tokens: OnTokens | None = None,
    ) -> list[CompletionOutput]:
        """Run every prompt to completion; outputs in prompt order.

        ``on_tokens(index, token_ids, finish_reason)`` is called after every step in
        which prompt ``index`` got a token (for streaming).

        All requests are validated before any runs: one that cannot fit the
        engine even alone raises ``RequestRejected`` and nothing is run.
        """
        batch = _as_prompt_list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(batch)
        else:
            params = list(sampling_params)
            if len(params) != len(batch):
                raise InputError(f"{len(params)} sampling params for {len(batch)} prompts")
        requests = []
        for i, (prompt, p) in enumerate(zip(batch, params, strict=True)):
            try:  # errors name the caller's position, not the engine's request id
                if not isinstance(p, SamplingParams):
                    raise InputError(f"expected SamplingParams, got {type(p).__name__}")
                requests.append(self.engine.make_request(self.encode(prompt), p))
            except InputError as exc:
                raise type(exc)(f"prompts[{i}]: {_without_request_id(exc)}") from None
        for request in requests:
            self.engine.add_request(request)
        seen = [0] * len(requests)
        try:
            while self.engine.has_unfinished():
                self.engine.step()
                if on_tokens is not None:
                    for index, request in enumerate(requests):
                        if len(request.output_token_ids) > seen[index]:
                            seen[index] = len(request.output_token_ids)
                            reason = request.finish_reason
                            on_tokens(index, tuple(request.output_token_ids),
                                      None if reason is None else reason.value)
        except BaseException as exc:
            # Every request of the call ends here, one way or the other: none stays running.
            self.engine.abort(requests)
            if isinstance(exc, KeyboardInterrupt):
                raise GenerationInterrupted([self._output(r) for r in requests]) from exc
            raise
        return [self._output(r) for r in requests]

    def chat(
        self,
        conversations: Sequence[Message] | Sequence[Sequence[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        on_tokens: OnTokens | None = None,
    ) -> list[CompletionOutput]:
        """``generate`` for one conversation (a list of messages) or several, each rendered
        with the model's chat template and an assistant turn to answer."""
        if conversations and isinstance(conversations[0], Mapping):
            conversations = [conversations]  # type: ignore[list-item]
        prompts = [self.apply_chat_template(c) for c in conversations]  # type: ignore[arg-type]
        return self.generate(prompts, sampling_params, on_tokens=on_tokens)

    def apply_chat_template(self, messages: Sequence[Message]) -> list[int]:
        """The token ids of ``messages`` rendered by the chat template, ready for the reply."""
        if self.chat_template is None or self.tokenizer is None:
            raise InputError(
                "chat needs a tokenizer.json and a chat_template in tokenizer_config.json in "
                "the model directory; this model has none"
            )
        text = self.chat_template.render(messages)
        # The template writes every special token itself (BOS included, where it wants one).
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of generated tokens (special tokens such as EOS left out)."""
        if self.tokenizer is None:
            raise InputError("decoding needs a tokenizer.json in the model directory")
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def encode(self, prompt: Prompt) -> list[int]:
        if not isinstance(prompt, str):
            if isinstance(prompt, bytes) or not isinstance(prompt, Sequence):
                raise InputError(
                    f"a prompt is text or a list of token ids; got {type(prompt).__name__}"
                )
            return list(prompt)
        if self.tokenizer is None:
            raise InputError(
                "text prompts need a tokenizer.json in the model directory; pass token ids instead"
            )
        return self.tokenizer.encode(prompt).ids

    def report(self) -> RunnerReport:
        return self.engine.report()

    def close(self) -> None:
        """Stop the other tensor-parallel ranks, if any (also done at exit); the LLM cannot
        generate afterwards."""
        if isinstance(self.engine.runner, TensorParallelRunner):
            self.engine.runner.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _output(self, request: Request) -> CompletionOutput:
        tokens = tuple(request.output_token_ids)
        text = None if self.tokenizer is None else self.decode(tokens)
        first = request.first_token_time
        ttft = 0.0 if first is None else first - request.arrival_time
        decode_time = 0.0 if first is None else (request.finish_time or first) - first
        return CompletionOutput(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            token_ids=tokens,
            text=text,
            finish_reason=request.finish_reason.value,
            ttft_s=ttft,
            tpot_s=decode_time / (len(tokens) - 1) if len(tokens) > 1 else 0.0,
        )


def install_plugin_kernels() -> KernelInstall:
    """Put every ok plugin's kernel implementations into ``kernels.REGISTRY``, before any
    runner (built-in or a plugin's) builds its kernel table, so each of them can dispatch
    to them and ``INTERLOCK_KERNELS`` can name their backends. Idempotent. A kernel that
    cannot be installed is logged as a warning and left out (its plugin's other kernels
    still install); with ``INTERLOCK_PLUGINS_STRICT=1`` it raises ``PluginError``."""
    from interlock.kernels import REGISTRY
    from interlock.plugins.kernels import install_plugin_kernels as install

    report = install(REGISTRY)
    for failure in report.failed:
        LOG.warning("plugin kernel not installed: %s", failure)
    return report


class GenerationInterrupted(KeyboardInterrupt):
    """Ctrl-C during ``generate``: ``outputs`` holds what each prompt generated so far
    (unfinished ones with finish reason ``aborted``)."""

    def __init__(self, outputs: list[CompletionOutput]) -> None:
        super().__init__()
        self.outputs = outputs


def _without_request_id(exc: Exception) -> str:
    text = str(exc)
    return text.split(": ", 1)[1] if text.startswith("request ") and ": " in text else text


def runner_factory(name: str) -> str:
    """The import path of runner ``name``'s factory, from the plugin that registers it; an
    unknown or ambiguous name is a ``plugins.PluginError`` saying why."""
    from interlock.plugins import load_registry

    return load_registry().runner(name).spec.factory


def runner_from_plugin(name: str) -> Runner:
    """A fresh runner object from the plugin that registers runner ``name`` (its spec's
    factory); an unknown or ambiguous name is a ``interlock.plugins.PluginError`` saying why."""
    from interlock.plugins import PluginError, load_import_path, load_registry
    from interlock.plugins.discovery import summarize
    from interlock.plugins.isolation import plugin_code

    registered = load_registry().runner(name)
    try:
        with plugin_code():
            runner = load_import_path(registered.spec.factory)()
    except Exception as exc:  # the plugin's code: quarantined for this run, with its line
        raise PluginError(
            f"runner {name!r} cannot be created: its factory {registered.spec.factory} (plugin "
            f"{registered.plugin.provider}) failed: {summarize(exc)}; choose another runner "
            f"(--set runner=...) or fix or disable the plugin"
        ) from exc
    if not isinstance(runner, Runner):
        raise PluginError(
            f"runner {name!r}: {registered.spec.factory} (plugin {registered.plugin.provider}) "
            f"built a {type(runner).__name__}, which does not implement "
            "interlock.runners.contract.Runner (load, execute, report)"
        )
    return runner


def _resolve(
    model: str | Path,
    device: str | None,
    policy_paths: Sequence[str | os.PathLike[str]] | None,
    overrides: Mapping[str, Any] | None,
    tensor_parallel_size: int,
) -> Resolution:
    """The policy's decision for ``model``: the platform is the given device's, else detected;
    the run's tensor_parallel_size is a given feature."""
    policy = load_policy(policy_paths)
    env, sources = process_env(policy)
    platform = None
    features: dict[str, Any] = {TENSOR_PARALLEL: tensor_parallel_size}
    sources[f"features.{TENSOR_PARALLEL}"] = (
        f"given (tensor_parallel_size={tensor_parallel_size})"
    )
    kind = torch.device(device).type if device is not None else None
    if kind in ("cpu", "xpu"):  # cuda is detected: the device cannot tell CUDA from ROCm
        platform = kind
        sources["platform"] = f"given (device={device!r})"
        # This machine runs it, so Triton is probed, not assumed as for a named platform.
        features["has_triton"], sources["features.has_triton"] = has_triton_fact(True)
    return resolve_model_run(
        policy, model, overrides, platform=platform, features=features, env=env, sources=sources
    )


def _given_by_caller(decision: Decision) -> str:
    values = {name: getattr(decision, name) for name in LOGGED_FIELDS}
    return decision_line(values, dict.fromkeys(LOGGED_FIELDS, GIVEN_BY_CALLER))


def _detected_device() -> str:
    return device_for(detect_platform()[0])


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    if not isinstance(prompts, Sequence):
        raise InputError(
            f"prompts must be text, a list of token ids, or a list of those; got "
            f"{type(prompts).__name__}"
        )
    prompts = list(prompts)
    if prompts and all(isinstance(p, int) for p in prompts):
        return [prompts]  # one prompt given as token ids
    return prompts


#: A tokenizer.json larger than this is refused unread (large vocabularies are ~20 MB).
MAX_TOKENIZER_BYTES = 256 * 1024 * 1024


def _load_tokenizer(directory: Path | None) -> Tokenizer | None:
    path = None if directory is None else directory / "tokenizer.json"
    if path is None or not os.path.lexists(path):
        return None
    try:
        text = decode_utf8(read_regular(path, MAX_TOKENIZER_BYTES), str(path))
        return Tokenizer.from_str(text)
    except FileProblem as exc:
        raise ModelError(f"cannot read the tokenizer: {exc}") from None
    except Exception as exc:  # tokenizers raises a bare Exception for a file it cannot parse
        raise ModelError(
            f"{path}: not a tokenizer the `tokenizers` library can load: "
            f"{' '.join(str(exc).split())[:300]}"
        ) from None


class ChatTemplate:
    """A model's Jinja chat template, rendered in a sandbox: the template comes from the
    model's files, so it may not reach Python objects beyond the values given to it."""

    def __init__(self, source: str, special_tokens: Mapping[str, str], origin: str) -> None:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals["raise_exception"] = raise_exception
        self.origin = origin
        self.special_tokens = dict(special_tokens)
        try:
            self.template = environment.from_string(source)
        except TemplateError as exc:
            raise ModelError(f"{origin}: chat_template is not a valid template: {exc}") from None

    def render(self, messages: Sequence[Message]) -> str:
        from jinja2 import TemplateError

        for i, message in enumerate(messages):
            if not (isinstance(message, Mapping) and isinstance(message.get("role"), str)
                    and isinstance(message.get("content"), str)):
                raise InputError(
                    f"message {i} is {message!r}; a message is a mapping with string 'role' "
                    "and 'content'"
                )
        try:
            return self.template.render(
                messages=[dict(m) for m in messages], add_generation_prompt=True,
                **self.special_tokens,
            )
        except TemplateError as exc:
            raise ModelError(f"{self.origin}: chat_template failed: {exc}") from None


def _load_chat_template(directory: Path | None) -> ChatTemplate | None:
    """The chat template of ``tokenizer_config.json`` (None when there is none)."""
    path = None if directory is None else directory / "tokenizer_config.json"
    if path is None or not path.is_file():
        return None
    try:
        config = read_json(path, MAX_TOKENIZER_BYTES)
    except FileProblem as exc:
        raise ModelError(f"cannot read the chat template: {exc}") from None
    template = config.get("chat_template") if isinstance(config, dict) else None
    if template is None:
        return None
    if not isinstance(template, str):
        raise ModelError(f"{path}: chat_template must be a string (one template)")
    special = {k: v for k, v in config.items() if k.endswith("_token") and isinstance(v, str)}
    return ChatTemplate(template, special, str(path))
