"""`make vllm-release`'s report (tools/vllm_probe/release.py): what a release changed per
context, a drafted history policy that reproduces it, the site rules it refuses, and the
release table checked against the facts read in the wheel."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "vllm_probe" / "release.py"


def _wheel(venv: Path, *, runner_env: bool, seam: int) -> None:
    """A probe venv whose vllm package holds just the text the tool reads."""
    root = venv / "lib" / "python3.11" / "site-packages" / "vllm"
    (root / "config").mkdir(parents=True)
    (root / "platforms").mkdir()
    envs = '"VLLM_USE_BREAKABLE_CUDAGRAPH": lambda: 0,\n'
    if runner_env:
        envs += '"VLLM_USE_V2_MODEL_RUNNER": lambda: 1,\n'
    (root / "envs.py").write_text(envs)
    (root / "config" / "vllm.py").write_text(
        "\n" * (seam - 1) + "    def try_verify_and_update_config(self):\n")
    (root / "config" / "compilation.py").write_text("")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True,
                          cwd=REPO, timeout=300, check=False)


def test_the_report_of_033_over_032(tmp_path: Path) -> None:
    venv, out = tmp_path / "venv", tmp_path / "out"
    _wheel(venv, runner_env=False, seam=9)  # planted: not what 0.33.0's wheel says
    site = tmp_path / "site.yaml"
    site.write_text("""\
schema_version: 1
version: site-1
rules:
  - id: step5-on-mrv1
    when: {architecture: Step5ForCausalLM}
    set: {runner: mrv1}
    reason: a site that kept Step5 on V1
""")
    proc = _run("--vllm", "0.33.0", "--venv", str(venv), "--site", str(site), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "56 changed context(s); shipped policy 100.0 %" in proc.stdout
    report = (out / "report.md").read_text()
    assert "- breakable: 32" in report and "- outcome decided -> refused: 24" in report
    # The draft over 0.32.0's history policy reproduces 0.33.0 whole.
    assert "examples/history/vllm-0.32.0.yaml + the draft: 100.0 % of 1584" in report
    draft = (out / "vllm-0.33.0.draft.yaml").read_text()
    assert 'refuse: "Model Runner V1 does not support: Step5"' in draft
    assert "rule step5-on-mrv1 (" in report and "sets runner: refused on 4 context(s)" in report
    # The table's entry is checked against the wheel's text: the planted facts disagree.
    assert "- reads VLLM_USE_V2_MODEL_RUNNER: the wheel says False, the table True" in report
    assert "- seam: the wheel says 9, the table 2735" in report
    changes = [json.loads(line) for line in (out / "changes.jsonl").read_text().splitlines()]
    assert len(changes) == 56


def test_a_release_not_in_the_table_gets_its_facts_listed(tmp_path: Path) -> None:
    venv, out = tmp_path / "venv", tmp_path / "out"
    _wheel(venv, runner_env=False, seam=3000)
    snapshots = tmp_path / "snapshots"
    snapshots.mkdir()
    lines = (REPO / "conformance" / "vllm-0.33.0.jsonl").read_text().splitlines()
    (snapshots / "vllm-0.33.0.jsonl").write_text("\n".join(lines) + "\n")
    (snapshots / "vllm-0.99.0.jsonl").write_text("\n".join([
        lines[0].replace('"0.33.0"', '"0.99.0"'),
        *[line.replace('"vllm": "0.33.0"', '"vllm": "0.99.0"') for line in lines[1:]]]) + "\n")
    proc = _run("--vllm", "0.99.0", "--venv", str(venv), "--out", str(out), "--snapshots",
                str(snapshots))
    assert proc.returncode == 0, proc.stderr
    report = (out / "report.md").read_text()
    assert "vLLM 0.99.0 is not in interlock/vllm/releases.py: add a Release entry" in report
    assert "- seam: 3000" in report and "(no engine stage: " not in report
    assert "no release stage: not read yet" in report
