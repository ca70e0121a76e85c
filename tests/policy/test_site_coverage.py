"""`policy test` counts the site's rules: coverage per file of a stack, and --min-coverage on
every file but the shipped policy (which counts only when it is the whole stack)."""

from __future__ import annotations

import json
from pathlib import Path

from interlock.cli import main

SITE = """\
schema_version: 1
version: site-1
rules:
  - id: site-tp-mrv1
    when: {platform: rocm, device_arch: gfx950, features: {tensor_parallel_size: {gt: 1}}}
    set: {runner: mrv1}
    reason: tensor-parallel serving measured faster on mrv1 at this site
    ref: https://example.invalid/site/1
  - id: site-cuda-piecewise
    when: {platform: cuda, device_arch: sm_90}
    set: {cudagraph: piecewise}
    reason: piecewise graphs only on our H100 hosts, after a capture regression
    ref: https://example.invalid/site/2
"""
CLUSTER = """\
schema_version: 1
version: cluster-1
rules:
  - id: cluster-llama-eager
    when: {architecture: LlamaForCausalLM, platform: cuda}
    set: {cudagraph: none}
    reason: this cluster runs Llama eagerly while its driver is pinned
    ref: https://example.invalid/cluster/1
"""
TP8_ON_MI355X = """\
  - name: TP=8 on MI355X runs mrv1 here
    given:
      architecture: GlmMoeDsaForCausalLM
      platform: rocm
      device_arch: gfx950
      features: {tensor_parallel_size: 8}
    expect: {runner: mrv1, rule: site-tp-mrv1}
"""


def write_tests(folder: Path, stack: str, cases: str) -> Path:
    path = folder / "site.tests.yaml"
    path.write_text(f"schema_version: 1\npolicy: {stack}\ncases:\n{cases}")
    return path


def test_a_site_stack_counts_the_site_file_not_the_shipped_one(tmp_path: Path, capsys) -> None:
    (tmp_path / "site.yaml").write_text(SITE)
    tests = write_tests(tmp_path, '["@shipped", site.yaml]', TP8_ON_MI355X)
    # The shipped policy is barely covered (1 of its rules), the site's half: 50 % passes.
    assert main(["test", str(tests), "--min-coverage", "50"]) == 0
    out = capsys.readouterr().out.splitlines()
    shipped, site, uncovered = out[-3:]
    assert shipped.startswith("rule coverage of ") and "(shipped, not counted): 1/" in shipped
    assert site == f"rule coverage of {tmp_path / 'site.yaml'}: 1/2 rules (50.0 %)"
    assert uncovered == f"not covered in {tmp_path / 'site.yaml'}: site-cuda-piecewise"
    assert main(["test", str(tests), "--min-coverage", "60"]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"policy: error: rule coverage of {tmp_path / 'site.yaml'} is 50.0 %, below "
        "--min-coverage 60 %\n"
    )


def test_every_non_shipped_layer_is_counted_on_its_own(tmp_path: Path, capsys) -> None:
    (tmp_path / "site.yaml").write_text(SITE)
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    h100 = (
        "  - name: H100 takes piecewise graphs\n"
        "    given: {architecture: GlmMoeDsaForCausalLM, platform: cuda, device_arch: sm_90}\n"
        "    expect: {cudagraph: piecewise}\n"
    )
    tests = write_tests(tmp_path, '["@shipped", site.yaml, cluster.yaml]', TP8_ON_MI355X + h100)
    # site.yaml is covered whole; cluster.yaml's one rule is not, and fails the gate alone.
    assert main(["test", str(tests), "--min-coverage", "100", "--json"]) == 1
    captured = capsys.readouterr()
    coverage = json.loads(captured.out)["runs"][0]["coverage"]
    files = {Path(f["file"]).name: f for f in coverage["files"]}
    assert [(f["gated"], f["shipped"]) for f in files.values()] == [
        (False, True), (True, False), (True, False)
    ]
    assert files["site.yaml"]["percent"] == 100.0
    assert files["cluster.yaml"]["uncovered"] == ["cluster-llama-eager"]
    # Together, the counted files: 2 of 3 rules.
    assert (coverage["rules"], coverage["percent"]) == (3, 66.67)
    assert "cluster.yaml is 0.0 %, below --min-coverage 100 %" in captured.err
    assert "site.yaml is" not in captured.err


def test_the_shipped_policy_alone_is_counted(capsys) -> None:
    # Its own tests (policies.tests.yaml) are about it: there the gate applies to it.
    assert main(["test", "--min-coverage", "100"]) == 0
    assert "rule coverage: 23/23 rules (100.0 %)" in capsys.readouterr().out
