"""Resolution: precedence of the stages, provenance, env bindings, overrides, memoization."""

from __future__ import annotations

import pytest

from interlock.policy import Context, PolicyError, load_policy_text, resolve
from interlock.policy.trace import DEFAULTS, ENV, IMPLIED, OVERRIDES, RULES, Provenance, Step

RULES_TEXT = """\
rules:
  - id: dsa-breakable
    when: {attention: dsa}
    set: {breakable: true, capture_sizes: [1, 2, 4]}
    reason: indexer stays eager
    ref: https://github.com/vllm-project/vllm/pull/52861
  - id: rocm-mrv1
    when: {platform: rocm, attention: dsa}
    set: {runner: mrv1}
    reason: slower on rocm
  - id: rocm-no-breakable
    when: {platform: rocm}
    set: {breakable: false, cudagraph: piecewise}
    reason: no benefit on rocm
  - id: big-tp
    when: {features: {tensor_parallel_size: {gt: 4}}}
    set: {cudagraph: full_decode_only}
    reason: big tp
"""


@pytest.fixture
def policy(base):
    return load_policy_text(base.replace("rules: []\n", RULES_TEXT), "p.yaml")


def line(needle: str) -> int:
    return next(i for i, text in enumerate(RULES_TEXT.splitlines(), 9) if needle in text)


def test_defaults_only(policy) -> None:
    res = resolve(policy, Context("DenseModel", "cuda"))
    assert res.decision.to_dict() == {
        "runner": "mrv2",
        "cudagraph": "full_and_piecewise",
        "breakable": False,
        "compile": True,
        "capture_sizes": None,
    }
    assert {p.stage for p in res.provenance.values()} == {DEFAULTS}
    assert res.provenance["runner"].location.line == 6
    assert "capture_sizes" not in res.provenance


def test_later_rule_wins_per_field(policy) -> None:
    res = resolve(policy, Context("DsaModel", "rocm", "gfx950"))
    d = res.decision
    assert (d.runner, d.breakable, d.cudagraph, d.capture_sizes) == (
        "mrv1",
        False,
        "piecewise",
        (1, 2, 4),
    )
    assert res.provenance["breakable"].source == "rocm-no-breakable"
    assert res.provenance["capture_sizes"].source == "dsa-breakable"
    assert res.provenance["runner"] == Provenance(
        "runner", "mrv1", RULES, "rocm-mrv1", "slower on rocm", res.provenance["runner"].location
    )
    assert res.provenance["runner"].location.file == "p.yaml"
    first = next(s for s in res.trace if s.name == "dsa-breakable")
    assert first.matched and first.overridden == {"breakable": "rocm-no-breakable (rules)"}


def test_trace_lists_every_rule_in_order_with_failures(policy) -> None:
    res = resolve(policy, Context("DenseModel", "cuda"))
    rules = [s for s in res.trace if s.stage == RULES]
    assert [s.name for s in rules] == ["dsa-breakable", "rocm-mrv1", "rocm-no-breakable", "big-tp"]
    assert not any(s.matched for s in rules)
    assert rules[0].failure.describe() == "attention: wanted dsa, observed gqa"
    assert rules[1].failure.describe() == "platform: wanted rocm, observed cuda"
    assert rules[3].failure.describe() == (
        "features.tensor_parallel_size: wanted > 4, observed not given"
    )
    assert rules[0].location.line == line("id: dsa-breakable")
    assert [s.stage for s in res.trace] == [DEFAULTS, RULES, RULES, RULES, RULES, ENV]


def test_unknown_architecture_has_unknown_traits(policy) -> None:
    res = resolve(policy, Context("BrandNewForCausalLM", "rocm"))
    # Every trait is unknown but the task, which vLLM derives from the name when nothing
    # else says it.
    assert not res.in_catalog and set(res.traits) == {"task"}
    assert res.traits["task"].value == "generate"
    assert res.traits["task"].origin == "architecture name"
    assert res.decision.runner == "mrv2"
    step = next(s for s in res.trace if s.name == "rocm-mrv1")
    assert step.failure.unknown and step.failure.condition == "attention"


