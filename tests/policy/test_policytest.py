from __future__ import annotations

import pytest
from checkout import BEFORE_53155, SEED_53155, SEED_53155_TESTS, SHIPPED
from policy_texts import with_rules

from interlock.cli import main
from interlock.policy import PolicyError, load_policy_text
from interlock.policy.policytest import render_result, render_summary, run_cases
from interlock.policy.testfile import parse_tests

RULES = """\
  - id: rocm-dsa-mrv1
    when: {platform: rocm, attention: dsa}
    set: {runner: mrv1}
    reason: DSA models stay on mrv1 on ROCm
    ref: https://example.org/1
  - id: tp-piecewise
    when: {features: {tensor_parallel_size: {gt: 1}}}
    set: {cudagraph: piecewise}
    reason: tensor parallel runs take piecewise graphs here
    ref: https://example.org/2
"""
POLICY = with_rules(RULES)


def cases_file(cases: str) -> bytes:
    return f"schema_version: 1\ncases:\n{cases}".encode()


def run(cases: str, policy_text: str = POLICY):
    policy = load_policy_text(policy_text, "p.yaml")
    return run_cases(policy, parse_tests(cases_file(cases), "t.yaml").cases)


# -- the file format ------------------------------------------------------------------------


ROCM_DSA = "{architecture: DsaA, platform: rocm}"


def one_case(given: str, expect: str) -> str:
    return f"  - name: a\n    given: {given}\n    expect: {expect}\n"


@pytest.mark.parametrize(
    ("given", "expect", "where", "message"),
    [
        (
            "{architecture: DsaA, platfrom: rocm}",
            "{runner: mrv1}",
            "t.yaml:4:33: cases[0].given.platfrom",
            "unknown field 'platfrom'",
        ),
        (
            ROCM_DSA,
            "{cudagraph: fulll}",
            "t.yaml:5:25: cases[0].expect.cudagraph",
            "full_and_piecewise",
        ),
        (
            "{architecture: DsaA, platform: rocm, env: {USE_V2: 0}}",
            "{runner: mrv1}",
            "t.yaml:4:63: cases[0].given.env.USE_V2",
            "valid string (got 0)",
        ),
        (
            ROCM_DSA,
            "{}",
            "t.yaml:5:13: cases[0].expect",
            "expect at least one decision field, or an `error`",
        ),
        (
            ROCM_DSA,
            "{runner: mrv1, error: boom}",
            "t.yaml:5:13: cases[0].expect",
            "`error` cannot be combined",
        ),
        (
            ROCM_DSA,
            "{rule: r1}",
            "t.yaml:5:13: cases[0].expect",
            "`rule` needs at least one decision field",
        ),
        (
            "{platform: rocm}",
            "{runner: mrv1}",
            "t.yaml:4:12: cases[0].given",
            "missing required field 'architecture'",
        ),
    ],
)
def test_bad_input_is_an_error_at_file_line_col(
    given: str, expect: str, where: str, message: str
) -> None:
    with pytest.raises(PolicyError) as info:
        parse_tests(cases_file(one_case(given, expect)), "t.yaml")
    lines = str(info.value).splitlines()
    assert any(line.startswith(where) and message in line for line in lines), lines


def test_duplicate_case_names_and_unknown_schema_versions_are_refused() -> None:
    case = (
        "  - name: a\n    given: {architecture: DsaA, platform: rocm}\n    expect: {runner: mrv1}\n"
    )
    with pytest.raises(PolicyError, match=r"t.yaml:6:11: cases\[1\].name: duplicate case name 'a'"):
        parse_tests(cases_file(case + case), "t.yaml")
    with pytest.raises(PolicyError, match="schema_version: input should be 1"):
        parse_tests(cases_file(case).replace(b"schema_version: 1", b"schema_version: 2"), "t.yaml")


# -- running cases --------------------------------------------------------------------------


def test_a_case_passes_on_the_expected_fields_and_setter() -> None:
    result = run("""\
  - name: dsa on rocm
    given: {architecture: DsaA, platform: rocm, device_arch: gfx950}
    expect: {runner: mrv1, rule: rocm-dsa-mrv1}
""")
    assert (result.passed, result.failed) == (1, 0)
    assert render_result(result.results[0]) == ["PASS  dsa on rocm"]


def test_a_failing_case_reports_the_decision_and_the_trace_of_the_field() -> None:
    result = run("""\
  - name: dense on rocm
    given: {architecture: GqaA, platform: rocm}
    expect: {runner: mrv1, cudagraph: full_and_piecewise}
""")
    (case,) = result.results
    assert case.problems == ("runner: expected mrv1, got mrv2 (set by defaults at p.yaml:11)",)
    lines = render_result(case)
    assert lines[0] == "FAIL  dense on rocm  (t.yaml:3)"
    assert lines[2].startswith("      decision: runner=mrv2 cudagraph=full_and_piecewise")
    assert lines[3] == "      trace of runner:"
    trace = "\n".join(lines[4:])
    assert "rocm-dsa-mrv1" in trace and "attention: wanted dsa, observed gqa" in trace
    assert "tp-piecewise" not in trace  # it does not set runner
    assert "USE_V2" in trace and "not set" in trace


def test_rule_checks_who_set_the_field() -> None:
    result = run("""\
  - name: env wins over the rule
    given: {architecture: DsaA, platform: rocm, env: {USE_V2: "0"}}
    expect: {runner: mrv1, rule: rocm-dsa-mrv1}
""")
    (case,) = result.results
    assert case.problems == (
        "runner: expected it set by rule rocm-dsa-mrv1, but it was set by env USE_V2=0 (given) "
        "at p.yaml:13",
    )
    assert case.failing_fields == ("runner",)


