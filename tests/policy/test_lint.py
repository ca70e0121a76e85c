from __future__ import annotations

import json

import pytest
from checkout import BEFORE_53155, SHIPPED
from policy_texts import BASE, with_rules

from interlock.cli import main
from interlock.plugins import PlatformSupport, RunnerSpec, hookimpl
from interlock.plugins.checks import lint_paths
from interlock.plugins.checks import lint_sources as lint_installed
from interlock.policy.lint import lint_sources
from interlock.testing import register_plugin  # noqa: F401  (fixture)

REF = "    ref: https://example.org/pr/1\n"


def lint(text: str, name: str = "p.yaml", runners=("mrv1", "mrv2")):
    return lint_sources([(name, text.encode())], runners=runners)


def codes(findings) -> list[str]:
    return [f.code for f in findings]


def rule(rid: str, when: str, sets: str, reason: str = "a reason long enough", ref: str = REF):
    return f"  - id: {rid}\n    when: {when}\n    set: {sets}\n    reason: {reason}\n{ref}"


def only(findings, code: str):
    found = [f for f in findings if f.code == code]
    assert len(found) == 1, findings
    return found[0]


def test_the_shipped_policy_is_clean() -> None:
    assert lint_paths([SHIPPED]) == []


def test_findings_read_file_line_col_severity_code_message() -> None:
    text = with_rules(rule("r1", "{platform: rocm}", "{runner: mrv3}"))
    finding = only(lint(text), "unknown-runner")
    assert str(finding).startswith(
        "p.yaml:17:19: error: unknown-runner: rule r1: runner 'mrv3' is not registered"
    )
    assert "(did you mean 'mrv1'?)" in finding.message


# -- errors ---------------------------------------------------------------------------------


def test_loader_errors_are_error_findings_with_positions() -> None:
    text = with_rules(rule("r1", "{platform: rocm, platfrom: cuda}", "{runner: mrv1}"))
    (finding,) = lint(text)
    assert (finding.severity, finding.code, finding.line) == ("error", "invalid", 16)
    assert "unknown field 'platfrom'" in finding.message


def test_duplicate_yaml_keys_are_errors() -> None:
    text = with_rules(rule("r1", "{platform: rocm}", "{runner: mrv1, runner: mrv2}"))
    (finding,) = lint(text)
    assert finding.code == "invalid"
    assert "duplicate key 'runner'" in finding.message


def test_unknown_decision_values_are_errors() -> None:
    text = with_rules(rule("r1", "{platform: rocm}", "{cudagraph: fulll}"))
    finding = only(lint(text), "unknown-value")
    assert finding.line == 17 and "full_and_piecewise" in finding.message
    bad_env = with_rules().replace('"1": mrv2}', '"1": mrv2, "2": 7}')
    assert codes(lint(bad_env)) == ["unknown-value"]


def test_duplicate_rule_ids_are_reported_across_layered_files() -> None:
    base = with_rules(rule("r1", "{platform: rocm}", "{runner: mrv1}"))
    site = 'schema_version: 1\nversion: "site"\nrules:\n' + rule(
        "r1", "{platform: cuda}", "{runner: mrv1}"
    )
    findings = lint_installed([("base.yaml", base.encode()), ("site.yaml", site.encode())])
    finding = only(findings, "duplicate-rule-id")
    assert (finding.file, finding.line) == ("site.yaml", 4)
    assert "first defined at base.yaml:15" in finding.message


def test_unknown_runners_in_defaults_and_env_bindings() -> None:
    text = with_rules().replace("runner: mrv2, cudagraph", "runner: mvr2, cudagraph")
    text = text.replace('"0": mrv1', '"0": mrv9')
    findings = [f for f in lint(text) if f.code == "unknown-runner"]
    assert [f.line for f in findings] == [11, 13]
    assert findings[0].message.startswith("defaults: runner 'mvr2' is not registered")
    assert "(did you mean 'mrv2'?)" in findings[0].message
    assert findings[1].message.startswith("env USE_V2=0: runner 'mrv9' is not registered")


