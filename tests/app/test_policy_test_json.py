"""Issue 24 item 10: ``policy test --json``, and a case whose architecture is not in the
catalog warns with "did you mean" (and fails under ``--strict``)."""

from __future__ import annotations

from pathlib import Path

TYPO = """\
schema_version: 1
cases:
  - name: GLM-5.2 on MI355X
    given: {architecture: GlmMoeDSAForCausalLM, platform: rocm, device_arch: gfx950}
    expect: {runner: mrv2}
"""


def test_policy_test_prints_json(cli) -> None:
    res = cli("test", "--json")
    assert res.code == 0, res.err
    doc = res.json()
    assert doc["ok"] is True and doc["failed"] == 0 and doc["passed"] > 10
    (run,) = doc["runs"]
    case = run["cases"][0]
    assert set(case) == {"name", "location", "passed", "problems", "warnings", "decision", "error"}
    assert case["location"]["file"] == "policies.tests.yaml"
    assert run["coverage"]["percent"] == 100.0


def test_an_uncatalogued_architecture_warns_with_did_you_mean(cli, tmp_path: Path) -> None:
    path = tmp_path / "t.tests.yaml"
    path.write_text(TYPO)
    res = cli("test", path)
    assert res.code == 0  # the case passes, for the wrong reason: a warning says so
    assert f"{path}:4:27: warning: architecture 'GlmMoeDSAForCausalLM' is not in the" in res.out
    assert "did you mean 'GlmMoeDsaForCausalLM'?" in res.out
    strict = cli("test", path, "--strict", "--json")
    assert strict.code == 1
    doc = strict.json()
    assert doc["ok"] is False and doc["failed"] == 1 and doc["strict"] is True
    assert "did you mean" in doc["runs"][0]["cases"][0]["warnings"][0]


def test_a_case_may_mean_an_architecture_outside_the_catalog(cli, tmp_path: Path) -> None:
    path = tmp_path / "t.tests.yaml"
    path.write_text(TYPO.replace("gfx950}", "gfx950, outside_catalog: true}"))
    res = cli("test", path, "--strict")
    assert res.code == 0 and "warning" not in res.out