def test_expected_errors() -> None:
    result = run("""\
  - name: undeclared value
    given: {architecture: DsaA, platform: rocm, env: {USE_V2: "2"}}
    expect: {error: 'allowed: "0", "1"'}
  - name: other error
    given: {architecture: DsaA, platform: rocm, env: {USE_V2: "2"}}
    expect: {error: something else}
  - name: no error
    given: {architecture: DsaA, platform: rocm}
    expect: {error: not a declared value}
  - name: unexpected error
    given: {architecture: DsaA, platform: rocm, env: {USE_V2: "2"}}
    expect: {runner: mrv1}
""")
    ok, other, none, unexpected = result.results
    assert ok.passed and "is not a declared value" in ok.error
    assert other.problems[0].startswith("expected an error containing 'something else', got: ")
    assert none.problems == (
        "expected an error containing 'not a declared value', but the case resolves",
    )
    assert unexpected.problems[0].startswith("resolution failed: p.yaml:13:3: env.USE_V2:")


def test_names_the_policy_lacks_fail_the_case_at_their_line() -> None:
    result = run("""\
  - name: typos
    given: {architecture: DsaA, platform: rocm, env: {USE_V3: "1"}}
    expect: {runner: mrv2, rule: rocm-dsa-mvr1}
""")
    (case,) = result.results
    env, rule, value = case.problems
    assert env.startswith("t.yaml:4:63: cases[0].given.env.USE_V3: the policy binds no variable")
    assert env.endswith("(did you mean 'USE_V2'?)")
    assert rule == (
        "t.yaml:5:34: cases[0].expect.rule: the policy has no rule 'rocm-dsa-mvr1' "
        "(did you mean 'rocm-dsa-mrv1'?)"
    )
    assert value.startswith("runner: expected mrv2, got mrv1")


def test_overrides_and_features_reach_the_resolution() -> None:
    result = run("""\
  - name: override
    given: {architecture: DsaA, platform: rocm, set: {runner: mrv2, capture_sizes: [1, 2]}}
    expect: {runner: mrv2, capture_sizes: [1, 2]}
  - name: tensor parallel
    given: {architecture: GqaA, platform: cuda, features: {tensor_parallel_size: 2}}
    expect: {cudagraph: piecewise, rule: tp-piecewise}
""")
    assert [r.problems for r in result.results] == [(), ()]


def test_coverage_counts_rules_that_decided_a_field() -> None:
    result = run("""\
  - name: override hides the rule
    given: {architecture: DsaA, platform: rocm, set: {runner: mrv2}}
    expect: {runner: mrv2}
  - name: tensor parallel
    given: {architecture: GqaA, platform: cuda, features: {tensor_parallel_size: 4}}
    expect: {cudagraph: piecewise}
""")
    assert result.covered() == ["tp-piecewise"]
    assert result.uncovered() == ["rocm-dsa-mrv1"]
    assert result.coverage() == 50.0
    assert render_summary(result) == [
        "2 passed, 0 failed",
        "rule coverage: 1/2 rules (50.0 %)",
        "not covered: rocm-dsa-mrv1",
    ]


# -- the shipped cases and the command ------------------------------------------------------


def test_the_shipped_cases_pass_and_cover_every_rule(capsys) -> None:
    assert main(["test", "--min-coverage", "100"]) == 0
    out = capsys.readouterr().out
    assert " passed, 0 failed\nrule coverage: 23/23 rules (100.0 %)\n" in out


def test_the_seed_cases_pass_on_their_policy(capsys) -> None:
    argv = ["test", str(SEED_53155_TESTS), "--policy", str(SEED_53155), "--min-coverage", "100"]
    assert main(argv) == 0
    assert "rule coverage: 8/8 rules (100.0 %)" in capsys.readouterr().out


def test_the_seed_cases_catch_both_incidents(capsys) -> None:
    assert main(["test", str(SEED_53155_TESTS), "--policy", str(BEFORE_53155)]) == 1
    out = capsys.readouterr().out
    glm = out.split("FAIL  GLM-5.2 on MI355X stays on MRV1 (vLLM 53155)")[1]
    assert "runner: expected mrv1, got mrv2 (set by defaults" in glm.split("FAIL")[0]
    kimi = out.split("FAIL  Kimi-K3 on MI355X runs MRV2 since vLLM 51653")[1]
    assert "breakable: expected false, got true" in kimi.split("FAIL")[0]


def test_the_command_finds_the_tests_beside_the_policy(write, capsys) -> None:
    policy = write("site.yaml", POLICY)
    write(
        "site.tests.yaml",
        "schema_version: 1\ncases:\n  - name: dsa\n"
        "    given: {architecture: DsaA, platform: rocm}\n    expect: {runner: mrv1}\n",
    )
    assert main(["test", "--policy", str(policy)]) == 0
    assert "1 passed, 0 failed\nrule coverage: 1/2 rules (50.0 %)" in capsys.readouterr().out
    assert main(["test", "--policy", str(policy), "--min-coverage", "60"]) == 1
    assert "rule coverage of " in (err := capsys.readouterr().err)
    assert "site.yaml is 50.0 %, below --min-coverage 60 %" in err
    assert main(["test", "--policy", str(SHIPPED), str(policy.with_name("site.tests.yaml"))]) == 1


def test_the_command_without_a_tests_file(write, capsys) -> None:
    policy = write("lonely.yaml", POLICY)
    assert main(["test", "--policy", str(policy)]) == 1
    assert "no tests file beside the policy" in capsys.readouterr().err
    assert main(["test", "--policy", str(policy), "--min-coverage", "120"]) == 2
