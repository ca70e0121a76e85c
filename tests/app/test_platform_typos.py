"""Issue 24 item 5: unknown platform and device-arch names get "did you mean", in rules
(``policy check``), flags (``--platform``, ``--device-arch``, ``--target``) and plugin specs;
a plugin may declare a new platform explicitly (``new_platforms``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from interlock.plugins import PlatformSupport, RunnerSpec
from interlock.plugins.spec import SpecError

TYPO_SITE = """\
schema_version: 1
version: "site-typo"
rules:
  - id: site-rocm-mrv1
    when: {platform: rcom}
    set: {runner: mrv1}
    reason: keep our ROCm hosts on mrv1 until the site bench is redone
    ref: https://example.invalid/site/1
  - id: site-gfx-typo
    when: {platform: rocm, device_arch: [gfx942, gfx95O]}
    set: {runner: mrv1}
    reason: keep our MI300X and MI355X hosts on mrv1 until the bench is redone
    ref: https://example.invalid/site/2
"""


def test_a_rule_with_a_misspelt_platform_warns_on_that_rule(cli, tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(TYPO_SITE)
    res = cli("check", "--policy", f"@shipped{os.pathsep}{site}", "--json")
    findings = res.json()["findings"]
    platform = [f for f in findings if f["code"] == "unknown-platform"]
    assert len(platform) == 1
    assert platform[0]["file"] == str(site) and platform[0]["line"] == 5
    assert "unknown platform 'rcom'" in platform[0]["message"]
    assert "did you mean 'rocm'?" in platform[0]["message"]
    arch = [f for f in findings if f["code"] == "unknown-device-arch"]
    assert len(arch) == 1 and arch[0]["line"] == 10
    assert "'gfx95O'" in arch[0]["message"] and "did you mean 'gfx950'?" in arch[0]["message"]
    # The shipped rules are not blamed for the site's typo.
    assert all(f["file"] == str(site) for f in findings if f["severity"] == "warning")
    strict = cli("check", "--policy", f"@shipped{os.pathsep}{site}", "--strict")
    assert strict.code == 1


@pytest.mark.parametrize(
    ("argv", "wanted"),
    [
        (["explain", "GlmMoeDsaForCausalLM", "--platform", "rcom"], "did you mean 'rocm'?"),
        (["resolve", "X", "--platform", "cdua"], "did you mean 'cuda'?"),
        (["explain", "X", "--platform", "rocm", "--device-arch", "gfx95O"],
         "did you mean 'gfx950'?"),
        (["explain", "X", "--platform", "cuda", "--device-arch", "sm90"], "did you mean 'sm_90'?"),
        (["vllm", "args", "--platform", "rcom", "./M"], "did you mean 'rocm'?"),
        (["table", "--target", "rcom:gfx950"], "did you mean 'rocm'?"),
        (["table", "--target", "rocm:gfx95O"], "did you mean 'gfx950'?"),
    ],
)
def test_flags_with_a_misspelt_platform_or_arch_are_errors(cli, argv, wanted) -> None:
    res = cli(*argv)
    assert res.code == 1, res.err
    assert wanted in res.err and "install a runner plugin" not in res.err


def spec(platforms: dict, **kwargs) -> RunnerSpec:
    return RunnerSpec(name="npurunner", description="d", plugin_api=">=1.0,<2",
                      platforms=platforms, factory="wf_npu:Runner", **kwargs)


def test_a_spec_with_a_misspelt_platform_is_refused() -> None:
    with pytest.raises(SpecError, match=r"unknown platform 'cdua'.*did you mean 'cuda'\?"):
        spec({"cdua": PlatformSupport(cudagraph={"none"})})


def test_a_plugin_may_declare_a_new_platform() -> None:
    made = spec({"npu": PlatformSupport(cudagraph={"none"})}, new_platforms=("npu",))
    assert list(made.platforms) == ["npu"]
    assert RunnerSpec.from_dict(made.to_dict()) == made
    with pytest.raises(SpecError, match="is built in"):
        spec({"cuda": PlatformSupport(cudagraph={"none"})}, new_platforms=("cuda",))


TYPO_PLUGIN = """
from interlock.plugins import PlatformSupport, RunnerSpec, hookimpl

@hookimpl
def interlock_runner_specs():
    return [RunnerSpec(name="typorunner", description="d", plugin_api=">=1.0,<2",
                       platforms={"cdua": PlatformSupport(cudagraph={"none"})},
                       factory="wf_typo:Runner")]
"""
NEW_PLATFORM_PLUGIN = TYPO_PLUGIN.replace('"cdua"', '"npu"').replace(
    'factory="wf_typo:Runner")', 'factory="wf_typo:Runner", new_platforms=("npu",))'
)


def test_a_plugin_with_a_misspelt_platform_is_not_listed_ok(cli, install) -> None:
    install("wf-typo", {"typo": "wf_typo"}, {"wf_typo": TYPO_PLUGIN})
    res = cli("plugins", "--json")
    (record,) = [p for p in res.json()["plugins"] if p["distribution"] == "wf-typo"]
    assert record["status"] != "ok"
    assert "did you mean 'cuda'?" in record["detail"]


def test_a_declared_platform_is_known_to_the_flags_and_rules(cli, install) -> None:
    install("wf-typo", {"typo": "wf_typo"}, {"wf_typo": NEW_PLATFORM_PLUGIN})
    res = cli("explain", "LlamaForCausalLM", "--platform", "npu", "--set", "runner=typorunner")
    assert "unknown platform" not in res.err
