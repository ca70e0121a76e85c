"""One question, one answer: every entry point builds a Query once and decide_query() answers it;
what runs afterwards is handed the result (debug graphs included), never the environment."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from interlock.app.query import Query, decide_query, model_target
from interlock.core.errors import InputError, PolicyError
from interlock.llm import LLM
from interlock.policy.loader import load_policy
from interlock.runners.contract import Decision, KVCacheSpec
from interlock.runners.parallel import messages

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("INTERLOCK_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("INTERLOCK_POLICY", "INTERLOCK_DEBUG_GRAPHS", "VLLM_USE_V2_MODEL_RUNNER",
                 "VLLM_USE_BREAKABLE_CUDAGRAPH"):
        monkeypatch.delenv(name, raising=False)


def test_the_command_line_the_api_and_decide_answer_alike(tiny_models, cli):
    path = str(tiny_models.path("llama"))
    policy = load_policy(None)
    direct = decide_query(policy, Query(model=model_target(path), platform="cpu"))
    shown = cli("explain", "--model", path, "--platform", "cpu", "--json")
    assert shown.code == 0, shown.err
    assert json.loads(shown.out)["decision"] == direct.decision.to_dict()
    llm = LLM(path, num_blocks=8, max_model_len=32, max_num_seqs=1, max_num_batched_tokens=8,
              device="cpu")
    assert llm.resolution is not None
    assert llm.resolution.decision == direct.decision
    assert llm.resolution.context.architecture == direct.context.architecture == "LlamaForCausalLM"
    llm.close()


def test_the_run_split_is_one_feature_and_a_disagreeing_one_is_named():
    policy = load_policy(None)
    query = Query(architecture="LlamaForCausalLM", platform="cpu", tensor_parallel_size=2,
                  tensor_parallel_given="--tensor-parallel-size 2")
    context = decide_query(policy, query).context
    assert context.features["tensor_parallel_size"] == 2
    assert context.source("features.tensor_parallel_size") == "given (--tensor-parallel-size 2)"
    clash = replace(query, features={"tensor_parallel_size": 4},
                    sources={"features.tensor_parallel_size": "given with --feature"})
    with pytest.raises(InputError, match=r"tensor_parallel_size=4 \(given with --feature\) "
                                         r"disagrees with --tensor-parallel-size 2"):
        decide_query(policy, clash)


def test_a_run_elsewhere_is_refused_and_vllm_runners_skip_stage_5():
    policy = load_policy(None)
    with pytest.raises(PolicyError, match="--platform rocm: this command runs the model on "
                                          "this machine"):
        decide_query(policy, Query(architecture="LlamaForCausalLM", platform="rocm",
                                   runs_here=True))
    # vLLM runs its own runners: no interlock plugin judges them, so the same query decides
    # with or without them, and neither reads the process environment by itself.
    asked = Query(architecture="LlamaForCausalLM", platform="rocm", device_arch="gfx942")
    by_vllm = decide_query(policy, replace(asked, executed_by="vllm"))
    assert by_vllm.decision.runner in ("mrv1", "mrv2")


def test_debug_graphs_reach_the_runner_in_its_spec(tiny_models, monkeypatch):
    path = str(tiny_models.path("llama"))
    decision = Decision("mrv1", "full", capture_sizes=(1, 2))
    small = dict(num_blocks=8, max_model_len=32, max_num_seqs=1, max_num_batched_tokens=8,
                 device="cpu", decision=decision)
    asked = LLM(path, debug_graphs=True, **small)
    assert asked.step_loop.model.debug_graphs is True
    assert asked.report().graphs.backend == "debug"
    asked.close()
    # The environment is read once, where the LLM is made; an explicit False wins over it.
    monkeypatch.setenv("INTERLOCK_DEBUG_GRAPHS", "1")
    by_env = LLM(path, **small)
    assert by_env.step_loop.model.debug_graphs is True
    by_env.close()
    refused = LLM(path, debug_graphs=False, **small)
    assert refused.step_loop.model.debug_graphs is False
    refused.close()
    # Every tensor-parallel rank is handed the same spec: the setting travels in its message.
    message = messages.load_message(asked.step_loop.model, KVCacheSpec(8, 16), decision, "f:g")
    assert messages.load_parts(json.loads(json.dumps(message)))[0]["debug_graphs"] is True
