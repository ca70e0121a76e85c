"""Issue 28 W7: ``policy vllm`` reads the user's flags as vLLM does: a JSON null is "not
given", and ``-O<n>`` / ``--optimization-level`` set graph defaults that interlock's own
``-cc`` flags never override silently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from interlock.vllm.flags import read_user_flags


@pytest.fixture
def llama(tmp_path: Path) -> Path:
    path = tmp_path / "llama"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    return path


def test_w7_null_cudagraph_mode_is_not_given() -> None:
    user = read_user_flags(["-cc", '{"cudagraph_mode": null}'])
    assert "cudagraph" not in user.overrides


def test_w7_null_mode_does_not_turn_compile_off() -> None:
    user = read_user_flags(["--compilation-config", '{"mode": null}'])
    assert "compile" not in user.overrides


def test_w7_null_keys_leave_the_decision_to_the_policy(cli, llama) -> None:
    res = cli("vllm", "args", "--platform", "cuda", "--json", llama,
              "-cc", '{"cudagraph_mode": null, "mode": null}')
    assert res.code == 0, res.err
    doc = res.json()
    assert doc["decision"]["cudagraph"] == "full_and_piecewise"
    assert doc["decision"]["compile"] is True
    assert doc["resolution"]["provenance"]["cudagraph"]["stage"] == "defaults"


@pytest.mark.parametrize("flags", [["-O0"], ["-O", "0"], ["-O=0"], ["--optimization-level", "0"],
                                   ["--optimization-level=0"]])
def test_w7_level_zero_is_not_overridden_by_our_flags(cli, llama, flags) -> None:
    res = cli("vllm", "args", "--platform", "cuda", "--json", llama, *flags)
    assert res.code == 0, res.err
    doc = res.json()
    assert doc["decision"]["cudagraph"] == "none" and doc["decision"]["compile"] is False
    ours = doc["argv"][3 : len(doc["argv"]) - len(flags)]
    assert "-cc.cudagraph_mode=FULL_AND_PIECEWISE" not in ours
    assert "-cc.mode=VLLM_COMPILE" not in ours


def test_w7_an_explicit_key_beats_the_level(cli, llama) -> None:
    res = cli("vllm", "args", "--platform", "cuda", "--json", llama, "-O0",
              "-cc.cudagraph_mode=PIECEWISE", "-cc.mode=VLLM_COMPILE")
    assert res.code == 0, res.err
    assert res.json()["decision"]["cudagraph"] == "piecewise"


@pytest.mark.parametrize("value", ["4", "-1", "x", ""])
def test_w7_a_level_vllm_does_not_have_is_refused(cli, llama, value) -> None:
    res = cli("vllm", "args", "--platform", "cuda", llama, f"--optimization-level={value}")
    assert res.code == 1 and "optimization levels are 0, 1, 2 and 3" in res.err
