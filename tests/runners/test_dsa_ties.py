"""DSA where the indexer must choose among equal scores (issue 36): 2 indexer heads, so a
score of exactly 0 is common, and a top-4 of contexts up to 28 tokens. Token for token
with transformers fed as the runner was (one-shot prefill, prefill chunks, decode steps,
preemptions), through every runner and graph mode, on two ranks, and as a property over
index_topk, context length and indexer heads."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_oracle import transformers_greedy, transformers_replay
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import TIE_CONFIGS, make_checkpoint

from interlock.kernels.native import unavailable as native_unavailable
from interlock.llm import LLM
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.contract import Decision

MODELS = list(TIE_CONFIGS)
# Prompts of 8 to 16 tokens, as the issue's; with 12 new tokens the contexts reach 28.
PROMPTS = [[88, 3, 41, 17, 102, 9, 66, 120],
           [53, 7, 99, 12, 31, 77, 5, 108, 64, 2, 45],
           [10, 60, 21, 94, 35, 118, 4, 73, 29, 86, 51, 14, 100, 38, 57, 6],
           [63, 11, 25, 90, 47, 70, 19, 114, 33, 81, 8, 58, 97]]
MAX_TOKENS = [12, 9, 12, 10]
CPU_GRAPHS = "debug" if native_unavailable("cpu") else "native"
MODES = [("none", False), ("piecewise", False), ("full_and_piecewise", False),
         ("full_and_piecewise", True), ("full", False), ("full_decode_only", False)]

Steps = list[tuple[int, int]]


def run(llm: LLM, prompts: Sequence[Sequence[int]], max_tokens: Sequence[int]
        ) -> tuple[list[list[int]], list[Steps]]:
    """Greedy tokens of every prompt, all queued at once, and each request's steps as the
    scheduler gave them: (start_position, token count)."""
    engine = llm.step_loop
    requests = [engine.make_request(p, SamplingParams(temperature=0, max_tokens=n,
                                                      ignore_eos=True))
                for p, n in zip(prompts, max_tokens, strict=True)]
    steps: dict[str, Steps] = {r.request_id: [] for r in requests}
    schedule = engine.scheduler.schedule

    def recording_schedule() -> Any:
        batch = schedule()
        for sequence in batch.sequences:
            steps[sequence.request_id].append((sequence.start_position,
                                               len(sequence.token_ids)))
        return batch

    engine.scheduler.schedule = recording_schedule  # type: ignore[method-assign]
    try:
        for request in requests:
            engine.add_request(request)
        while engine.has_unfinished():
            engine.step()
    finally:
        del engine.scheduler.schedule  # the class's own again
    return ([list(r.output_token_ids) for r in requests],
            [steps[r.request_id] for r in requests])


def make_llm(path: Path, decision: Decision, **engine: Any) -> LLM:
    options = {"block_size": 4, "num_blocks": 96, "max_model_len": 64, "max_num_seqs": 4,
               **engine}
    return LLM(str(path), dtype="float32", decision=decision, **options)


def replayed(model: Any, prompts: Sequence[Sequence[int]], steps: Sequence[Steps]
             ) -> list[list[int]]:
    return [transformers_replay(model, p, s) for p, s in zip(prompts, steps, strict=True)]


def index_score_rows(model: Any, prompt: Sequence[int]) -> list[torch.Tensor]:
    """transformers' indexer scores [S, S] of each indexer layer over a one-shot prefill
    of ``prompt``: what its indexers hand torch.topk."""
    rows: list[torch.Tensor] = []
    topk = torch.Tensor.topk

    def recording_topk(scores: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        rows.append(scores[0].clone())
        return topk(scores, *args, **kwargs)

    indexers = [layer.self_attn.indexer for layer in model.model.layers
                if getattr(layer.self_attn, "indexer", None) is not None]
    hooks = [m.register_forward_pre_hook(lambda *_: setattr(torch.Tensor, "topk",
                                                             recording_topk))
             for m in indexers]
    hooks += [m.register_forward_hook(lambda *_: setattr(torch.Tensor, "topk", topk))
              for m in indexers]
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([list(prompt)]))
    finally:
        torch.Tensor.topk = topk  # type: ignore[method-assign]
        for hook in hooks:
            hook.remove()
    return rows


@pytest.mark.parametrize("name", MODELS)
def test_these_checkpoints_tie_at_the_cut_where_the_lowest_positions_are_not_torch_topk(
    name, tiny_models
):
    """What makes the tests below bite: transformers' indexer rows often hold equal
    scores at the top-4 cut, and torch.topk then keeps other positions than the lowest
    (the rule the op had before issue 36)."""
    ties = differs = 0
    for prompt in PROMPTS:
        for scores in index_score_rows(tiny_models.hf(name), prompt):
            for token, row in enumerate(scores):
                visible = row[: token + 1]
                if visible.shape[0] <= 4:
                    continue
                ordered = visible.sort(descending=True).values
                ties += bool(ordered[3] == ordered[4])
                kept = set(torch.topk(row, 4).indices.tolist())
                lowest = torch.sort(visible, descending=True, stable=True).indices[:4]
                differs += kept != set(lowest.tolist())
    assert ties >= 5 and differs >= 3, (ties, differs)


def test_transformers_own_tokens_depend_on_how_the_prompt_is_chunked(tiny_models):
    """Why chunked runs are checked against transformers fed the same chunks: its rows
    end where the chunk does, and torch.topk on the CPU breaks ties by the whole row
    (the same visible scores, two more hidden positions: another pick)."""
    row = torch.tensor([0.5, 0.0, 0.0, 0.0, 0.0, float("-inf"), float("-inf")])
    assert set(torch.topk(row, 3).indices.tolist()) != set(torch.topk(row[:5], 3).indices.tolist())
    model = tiny_models.hf("deepseek_v32_ties")
    one_shot = [transformers_greedy(model, p, n) for p, n in zip(PROMPTS, MAX_TOKENS,
                                                                   strict=True)]
    in_threes = [[(s, min(3, len(p) - s)) for s in range(0, len(p), 3)]
                 + [(len(p) + i, 1) for i in range(n - 1)]
                 for p, n in zip(PROMPTS, MAX_TOKENS, strict=True)]
    assert replayed(model, PROMPTS, in_threes) != one_shot


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_one_shot_prefill_and_decode_give_transformers_tokens(runner, name, tiny_models):
    """Every prompt prefilled in one step, alone and batched: transformers' plain greedy
    loop is the oracle."""
    oracle = [transformers_greedy(tiny_models.hf(name), p, n)
              for p, n in zip(PROMPTS, MAX_TOKENS, strict=True)]
    llm = make_llm(tiny_models.path(name), Decision(runner), max_num_batched_tokens=64)
    tokens, steps = run(llm, PROMPTS, MAX_TOKENS)
    assert tokens == oracle
    assert all(s[0] == (0, len(p)) for s, p in zip(steps, PROMPTS, strict=True))
    assert [run(llm, [p], [n])[0][0] for p, n in zip(PROMPTS, MAX_TOKENS, strict=True)] == oracle


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize(("mode", "breakable"), MODES,
                         ids=[f"{m}{'-breakable' if b else ''}" for m, b in MODES])
@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_every_runner_and_graph_mode_gives_transformers_tokens_over_chunked_prefill(
    runner, mode, breakable, name, tiny_models
):
    """A budget of 10 tokens a step: long prompts prefill in chunks, beside other
    requests' chunks and decode steps, captured or not."""
    decision = Decision(runner, mode, breakable, capture_sizes=(1, 2, 4, 8))
    llm = make_llm(tiny_models.path(name), decision, max_num_batched_tokens=10)
    tokens, steps = run(llm, PROMPTS, MAX_TOKENS)

    assert tokens == replayed(tiny_models.hf(name), PROMPTS, steps)
    prefill_steps = [sum(start < len(p) for start, _ in s) for s, p in zip(steps, PROMPTS,
                                                                           strict=True)]
    assert max(prefill_steps) > 1, "no prompt was prefilled in chunks"
    report = llm.report()
    assert report.graphs.backend == ("none" if mode == "none" else CPU_GRAPHS)
    assert not report.graphs.failed and not report.fallbacks
    if mode != "none":
        assert report.graphs.captured


