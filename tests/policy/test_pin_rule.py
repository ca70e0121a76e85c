"""`policy check`'s pin-rule note: a rule that changes nothing where it matches (every field
it sets already has that value from the defaults and the earlier matched rules)."""

from __future__ import annotations

from policy_texts import with_rules

from interlock.policy.lint import NOTE, lint_sources, summary

REF = "    ref: https://example.org/pr/1\n"


def rule(rid: str, when: str, sets: str) -> str:
    head = f"  - id: {rid}\n    when: {when}\n    set: {sets}\n"
    return f"{head}    reason: a reason long enough\n{REF}"


def pins(rules: str) -> list:
    findings = lint_sources([("p.yaml", with_rules(rules).encode())], runners=("mrv1", "mrv2"))
    return [f for f in findings if f.code == "pin-rule"]


def test_a_rule_restating_the_defaults_is_a_pin() -> None:
    (found,) = pins(rule("keep-mrv2", "{platform: cuda}", "{runner: mrv2, compile: true}"))
    assert found.severity == NOTE
    assert (found.file, found.line) == ("p.yaml", 17)  # its `set:` key
    assert found.message.startswith(
        "rule keep-mrv2 changes nothing: in the 7 contexts it matches, every field it sets "
        "already has that value (compile=true from defaults; runner=mrv2 from defaults)"
    )
    # A note: it fails no check, --strict included.
    assert summary([found], strict=True) == (0, 0, False)


def test_a_rule_restating_an_earlier_rule_is_a_pin_naming_it() -> None:
    rules = rule("dsa-mrv1", "{attention: dsa}", "{runner: mrv1}") + rule(
        "rocm-dsa-mrv1", "{platform: rocm, attention: dsa}", "{runner: mrv1}"
    )
    (found,) = pins(rules)
    assert "rule rocm-dsa-mrv1 changes nothing" in found.message
    assert "(runner=mrv1 from dsa-mrv1)" in found.message


def test_a_rule_that_changes_a_value_somewhere_is_no_pin() -> None:
    # On DSA models the earlier rule set mrv1: there mrv2 is a change.
    rules = rule("dsa-mrv1", "{attention: dsa}", "{runner: mrv1}") + rule(
        "rocm-mrv2", "{platform: rocm}", "{runner: mrv2}"
    )
    assert pins(rules) == []
    # One field of two changed everywhere it matches: no pin either.
    assert pins(rule("cuda", "{platform: cuda}", "{runner: mrv2, cudagraph: piecewise}")) == []


def test_a_shadowed_rule_gets_its_warning_not_a_note() -> None:
    rules = rule("early", "{platform: cuda}", "{runner: mrv2}") + rule(
        "late", "{platform: cuda}", "{runner: mrv1}"
    )
    assert pins(rules) == []
