"""The pytest11 plugin, run as a user would: pytest in a subprocess."""

from __future__ import annotations

import subprocess
import sys

import pytest
from checkout import BEFORE_53155, REPO, SEED_53155, SEED_53155_TESTS

pytestmark = pytest.mark.usefixtures("isolated_env")


def pytest_run(cwd, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_projects_pytest_collects_the_shipped_cases_one_item_each() -> None:
    done = pytest_run(REPO, "--collect-only", "-q", "policies.tests.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    items = [line for line in done.stdout.splitlines() if line.startswith("policies.tests.yaml::")]
    assert len(items) == (REPO / "policies.tests.yaml").read_text().count("  - name: ")
    assert "policies.tests.yaml::GLM-5.2 on MI355X runs MRV2 since vLLM 0.32" in items
    assert '"policies.tests.yaml"' in (REPO / "pyproject.toml").read_text()  # in testpaths


def test_failing_cases_report_like_policy_test(tmp_path) -> None:
    cases = SEED_53155_TESTS.read_text()
    (tmp_path / "old.yaml").write_text(BEFORE_53155.read_text())
    (tmp_path / "old.tests.yaml").write_text(cases)
    (tmp_path / "new.yaml").write_text(SEED_53155.read_text())
    (tmp_path / "new.tests.yaml").write_text(cases)
    (tmp_path / "orphan.tests.yaml").write_text(cases)
    done = pytest_run(tmp_path, "-q", "--continue-on-collection-errors")
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "FAIL  GLM-5.2 on MI355X stays on MRV1 (vLLM 53155)  (old.tests.yaml:10)" in out
    assert "runner: expected mrv1, got mrv2 (set by defaults at old.yaml:" in out
    assert "FAILED old.tests.yaml::GLM-5.2 on MI355X stays on MRV1 (vLLM 53155)" in out
    assert "new.tests.yaml: rule coverage: 8/8 rules (100.0 %)" in out
    assert "FAILED new.tests.yaml" not in out
    # A tests file needs its policy beside it: a collection error, not a silent skip.
    assert "ERROR orphan.tests.yaml" in out
    assert "orphan.tests.yaml: no policy orphan.yaml beside it to test" in out