class EagerPlugin:
    @hookimpl
    def interlock_runner_specs(self) -> list[RunnerSpec]:
        return [
            RunnerSpec(
                name="eager",
                description="runs every step eagerly",
                plugin_api=">=1.0,<2",
                platforms={"cpu": PlatformSupport(cudagraph={"none"})},
                factory="nowhere:Runner",
            )
        ]


def test_registered_runners_are_known(write, register_plugin) -> None:  # noqa: F811
    path = write("p.yaml", with_rules(rule("r1", "{platform: cpu}", "{runner: eager}")))
    assert "unknown-runner" in codes(lint_paths([path]))
    register_plugin(EagerPlugin(), "eager")
    assert "unknown-runner" not in codes(lint_paths([path]))


# -- warnings: each with a policy that triggers it and one that does not --------------------


def test_unknown_architecture_suggests_the_catalog_name() -> None:
    text = with_rules(rule("r1", "{architecture: [DsaA, DSAb]}", "{runner: mrv1}"))
    finding = only(lint(text), "unknown-architecture")
    assert finding.line == 16
    assert "'DSAb' is not in the catalog" in finding.message
    assert "(did you mean 'DsaB'?)" in finding.message
    fixed = text.replace("DSAb", "DsaB")
    assert "unknown-architecture" not in codes(lint(fixed))


def test_a_glob_matching_no_catalog_architecture_is_unknown() -> None:
    text = with_rules(rule("r1", "{architecture: 'Mamba*'}", "{runner: mrv1}"))
    assert "matches no catalog architecture" in only(lint(text), "unknown-architecture").message
    assert "unknown-architecture" not in codes(lint(text.replace("Mamba*", "Dsa*")))


def test_dead_rule() -> None:
    dead = with_rules(rule("r1", "{attention: dsa, moe: false}", "{runner: mrv1}"))
    finding = only(lint(dead), "dead-rule")
    assert finding.line == 16 and "matches no context" in finding.message
    alive = dead.replace("moe: false", "moe: true")
    assert "dead-rule" not in codes(lint(alive))


def test_a_rule_on_an_unnamed_device_arch_or_a_feature_is_alive() -> None:
    text = with_rules(
        rule(
            "r1",
            "{device_arch: 'gfx9*', features: {tensor_parallel_size: {ge: 8}}}",
            "{runner: mrv1}",
        )
    )
    assert lint(text) == []


def test_shadowed_rule_names_what_overwrites_it() -> None:
    shadowed = with_rules(
        rule("early", "{attention: dsa, platform: rocm}", "{runner: mrv1}")
        + rule("late", "{platform: rocm}", "{runner: mrv2}")
    )
    finding = only(lint(shadowed), "shadowed-rule")
    assert finding.line == 17
    assert "rule early matches" in finding.message and "runner by late" in finding.message
    partly = shadowed.replace("{runner: mrv1}", "{runner: mrv1, cudagraph: piecewise}")
    assert "shadowed-rule" not in codes(lint(partly))


def test_near_miss_list_names_the_missing_and_suggests_the_trait() -> None:
    near = with_rules(
        rule("rocm-dsa", "{platform: rocm, architecture: [DsaA, DsaB]}", "{runner: mrv1}")
    )
    finding = only(lint(near), "near-miss-list")
    assert finding.line == 16
    assert "all have attention: dsa" in finding.message
    assert "misses 1 more catalog architecture(s) with attention: dsa: DsaC" in finding.message
    assert "`attention: dsa`" in finding.message
    complete = near.replace("[DsaA, DsaB]", "[DsaA, DsaB, DsaC]")
    assert "near-miss-list" not in codes(lint(complete))


def test_near_miss_ignores_what_the_rules_own_traits_exclude() -> None:
    # DsaA and MlaA share family: a, and so does GqaA, which the list misses...
    text = with_rules(rule("r1", "{architecture: [DsaA, MlaA]}", "{runner: mrv1}"))
    finding = only(lint(text), "near-miss-list")
    assert "with family: a: GqaA" in finding.message
    # ...unless the rule's own trait condition rules GqaA out.
    narrowed = text.replace("{architecture:", "{moe: true, architecture:")
    assert "near-miss-list" not in codes(lint(narrowed))


