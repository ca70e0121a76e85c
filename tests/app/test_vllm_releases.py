"""The release table (interlock/vllm/releases.py) and its engine stage: the decision shown is
what that vLLM release runs, a release not read is refused, and the plugin reads vLLM's final
config back."""

from __future__ import annotations

import sys
import types
from enum import Enum
from pathlib import Path
from typing import Any

import pytest

from interlock.core.errors import EXIT_CODES
from interlock.policy.loader import load_policy
from interlock.vllm.plugin import EngineFacts, PluginRefusal, plugin_decision, read_back, register
from interlock.vllm.releases import KNOBS, NEWEST, RELEASES, known, release_number

ROOT = Path(__file__).parents[2]
GONE = ("VLLM_USE_V2_MODEL_RUNNER=0 is no longer supported: Model Runner V1 has been removed. "
        "Unset this variable.")


def _model(tmp_path: Path, arch: str) -> str:
    model = tmp_path / arch
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(f'{{"architectures": ["{arch}"]}}')
    return str(model)


def test_a_version_is_known_by_its_release_number() -> None:
    assert release_number("0.34.0rc1") == "0.34.0" and known("0.34.0+cu130") is NEWEST
    assert known("0.33.0.post1") is not None and known("0.33.1") is None
    assert known("0.35.0") is None
    assert [r.version for r in RELEASES] == sorted((r.version for r in RELEASES),
                                                   key=lambda v: tuple(map(int, v.split("."))))


@pytest.mark.parametrize("rel", [r for r in RELEASES if r.version >= "0.27"],
                         ids=lambda r: r.version)
def test_each_release_gets_exactly_the_env_knobs_it_reads(
    cli: Any, tmp_path: Path, rel: Any
) -> None:
    result = cli("vllm", "args", "--json", "--platform", "cuda", "--device-arch", "sm_90",
                 "--engine-version", f"vllm={rel.version}", "--allow-version-mismatch",
                 _model(tmp_path, "LlamaForCausalLM"))  # fmt: skip
    assert result.code == 0, result.err
    doc = result.json()
    assert set(doc["env"]) == {k.name for k in rel.knobs if k.kind == "env"}
    assert doc["vllm_release"] == rel.version
    assert set(doc["env"]) <= {k.name for k in KNOBS}


