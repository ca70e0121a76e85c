"""The Python API: ``LLM(model=...).generate(prompts, sampling_params)``.

    from runners.llm import LLM
    from runners.engine.sampling import SamplingParams

    llm = LLM("demo")
    [out] = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=8))
    out.token_ids  # (8 token ids)

A model directory with a ``tokenizer.json`` also accepts text prompts and
returns text. The runner is the one ``decision.runner`` names (default
``RunDecision()``: mrv1, no graphs), created through the plugin that
registers it, or an object given as ``runner``; it serves the decision's
cudagraph mode, breakable capture and capture sizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from runners.contract import ModelSpec, RunDecision, Runner, RunnerReport
from runners.engine.engine import Engine, EngineConfig
from runners.engine.kv_cache import plan_kv_cache
from runners.engine.request import Request
from runners.engine.sampling import SamplingParams
from runners.model.checkpoint import resolve_dtype, resolve_model

Prompt = str | Sequence[int]


@dataclass(frozen=True)
class CompletionOutput:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    text: str | None  # None without a tokenizer
    finish_reason: str  # "length" | "stop"
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
        decision: RunDecision | None = None,
    ) -> None:
        source = resolve_model(model)
        config = source.config
        resolved_dtype = resolve_dtype(dtype, config)
        limit = config.max_position_embeddings
        if max_model_len is None:
            max_model_len = limit
        elif not 0 < max_model_len <= limit:
            raise ValueError(
                f"max_model_len={max_model_len} is invalid; allowed: 1..{limit} "
                "(the model's max_position_embeddings)"
            )
        spec = ModelSpec(
            name=source.name,
            config=config,
            dtype=resolved_dtype,
            device=device or ("cuda" if torch.cuda.is_available() else "cpu"),
            load_format=load_format,
            seed=seed,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
        )
        kv_cache = plan_kv_cache(
            config, resolved_dtype, block_size, max_model_len, max_num_seqs,
            num_blocks=num_blocks, kv_cache_memory=kv_cache_memory,
        )
        self.tokenizer = _load_tokenizer(source.directory)
        decision = decision if decision is not None else RunDecision()
        self.engine = Engine(
            spec,
            kv_cache,
            runner if runner is not None else runner_from_plugin(decision.runner),
            decision,
            EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                         seed=seed),
        )

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[CompletionOutput]:
        """Run every prompt to completion; outputs in prompt order.

        All requests are validated before any runs: one that cannot fit the
        engine even alone raises ``RequestRejected`` and nothing is run.
        """
        batch = _as_prompt_list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(batch)
        else:
            params = list(sampling_params)
            if len(params) != len(batch):
                raise ValueError(f"{len(params)} sampling params for {len(batch)} prompts")
        requests = [
            self.engine.make_request(self.encode(prompt), p)
            for prompt, p in zip(batch, params, strict=True)
        ]
        for request in requests:
            self.engine.add_request(request)
        while self.engine.has_unfinished():
            self.engine.step()
        return [self._output(r) for r in requests]

    def encode(self, prompt: Prompt) -> list[int]:
        if not isinstance(prompt, str):
            return list(prompt)
        if self.tokenizer is None:
            raise ValueError(
                "text prompts need a tokenizer.json in the model directory; pass token ids instead"
            )
        return self.tokenizer.encode(prompt).ids

    def report(self) -> RunnerReport:
        return self.engine.report()

    def _output(self, request: Request) -> CompletionOutput:
        tokens = tuple(request.output_token_ids)
        text = None
        if self.tokenizer is not None:
            text = self.tokenizer.decode(list(tokens), skip_special_tokens=True)
        ttft = request.first_token_time - request.arrival_time
        decode_time = request.finish_time - request.first_token_time
        return CompletionOutput(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            token_ids=tokens,
            text=text,
            finish_reason=request.finish_reason.value,
            ttft_s=ttft,
            tpot_s=decode_time / (len(tokens) - 1) if len(tokens) > 1 else 0.0,
        )


def runner_from_plugin(name: str) -> Runner:
    """A fresh runner object from the plugin that registers runner ``name`` (its spec's
    factory); an unknown or ambiguous name is a ``plugins.PluginError`` saying why."""
    from plugins import load_import_path, load_registry

    registered = load_registry().runner(name)
    runner = load_import_path(registered.spec.factory)()
    if not isinstance(runner, Runner):
        raise TypeError(
            f"runner {name!r}: {registered.spec.factory} (plugin {registered.plugin.provider}) "
            f"built a {type(runner).__name__}, which does not implement runners.contract.Runner "
            "(load, execute, report)"
        )
    return runner


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(p, int) for p in prompts):
        return [prompts]  # one prompt given as token ids
    return prompts


def _load_tokenizer(directory: Path | None) -> Tokenizer | None:
    if directory is None or not (directory / "tokenizer.json").is_file():
        return None
    return Tokenizer.from_file(str(directory / "tokenizer.json"))
