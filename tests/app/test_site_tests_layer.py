"""Issue 24 item 4: a site's tests file names the stack it tests
(``policy: ["@shipped", site.yaml]``), and ``policy test`` and the pytest plugin both honour
it; without the key, a site policy alone is told how to layer it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SITE_TESTS = """\
schema_version: 1
policy: ["@shipped", site.yaml]
cases:
  - name: GLM-5.2 with TP=8 on MI355X runs mrv1 here
    given:
      architecture: GlmMoeDsaForCausalLM
      platform: rocm
      device_arch: gfx950
      features: {tensor_parallel_size: 8}
    expect: {runner: mrv1, rule: site-mi355x-tp-mrv1}
  - name: the shipped defaults still apply on H100
    given: {architecture: LlamaForCausalLM, platform: cuda, device_arch: sm_90}
    expect: {runner: mrv2, cudagraph: full_and_piecewise}
"""


def pytest_in(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=folder, capture_output=True, text=True, check=False,
    )


def test_pytest_collects_a_layered_site_tests_file(site: Path) -> None:
    (site.parent / "site.tests.yaml").write_text(SITE_TESTS)
    done = pytest_in(site.parent, "site.tests.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout
    # Per file: the shipped layer shown but not counted, the site's one rule covered.
    shipped, own = [x for x in done.stdout.splitlines() if "rule coverage of " in x]
    assert shipped.startswith("site.tests.yaml: rule coverage of ")
    assert "(shipped, not counted): " in shipped and "/23 rules" in shipped
    assert own == "site.tests.yaml: rule coverage of site.yaml: 1/1 rules (100.0 %)"
    assert "not covered" not in done.stdout


def test_policy_test_honours_the_key(cli, site: Path, monkeypatch) -> None:
    tests = site.parent / "site.tests.yaml"
    tests.write_text(SITE_TESTS)
    elsewhere = site.parent / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # paths in the key are relative to the tests file
    res = cli("test", tests, "--json")
    assert res.code == 0, res.out + res.err
    doc = res.json()
    assert doc["passed"] == 2 and doc["failed"] == 0
    (run,) = doc["runs"]
    assert run["policy"]["files"][-1] == str(site)
    assert run["policy"]["version"] == "vllm-0.33.0..0.34.0+site-1"


def test_without_the_key_pytest_says_how_to_layer(site: Path) -> None:
    text = SITE_TESTS.replace('policy: ["@shipped", site.yaml]\n', "")
    (site.parent / "site.tests.yaml").write_text(text)
    done = pytest_in(site.parent, "site.tests.yaml")
    assert done.returncode != 0
    assert 'add policy: ["@shipped", site.yaml] to site.tests.yaml' in done.stdout


def test_a_bad_entry_in_the_key_is_an_error_at_its_line(cli, site: Path) -> None:
    tests = site.parent / "site.tests.yaml"
    tests.write_text(SITE_TESTS.replace('"@shipped"', '"@shiped"'))
    res = cli("test", tests)
    assert res.code == 1
    assert "site.tests.yaml:2:" in res.err and "did you mean '@shipped'" in res.err