def test_mrv1_on_034_is_refused_in_vllms_words_at_its_line(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model(tmp_path, "GlmMoeDsaForCausalLM")
    args = ("--platform", "rocm", "--device-arch", "gfx950", "--engine-version", "vllm=0.34.0")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    result = cli("vllm", "args", *args, model)
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER")
    assert result.code == EXIT_CODES["refused"] and result.out == ""
    assert f"refused by vLLM 0.34.0 (vllm/platforms/interface.py:1483): {GONE}" in result.err
    assert "runner=mrv1 from VLLM_USE_V2_MODEL_RUNNER (env)" in result.err
    explained = cli("explain", "GlmMoeDsaForCausalLM", *args, "--env",
                    "VLLM_USE_V2_MODEL_RUNNER=0")
    assert "REFUSED  by vLLM 0.34.0  vllm/platforms/interface.py:1483" in explained.out
    # A site rule keeping GLM-5.2 on MRV1 (the seed-2 fix) is refused there as well.
    site = tmp_path / "site.yaml"
    site.write_text("""\
schema_version: 1
version: site-1
rules:
  - id: glm-stays-on-mrv1
    when: {architecture: GlmMoeDsaForCausalLM, platform: rocm}
    set: {runner: mrv1}
    reason: the seed-2 regression
""")
    sited = cli("vllm", "args", *args, "--policy", "@shipped", "--policy", str(site), model)
    assert sited.code == EXIT_CODES["refused"], sited.err
    assert "[runner=mrv1 from glm-stays-on-mrv1 (rules)]" in sited.err
    # On 0.33.0 the same site rule is a command vLLM runs.
    ok = cli("vllm", "args", "--platform", "rocm", "--device-arch", "gfx950",
             "--engine-version", "vllm=0.33.0", "--policy", "@shipped", "--policy", str(site),
             model)  # fmt: skip
    assert ok.code == 0 and "VLLM_USE_V2_MODEL_RUNNER=0" in ok.out, ok.err


def test_034_commands_carry_no_runner_knob_and_decide_its_breakable_set(
    cli: Any, tmp_path: Path
) -> None:
    result = cli("vllm", "args", "--json", "--platform", "rocm", "--device-arch", "gfx942",
                 "--engine-version", "vllm=0.34.0", _model(tmp_path, "HYV4ForCausalLM"))
    assert result.code == 0, result.err
    doc = result.json()
    assert doc["env"] == {"VLLM_USE_BREAKABLE_CUDAGRAPH": "1"}
    assert doc["decision"]["breakable"] is True and doc["decision"]["runner"] == "mrv2"


def test_a_release_not_read_is_refused_and_allowed_only_loudly(cli: Any, tmp_path: Path) -> None:
    model = _model(tmp_path, "LlamaForCausalLM")
    args = ("--platform", "cuda", "--engine-version", "vllm=0.35.0")
    refused = cli("vllm", "args", *args, model)
    assert refused.code == EXIT_CODES["refused"] and refused.out == ""
    assert "vLLM 0.35.0 is a release interlock has not read" in refused.err
    assert "make vllm-release VLLM=0.35.0" in refused.err
    allowed = cli("vllm", "args", "--allow-version-mismatch", *args, model)
    assert allowed.code == 0, allowed.err
    assert f"deciding as vLLM {NEWEST.version}" in allowed.err
    assert "VLLM_USE_V2_MODEL_RUNNER" not in allowed.out


def _gpu_facts(**changes: Any) -> EngineFacts:
    base: dict[str, Any] = dict(
        architecture="HYV4ForCausalLM", platform="rocm", device_arch="gfx942",
        vllm_version="0.34.0", has_triton=True,
        triton_source="detected by the engine (vllm.triton_utils.HAS_TRITON)",
        static_graphs=True, features={"tensor_parallel_size": 1},
    )
    base.update(changes)
    return EngineFacts(**base)


class Mode(Enum):
    NONE = 0
    PIECEWISE = 1
    FULL_AND_PIECEWISE = 2
    VLLM_COMPILE = 3


def _config(cudagraph: str, mode: str, breakable: bool) -> Any:
    compilation = types.SimpleNamespace(cudagraph_mode=Mode[cudagraph], mode=Mode[mode],
                                        use_breakable_cudagraph=breakable)
    return types.SimpleNamespace(compilation_config=compilation)


def test_the_plugin_on_034_sets_no_runner_and_says_why() -> None:
    made = plugin_decision(_gpu_facts(), load_policy([str(ROOT / "policies.yaml")]), {})
    assert made.env == {"VLLM_USE_BREAKABLE_CUDAGRAPH": "1"}
    lines = [s.line() for s in made.settings]
    assert lines[0].startswith("interlock: decided runner=mrv2 (defaults, ")
    assert lines[0].endswith("-> nothing to set (vLLM 0.34.0 reads no VLLM_USE_V2_MODEL_RUNNER)")
    assert any(line.startswith("interlock: decided breakable=true (rules rocm-hyv4-breakable, ")
               for line in lines)


def test_the_plugin_reads_back_vllms_final_config() -> None:
    made = plugin_decision(_gpu_facts(), load_policy([str(ROOT / "policies.yaml")]), {})
    read_back(_config("FULL_AND_PIECEWISE", "NONE", True), made)  # what was decided
    # A planted disagreement: a later step of vLLM turned breakable graphs off.
    with pytest.raises(PluginRefusal) as caught:
        read_back(_config("FULL_AND_PIECEWISE", "VLLM_COMPILE", False), made)
    text = str(caught.value)
    assert "breakable: decided true (rules rocm-hyv4-breakable, " in text
    assert "but vLLM 0.34.0's final config has false" in text
    assert "compile: decided NONE" in text and "has VLLM_COMPILE" in text


def test_the_plugin_refuses_to_govern_a_release_it_has_not_read(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = types.ModuleType("vllm")
    fake.__version__ = "0.35.0"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", fake)
    with pytest.raises(SystemExit) as stopped:
        register()
    assert stopped.value.code == EXIT_CODES["refused"]
    err = capsys.readouterr().err
    assert "interlock: the vLLM plugin stops the engine: vLLM 0.35.0 is a release" in err
    fake.__version__ = "0.26.0"  # type: ignore[attr-defined]
    with pytest.raises(SystemExit):
        register()
    assert "config seam (try_verify_and_update_config) was not read" in capsys.readouterr().err


def test_the_plugin_warns_when_the_policy_is_written_for_other_releases() -> None:
    facts = _gpu_facts(vllm_version="0.32.0", architecture="LlamaForCausalLM")
    (warning,) = plugin_decision(facts, load_policy([str(ROOT / "policies.yaml")]), {}).warnings
    assert warning.startswith("interlock: WARNING: vLLM 0.32.0 (the running vLLM) is outside "
                              "what the policy is written for: vLLM 0.33.0 to 0.34.0")
    assert "use --policy @all-releases (vLLM 0.27.1 to 0.34.0" in warning
    every = load_policy([str(ROOT / "examples" / "vllm-all-releases.yaml")])
    assert plugin_decision(facts, every, {}).warnings == ()


def test_a_wrapper_is_matched_on_its_text_model_from_034(cli: Any, tmp_path: Path) -> None:
    """vLLM 0.34.0 takes a multimodal wrapper whose text model is on its breakable list for a
    breakable model (hf_text_config): the text_architecture trait, read from config.json."""
    model = tmp_path / "wrapper"
    model.mkdir()
    (model / "config.json").write_text(
        '{"architectures": ["SomeVisionWrapperForConditionalGeneration"], '
        '"text_config": {"architectures": ["KimiK31ForConditionalGeneration"]}}')
    args = ("explain", "--model", str(model), "--platform", "cuda", "--device-arch", "sm_90")
    new = cli(*args, "--engine-version", "vllm=0.34.0", "--json").json()
    assert new["decision"]["breakable"] is True
    assert new["provenance"]["breakable"]["source"] == "breakable-text-model-from-0.34"
    trait = new["context"]["traits"]["text_architecture"]
    assert trait["value"] == "KimiK31ForConditionalGeneration"
    assert trait["origin"].startswith("model config")
    old = cli(*args, "--engine-version", "vllm=0.33.0", "--json").json()
    assert old["decision"]["breakable"] is False


def test_034_on_a_cpu_without_triton_refuses_x86_and_runs_v2_elsewhere(
    cli: Any, tmp_path: Path
) -> None:
    model = _model(tmp_path, "LlamaForCausalLM")
    args = ("vllm", "args", "--platform", "cpu", "--engine-version", "vllm=0.34.0",
            "--feature", "has_triton=false")
    x86 = cli(*args, model)
    assert x86.code == EXIT_CODES["refused"]
    assert ("refused by vLLM 0.34.0 (vllm/platforms/cpu.py:243): vLLM on x86 CPUs requires "
            "Triton (triton-cpu).") in x86.err
    arm = cli(*args, "--feature", "cpu_arch=arm", "--json", model)
    assert arm.code == 0, arm.err
    assert arm.json()["decision"]["runner"] == "mrv2" and arm.json()["env"] == {
        "VLLM_USE_BREAKABLE_CUDAGRAPH": "0"}


def test_the_plugin_reads_the_cpus_architecture_from_vllm() -> None:
    from interlock.vllm.releases import cpu_arch_name

    assert [cpu_arch_name(n) for n in ("X86", "ARM", "POWERPC")] == ["x86_64", "arm", "powerpc"]