def test_given_traits_win_and_model_traits_fill_gaps(policy) -> None:
    res = resolve(policy, Context("BrandNewForCausalLM", "rocm", traits={"attention": "dsa"}))
    assert res.decision.runner == "mrv1"
    assert res.traits["attention"].origin == "given"
    res = resolve(
        policy,
        Context(
            "BrandNewForCausalLM",
            "rocm",
            model_traits={"attention": "dsa"},
            sources={"traits.attention": "model config (index_topk=2048)"},
        ),
    )
    assert res.decision.runner == "mrv1"
    assert res.traits["attention"].origin == "model config (index_topk=2048)"


def test_catalog_wins_over_model_config_and_records_the_disagreement(policy) -> None:
    ctx = Context("DenseModel", "rocm", model_traits={"attention": "dsa", "quantized": True})
    res = resolve(policy, ctx)
    assert res.traits["attention"].value == "gqa"
    assert res.traits["attention"].origin == "catalog"
    assert "model config says dsa: the catalog wins" in res.traits["attention"].note
    assert res.traits["quantized"].value is True  # not in the catalog: the config fills it
    assert res.decision.runner == "mrv2"


def test_features_are_typed(policy) -> None:
    assert resolve(policy, Context("DenseModel", "cuda", features={"tensor_parallel_size": 8}))
    big = resolve(policy, Context("DenseModel", "cuda", features={"tensor_parallel_size": 8}))
    small = resolve(policy, Context("DenseModel", "cuda", features={"tensor_parallel_size": 2}))
    assert (big.decision.cudagraph, small.decision.cudagraph) == (
        "full_decode_only",
        "full_and_piecewise",
    )


def test_env_binding_beats_rules_and_is_provenanced(policy) -> None:
    ctx = Context(
        "DsaModel", "rocm", env={"USE_V2": "1"}, sources={"env.USE_V2": "process environment"}
    )
    res = resolve(policy, ctx)
    assert res.decision.runner == "mrv2"
    prov = res.provenance["runner"]
    assert (prov.stage, prov.source, prov.forced) == (ENV, "USE_V2", True)
    assert prov.reason == "USE_V2=1 (process environment)"
    assert prov.location.line == 8
    step = next(s for s in res.trace if s.stage == ENV)
    assert step.sets == {"runner": "mrv2"}


def test_env_value_outside_the_map_lists_the_allowed_values(policy) -> None:
    with pytest.raises(PolicyError) as info:
        resolve(policy, Context("DsaModel", "rocm", env={"USE_V2": "yes"}))
    err = info.value
    assert (err.file, err.line, err.path) == ("p.yaml", 8, "env.USE_V2")
    assert "USE_V2='yes'" in err.message and 'allowed: "0", "1"' in err.message


def test_unset_env_binding_is_in_the_trace(policy) -> None:
    res = resolve(policy, Context("DsaModel", "rocm"))
    assert Step(ENV, "USE_V2", res.policy.env["USE_V2"].location, note="not set") in res.trace


def test_override_beats_env(policy) -> None:
    res = resolve(policy, Context("DsaModel", "rocm", env={"USE_V2": "1"}), {"runner": "mrv1"})
    assert res.decision.runner == "mrv1"
    assert res.provenance["runner"].stage == OVERRIDES and res.provenance["runner"].forced
    res = resolve(policy, Context("DenseModel", "cuda"), {"capture_sizes": [8, 16]})
    assert res.decision.capture_sizes == (8, 16)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"runnr": "mrv1"}, "unknown decision field 'runnr'; allowed: runner, cudagraph"),
        ({"cudagraph": "fast"}, "allowed: none, piecewise, full, full_decode_only"),
        ({"breakable": "yes"}, "allowed: true, false"),
        ({"capture_sizes": [0]}, "distinct integers from 1 to 65536"),
        ({"runner": "MRV1"}, "a runner name"),
    ],
)
def test_bad_overrides(policy, overrides: dict, needle: str) -> None:
    with pytest.raises(PolicyError, match=needle.replace("(", r"\(")):
        resolve(policy, Context("DenseModel", "cuda"), overrides)