@pytest.mark.parametrize("name", MODELS)
def test_preempted_requests_recompute_the_tokens_transformers_recomputes(name, tiny_models):
    """Few blocks: requests are preempted and recomputed from their prompt and tokens."""
    llm = make_llm(tiny_models.path(name), Decision("mrv2", "full_and_piecewise"),
                   num_blocks=14, max_num_batched_tokens=10)
    tokens, steps = run(llm, PROMPTS, MAX_TOKENS)
    assert tokens == replayed(tiny_models.hf(name), PROMPTS, steps)
    assert any(start == 0 for s in steps for start, _ in s[1:]), "nothing was preempted"


# slow: each LLM starts two ranks (about 10 s each on the 2-core machine).
@pytest.mark.slow
@pytest.mark.parametrize(("runner", "mode"), [("mrv1", "none"),
                                              ("mrv2", "full_and_piecewise")])
@pytest.mark.parametrize("name", MODELS)
def test_two_ranks_give_transformers_tokens(name, runner, mode, tiny_models):
    """Every rank runs the replicated indexer and selects alike; each attends with its
    two of the four heads."""
    llm = make_llm(tiny_models.path(name), Decision(runner, mode, capture_sizes=(1, 2, 4)),
                   max_num_batched_tokens=10, tensor_parallel_size=2)
    try:
        tokens, steps = run(llm, PROMPTS, MAX_TOKENS)
        split = llm.report().tensor_parallel
        assert split is not None and split.size == 2
    finally:
        llm.close()
    assert tokens == replayed(tiny_models.hf(name), PROMPTS, steps)


# A checkpoint built and loaded per example: about half a second each.
@settings(max_examples=8, deadline=None)
@given(name=st.sampled_from(MODELS), top_k=st.integers(1, 6), heads=st.integers(1, 4),
       context=st.integers(2, 20), budget=st.sampled_from([3, 7, 64]),
       seed=st.integers(0, 2**16))
def test_any_top_k_context_and_index_heads_give_transformers_tokens(
    name: str, top_k: int, heads: int, context: int, budget: int, seed: int
) -> None:
    model_type, architecture, extra = TIE_CONFIGS[name]
    extra = {**extra, "index_topk": top_k, "index_n_heads": heads}
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, 128, (n,), generator=gen).tolist() for n in (context, 5)]
    with tempfile.TemporaryDirectory() as directory:
        model = make_checkpoint(Path(directory), model_type, architecture, extra, seed)
        llm = make_llm(Path(directory), Decision("mrv1"), max_num_batched_tokens=budget)
        tokens, steps = run(llm, prompts, [6, 6])
    assert tokens == replayed(model, prompts, steps)