def test_near_miss_ignores_a_trait_most_of_the_catalog_has() -> None:
    # DsaB and MlaA share only moe: true, which 4 of the 7 catalog architectures have.
    listed = rule("r1", "{architecture: [DsaB, MlaA]}", "{runner: mrv1}")
    assert "near-miss-list" not in codes(lint(with_rules(listed)))
    dense = "  DenseX: {moe: false}\n  DenseY: {moe: false}\ndefaults:"
    larger = BASE.replace("defaults:", dense)
    finding = only(lint(with_rules(listed, larger)), "near-miss-list")
    assert "with moe: true: DsaA, DsaC" in finding.message


def test_the_glm_5_2_incident_is_caught() -> None:
    findings = lint_paths([BEFORE_53155])
    near = [f for f in findings if f.code == "near-miss-list"]
    assert near and all("GlmMoeDsaForCausalLM" in f.message for f in near)
    assert "rocm-deepseek-dsa-stays-on-mrv1" in near[0].message


def test_missing_ref() -> None:
    text = with_rules(rule("r1", "{platform: rocm}", "{runner: mrv1}", ref=""))
    finding = only(lint(text), "missing-ref")
    assert (finding.line, finding.col) == (15, 5)
    assert "missing-ref" not in codes(
        lint(with_rules(rule("r1", "{platform: rocm}", "{runner: mrv1}")))
    )


@pytest.mark.parametrize("reason", ["TODO", "'  tbd. '", "fix later", "perf", "'TODO: explain'"])
def test_vague_reason(reason: str) -> None:
    text = with_rules(rule("r1", "{platform: rocm}", "{runner: mrv1}", reason=reason))
    assert only(lint(text), "vague-reason").line == 18


def test_a_reason_that_explains_is_not_vague() -> None:
    reason = "MRV2 regresses gfx950 batch-1 TPOT by 30 %"
    assert lint(with_rules(rule("r1", "{platform: rocm}", "{runner: mrv1}", reason=reason))) == []


# -- the command ----------------------------------------------------------------------------


def test_check_exit_codes_and_strict(write, capsys) -> None:
    clean = write("clean.yaml", with_rules(rule("r1", "{platform: rocm}", "{runner: mrv1}")))
    warned = write(
        "warned.yaml", with_rules(rule("r1", "{platform: rocm}", "{runner: mrv1}", ref=""))
    )
    broken = write("broken.yaml", with_rules(rule("r1", "{platform: rocm}", "{runner: mrv3}")))
    assert main(["check", "--policy", str(clean)]) == 0
    assert main(["check", "--policy", str(warned)]) == 0
    assert main(["check", "--policy", str(warned), "--strict"]) == 1
    assert main(["check", "--policy", str(broken)]) == 1
    out = capsys.readouterr()
    assert f"{broken}:17:19: error: unknown-runner:" in out.out
    assert "1 error(s), 0 warning(s)" in out.err


def test_check_json(write, capsys) -> None:
    warned = write(
        "warned.yaml", with_rules(rule("r1", "{platform: rocm}", "{runner: mrv1}", ref=""))
    )
    assert main(["check", "--policy", str(warned), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["ok"], doc["errors"], doc["warnings"]) == (True, 0, 1)
    assert doc["findings"][0]["code"] == "missing-ref"
    assert set(doc["findings"][0]) == {"file", "line", "col", "severity", "code", "message"}


def test_check_a_missing_file(capsys) -> None:
    assert main(["check", "--policy", "/nonexistent/p.yaml"]) == 1
    assert (
        "/nonexistent/p.yaml:1:1: error: invalid: cannot read policy file"
        in capsys.readouterr().out
    )


def test_a_rule_on_a_wrappers_text_model_is_not_dead() -> None:
    # No catalog entry has text_architecture (only a model's config.json gives it): such a
    # rule is judged on real models and config-carrying cases, not called dead.
    text = with_rules(rule("text", "{text_architecture: GlmMoeDsaForCausalLM}",
                           "{breakable: true}"))
    assert "dead-rule" not in {f.code for f in lint(text)}
