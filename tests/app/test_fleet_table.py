"""Issue 24 item 7: ``policy table`` answers the fleet question in one call: rows are
architectures (filtered by name or glob), columns the ``--target`` platform/arch pairs,
``--json`` works, and a layered site policy's changes are marked."""

from __future__ import annotations

import os

FLEET = ("--target", "cuda:sm_90", "--target", "rocm:gfx942", "--target", "rocm:gfx950")


def test_the_three_by_three_fleet_question(cli) -> None:
    res = cli("table", *FLEET, "-a", "GlmMoeDsaForCausalLM", "-a", "Kimi*", "-a",
              "LlamaForCausalLM", "--json")
    assert res.code == 0, res.err
    doc = res.json()
    assert [t["name"] for t in doc["targets"]] == ["cuda:sm_90", "rocm:gfx942", "rocm:gfx950"]
    archs = [row["architecture"] for row in doc["rows"]]
    assert archs[0] == "GlmMoeDsaForCausalLM" and archs[-1] == "LlamaForCausalLM"
    assert {"KimiK3ForConditionalGeneration", "KimiLinearForCausalLM"} <= set(archs)
    glm = doc["rows"][0]["cells"]
    assert glm["cuda:sm_90"]["decision"]["breakable"] is True
    assert glm["rocm:gfx950"]["decision"]["breakable"] is False
    assert glm["rocm:gfx950"]["set_by"]["breakable"] == "rocm-no-default-breakable"
    for row in doc["rows"]:  # the same answers as one explain call per cell
        for name, cell in row["cells"].items():
            platform, arch = name.split(":")
            one = cli("explain", row["architecture"], "--platform", platform,
                      "--device-arch", arch, "--json").json()
            assert cell["decision"] == one["decision"]


def test_a_gfx950_only_rule_is_visible(cli, tmp_path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(
        'schema_version: 1\nversion: "s"\nrules:\n  - id: gfx950-only\n'
        "    when: {platform: rocm, device_arch: gfx950}\n    set: {cudagraph: piecewise}\n"
        "    reason: gfx950 captures piecewise at this site\n"
        "    ref: https://example.invalid/gfx950\n"
    )
    stack = f"@shipped{os.pathsep}{site}"
    res = cli("table", "--policy", stack, "--platform", "rocm", "--device-arch", "gfx950",
              "-a", "LlamaForCausalLM", "--format", "json")
    assert res.json()[0]["cudagraph"] == "piecewise"
    plain = cli("table", "--policy", stack, "--platform", "rocm", "-a", "LlamaForCausalLM",
                "--json")
    assert plain.json()[0]["cudagraph"] == "full_and_piecewise"


def test_a_layered_site_policy_marks_what_it_changes(cli, site) -> None:
    stack = f"@shipped{os.pathsep}{site}"
    res = cli("table", "--policy", stack, *FLEET, "--feature", "tensor_parallel_size=8",
              "-a", "Glm*")
    assert res.code == 0, res.err
    lines = res.out.splitlines()
    glm = next(x for x in lines if x.startswith("GlmMoeDsaForCausalLM "))
    assert glm.endswith("mrv1 full_and_piecewise *")
    assert glm.count("*") == 1  # only gfx950 changes
    assert f"cell(s) where {site} changes the decision of" in res.out
    doc = cli("table", "--policy", stack, *FLEET, "--feature", "tensor_parallel_size=8",
              "-a", "GlmMoeDsaForCausalLM", "--json").json()
    cells = doc["rows"][0]["cells"]
    assert cells["rocm:gfx950"]["changed"] == ["runner"]
    assert cells["rocm:gfx950"]["base"]["runner"] == "mrv2"
    assert cells["cuda:sm_90"]["changed"] == []
    assert doc["base"]["files"] == doc["policy"]["files"][:1]


def test_against_names_the_base(cli, site) -> None:
    stack = f"@shipped{os.pathsep}{site}"
    doc = cli("table", "--policy", stack, "--against", "@shipped", "--target", "rocm:gfx950",
              "--feature", "tensor_parallel_size=2", "-a", "LlamaForCausalLM", "--json").json()
    assert doc["rows"][0]["cells"]["rocm:gfx950"]["changed"] == ["runner"]


def test_an_architecture_typo_says_did_you_mean(cli) -> None:
    res = cli("table", "-a", "GlmMoeDSAForCausalLM", "--target", "rocm:gfx950")
    assert res.code == 1 and "did you mean 'GlmMoeDsaForCausalLM'?" in res.err
    res = cli("table", "-a", "Nothing*", "--target", "rocm:gfx950")
    assert res.code == 1 and "matches no catalog architecture" in res.err
