"""Issue 39 point 6: `policy explain` and `policy vllm args|serve` say which vLLM release a
decision is for (the policy's `version:`), explain warns when the given vLLM is outside it,
and `vllm args|serve` refuse it (exit 5) unless --allow-version-mismatch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .planted_vllm import planted_venv

REPO = Path(__file__).resolve().parents[2]
SHIPPED_RELEASE = "vLLM 0.33.0 to 0.34.0 (version: policies.yaml:11)"


@pytest.fixture(autouse=True)
def _in_the_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    # Locations name the shipped policy relative to the current directory.
    monkeypatch.chdir(REPO)


def _model(tmp_path: Path) -> Path:
    path = tmp_path / "GLM-5.2"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["GlmMoeDsaForCausalLM"]}))
    return path


def test_explain_names_the_release_and_warns_on_another(cli: Any) -> None:
    same = cli("explain", "GlmMoeDsaForCausalLM", "--platform", "rocm",
               "--engine-version", "vllm=0.33.0+rocm7")  # fmt: skip
    assert same.code == 0 and same.err == ""
    assert same.out.split("\n")[2] == f"for {SHIPPED_RELEASE}"
    other = cli("explain", "GlmMoeDsaForCausalLM", "--platform", "rocm",
                "--engine-version", "vllm=0.31.0")  # fmt: skip
    assert other.code == 0 and other.out.split("\n")[2] == f"for {SHIPPED_RELEASE}"
    assert other.err == (
        "policy explain: warning: vLLM 0.31.0 (given with --engine-version) is outside what "
        f"the policy is written for: {SHIPPED_RELEASE}; the decision shown is that "
        "release's, not necessarily vLLM 0.31.0's: use --policy @all-releases (vLLM 0.27.1 "
        "to 0.34.0, one rule set for every release read; layer a site policy on it as "
        "@all-releases:site.yaml) or a policy written for vLLM 0.31.0\n"
    )


def test_explain_json_lists_the_releases(cli: Any) -> None:
    doc = cli("explain", "GlmMoeDsaForCausalLM", "--platform", "rocm", "--json").json()
    assert doc["releases"] == [{"engine": "vllm", "first": "0.33.0", "last": "0.34.0",
                                "location": {"file": "policies.yaml", "line": 11, "col": 1}}]


def test_a_policy_naming_no_release_says_so(cli: Any, write: Any, tmp_path: Path) -> None:
    site = write("site.yaml", 'schema_version: 1\nversion: "site-1"\n'
                 "defaults: {runner: mrv2, cudagraph: none, breakable: false, compile: true}\n")
    result = cli("explain", "LlamaForCausalLM", "--platform", "cuda", "--policy", site,
                 "--engine-version", "vllm=0.31.0")  # fmt: skip
    assert result.code == 0 and result.err == ""
    assert f"for no vLLM release: no file's version is vllm-X.Y.Z ('site-1' at {site}:2)" in (
        result.out.split("\n"))
    args = cli("vllm", "args", "--platform", "cuda", "--policy", site,
               "--engine-version", "vllm=0.31.0", _model(tmp_path))
    assert args.code == 0, args.err
    assert "policy vllm: policy for no vLLM release" in args.err and "warning" not in args.err


def test_vllm_args_refuses_a_given_release_outside_the_policy(cli: Any, tmp_path: Path) -> None:
    model = _model(tmp_path)
    refused = cli("vllm", "args", "--platform", "rocm", "--engine-version", "vllm=0.31.0",
                  model)  # fmt: skip
    assert refused.code == 5 and refused.out == ""
    assert refused.err == (
        "policy: error: vLLM 0.31.0 (given with --engine-version) is outside what the policy "
        f"is written for: {SHIPPED_RELEASE}; its decision may not be what vLLM 0.31.0 needs "
        "or can run: use --policy @all-releases (vLLM 0.27.1 to 0.34.0, one rule set for "
        "every release read; layer a site policy on it as @all-releases:site.yaml) or a "
        "policy written for vLLM 0.31.0, or give "
        "--allow-version-mismatch to use this one anyway\n"
    )
    as_json = cli("vllm", "args", "--json", "--platform", "rocm", "--engine-version",
                  "vllm=0.31.0", model)  # fmt: skip
    assert as_json.code == 5 and as_json.json()["error"]["kind"] == "refused"
    allowed = cli("vllm", "args", "--platform", "rocm", "--engine-version", "vllm=0.31.0",
                  "--allow-version-mismatch", model)  # fmt: skip
    assert allowed.code == 0 and allowed.out.startswith("VLLM_USE_V2_MODEL_RUNNER=")
    assert (f"policy vllm: warning: vLLM 0.31.0 (given with --engine-version) is outside what "
            f"the policy is written for: {SHIPPED_RELEASE}; going on "
            "(--allow-version-mismatch)") in allowed.err.split("\n")


def test_vllm_args_takes_a_policy_covering_the_release(cli: Any, tmp_path: Path) -> None:
    result = cli("vllm", "args", "--platform", "rocm", "--engine-version", "vllm=0.31.0",
                 "--policy", "examples/vllm-all-releases.yaml", _model(tmp_path))  # fmt: skip
    assert result.code == 0, result.err
    assert ("policy vllm: policy for vLLM 0.27.1 to 0.34.0 (version: "
            "examples/vllm-all-releases.yaml:17)") in result.err.split("\n")
    assert "warning" not in result.err


def test_vllm_args_without_a_version_warns_that_nothing_was_checked(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    result = cli("vllm", "args", "--platform", "rocm", _model(tmp_path))
    assert result.code == 0, result.err
    assert ("policy vllm: warning: no vLLM version to check the policy's release against "
            "(give --vllm PATH or --engine-version vllm=X.Y.Z)") in result.err.split("\n")


def test_vllm_serve_refuses_a_detected_release_before_running_anything(
    cli: Any, tmp_path: Path
) -> None:
    vllm = planted_venv(tmp_path / "venv", "vllm", "0.31.0")
    result = cli("vllm", "serve", "--platform", "rocm", "--vllm", vllm, _model(tmp_path))
    assert result.code == 5
    assert "vLLM 0.31.0 (detected (package metadata " in result.err
    assert f"is outside what the policy is written for: {SHIPPED_RELEASE}" in result.err
    assert not (tmp_path / "venv" / "RAN").exists()


def test_the_flag_goes_before_the_model(cli: Any, tmp_path: Path) -> None:
    result = cli("vllm", "args", "--platform", "rocm", _model(tmp_path),
                 "--allow-version-mismatch")  # fmt: skip
    assert result.code == 1 and "comes after MODEL" in result.err
