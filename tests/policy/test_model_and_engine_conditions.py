"""Config, model and engine conditions: matching, unknown facts, typing, bounds, the domain."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from interlock.core.errors import PolicyError
from interlock.policy import load_policy_text, make_context, parse_when, resolve
from interlock.policy.conditions import Facts, flatten_config
from interlock.policy.context import Context
from interlock.policy.diff import diff_policies, render_text
from interlock.policy.domain import Domain

GLM53 = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "model_type": "glm_moe_dsa",
    "_name_or_path": "zai-org/GLM-5.3",
    "num_hidden_layers": 78,
    "index_topk": 2048,
    "n_routed_experts": 256,
    "rope_scaling": None,
    "tie_word_embeddings": False,
    "layer_types": ["full_attention"],
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
}


def _facts(config: dict | None = None, model: tuple[str, ...] = (), **engine: str) -> Facts:
    flat = None if config is None else flatten_config(config)
    return Facts("GlmMoeDsaForCausalLM", "rocm", "gfx950", {}, {}, flat, model, engine)


def test_config_conditions_match_on_dotted_paths_with_feature_operators() -> None:
    when = parse_when({
        "config": {
            "num_hidden_layers": {"gt": 70},
            "quantization_config.quant_method": "fp8",
            "model_type": ["glm_moe_dsa", "deepseek_v32"],
        }
    })  # fmt: skip
    assert when.matches(_facts(GLM53))
    assert when.first_failure(_facts(GLM53)) is None
    smaller = {**GLM53, "num_hidden_layers": 70}
    failure = when.first_failure(_facts(smaller))
    assert failure is not None and failure.describe() == (
        "config.num_hidden_layers: wanted > 70, observed 70"
    )


@pytest.mark.parametrize(
    ("config", "observed"),
    [
        (None, "unknown (no model config)"),
        ({"model_type": "glm_moe_dsa"}, "unknown (absent from the model config)"),
    ],
)
def test_a_config_fact_that_is_unknown_never_matches_and_says_why(
    config: dict | None, observed: str
) -> None:
    when = parse_when({"config": {"num_hidden_layers": {"gt": 70}}})
    assert not when.matches(_facts(config))
    failure = when.first_failure(_facts(config))
    assert failure is not None and failure.unknown
    assert failure.describe() == f"config.num_hidden_layers: wanted > 70, observed {observed}"
    # `ne` does not match an unknown value either: unknown is not "different".
    assert not parse_when({"config": {"num_hidden_layers": {"ne": 1}}}).matches(_facts(config))


def test_config_values_are_compared_as_json_types_them() -> None:
    facts = _facts(GLM53)
    # A JSON boolean is not the number 0, a JSON number is not a string, null equals nothing.
    assert parse_when({"config": {"tie_word_embeddings": False}}).matches(facts)
    assert not parse_when({"config": {"tie_word_embeddings": 0}}).matches(facts)
    assert not parse_when({"config": {"num_hidden_layers": "78"}}).matches(facts)
    assert parse_when({"config": {"num_hidden_layers": 78.0}}).matches(facts)
    assert not parse_when({"config": {"model_type": {"gt": 1}}}).matches(facts)
    assert not parse_when({"config": {"rope_scaling": "none"}}).matches(facts)
    assert parse_when({"config": {"rope_scaling": {"ne": "none"}}}).matches(facts)


def test_a_non_scalar_config_value_never_matches_and_says_what_it_is() -> None:
    when = parse_when({"config": {"quantization_config": "fp8"}})
    failure = when.first_failure(_facts(GLM53))
    assert failure is not None and not when.matches(_facts(GLM53))
    assert failure.describe() == (
        "config.quantization_config: wanted = fp8, observed a JSON object, not a scalar"
    )
    arrays = parse_when({"config": {"layer_types": "full_attention"}})
    assert "a JSON array, not a scalar" in str(arrays.first_failure(_facts(GLM53)).describe())


@pytest.mark.parametrize(
    ("when", "message"),
    [
        ({"config": {".".join("a" * 9): 1}}, "has 9 parts; a path has at most 8"),
        ({"config": {"a" * 201: 1}}, "a path has at most 200"),
        ({"config": {"a..b": 1}}, "has an empty part"),
        ({"config": {"quantization_config": {"quant_method": "fp8"}}}, "unknown field"),
        ({"config": {"a": None}}, "config.a"),
        ({"config": {}}, "at least 1 item"),
        ({"engine": {"vllm": "newest"}}, "not a PEP 440 version specifier set"),
        ({"engine": {"trtllm": ">=1"}}, "engine.trtllm"),
        ({"model": []}, "model"),
    ],
)
def test_absurd_conditions_are_refused_naming_the_key(when: dict, message: str) -> None:
    with pytest.raises(PolicyError) as exc:
        parse_when(when)
    assert message in str(exc.value)


def test_model_globs_match_any_identity_case_insensitively() -> None:
    when = parse_when({"model": "*GLM-5.3*"})
    assert when.matches(_facts(model=("GLM-5.3-FP8",)))
    assert when.matches(_facts(model=("models", "zai-org/glm-5.3")))
    assert not when.matches(_facts(model=("GLM-5.2",)))
    failure = when.first_failure(_facts())
    assert failure is not None and failure.describe() == (
        "model: wanted *GLM-5.3*, observed unknown (no model identity)"
    )


def test_engine_conditions_are_pep_440_specifier_sets() -> None:
    when = parse_when({"engine": {"vllm": ">=0.32,<0.34"}})
    assert when.matches(_facts(vllm="0.32.0"))
    assert when.matches(_facts(vllm="0.33.1.dev5+g1234"))  # a dev build of the line
    assert not when.matches(_facts(vllm="0.34.0"))
    assert not when.matches(_facts(vllm="0.31.9"))
    failure = when.first_failure(_facts())
    assert failure is not None and failure.unknown
    assert "observed unknown (no vllm version" in failure.describe()
    assert when.first_failure(_facts(vllm="0.29.0")).describe() == (
        "engine.vllm: wanted >=0.32,<0.34, observed 0.29.0"
    )


def test_a_context_refuses_an_engine_version_that_is_not_pep_440() -> None:
    with pytest.raises(PolicyError, match="is not a PEP 440 version"):
        Context("A", engine={"vllm": "latest"})
    with pytest.raises(PolicyError, match="unknown engine"):
        Context("A", engine={"trtllm": "1.0"})


POLICY = """\
schema_version: 1
version: t
catalog:
  GlmMoeDsaForCausalLM: {family: glm, moe: true, attention: dsa}