def test_breakable_implies_no_compile_in_the_trace(policy) -> None:
    res = resolve(policy, Context("DsaModel", "cuda"))
    assert (res.decision.breakable, res.decision.compile) == (True, False)
    prov = res.provenance["compile"]
    assert (prov.stage, prov.source) == (IMPLIED, "breakable")
    assert "breakable=true (from dsa-breakable) implies compile=false" in prov.reason
    assert res.trace[-1].stage == IMPLIED and res.trace[-1].sets == {"compile": False}
    # Not breakable: nothing implied, nothing recorded.
    assert all(s.stage != IMPLIED for s in resolve(policy, Context("DsaModel", "rocm")).trace)


def test_forced_compile_conflicts_with_breakable(policy) -> None:
    with pytest.raises(PolicyError, match="compile=true was forced by override"):
        resolve(policy, Context("DsaModel", "cuda"), {"compile": True})
    ok = resolve(policy, Context("DsaModel", "cuda"), {"compile": True, "breakable": False})
    assert (ok.decision.breakable, ok.decision.compile) == (False, True)


def test_memoized_per_context(policy) -> None:
    a = resolve(policy, Context("DsaModel", "cuda"))
    assert resolve(policy, Context("DsaModel", "cuda")) is a
    assert resolve(policy, Context("DsaModel", "rocm")) is not a
    assert resolve(policy, Context("DsaModel", "cuda"), {"runner": "mrv1"}) is not a


def test_capabilities_stage_runs_after_overrides_and_before_implied(policy) -> None:
    seen = []

    def stage(draft) -> None:
        seen.append(dict(draft.values))
        draft.assign(Provenance("breakable", False, "capabilities", "mrv2", "cannot break"))
        draft.record(Step("capabilities", "mrv2", sets={"breakable": False}))

    res = resolve(policy, Context("DsaModel", "cuda"), {"runner": "mrv2"}, capabilities=stage)
    assert seen[0]["runner"] == "mrv2" and seen[0]["breakable"] is True
    assert res.decision.breakable is False and res.decision.compile is True
    assert [s.stage for s in res.trace][-1] == "capabilities"


def test_context_validation() -> None:
    with pytest.raises(PolicyError, match="architecture is required"):
        Context("")
    with pytest.raises(PolicyError, match="unknown trait 'sparse'"):
        Context("X", traits={"sparse": True})
    with pytest.raises(PolicyError, match="trait attention: bad value 'fast'"):
        Context("X", traits={"attention": "fast"})
    with pytest.raises(PolicyError, match="feature tp"):
        Context("X", features={"tp": [1]})
    assert Context("X", "cuda", features={"a": 1}) == Context("X", "cuda", features={"a": 1})
    assert hash(Context("X", "cuda")) == hash(Context("X", "cuda"))


def test_json_document_shape(policy) -> None:
    doc = resolve(policy, Context("DsaModel", "cuda")).to_dict()
    assert set(doc) == {
        "decision", "refusal", "task", "provenance", "trace", "deviations", "context", "policy",
        "releases",
    }
    # "DsaModel" is not in the catalog: vLLM's name suffixes make a `*Model` a pooling model.
    assert doc["refusal"] is None and doc["task"] == "pooling"
    assert set(doc["policy"]) == {"schema_version", "version", "revision", "files"}
    assert doc["policy"]["files"] == ["p.yaml"]
    assert doc["provenance"]["breakable"]["source"] == "dsa-breakable"
    assert doc["provenance"]["breakable"]["ref"].endswith("/52861")
    assert doc["provenance"]["capture_sizes"]["value"] == [1, 2, 4]
    assert (
        doc["trace"][1]["matched"] is True and doc["trace"][2]["failure"]["condition"] == "platform"
    )
    assert doc["context"]["traits"]["attention"] == {
        "value": "dsa",
        "origin": "catalog",
        "note": "p.yaml:4",
    }
