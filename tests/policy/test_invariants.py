"""Invariants of tests files: checked over the whole domain, violations as counterexamples."""

from __future__ import annotations

from pathlib import Path

import pytest
from policy_texts import MINIMAL_BASE, with_rules

from interlock.core.errors import PolicyError
from interlock.policy import load_policy, load_policy_text
from interlock.policy.invariants import check_invariants
from interlock.policy.lint import lint_sources
from interlock.policy.testfile import parse_tests

REPO = Path(__file__).resolve().parents[2]
HISTORY = REPO / "examples" / "history"

POLICY = with_rules("""\
  - id: dsa-breakable
    when: {attention: dsa}
    set: {breakable: true}
    reason: DSA runs its indexer eagerly between graph segments
  - id: rocm-dsa-mrv1
    when: {platform: rocm, architecture: DsaModel}
    set: {runner: mrv1}
    reason: DSA models are faster on MRV1 on ROCm
""", base=MINIMAL_BASE)


def _invariants(text: str) -> list:
    content = ("schema_version: 1\ninvariants:\n" + text).encode()
    return list(parse_tests(content, "t.yaml").invariants)


def test_invariants_that_hold_pass_over_every_context_they_select() -> None:
    policy = load_policy_text(POLICY, "p.yaml")
    results = check_invariants(policy, _invariants("""\
  - name: dsa on rocm is mrv1 unless the env says otherwise
    forall: {platform: rocm, attention: dsa}
    env: {USE_V2: null}
    expect: {runner: mrv1}
  - name: breakable never compiles
    never: {breakable: true, compile: true}
  - name: mrv1 on rocm is breakable
    forall: {platform: rocm, architecture: DsaModel}
    implies: {if: {runner: mrv1}, then: {breakable: true}}
"""))
    assert [r.passed for r in results] == [True, True, True]
    # dsa on rocm: one architecture, one unnamed device arch, env unset.
    assert results[0].checked == 1
    # every context: 2 archs x 4 platforms x 3 env states.
    assert results[1].checked == 2 * 4 * 3


def test_a_violation_is_a_counterexample_with_context_decision_and_deciding_rule() -> None:
    policy = load_policy_text(POLICY, "p.yaml")
    (result,) = check_invariants(policy, _invariants("""\
  - name: dsa on rocm is mrv1
    forall: {platform: rocm, attention: dsa}
    expect: {runner: mrv1}
"""))
    assert not result.passed and result.checked == 3
    (example,) = result.counterexamples  # USE_V2=1 overrides the rule
    assert example.context.architecture == "DsaModel" and example.context.env == {"USE_V2": "1"}
    assert example.decision["runner"] == "mrv2"
    assert example.deciders == {"runner": "env USE_V2=1 (given) (p.yaml:8)"}
    text = "\n".join(result.render())
    assert text.startswith("FAIL  invariant: dsa on rocm is mrv1  (t.yaml:3)")
    assert "counterexample: DsaModel on rocm/(other), USE_V2=1: decision runner=mrv2" in text


def test_never_and_implies_name_the_rules_of_every_field_concerned() -> None:
    policy = load_policy_text(
        POLICY + """\
  - id: dense-compiled-breakable
    when: {architecture: DenseModel, platform: cuda}
    set: {breakable: true, compile: true}
    reason: a deliberately broken rule for this test
""",
        "p.yaml",
    )
    results = check_invariants(policy, _invariants("""\
  - name: mrv2 implies no breakable graphs
    implies: {if: {runner: mrv2}, then: {breakable: false}}
"""))
    (result,) = results
    examples = result.counterexamples
    assert {e.context.architecture for e in examples} == {"DsaModel", "DenseModel"}
    dense = next(e for e in examples if e.context.architecture == "DenseModel")
    assert dense.deciders["breakable"] == "rule dense-compiled-breakable (p.yaml:20)"
    assert dense.deciders["runner"] == "defaults (p.yaml:6)"


def test_an_invariant_has_exactly_one_claim() -> None:
    with pytest.raises(PolicyError, match="exactly one of expect, never, implies"):
        _invariants("  - {name: x, expect: {runner: mrv1}, never: {compile: true}}\n")
    with pytest.raises(PolicyError, match="exactly one of expect, never, implies"):
        _invariants("  - {name: x, forall: {platform: rocm}}\n")


SEED_TESTS = HISTORY / "2026-09-01-vllm-53155.tests.yaml"


