"""Stage 5 and tensor parallelism: the run's tensor_parallel_size is a given feature, rules
condition on it, and a runner that does not serve it is refused (forced) or fallen back
from (automatic), with its trace step."""

from __future__ import annotations

import pytest
from plugin_builders import EVERY_MODE, registry_of, spec

from interlock.plugins import PlatformSupport, SpecError
from interlock.plugins.capabilities import CapabilityError, capability_stage
from interlock.policy import load_policy, load_policy_text, make_context, resolve
from interlock.policy.trace import CAPABILITIES, RULES

SHARDS = PlatformSupport(cudagraph=EVERY_MODE.cudagraph, max_tensor_parallel_size=4)
WIDE = spec("wide", {"cpu": SHARDS})
SINGLE = spec("single", fallback="wide")  # declares no tensor parallelism (the default)
REGISTRY = registry_of(WIDE, SINGLE)

POLICY = """\
schema_version: 1
version: "t"
catalog:
  Dense: {moe: false, attention: gqa}
defaults: {runner: single, cudagraph: none, breakable: false, compile: false}
rules:
  - id: sharded-runs-on-wide
    when: {features: {tensor_parallel_size: {gt: 1}}}
    set: {cudagraph: full}
    reason: sharded runs replay one full graph per step in this test policy
"""


def decide(tp: int | None, overrides: dict | None = None, text: str = POLICY):
    features = {} if tp is None else {"tensor_parallel_size": tp}
    ctx = make_context("Dense", platform="cpu", features=features)
    return resolve(load_policy_text(text), ctx, overrides, capabilities=capability_stage(REGISTRY))


def test_a_rule_on_tensor_parallel_size_is_honoured_and_explained():
    res = decide(2)
    assert res.decision.cudagraph == "full"
    assert res.provenance["cudagraph"].source == "sharded-runs-on-wide"
    assert res.context.features["tensor_parallel_size"] == 2
    matched = [s for s in res.trace if s.stage == RULES and s.name == "sharded-runs-on-wide"]
    assert matched and matched[0].matched
    assert decide(1).decision.cudagraph == "none"
    assert decide(None).decision.cudagraph == "none"


def test_an_automatic_runner_without_tensor_parallelism_falls_back_with_a_trace_step():
    res = decide(2)
    assert res.decision.runner == "wide"
    steps = [(s.name, s.note) for s in res.trace if s.stage == CAPABILITIES]
    assert steps[0][0] == "runner single -> wide"
    assert "single does not serve tensor_parallel_size=2 on cpu" in steps[0][1]
    assert "no tensor parallelism" in steps[0][1]
    assert decide(1).decision.runner == "single"


def test_a_forced_runner_without_tensor_parallelism_is_refused():
    with pytest.raises(CapabilityError) as caught:
        decide(2, overrides={"runner": "single"})
    message = str(caught.value)
    assert "runner=single is forced" in message
    assert "single does not serve tensor_parallel_size=2 on cpu" in message
    assert "runner=wide" in message  # the runner that serves it


def test_the_declared_largest_size_is_the_limit():
    assert decide(4).decision.runner == "wide"
    with pytest.raises(CapabilityError, match="wide does not serve tensor_parallel_size=8 on cpu "
                       r"\(given; it serves at most 4\)"):
        decide(8, overrides={"runner": "wide"})


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_a_bad_declared_limit_is_a_spec_error(bad):
    with pytest.raises(SpecError, match="max_tensor_parallel_size"):
        PlatformSupport(cudagraph={"none"}, max_tensor_parallel_size=bad)


def test_the_shipped_policy_decides_alike_at_one_rank_and_the_built_ins_shard():
    policy = load_policy()
    for arch in ("LlamaForCausalLM", "GlmMoeDsaForCausalLM"):
        for platform in ("cpu", "cuda", "rocm"):
            plain = make_context(arch, platform=platform)
            one = make_context(arch, platform=platform, features={"tensor_parallel_size": 1})
            two = make_context(arch, platform=platform, features={"tensor_parallel_size": 2})
            stage = capability_stage()
            base = resolve(policy, plain, capabilities=stage).decision
            assert resolve(policy, one, capabilities=stage).decision == base
            assert resolve(policy, two, capabilities=stage).decision == base
