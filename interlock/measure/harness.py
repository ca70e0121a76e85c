"""Running the design: resolve every combination, load each configuration once, run the
trials in interleaved blocks, time every engine step."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from interlock.app.query import Query, decide_query
from interlock.app.timing import RequestTimes, decode_ms_per_token, mean_ttft_ms
from interlock.core.env import Settings
from interlock.core.errors import InputError
from interlock.core.fields import show_scalar
from interlock.measure.design import block_order, combinations
from interlock.plugins.registry import PluginRegistry

#: The harness's own time (outside the engine's steps) must stay under this share.
OVERHEAD_LIMIT = 0.01
#: Spare KV-cache blocks per sequence beyond what the workload needs.
SPARE_BLOCKS = 1
BLOCK_SIZE = 16


@dataclass(frozen=True)
class Workload:
    """What every trial runs: ``batch_size`` copies of one prompt, ``max_tokens`` each."""

    batch_sizes: tuple[int, ...] = (1,)
    prompt_len: int = 16
    prompt: str | None = None
    max_tokens: int = 32
    trials: int = 5
    warmup: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        problems = []
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            problems.append(f"batch sizes {list(self.batch_sizes)} must be integers >= 1")
        if len(set(self.batch_sizes)) != len(self.batch_sizes):
            problems.append(f"batch sizes {list(self.batch_sizes)} repeat a size")
        if self.prompt is None and self.prompt_len < 1:
            problems.append(f"prompt_len {self.prompt_len} must be >= 1")
        if self.max_tokens < 2:
            problems.append(f"max_tokens {self.max_tokens} must be >= 2 (TPOT needs two tokens)")
        if self.trials < 2:
            problems.append(f"trials {self.trials} must be >= 2 (an interval needs two)")
        if self.warmup < 0:
            problems.append(f"warmup {self.warmup} must be >= 0")
        if problems:
            raise InputError("workload: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "batch_sizes": list(self.batch_sizes)}


@dataclass(frozen=True)
class Config:
    """One configuration of the design: the levels it fixes and the decision it runs."""

    id: str
    levels: dict[str, Any]
    resolution: Any

    @property
    def label(self) -> str:
        return " ".join(f"{k}={show_scalar(v)}" for k, v in self.levels.items()) or "policy"


@dataclass
class Loaded:
    config: Config
    llm: Any
    load_s: float


def resolve_design(
    policy: Any, query: Query, factors: Mapping[str, Sequence[Any]],
    plugins: PluginRegistry | None = None,
) -> tuple[Any, list[Config], list[dict[str, Any]]]:
    """``(base resolution, configurations, skipped)``: every combination resolved with its
    levels forced on top of the query's overrides; one that stage 5 refuses is skipped
    with why."""
    from interlock.plugins.capabilities import CapabilityError

    base = decide_query(policy, query, plugins=plugins)
    configs: list[Config] = []
    skipped: list[dict[str, Any]] = []
    for levels in combinations(factors):
        try:
            resolution = decide_query(
                policy, replace(query, overrides={**query.overrides, **levels}), plugins=plugins)
        except CapabilityError as exc:
            skipped.append({"levels": _jsonable(levels), "reason": str(exc)})
            continue
        configs.append(Config(f"c{len(configs)}", levels, resolution))
    return base, configs, skipped


def load_configs(
    model: str,
    configs: Sequence[Config],
    workload: Workload,
    prompt_len: int,
    *,
    dtype: str,
    load_format: str,
    max_position: int,
    settings: Settings,
) -> list[Loaded]:
    """One ``LLM`` per configuration, sized to the workload, loaded once and kept, each
    handed ``settings`` (the environment read where the measurement started)."""
    from interlock.core.platform import device_for
    from interlock.llm import LLM

    seq_len = prompt_len + workload.max_tokens
    if seq_len > max_position:
        raise InputError(
            f"prompt ({prompt_len} tokens) + max_tokens ({workload.max_tokens}) = {seq_len} "
            f"exceeds the model's max_position_embeddings ({max_position})"
        )
    seqs = max(workload.batch_sizes)
    blocks = seqs * (-(-seq_len // BLOCK_SIZE) + SPARE_BLOCKS)
    loaded = []
    for config in configs:
        start = time.perf_counter()
        llm = LLM(
            model,
            dtype=dtype,
            load_format=load_format,
            device=device_for(config.resolution.context.platform),
            seed=workload.seed,
            block_size=BLOCK_SIZE,
            num_blocks=blocks,
            max_num_seqs=seqs,
            max_num_batched_tokens=max(2048, seqs * prompt_len),
            max_model_len=seq_len,
            decision=config.resolution.decision,
            settings=settings,
        )
        loaded.append(Loaded(config, llm, time.perf_counter() - start))
    return loaded


def run_trials(
    loaded: Sequence[Loaded],
    workload: Workload,
    prompt_ids: Sequence[int],
    progress: Callable[[], None] | None = None,
) -> tuple[list[list[int]], list[dict[str, Any]]]:
    """``(order, samples)``: ``warmup + trials`` blocks, each running every unit (a
    configuration at a batch size) once, in the order of :func:`block_order`."""
    from interlock.runners.batching.sampling import SamplingParams

    units = [(c, b) for c in range(len(loaded)) for b in workload.batch_sizes]
    order = block_order(len(units), workload.warmup + workload.trials, workload.seed)
    params = SamplingParams(temperature=0, max_tokens=workload.max_tokens, ignore_eos=True)
    samples = []
    for block, row in enumerate(order):
        for position, unit in enumerate(row):
            index, batch_size = units[unit]
            sample = _trial(loaded[index].llm.step_loop, prompt_ids, batch_size, params)
            warmup = block < workload.warmup
            samples.append(
                {
                    "config": loaded[index].config.id,
                    "batch_size": batch_size,
                    "block": block - workload.warmup,
                    "position": position,
                    "warmup": warmup,
                    **sample,
                }
            )
            if progress is not None:
                progress()
    return order, samples


def _trial(
    engine: Any, prompt_ids: Sequence[int], batch_size: int, params: Any
) -> dict[str, Any]:
    """Run one batch to completion, timing each engine step; the time outside the steps
    is the harness's (and request bookkeeping's) overhead."""
    clock = time.perf_counter
    steps: list[float] = []
    start = clock()
    requests = [engine.make_request(list(prompt_ids), params) for _ in range(batch_size)]
    for request in requests:
        engine.add_request(request)
    while engine.has_unfinished():
        began = clock()
        engine.step()
        steps.append(clock() - began)
    wall = clock() - start
    measured = sum(steps)
    tokens = sum(len(r.output_token_ids) for r in requests)
    times = [RequestTimes(arrival=r.arrival_time, first_token=r.first_token_time,
                          finish=r.finish_time, output_tokens=len(r.output_token_ids))
             for r in requests]
    decode = decode_ms_per_token(times)
    if decode is None:
        raise InputError("max_tokens must be >= 2: TPOT needs a decode step")
    return {
        "ttft_ms": round(mean_ttft_ms(times), 4),
        "tpot_ms": round(decode, 4),
        "throughput_tok_s": round(tokens / measured, 3),
        "wall_ms": _ms(wall),
        "overhead_ms": _ms(wall - measured),
        "step_ms": [_ms(s) for s in steps],
    }


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 4)


def prompt_token_ids(workload: Workload, source: Any) -> list[int]:
    """The prompt every trial runs: the text encoded by the model's ``tokenizer.json``, else
    ``prompt_len`` token ids cycling through the vocabulary (never 0, often padding)."""
    if workload.prompt is None:
        vocab = source.config.vocab_size
        return [1 + (7 * i) % (vocab - 1) for i in range(workload.prompt_len)]
    path = source.directory / "tokenizer.json" if source.directory is not None else None
    if path is None or not path.is_file():
        raise InputError(
            f"--prompt needs the model's tokenizer.json, and {source.name} has none; "
            "use --prompt-len N instead"
        )
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(path)).encode(workload.prompt).ids
    if not ids:
        raise InputError(f"--prompt {workload.prompt!r} encodes to no tokens")
    return list(ids)


def context_record(base: Any) -> dict[str, Any]:
    """The evidence record's ``context``: what the base resolution ``base`` was decided for."""
    return {
        "architecture": base.context.architecture,
        "platform": base.context.platform,
        "device_arch": base.context.device_arch,
        "traits": {name: fact.value for name, fact in base.traits.items()},
        "features": dict(base.context.features),
        "env": dict(base.context.env),
    }


def config_hash(model: str) -> str:
    """The sha256 of the model's config.json (the demo's built-in config), keys sorted."""
    from interlock.policy.context import read_model_config
    from interlock.runners.model.sources import DEMO

    if os.fspath(model) == DEMO:
        from interlock.runners.model.demo import DEMO_CONFIG

        config = dict(DEMO_CONFIG)
    else:
        config = read_model_config(model)[1]
    text = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _jsonable(levels: Mapping[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in levels.items()}
