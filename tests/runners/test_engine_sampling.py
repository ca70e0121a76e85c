"""Sampling parameters end to end: seeds, top-k / top-p support, stopping."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from tiny_models import PROMPTS

from interlock.llm import LLM
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.contract import Decision


def make_llm(tiny_models, runner=None, name: str = "llama", **kwargs) -> LLM:
    """Eager mrv1: sampling is the subject here, not the policy's decision."""
    return LLM(str(tiny_models.path(name)), runner=runner, num_blocks=64, max_model_len=96,
               decision=Decision(), **kwargs)


def test_sampling_params_are_validated():
    for kwargs, message in [
        ({"max_tokens": 0}, "max_tokens=0 is invalid"),
        ({"temperature": -1.0}, "temperature=-1.0 is invalid; allowed: a finite number >= 0"),
        ({"top_k": -2}, "top_k=-2 is invalid"),  # -1 is off, as in vLLM
        ({"top_p": 0.0}, r"top_p=0.0 is invalid; allowed: a number with 0 < top_p <= 1"),
        ({"seed": -3}, "seed=-3 is out of range"),
    ]:
        with pytest.raises(ValueError, match=message):
            SamplingParams(**kwargs)


def test_a_seed_fixes_the_sample_whatever_the_batch(tiny_models):
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=7, ignore_eos=True)
    llm = make_llm(tiny_models)
    alone = llm.generate([PROMPTS[0]], params)[0].token_ids
    together = llm.generate(PROMPTS, [params, SamplingParams(max_tokens=5, temperature=1.0),
                                      SamplingParams(temperature=0, max_tokens=9)])[0].token_ids
    assert together == alone
    other_seed = SamplingParams(max_tokens=24, temperature=1.0, seed=8, ignore_eos=True)
    assert llm.generate([PROMPTS[0]], other_seed)[0].token_ids != alone


def test_unseeded_requests_follow_the_engine_seed(tiny_models):
    params = SamplingParams(max_tokens=24, temperature=1.0, ignore_eos=True)
    first = make_llm(tiny_models, seed=3).generate(PROMPTS, params)
    again = make_llm(tiny_models, seed=3).generate(PROMPTS, params)
    other = make_llm(tiny_models, seed=4).generate(PROMPTS, params)
    assert [o.token_ids for o in first] == [o.token_ids for o in again]
    assert [o.token_ids for o in first] != [o.token_ids for o in other]


def sampled_with_logits(tiny_models, recording_runner, params: SamplingParams):
    """(logits row, sampled token) for every decode step of one request."""
    runner = recording_runner()
    output = make_llm(tiny_models, runner).generate([PROMPTS[2]], params)[0]
    return list(zip((step[0] for step in runner.logits), output.token_ids, strict=True))


def test_top_k_samples_only_among_the_k_best(tiny_models, recording_runner):
    params = SamplingParams(max_tokens=32, temperature=2.0, top_k=3, seed=1, ignore_eos=True)
    steps = sampled_with_logits(tiny_models, recording_runner, params)
    for logits, token in steps:
        assert token in torch.topk(logits, 3).indices.tolist()
    assert len({token for _, token in steps}) > 1
    greedy = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    top1 = SamplingParams(max_tokens=32, temperature=2.0, top_k=1, seed=1, ignore_eos=True)
    llm = make_llm(tiny_models)
    [sampled], [argmax] = llm.generate([PROMPTS[2]], top1), llm.generate([PROMPTS[2]], greedy)
    assert sampled.token_ids == argmax.token_ids


def test_top_p_samples_only_inside_the_nucleus(tiny_models, recording_runner):
    temperature, top_p = 1.5, 0.6
    params = SamplingParams(max_tokens=32, temperature=temperature, top_p=top_p, seed=5,
                            ignore_eos=True)
    for logits, token in sampled_with_logits(tiny_models, recording_runner, params):
        probs, order = torch.softmax(logits / temperature, dim=-1).sort(descending=True)
        before = probs.cumsum(0) - probs  # mass of strictly more likely tokens
        nucleus = order[before < top_p].tolist()
        assert token in nucleus


def test_eos_stops_unless_ignored_and_stop_tokens_stop(tiny_models, tmp_path):
    directory = shutil.copytree(tiny_models.path("llama"), tmp_path / "llama")
    greedy = make_llm(tiny_models).generate([PROMPTS[1]], SamplingParams(temperature=0,
        max_tokens=12))[0]
    eos = greedy.token_ids[3]
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    llm = LLM(str(directory), num_blocks=64, max_model_len=96, decision=Decision())
    stopped = llm.generate([PROMPTS[1]], SamplingParams(temperature=0, max_tokens=12))[0]
    cut = greedy.token_ids.index(eos) + 1
    assert (stopped.token_ids, stopped.finish_reason) == (greedy.token_ids[:cut], "stop")
    ignored = llm.generate([PROMPTS[1]], SamplingParams(temperature=0, max_tokens=12,
        ignore_eos=True))[0]
    assert (ignored.token_ids, ignored.finish_reason) == (greedy.token_ids, "length")
    stop_at = greedy.token_ids[1]
    by_stop_id = llm.generate([PROMPTS[1]], SamplingParams(temperature=0,
        max_tokens=12, ignore_eos=True, stop_token_ids=(stop_at,)))[0]
    assert by_stop_id.token_ids == greedy.token_ids[:greedy.token_ids.index(stop_at) + 1]
