"""Refusal as an outcome (a rule's `refuse`), rules on the decided values, and the model's
task as a fact (generate, pooling, draft, encoder-decoder) derived as vLLM derives it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from interlock.core.errors import EXIT_CODES, PolicyError, error_kind
from interlock.policy import PolicyRefused, check_refusal
from interlock.policy.context import Context, make_context, task_from_name
from interlock.policy.explain import render_table, render_text
from interlock.policy.lint import lint_sources
from interlock.policy.loader import load_policy_text
from interlock.policy.resolution import resolve
from interlock.policy.stored import policy_from_data, policy_to_data
from interlock.policy.trace import REFUSAL, RULES

BASE = """schema_version: 1
version: t
catalog:
  A: {family: a}
  Enc: {task: encoder-decoder}
defaults: {runner: mrv2, cudagraph: full_and_piecewise, breakable: false, compile: true}
env:
  VLLM_USE_V2_MODEL_RUNNER: {field: runner, values: {"0": mrv1, "1": mrv2}}
"""
RULES_TEXT = """rules:
  - id: a-refuses-mrv1
    when: {architecture: A}
    decided: {runner: mrv1}
    refuse: Model Runner V1 does not support A
    reason: the engine stops at startup
  - id: pooling-piecewise
    when: {task: pooling}
    set: {cudagraph: piecewise}
    reason: pooling models are captured piecewise
  - id: a-eager-under-mrv2
    when: {architecture: A}
    decided: {runner: mrv2}
    set: {cudagraph: none}
    reason: an engine default on the runner decided
