"""interlock's plugin inside SGLang's real resolution (``load_plugins()``, then
``ServerArgs(...).resolve_once()``) under the probe's stand-in platforms, in `.sglang/`
(`make sglang`), each context in a fresh process (tools/sglang_probe/governed.py). Opt in:
`make test-sglang` (marker ``sglang``).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from interlock.policy import load_policy, make_context, resolve

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".sglang" / "bin" / "python"
GOVERNED = ROOT / "tools" / "sglang_probe" / "governed.py"
#: The seeds' families where their incidents were (and DeepSeek-V3 on B200), with the
#: attention kind the probe's stand-in config carries for them.
SEEDS = [
    ("rocm", "gfx950", "GlmMoeDsaForCausalLM", "dsa"),
    ("rocm", "gfx942", "HYV4ForCausalLM", "mla"),
    ("cuda", "sm_90", "DeepseekV32ForCausalLM", "dsa"),
    ("cuda", "sm_100", "DeepseekV3ForCausalLM", "mla"),
    ("cpu", "", "LlamaForCausalLM", None),
]
SITE = """\
schema_version: 1
version: site-2026.12
rules:
  - id: site-glm-triton
    when: {architecture: GlmMoeDsaForCausalLM, platform: rocm}
    set: {attention_backend: triton, decode_cuda_graph_max_bs: 256}
    reason: our GLM-5.2 fleet
"""


def governed(platform: str, device_arch: str, architecture: str, attention: str | None,
             *given: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    if not PYTHON.exists():
        pytest.fail("no .sglang venv: run make sglang")
    command = [str(PYTHON), str(GOVERNED), "--platform", platform, "--device-arch", device_arch]
    command += ["--attention", attention] if attention else []
    command += [arg for item in given for arg in ("--set", item)] + [architecture]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")}
    return subprocess.run(command, cwd=ROOT, env={**environment, **(env or {})},
                          capture_output=True, text=True, timeout=600, check=False)


def _result(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def _plugin_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("interlock: ")]


@pytest.mark.parametrize(("platform", "device_arch", "architecture", "attention"), SEEDS)
def test_sglang_runs_the_policys_decision(platform: str, device_arch: str, architecture: str,
                                         attention: str | None) -> None:
    proc = governed(platform, device_arch, architecture, attention)
    result = _result(proc)
    expected = resolve(load_policy(["@sglang"]), make_context(
        architecture, platform=platform, device_arch=device_arch or None,
        engine={"sglang": "0.5.23"}))
    assert result["decision"] == expected.decision.to_dict()
    decided = [line for line in _plugin_lines(proc) if line.startswith("interlock: decided ")]
    assert len(decided) == len(expected.decision.to_dict())  # one line per field
    # SGLang's own provenance carries the rule and file:line (the backend and compile are
    # declared last by interlock; the graph config is re-declared by a later SGLang step
    # with the same values, which the read-back checked).
    backend = expected.provenance["attention_backend"]
    assert result["sources"]["attention_backend"] == (
        f"interlock: {backend.source} ({backend.stage}) {backend.location}")
    assert result["sources"]["torch_compile"].startswith("interlock: ")
    assert "examples/sglang.yaml:" in result["sources"]["torch_compile"]


def test_a_site_policy_changes_the_decision(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(SITE)
    proc = governed("rocm", "gfx950", "GlmMoeDsaForCausalLM", "dsa",
                    env={"INTERLOCK_POLICY": f"@sglang:{site}"})
    result = _result(proc)
    assert result["decision"]["attention_backend"] == "triton"
    assert result["decision"]["decode_cuda_graph_max_bs"] == 256
    assert result["sources"]["attention_backend"] == (
        f"interlock: site-glm-triton (rules) {site}:6")


def test_a_user_flag_is_left_alone() -> None:
    proc = governed("rocm", "gfx950", "GlmMoeDsaForCausalLM", "dsa",
                    "cuda_graph_backend_prefill=breakable", "attention_backend=triton")
    result = _result(proc)
    assert result["decision"]["prefill_cuda_graph"] == "breakable"
    assert result["decision"]["attention_backend"] == "triton"
    assert not result["sources"]["attention_backend"].startswith("interlock")
    lines = _plugin_lines(proc)
    assert "interlock: left prefill_cuda_graph to the user (cuda_graph_config given)" in lines
    assert "interlock: left attention_backend to the user (attention_backend given)" in lines


def test_the_decision_record_names_sglangs_decision(tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    _result(governed("cuda", "sm_90", "DeepseekV32ForCausalLM", "dsa",
                     env={"INTERLOCK_DECISION_LOG": str(log)}))
    (record,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert record["command"] == "sglang plugin"
    assert record["policy"]["engine"] == "sglang"
    assert record["engine"]["sglang_version"] == "0.5.23"
    assert record["decision"]["attention_backend"] == "dsa"


def test_a_later_step_that_changes_the_decision_stops_the_engine(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(SITE.replace("GlmMoeDsaForCausalLM, platform: rocm",
                                 "DeepseekV3ForCausalLM, platform: cuda")
                    .replace("attention_backend: triton, decode_cuda_graph_max_bs: 256",
                             "prefill_cuda_graph: breakable"))
    proc = governed("cuda", "sm_100", "DeepseekV3ForCausalLM", "mla",
                    env={"INTERLOCK_POLICY": f"@sglang:{site}"})
    assert proc.returncode == 5 and proc.stdout == ""
    assert ("prefill_cuda_graph: interlock declared breakable (interlock: site-glm-triton "
            f"(rules) {site}:6), but SGLang's step "
            "_disable_prefill_cuda_graph_for_deepseek_trtllm_mla changed it to disabled"
            ) in proc.stderr


@pytest.mark.parametrize(("policy", "code", "says"), [
    ("@shipped", 5, "the policy (policies.yaml) decides for vLLM, not SGLang"),
    ("missing.yaml", 1, "cannot read policy file"),
])
def test_a_failing_plugin_stops_the_process(policy: str, code: int, says: str) -> None:
    proc = governed("cpu", "", "LlamaForCausalLM", None, env={"INTERLOCK_POLICY": policy})
    assert proc.returncode == code and proc.stdout == ""
    assert "interlock: the SGLang plugin stops the engine: " in proc.stderr
    assert says in proc.stderr


def test_an_sglang_release_not_read_is_refused() -> None:
    if not PYTHON.exists():
        pytest.fail("no .sglang venv: run make sglang")
    code = ("import sglang; sglang.__version__ = '0.5.24'\n"
            "from interlock.sglang.plugin import register; register()")
    proc = subprocess.run([str(PYTHON), "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 5
    assert "SGLang 0.5.24 was not read by interlock (the plugin governs SGLang 0.5.23)" in (
        proc.stderr)
