"""Rules citing measurement records: `policy check` validates them and warns when the evidence
contradicts the rule or predates its last change; `policy explain` summarises them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from checkout import REPO

from interlock.measure import Workload, run

POLICY = """\
schema_version: 1
version: "t1"
catalog:
  LlamaForCausalLM: {{family: llama, attention: gqa, moe: false}}
defaults: {{runner: fast, cudagraph: none, breakable: false, compile: false}}
rules:
  - id: cpu-llama-runner
    when: {{platform: {platform}, architecture: LlamaForCausalLM}}
    set: {{runner: {runner}}}
    reason: {reason}
    ref: https://example.invalid/measured
    evidence: [{evidence}]
"""


def policy_text(
    runner: str = "fast", platform: str = "cpu", evidence: str = "evidence/runner.json",
    reason: str = "the fast runner measured faster on this machine",
) -> str:
    return POLICY.format(runner=runner, platform=platform, evidence=evidence, reason=reason)


@pytest.fixture(scope="module")
def record(shared_tiny_model: Path) -> dict[str, Any]:
    return run(
        shared_tiny_model, vary={"runner": ["fast", "slow"]},
        workload=Workload(prompt_len=4, max_tokens=4, trials=5, warmup=0), load_format="dummy",
    )


@pytest.fixture
def site(tmp_path: Path, record: dict[str, Any]) -> Path:
    """A folder holding ``evidence/runner.json``; write ``policy.yaml`` beside it."""
    (tmp_path / "evidence").mkdir()
    (tmp_path / "evidence" / "runner.json").write_text(json.dumps(record, indent=1))
    return tmp_path


def check(cli, policy: Path) -> tuple[int, list[dict[str, Any]]]:
    result = cli("check", "--policy", policy, "--json")
    # These CPU-only site policies also get the default-runner-unserved warning, and the rule
    # restating the default runner a pin-rule note: not the subject here.
    findings = result.json()["findings"]
    other = {"default-runner-unserved", "pin-rule"}
    return result.code, [f for f in findings if f["code"] not in other]


def codes(findings: list[dict[str, Any]]) -> list[str]:
    return [f["code"] for f in findings if f["code"].startswith("evidence")]


def test_evidence_for_the_rules_value_is_verified(cli, site):
    policy = site / "policy.yaml"
    policy.write_text(policy_text("fast"))
    code, findings = check(cli, policy)
    assert code == 0
    assert codes(findings) == ["evidence"]
    [note] = findings
    assert note["severity"] == "note" and note["line"] == 12
    assert "runner fast -" in note["message"] and "vs slow (batch 1)" in note["message"]
    assert "context matches" in note["message"]
    # tmp_path is not in a git repository
    assert "staleness not checked (no git history for the policy and the record)" in note[
        "message"
    ]


def test_evidence_contradicts_a_rule_choosing_the_slow_arm(cli, site):
    policy = site / "policy.yaml"
    policy.write_text(policy_text("slow"))
    code, findings = check(cli, policy)
    assert code == 0  # a warning
    [warning] = [f for f in findings if f["code"] == "evidence-contradicts"]
    assert warning["severity"] == "warning"
    assert "runner=slow is significantly slower than fast" in warning["message"]
    assert cli("check", "--policy", policy, "--strict").code == 1


def test_evidence_from_another_context_is_refused(cli, site):
    policy = site / "policy.yaml"
    policy.write_text(policy_text("fast", platform="rocm"))
    code, findings = check(cli, policy)
    assert code == 1
    [error] = [f for f in findings if f["severity"] == "error"]
    assert error["code"] == "evidence-invalid"
    assert "platform: wanted rocm, observed cpu" in error["message"]


def test_a_record_measuring_none_of_the_rules_fields_is_refused(cli, site):
    policy = site / "policy.yaml"
    policy.write_text(policy_text("fast").replace("set: {runner: fast}", "set: {breakable: true}"))
    code, findings = check(cli, policy)
    assert code == 1
    assert "measures none of the fields the rule sets: breakable=true" in findings[0]["message"]


def test_a_missing_record_is_an_error(cli, site):
    policy = site / "policy.yaml"
    policy.write_text(policy_text(evidence="evidence/nowhere.json"))
    code, findings = check(cli, policy)
    assert code == 1
    assert "no such file" in findings[0]["message"]


@pytest.mark.parametrize(
    ("damage", "where", "message"),
    [
        (
            lambda text: text.replace('"confidence": 0.95', '"confidence": "high"'),
            "json:",
            "analysis.confidence",
        ),
        (
            lambda text: text.replace('"schema": "interlock-evidence/1"', '"schema": "v9"'),
            ":2:",
            "schema",
        ),
        (lambda text: text[: len(text) // 2], "invalid JSON", ""),
        (
            lambda text: text.replace('"confidence": 0.95', '"confidence": NaN'),
            "invalid JSON",
            "NaN",
        ),
    ],
)
def test_a_malformed_record_is_a_clear_error_at_its_line(cli, site, damage, where, message):
    path = site / "evidence" / "runner.json"
    path.write_text(damage(path.read_text()))
    policy = site / "policy.yaml"
    policy.write_text(policy_text())
    code, findings = check(cli, policy)
    assert code == 1
    [error] = findings
    assert error["code"] == "evidence-invalid" and error["line"] == 12
    assert "is not a valid measurement record" in error["message"]
    assert where in error["message"] and message in error["message"]
    # file:line:col of the record itself
    assert "runner.json:" in error["message"]


def test_the_confidence_error_names_the_records_line(cli, site):
    path = site / "evidence" / "runner.json"
    text = path.read_text()
    line = text[: text.index('"confidence"')].count("\n") + 1
    path.write_text(text.replace('"confidence": 0.95', '"confidence": "high"'))
    policy = site / "policy.yaml"
    policy.write_text(policy_text())
    _, [error] = check(cli, policy)
    assert f"runner.json:{line}:" in error["message"]


def git(repo: Path, *args: str, date: str | None = None) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    if date is not None:
        env |= {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_evidence_is_stale_once_the_rule_changes_after_it(cli, site):
    policy = site / "policy.yaml"
    policy.write_text(policy_text())
    git(site, "init", "-q")
    git(site, "add", ".")
    git(site, "commit", "-qm", "rule and its evidence", date="2026-11-01T10:00:00Z")
    _, findings = check(cli, policy)
    assert codes(findings) == ["evidence"]
    assert "not stale (checked with git)" in findings[0]["message"]
    # Citing a record again is not a change of the rule; editing its reason is.
    policy.write_text(policy_text(reason="the fast runner measured faster on this cpu"))
    _, findings = check(cli, policy)
    [stale] = [f for f in findings if f["code"] == "evidence-stale"]
    assert "in uncommitted edits" in stale["message"] and "checked with git" in stale["message"]
    git(site, "commit", "-qam", "reword", date="2026-11-02T10:00:00Z")
    _, findings = check(cli, policy)
    [stale] = [f for f in findings if f["code"] == "evidence-stale"]
    assert "the rule last changed in a commit of 2026-11-02 10:00 UTC" in stale["message"]
    assert "the record in a commit of 2026-11-01 10:00 UTC" in stale["message"]


def test_explain_summarises_the_evidence(cli, site):
    policy = site / "policy.yaml"
    policy.write_text(policy_text())
    result = cli("explain", "LlamaForCausalLM", "--platform", "cpu", "--policy", policy)
    assert result.code == 0, result.err
    [line] = [ln for ln in result.out.splitlines() if "evidence:" in ln]
    day = json.loads((site / "evidence" / "runner.json").read_text())["created"][:10]
    assert "evidence: runner fast -" in line
    assert "ms/token [" in line
    assert f"vs slow (batch 1) on cpu, {day} (evidence/runner.json)" in line




def test_the_example_site_rule_cites_a_record_that_check_verifies(cli, monkeypatch):
    monkeypatch.chdir(REPO)
    result = cli(
        "check", "--policy", "policies.yaml", "--policy", "examples/measured-cpu.yaml", "--json"
    )
    assert result.code == 0, result.out
    findings = result.json()["findings"]
    # A later change to the runner or kernel code the record ran makes it stale (a warning
    # naming the files, until someone re-measures); nothing else may be found.
    code_stale = [f for f in findings if f["code"] == "evidence-stale"
                  and "the runner and kernel code it measured changed" in f["message"]]
    findings = [f for f in findings if f not in code_stale]
    assert [f["code"] for f in findings] == ["evidence"], findings
    assert "rule cpu-llama-graphs: evidence evidence/cpu-demo-2x2.json: cudagraph full_and_pie" in (
        findings[0]["message"]
    )
    assert "context matches" in findings[0]["message"]
    explained = cli(
        "explain", "LlamaForCausalLM", "--platform", "cpu", "--policy", "policies.yaml",
        "--policy", "examples/measured-cpu.yaml",
    )
    assert "evidence: cudagraph full_and_piecewise " in explained.out