"""


@pytest.fixture
def policy() -> Any:
    return load_policy_text(BASE + RULES_TEXT, "p.yaml")


def _error(text: str) -> PolicyError:
    with pytest.raises(PolicyError) as info:
        load_policy_text(text, "p.yaml")
    return info.value


def _messages(err: PolicyError) -> str:
    return " | ".join(e.message for e in (err, *err.more))


# -- the file format -------------------------------------------------------------------------


def test_a_rule_sets_or_refuses_not_both_nor_neither() -> None:
    both = _error(BASE + "rules:\n  - {id: x, set: {runner: mrv1}, refuse: nope, reason: r}\n")
    assert "exactly one of `set`" in _messages(both) and both.line == 10
    neither = _error(BASE + "rules:\n  - {id: x, reason: r}\n")
    assert "exactly one of `set`" in _messages(neither)


def test_decided_and_set_name_different_fields() -> None:
    err = _error(
        BASE + "rules:\n  - {id: x, decided: {runner: mrv1}, set: {runner: mrv2}, reason: r}\n"
    )
    assert "`decided` and `set` both name runner" in _messages(err)


def test_decided_values_are_checked_like_set_values() -> None:
    rule = "  - {id: x, decided: {cudagraph: fast}, refuse: nope, reason: r}\n"
    err = _error(BASE + "rules:\n" + rule)
    assert "rules[0].decided.cudagraph" in str(err)


def test_the_task_is_a_closed_vocabulary() -> None:
    err = _error(BASE.replace("A: {family: a}", "A: {task: chat}"))
    assert "catalog.A.task" in str(err) and "encoder-decoder" in str(err)


# -- refusals --------------------------------------------------------------------------------


def test_a_refusing_rule_refuses_the_decided_values_only(policy: Any) -> None:
    v1 = Context("A", "cuda", env={"VLLM_USE_V2_MODEL_RUNNER": "0"})
    with pytest.raises(PolicyRefused) as info:
        resolve(policy, v1)
    err = info.value
    assert error_kind(err) == "refused" and EXIT_CODES["refused"] == 5
    assert str(err).splitlines()[0] == (
        "refused by rule a-refuses-mrv1 (p.yaml:10): Model Runner V1 does not support A "
        "[runner=mrv1 from VLLM_USE_V2_MODEL_RUNNER (env)]"
    )
    assert err.refusal.rule.id == "a-refuses-mrv1" and err.resolution.refusal is err.refusal
    # Memoized: the second call refuses as well.
    with pytest.raises(PolicyRefused):
        resolve(policy, v1)
    assert resolve(policy, Context("A", "cuda")).refusal is None


def test_a_refused_resolution_can_be_shown_and_checked(policy: Any) -> None:
    res = resolve(policy, Context("A", "cuda", env={"VLLM_USE_V2_MODEL_RUNNER": "0"}),
                  refused=True)  # fmt: skip
    assert res.refusal is not None and res.decision.runner == "mrv1"
    with pytest.raises(PolicyRefused):
        check_refusal(res)
    step = next(s for s in res.trace if s.name == "a-refuses-mrv1" and s.stage == RULES)
    assert step.matched and step.refuse and step.note == "refuses this decision"
    assert [s.name for s in res.trace if s.stage == REFUSAL] == ["a-refuses-mrv1"]
    text = render_text(res)
    assert "REFUSED  by rule a-refuses-mrv1  p.yaml:10" in text
    assert "decision (refused)" in text and "refused: Model Runner V1" in text
    doc = res.to_dict()
    assert doc["refusal"]["rule"] == "a-refuses-mrv1"
    assert doc["refusal"]["decided"]["runner"]["source"] == "VLLM_USE_V2_MODEL_RUNNER"


def test_a_refusing_rule_that_does_not_refuse_says_why(policy: Any) -> None:
    res = resolve(policy, Context("A", "cuda"))
    step = next(s for s in res.trace if s.name == "a-refuses-mrv1")
    assert step.matched and step.note == "does not refuse: the decision has runner=mrv2"
    assert "does not refuse: the decision has runner=mrv2" in render_text(res)


def test_a_refusal_without_decided_refuses_every_decision() -> None:
    policy = load_policy_text(
        BASE + "rules:\n  - {id: no-a, when: {architecture: A}, refuse: not here, reason: r}\n",
        "p.yaml",
    )
    with pytest.raises(PolicyRefused, match="refused by rule no-a"):
        resolve(policy, Context("A", "rocm"))
    assert resolve(policy, Context("B", "rocm")).refusal is None


def test_refusing_rules_survive_the_disk_cache(policy: Any) -> None:
    again = policy_from_data(json.loads(json.dumps(policy_to_data(policy))))
    assert again.rules == policy.rules
    with pytest.raises(PolicyRefused):
        resolve(again, Context("A", "cuda", env={"VLLM_USE_V2_MODEL_RUNNER": "0"}))


def test_the_table_shows_a_refusal_as_the_cells_outcome(policy: Any) -> None:
    refused = resolve(policy, Context("A", "cuda", env={"VLLM_USE_V2_MODEL_RUNNER": "0"}),
                      refused=True)  # fmt: skip
    text = render_table([refused], "text")
    assert "refused by a-refuses-mrv1 (p.yaml:10)" in text
    (row,) = json.loads(render_table([refused], "json"))
    assert row["refusal"]["message"] == "Model Runner V1 does not support A"


# -- rules on the decided values -------------------------------------------------------------


def test_a_rule_on_the_decided_runner_follows_the_env(policy: Any) -> None:
    v2 = resolve(policy, Context("A", "cuda"))
    assert v2.decision.cudagraph == "none"
    assert v2.provenance["cudagraph"].source == "a-eager-under-mrv2"
    step = next(s for s in v2.trace if s.name == "a-eager-under-mrv2")
    assert step.matched
    other = load_policy_text(
        BASE + RULES_TEXT.replace("decided: {runner: mrv1}\n    refuse", "refuse"), "p.yaml"
    )
    assert other  # the same rules without the refusal's condition load too
    no = load_policy_text(BASE + RULES_TEXT.split("  - id: pooling")[0].replace(
        "a-refuses-mrv1", "x").replace("decided: {runner: mrv1}\n", "decided: {runner: mrv2}\n"),
        "p.yaml")  # fmt: skip
    assert no.rules[0].decided["runner"].value == "mrv2"


def test_a_rule_on_the_decided_values_keeps_what_was_forced(policy: Any) -> None:
    forced = resolve(policy, Context("A", "cuda"), {"cudagraph": "full"})
    assert forced.decision.cudagraph == "full"
    assert forced.provenance["cudagraph"].stage == "overrides"
    v1 = resolve(policy, Context("B", "cuda", env={"VLLM_USE_V2_MODEL_RUNNER": "0"}))
    step = next(s for s in v1.trace if s.name == "a-eager-under-mrv2")
    assert not step.matched  # B: its `when` fails


def test_a_rule_on_the_decided_runner_does_not_apply_to_another_runner() -> None:
    policy = load_policy_text(BASE + RULES_TEXT.replace(
        "  - id: a-refuses-mrv1\n    when: {architecture: A}\n    decided: {runner: mrv1}\n"
        "    refuse: Model Runner V1 does not support A\n    reason: the engine stops at startup\n",
        ""), "p.yaml")  # fmt: skip
    res = resolve(policy, Context("A", "cuda", env={"VLLM_USE_V2_MODEL_RUNNER": "0"}))
    assert res.decision.cudagraph == "full_and_piecewise"
    step = next(s for s in res.trace if s.name == "a-eager-under-mrv2")
    assert not step.matched
    assert step.note == "decided: wanted runner=mrv2, the decision has runner=mrv1"
    assert "decided: wanted runner=mrv2, the decision has runner=mrv1" in render_text(res)


# -- the model's task ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "task"),
    [
        ("LlamaForCausalLM", "generate"),
        ("Qwen2VLForConditionalGeneration", "generate"),
        ("BertEmbeddingModel", "pooling"),
        ("Qwen2ForSequenceClassification", "pooling"),
        ("HYV4MTPModel", "pooling"),
        ("Qwen4ExpMTP", "generate"),  # no suffix of vLLM's table
    ],
)
def test_the_task_from_the_name_follows_vllms_suffixes(name: str, task: str) -> None:
    assert task_from_name(name)[0] == task


def test_the_task_is_known_for_every_context(policy: Any) -> None:
    res = resolve(policy, Context("SomeEmbeddingModel", "cuda"))
    assert res.task == "pooling" and res.traits["task"].origin == "architecture name"
    assert res.decision.cudagraph == "piecewise"
    assert res.provenance["cudagraph"].source == "pooling-piecewise"
    assert re.search(r"trait task +pooling +architecture name vLLM's name suffix \*EmbeddingModel",
                     render_text(res))


def test_the_catalog_beats_the_name_and_a_given_task_beats_both(policy: Any) -> None:
    catalog = resolve(policy, Context("Enc", "cuda"))
    assert catalog.task == "encoder-decoder" and catalog.traits["task"].origin == "catalog"
    given = resolve(policy, Context("Enc", "cuda", traits={"task": "pooling"}))
    assert given.task == "pooling" and given.traits["task"].origin == "given"


def test_a_config_says_encoder_decoder(tmp_path: Path) -> None:
    model = tmp_path / "t5"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({"architectures": ["T5ForConditionalGeneration"], "is_encoder_decoder": True})
    )
    ctx = make_context(model=model, platform="cuda")
    assert ctx.model_traits["task"] == "encoder-decoder"
    assert ctx.sources["traits.task"] == "model config (is_encoder_decoder=true)"
    nested = tmp_path / "mm"
    nested.mkdir()
    (nested / "config.json").write_text(json.dumps({
        "architectures": ["XForConditionalGeneration"], "text_config": {"is_encoder_decoder": True},
    }))  # fmt: skip
    # vLLM reads the config's flag or its text config's.
    ctx = make_context(model=nested, platform="cuda")
    assert ctx.model_traits["task"] == "encoder-decoder"
    assert ctx.sources["traits.task"] == "model config (text_config.is_encoder_decoder=true)"
    plain = tmp_path / "llama"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert "task" not in make_context(model=plain, platform="cuda").model_traits


# -- lint: a deviation that covers nothing ---------------------------------------------------


def test_lint_flags_an_outcome_deviation_a_refusing_rule_covers() -> None:
    text = BASE + RULES_TEXT + """deviations:
  - id: a-refused-by-the-engine
    when: {architecture: A}
    env: {VLLM_USE_V2_MODEL_RUNNER: "0"}
    field: outcome
    reason: the engine refuses
  - id: nowhere
    when: {architecture: Nope}
    field: cudagraph
    reason: nothing
"""
    findings = [f for f in lint_sources([("p.yaml", text.encode())], runners=["mrv1", "mrv2"])
                if f.code == "stale-deviation"]  # fmt: skip
    messages = {f.message.split(" ")[1]: f for f in findings}
    assert set(messages) == {"a-refused-by-the-engine", "nowhere"}
    assert "rule(s) a-refuses-mrv1 refuse every context" in messages[
        "a-refused-by-the-engine"].message  # fmt: skip
    assert messages["a-refused-by-the-engine"].line == 25
    assert "applies to no context of the domain" in messages["nowhere"].message


def test_lint_checks_the_runner_a_rule_tests() -> None:
    text = BASE + "rules:\n  - {id: x, decided: {runner: mrv9}, refuse: nope, reason: r}\n"
    findings = lint_sources([("p.yaml", text.encode())], runners=["mrv1", "mrv2"])
    (unknown,) = [f for f in findings if f.code == "unknown-runner"]
    assert "rule x: runner 'mrv9' is not registered" in unknown.message and unknown.line == 10
