"""Opt-in (``pytest -m vllm_probe tests/app/test_vllm_probe.py``): vLLM's own config code in
the probe venv.

Builds ``.vllm-probe/venv-<newest snapshot's version>`` on first use (the vLLM wheel
is ~340 MB), so CI does not select these.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm_probe

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tools" / "vllm_probe"
NEWEST = max(
    (REPO / "conformance").glob("vllm-*.jsonl"),
    key=lambda p: tuple(int(x) for x in re.findall(r"\d+", p.stem)),
)
VERSION = NEWEST.stem.removeprefix("vllm-")
VENV = REPO / ".vllm-probe" / f"venv-{VERSION}"


@pytest.fixture(scope="module")
def venv() -> Path:
    subprocess.run([str(TOOLS / "setup_venv.sh"), VERSION, str(VENV)], check=True)
    return VENV


def test_probe_smoke(venv: Path, tmp_path: Path) -> None:
    """Two architectures on a stand-in H100: vLLM's breakable auto-enable and the defaults."""
    env = {**os.environ, "VLLM_CACHE_ROOT": str(tmp_path / "cache")}
    archs = "LlamaForCausalLM,GlmMoeDsaForCausalLM"
    probe = [str(venv / "bin" / "python"), str(TOOLS / "probe.py")]
    inspected = subprocess.run(
        [*probe, "--inspect", "--archs", archs], env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(inspected.stdout.splitlines()[-1])["not_inspected"] == {}
    out = tmp_path / "rows.jsonl"
    subprocess.run(
        [*probe, "--platform", "cuda", "--device-arch", "sm_90", "--env", "unset",
         "--archs", archs, "--out", str(out)],
        env=env, check=True,
    )  # fmt: skip
    rows = {r["architecture"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows["LlamaForCausalLM"]["vllm"] == VERSION
    assert (rows["LlamaForCausalLM"]["breakable"], rows["LlamaForCausalLM"]["compile"]) == (
        False,
        True,
    )
    glm = rows["GlmMoeDsaForCausalLM"]
    assert (glm["runner"], glm["breakable"], glm["compile"]) == ("mrv2", True, False)
    assert glm["cudagraph"] == "full_and_piecewise" and 1 in glm["capture_sizes"]


def test_round_trip(venv: Path, tmp_path: Path) -> None:
    """vLLM, given the flags `policy vllm args` emits, decides what interlock decided."""
    sys.path.insert(0, str(TOOLS))
    from roundtrip import round_trip

    report = round_trip(NEWEST, venv, [REPO / "policies.yaml"], tmp_path)
    print(json.dumps({k: v for k, v in report.items() if k != "failures"}))
    assert report["failures"] == []
    assert report["agree"] > 0
