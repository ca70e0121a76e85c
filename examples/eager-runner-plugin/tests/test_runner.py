"""The eager runner serves a model: the same tokens as interlock's mrv1, greedy
or sampled with penalties, min_p and logprobs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from interlock_eager.runner import EagerRunner, EagerRunnerError

from interlock.llm import LLM
from interlock.plugins import load_registry
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.contract import Decision
from interlock.runners.mrv1.runner import MRV1Runner
from interlock.testing.checks import TINY_LLAMA, TINY_PROMPTS


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-llama")
    (directory / "config.json").write_text(json.dumps(TINY_LLAMA))
    return directory


def llm(model: Path, runner: object, **kw: object) -> LLM:
    """The runner object with ``decision`` (default: eager, no graphs)."""
    kw.setdefault("decision", Decision())
    return LLM(
        model,
        load_format="dummy",
        dtype="float32",
        device="cpu",
        runner=runner,
        max_num_batched_tokens=8,
        max_model_len=64,
        max_num_seqs=4,
        **kw,
    )


def test_greedy_tokens_match_mrv1(tiny_model: Path) -> None:
    runner = EagerRunner()
    prompts, params = list(TINY_PROMPTS), SamplingParams(temperature=0, max_tokens=6)
    tokens = [o.token_ids for o in llm(tiny_model, runner).generate(prompts, params)]
    expected = [o.token_ids for o in llm(tiny_model, MRV1Runner()).generate(prompts, params)]
    assert tokens == expected
    report = runner.report()
    assert (report.runner, report.cudagraph, report.fallbacks) == ("eager", "none", ())


def test_penalties_min_p_and_logprobs_match_mrv1(tiny_model: Path) -> None:
    prompts = list(TINY_PROMPTS)
    params = SamplingParams(temperature=0.9, seed=5, max_tokens=6, ignore_eos=True, min_p=0.05,
                            repetition_penalty=1.4, presence_penalty=0.5, logprobs=2)
    ours = llm(tiny_model, EagerRunner()).generate(prompts, params)
    theirs = llm(tiny_model, MRV1Runner()).generate(prompts, params)
    assert [o.token_ids for o in ours] == [o.token_ids for o in theirs]
    for a, b in zip(ours, theirs, strict=True):
        assert a.outputs[0].cumulative_logprob == pytest.approx(b.outputs[0].cumulative_logprob)


def test_its_kernel_is_dispatched_when_installed(tiny_model: Path) -> None:
    if load_registry().find("eager") is None:
        pytest.skip("the plugin is not installed: its entry point registers the kernel")
    runner = EagerRunner()
    llm(tiny_model, runner)
    kernels = {k.op: k.implementation for k in runner.report().kernels}
    assert kernels["silu_and_mul"] == "eager_example (eager)"


def test_refuses_what_its_spec_does_not_declare(tiny_model: Path) -> None:
    with pytest.raises(EagerRunnerError, match="got cudagraph=piecewise"):
        llm(tiny_model, EagerRunner(), decision=Decision(runner="eager", cudagraph="piecewise"))
