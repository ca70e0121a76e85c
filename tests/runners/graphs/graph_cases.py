"""The graph tests' shared cases: prompts, capture sizes, the transformers oracle, runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from tiny_models import TinyModels

# Lengths 1..13 and staggered lengths of output: with a 10-token budget, steps
# mix prefill chunks and decodes, and batches shrink as requests finish, so their
# token counts fall on (1, 2, 4), between (3, 6) and above (10) capture sizes.
PROMPTS = [
    [7, 93, 12, 54, 3],
    [17],
    [33, 4, 120, 58, 77, 11, 96, 23, 64],
    [5, 9, 2],
    [81, 14, 6, 70, 29, 101, 44, 3, 12, 99, 8, 61, 37],
    [66, 18],
]
MAX_TOKENS = [3, 5, 7, 9, 11, 12]
CAPTURE_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Oracle:
    path: Path
    tokens: list[list[int]]  # transformers' greedy continuation of each prompt


def make_oracle(models: TinyModels, name: str) -> Oracle:
    hf = models.hf(name)
    tokens = []
    with torch.no_grad():
        for prompt, count in zip(PROMPTS, MAX_TOKENS, strict=True):
            out = hf.generate(
                input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt)),
                max_new_tokens=count, min_new_tokens=count, do_sample=False, pad_token_id=0,
            )
            tokens.append(out[0, len(prompt):].tolist())
    return Oracle(models.path(name), tokens)


@dataclass
class Routes:
    """Every step's batch shape and the key (or eager reason) that served it."""

    steps: list[tuple[int, int, bool, str]]

    def kinds(self) -> set[str]:
        return {key for *_, key in self.steps}


def run_case(path: Path, runner, decision, **engine) -> tuple[list[list[int]], Routes, object]:
    """Generate every prompt through ``runner`` (an instance, or None: through its plugin)."""
    from interlock.llm import LLM
    from interlock.runners.batching.sampling import SamplingParams

    options = {
        "block_size": 4, "num_blocks": 96, "max_model_len": 64, "max_num_seqs": 6,
        "max_num_batched_tokens": 10, **engine,
    }
    llm = LLM(str(path), dtype="float32", runner=runner, decision=decision, **options)
    graphs = llm.step_loop.runner.graphs
    routes = Routes([])
    select = graphs.select

    def recording(num_tokens: int, num_seqs: int, decode_only: bool):
        chosen = select(num_tokens, num_seqs, decode_only)
        route = graphs.plan.route(num_tokens, num_seqs, decode_only)
        label = chosen[0].label if chosen else f"eager: {route.reason or 'capture failed'}"
        routes.steps.append((num_tokens, num_seqs, decode_only, label))
        return chosen

    graphs.select = recording
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    outputs = llm.generate(PROMPTS, params)
    return [list(o.token_ids) for o in outputs], routes, llm.report()