defaults: {runner: mrv2, cudagraph: full_and_piecewise, breakable: false, compile: true}
rules:
  - id: rocm-dsa-mrv1
    when: {platform: rocm, attention: dsa}
    set: {runner: mrv1}
    reason: DSA models are faster on MRV1 on ROCm
  - id: deep-fp8-mrv2
    when:
      platform: rocm
      config: {num_hidden_layers: {gt: 70}, quantization_config.quant_method: fp8}
    set: {runner: mrv2}
    reason: the deep FP8 checkpoint loses accuracy on MRV1
"""


def _model_dir(tmp_path: Path, name: str, config: dict) -> Path:
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_a_model_directory_gives_its_config_and_identity(tmp_path: Path) -> None:
    policy = load_policy_text(POLICY, "p.yaml")
    deep = _model_dir(tmp_path, "GLM-5.3-FP8", GLM53)
    context = make_context(model=deep, platform="rocm", model_id="mirror/glm")
    assert context.model_names == ("mirror/glm", "GLM-5.3-FP8", "zai-org/GLM-5.3")
    assert context.config_fact("num_hidden_layers") == (78, f"model config ({deep}/config.json)")
    res = resolve(policy, context)
    assert res.decision.runner == "mrv2" and res.provenance["runner"].source == "deep-fp8-mrv2"
    shallow = _model_dir(tmp_path, "GLM-5.2", {**GLM53, "num_hidden_layers": 61})
    assert resolve(policy, make_context(model=shallow, platform="rocm")).decision.runner == "mrv1"
    # By name alone there is no config: the condition is unknown and the rule does not apply.
    by_name = resolve(policy, make_context("GlmMoeDsaForCausalLM", platform="rocm"))
    assert by_name.decision.runner == "mrv1"


def test_the_domain_enumerates_truth_assignments_and_diff_shows_both_branches() -> None:
    old = load_policy_text(POLICY.split("  - id: deep-fp8-mrv2")[0], "old.yaml")
    new = load_policy_text(
        POLICY + """\
  - id: shallow-fp8-eager
    when: {platform: cuda, config: {num_hidden_layers: {le: 70}}}
    set: {cudagraph: none}
    reason: shallow checkpoints run eagerly on CUDA for this test