def test_the_glm_5_2_near_miss_is_caught_as_a_counterexample() -> None:
    """vLLM 0.29.0's ROCm MRV1 list named DeepSeek V3.2 and V4, two of the three DSA target
    models: the seed cases' invariant written for that intent finds GLM-5.2 there, and the
    state after #53155 (and 0.30.0) passes it."""
    from interlock.policy.testfile import load_tests

    (invariant, *_) = load_tests(SEED_TESTS).invariants
    assert invariant.name.startswith("every DSA target model stays on MRV1 on ROCm")
    before = load_policy([HISTORY / "vllm-0.29.0.yaml"])
    (result,) = check_invariants(before, [invariant])
    assert not result.passed
    assert {e.context.architecture for e in result.counterexamples} == {"GlmMoeDsaForCausalLM"}
    example = result.counterexamples[0]
    assert example.context.platform == "rocm" and example.context.env == {}
    assert example.decision["runner"] == "mrv2"
    assert example.deciders["runner"].startswith("defaults (")
    assert "vllm-0.29.0.yaml:" in example.deciders["runner"]
    for fixed in ("2026-09-01-vllm-53155.yaml", "vllm-0.30.0.yaml"):
        (after,) = check_invariants(load_policy([HISTORY / fixed]), [invariant])
        assert after.passed and after.checked > 0


def test_policy_check_reports_a_violated_invariant_at_its_line(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(POLICY)
    (tmp_path / "p.tests.yaml").write_text(
        "schema_version: 1\ninvariants:\n"
        "  - name: dsa on rocm is mrv1\n"
        "    forall: {platform: rocm, attention: dsa}\n"
        "    expect: {runner: mrv1}\n"
    )
    from interlock.policy.lint import lint_paths

    findings = lint_paths([tmp_path / "p.yaml"], runners=["mrv1", "mrv2"])
    (finding,) = [f for f in findings if f.code == "invariant-violated"]
    assert finding.file.endswith("p.tests.yaml") and finding.line == 3
    assert "fails in 1 of 3 contexts" in finding.message
    assert "counterexample: DsaModel on rocm/(other), USE_V2=1" in finding.message
    assert "runner by env USE_V2=1" in finding.message


def test_lint_flags_a_config_condition_nothing_reaches() -> None:
    policy = POLICY + """\
  - id: unreachable
    when: {architecture: NotCatalogued, config: {num_hidden_layers: {gt: 70}}}
    set: {runner: mrv1}
    reason: a rule only an uncatalogued architecture could reach
  - id: reachable
    when: {architecture: DsaModel, config: {num_hidden_layers: {gt: 70}}}
    set: {runner: mrv1}
    reason: a rule a catalogued architecture reaches with a deep config
"""
    findings = lint_sources([("p.yaml", policy.encode())], runners=["mrv1", "mrv2"])
    flagged = [f for f in findings if f.code == "unreachable-config"]
    assert len(flagged) == 1 and "rule unreachable:" in flagged[0].message
    assert "`num_hidden_layers > 70`" in flagged[0].message


def test_the_simplest_witness_of_each_violation_comes_first() -> None:
    """Domain order puts DsaModel's env variant ahead of the plain case a rule on
    DenseModel breaks; the plain case comes first, then one witness per other violation."""
    policy = load_policy_text(
        with_rules("""\
  - id: dense-rocm-mrv1
    when: {architecture: DenseModel, platform: rocm}
    set: {runner: mrv1}
    reason: a deliberately broken rule for this test
""", base=MINIMAL_BASE),
        "p.yaml",
    )
    (result,) = check_invariants(policy, _invariants("""\
  - name: rocm runs mrv2
    forall: {platform: rocm}
    expect: {runner: mrv2}
"""))
    seen = [(e.context.architecture, dict(e.context.env), e.deciders["runner"])
            for e in result.counterexamples]
    assert seen == [
        ("DenseModel", {}, "rule dense-rocm-mrv1 (p.yaml:12)"),
        ("DsaModel", {"USE_V2": "0"}, "env USE_V2=0 (given) (p.yaml:8)"),
        ("DenseModel", {"USE_V2": "0"}, "env USE_V2=0 (given) (p.yaml:8)"),
    ]


def test_simplest_first_orders_heads_by_env_then_facts_then_variants() -> None:
    from interlock.policy.context import Context
    from interlock.policy.invariants import Counterexample, simplest_first

    def example(arch: str, rule: str, device_arch: str = "", **env: str) -> Counterexample:
        context = Context(arch, "rocm", device_arch, env=env)
        return Counterexample(context, {"runner": "mrv1"}, {"runner": rule})

    by_env = example("A", "env X=0 (given) (p.yaml:8)", X="0")
    by_env_named = example("A", "env X=0 (given) (p.yaml:8)", "gfx950", X="0")
    b_env = example("B", "env X=0 (given) (p.yaml:8)", X="0")
    rule_named = example("B", "rule r (p.yaml:20)", "gfx950")
    rule_named_env = example("B", "rule r (p.yaml:20)", "gfx950", Y="1")
    domain_order = [by_env_named, by_env, rule_named_env, b_env, rule_named]
    assert simplest_first(domain_order) == [
        rule_named,  # no env override: first, though a named device arch is one fact
        by_env,  # one env override, no other fact
        b_env,  # a distinct model with the same decider is a distinct violation
        by_env_named,  # variants: fewest env overrides and facts first
        rule_named_env,
    ]
