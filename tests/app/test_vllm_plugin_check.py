"""Opt-in (``pytest -m vllm_probe tests/app/test_vllm_plugin_check.py``): interlock's vLLM
plugin inside the newest release's own config code (tools/vllm_probe/plugin_check.py).

Runs only where that release's probe venv is built with this checkout's interlock installed
in it; ``make vllm-plugin-check VLLM=X`` builds both and runs the same check.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tools" / "vllm_probe"
NEWEST = max(
    (REPO / "conformance").glob("vllm-*.jsonl"),
    key=lambda p: tuple(int(x) for x in re.findall(r"\d+", p.stem)),
)
VERSION = NEWEST.stem.removeprefix("vllm-")
VENV = REPO / ".vllm-probe" / f"venv-{VERSION}"

pytestmark = [
    pytest.mark.vllm_probe,
    pytest.mark.slow,
    pytest.mark.skipif(
        not (VENV / f".installed-{VERSION}").exists(),
        reason=f"no probe venv for vLLM {VERSION} (make vllm-plugin-check VLLM={VERSION})",
    ),
]


def test_the_plugin_decides_what_the_newest_release_runs(tmp_path: Path) -> None:
    """Every seed context, under the shipped and the site policy: vLLM's final config is the
    plugin's decision, and the plugin's lines name the rule that chose each field."""
    proc = subprocess.run(
        [sys.executable, str(TOOLS / "plugin_check.py"), "--vllm", VERSION, "--venv", str(VENV),
         "--work", str(tmp_path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 0
    assert re.search(r"vLLM \S+: (\d+) of \1 contexts pass", proc.stdout)
    assert "| interlock: governing HYV4ForCausalLM on rocm gfx942" in proc.stdout
    assert "rules site-hyv4-mi300x-not-breakable" in proc.stdout