""",
        "new.yaml",
    )
    domain = Domain.of(old, new)
    # No config, then one config per distinct assignment of (layers > 70, fp8, layers <= 70):
    # layers above, at or below 70 or absent, times fp8 or not, where both layer predicates
    # are false only with the key absent.
    assert domain.config_states[0] is None
    assert len(domain.config_states) == 1 + 6
    diff = diff_policies(old, new)
    text = render_text(diff)
    assert "distinct truth assignments of the config predicates" in text
    assert "num_hidden_layers > 70" in text and "quantization_config.quant_method = fp8" in text
    groups = {(g.field, g.old, g.new) for g in diff.groups()}
    assert groups == {("runner", "mrv1", "mrv2"), ("cudagraph", "full_and_piecewise", "none")}
    # Each predicate's true branch changes something; "no config" changes nothing.
    assert all(c.context.config is not None for c in diff.changes)
    cudagraph = [c for c in diff.changes if c.field == "cudagraph"]
    assert cudagraph and all(c.context.config["num_hidden_layers"] <= 70 for c in cudagraph)
    runner = [c for c in diff.changes if c.field == "runner"]
    assert all(
        c.context.config["num_hidden_layers"] > 70
        and c.context.config["quantization_config.quant_method"] == "fp8"
        for c in runner
    )


def test_the_domain_enumerates_engine_versions_around_each_bound() -> None:
    policy = load_policy_text(
        POLICY.split("  - id: deep-fp8-mrv2")[0]
        + """\
  - id: new-releases
    when: {engine: {vllm: ">=0.32,<0.34"}}
    set: {compile: false}
    reason: releases 0.32 and 0.33 run without compilation in this test
""",
        "p.yaml",
    )
    states = Domain.of(policy).engine_states
    assert states[0] == ()
    versions = [dict(s)["vllm"] for s in states[1:]]
    assert versions == ["0.32", "0.34"]  # in the set, above it (below it reads the same)
    table = [resolve(policy, Context("GlmMoeDsaForCausalLM", engine=dict(s))) for s in states]
    assert [r.decision.compile for r in table] == [True, False, True]


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "glm-5.3-stays-on-mrv2.yaml"


@pytest.mark.parametrize(
    ("name", "runner", "why"),
    [
        ("GLM-5.2", "mrv1", "- glm-5.3-stays-on-mrv2"),
        ("GLM-5.3", "mrv2", "+ glm-5.3-stays-on-mrv2"),
    ],
)
def test_the_glm_example_keeps_5_2_on_mrv1_and_5_3_on_mrv2_and_explains_why(
    cli: object, tmp_path: Path, name: str, runner: str, why: str
) -> None:
    config = {**GLM53, "_name_or_path": f"zai-org/{name}"}
    model = _model_dir(tmp_path, name, config)
    result = cli(  # type: ignore[operator]
        "explain", "--policy", EXAMPLE, "--model", model, "--platform", "rocm",
        "--device-arch", "gfx950",
    )  # fmt: skip
    assert result.code == 0, result.err
    out = result.out
    decided = "rocm-dsa-stays-on-mrv1" if runner == "mrv1" else "glm-5.3-stays-on-mrv2"
    assert re.search(rf"runner +{runner} +rules {decided}", out)
    # The facts the rule tests, each with where it came from.
    assert re.search(rf"model +{name} +directory name \({model}\)", out)
    assert re.search(rf"model +zai-org/{name} +model config _name_or_path", out)
    assert re.search(r"config model_type +glm_moe_dsa +model config \(", out)
    trace = next(line for line in out.splitlines() if why in line)
    if runner == "mrv1":
        assert f"model: wanted *GLM-5.3*, observed [{name}, zai-org/{name}]" in trace
    else:
        assert "runner=mrv2" in trace
        assert "GSM8K accuracy" in out  # the rule's reason is shown with the decision


def test_hostile_model_facts_are_bounded_or_refused(tmp_path: Path) -> None:
    deep: dict = {"leaf": 1}
    for _ in range(50):
        deep = {"a": deep}
    flat = flatten_config({"architectures": ["A"], "nest": deep})
    assert max(len(path.split(".")) for path in flat) == 8  # deeper paths no rule can name
    with pytest.raises(PolicyError, match="must have 1 to 256 characters"):
        make_context("A", platform="cpu", model_id="x" * 300)
    odd = _model_dir(tmp_path, "odd", {"architectures": ["A"], "_name_or_path": ["not", "str"]})
    assert make_context(model=odd, platform="cpu").model_names == ("odd",)
