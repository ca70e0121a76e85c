"""Issue 41: `policy test` says how many counterexamples an invariant has and how many it
shows, shows the simplest witness of each distinct violation first, and
``--all-counterexamples`` shows them all."""

from __future__ import annotations

from pathlib import Path

import pytest

from interlock.policy.invariants import SHOWN

# The near-miss edit of the issue: a site rule that moves GLM-5.2 on MI355X back to MRV1,
# under an invariant it violates (and so does every VLLM_USE_V2_MODEL_RUNNER=0 variant). The
# invariant speaks of hosts with Triton: without it MRV2 cannot run there at all.
SITE = """\
schema_version: 1
version: site-1
rules:
  - id: rocm-glm-back-on-mrv1
    when: {platform: rocm, device_arch: gfx950, architecture: GlmMoeDsaForCausalLM}
    set: {runner: mrv1}
    reason: GLM-5.2 regresses on MRV2 on MI355X in our measurements
    ref: https://example.invalid/glm
"""
TESTS = """\
schema_version: 1
policy: ["@shipped", site.yaml]
invariants:
  - name: DSA models on ROCm run MRV2
    forall: {platform: rocm, attention: dsa, features: {has_triton: true}}
    expect: {runner: mrv2}
"""


@pytest.fixture
def near_miss(tmp_path: Path) -> Path:
    (tmp_path / "site.yaml").write_text(SITE)
    tests = tmp_path / "site.tests.yaml"
    tests.write_text(TESTS)
    return tests


def _shown(out: str) -> list[str]:
    return [line.strip() for line in out.splitlines() if line.strip().startswith("counterexample:")]


def test_the_report_counts_the_counterexamples_and_names_the_flag(cli, near_miss: Path) -> None:
    everything = cli("test", near_miss, "--json").json()
    total = len(everything["runs"][0]["invariants"][0]["counterexamples"])
    assert total > SHOWN  # the situation: more than a text report shows
    res = cli("test", near_miss)
    assert res.code == 1
    assert f"{total} counterexample(s) in " in res.out
    assert (f"showing {SHOWN} of {total} counterexamples, the simplest witness of each "
            f"distinct violation first (--all-counterexamples shows all {total})") in res.out
    assert len(_shown(res.out)) == SHOWN
    full = cli("test", near_miss, "--all-counterexamples")
    assert full.code == 1
    assert len(_shown(full.out)) == total and "showing " not in full.out


def test_the_plain_case_the_edit_changed_comes_first(cli, near_miss: Path) -> None:
    shown = _shown(cli("test", near_miss).out)
    assert shown[0].startswith(
        "counterexample: GlmMoeDsaForCausalLM on rocm/gfx950, env unset, has_triton=true:")
    assert "runner by rule rocm-glm-back-on-mrv1 (" in shown[0] and "site.yaml:6)" in shown[0]
    # Then one witness per other (rule, model): each DSA model under VLLM_USE_V2_MODEL_RUNNER=0
    # on the unnamed device arch, before any variant of a violation already shown.
    heads = [line.split(" on ")[0].removeprefix("counterexample: ") for line in shown[1:7]]
    assert sorted(heads) == sorted([
        "DeepseekV32ForCausalLM", "DeepseekV32MTPModel", "DeepseekV4ForCausalLM",
        "DeepseekV4ForConditionalGeneration", "DeepSeekV4MTPModel", "GlmMoeDsaForCausalLM",
    ])
    assert all("rocm/(other), VLLM_USE_V2_MODEL_RUNNER=0" in line for line in shown[1:7])
    assert all("rocm/gfx950" in line for line in shown[7:])


def test_json_lists_every_counterexample_in_the_same_order(cli, near_miss: Path) -> None:
    doc = cli("test", near_miss, "--json").json()
    examples = doc["runs"][0]["invariants"][0]["counterexamples"]
    first = examples[0]
    assert first["context"]["architecture"] == "GlmMoeDsaForCausalLM"
    assert first["context"]["env"] == {} and first["context"]["device_arch"] == "gfx950"
    full = _shown(cli("test", near_miss, "--all-counterexamples").out)
    archs = [line.split(" on ")[0].removeprefix("counterexample: ") for line in full]
    assert archs == [e["context"]["architecture"] for e in examples]
