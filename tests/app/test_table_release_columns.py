"""Issue 39 point 7: `policy table --target P[:ARCH]@vllm=X` makes a column of an engine
release, so one table across releases shows where two hosts' decisions differ; each cell is
decided with its column's version as a fact, and a column outside the policy's release is
warned about."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
ALL_RELEASES = ("--policy", "examples/vllm-all-releases.yaml")


@pytest.fixture(autouse=True)
def _in_the_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


def test_columns_of_two_releases_show_where_the_hosts_disagree(cli: Any) -> None:
    result = cli("table", *ALL_RELEASES, "--target", "rocm:gfx942@vllm=0.31.0",
                 "--target", "rocm:gfx942@vllm=0.32.0", "-a", "GlmMoeDsaForCausalLM",
                 "-a", "LlamaForCausalLM", "--json")  # fmt: skip
    assert result.code == 0 and result.err == ""
    doc = result.json()
    assert [(t["name"], t["engine"]) for t in doc["targets"]] == [
        ("rocm:gfx942@vllm=0.31.0", {"vllm": "0.31.0"}),
        ("rocm:gfx942@vllm=0.32.0", {"vllm": "0.32.0"}),
    ]
    glm, llama = (row["cells"] for row in doc["rows"])
    # vLLM 0.32.0 moved every DSA model to MRV2 on ROCm; Llama is the same on both.
    assert glm["rocm:gfx942@vllm=0.31.0"]["decision"]["runner"] == "mrv1"
    assert glm["rocm:gfx942@vllm=0.32.0"]["decision"]["runner"] == "mrv2"
    assert (llama["rocm:gfx942@vllm=0.31.0"]["decision"]
            == llama["rocm:gfx942@vllm=0.32.0"]["decision"])


@pytest.mark.parametrize("version", ["0.29.0", "0.31.0", "0.33.0"])
def test_each_cell_is_what_explain_decides_for_that_release(cli: Any, version: str) -> None:
    target = f"rocm:gfx950@vllm={version}"
    cell = cli("table", *ALL_RELEASES, "--target", target, "-a", "GlmMoeDsaForCausalLM",
               "--json").json()["rows"][0]["cells"][target]  # fmt: skip
    one = cli("explain", "GlmMoeDsaForCausalLM", *ALL_RELEASES, "--platform", "rocm",
              "--device-arch", "gfx950", "--engine-version", f"vllm={version}", "--json")
    assert cell["decision"] == one.json()["decision"]
    assert cell["set_by"] == {k: p["source"] for k, p in one.json()["provenance"].items()}


def test_a_column_s_release_wins_over_engine_version(cli: Any) -> None:
    doc = cli("table", *ALL_RELEASES, "--engine-version", "vllm=0.32.0", "--target",
              "rocm:gfx942@vllm=0.31.0", "--target", "rocm:gfx942", "-a",
              "GlmMoeDsaForCausalLM", "--json").json()  # fmt: skip
    cells = doc["rows"][0]["cells"]
    assert cells["rocm:gfx942@vllm=0.31.0"]["decision"]["runner"] == "mrv1"
    assert cells["rocm:gfx942"]["decision"]["runner"] == "mrv2"


def test_a_column_outside_the_policy_s_release_is_refused_naming_the_policy_for_it(
    cli: Any,
) -> None:
    result = cli("table", "--target", "rocm:gfx942@vllm=0.31.0", "--target", "rocm:gfx942",
                 "-a", "GlmMoeDsaForCausalLM")  # fmt: skip
    assert result.code == 5 and result.out == ""
    assert result.err == (
        "policy: error: policy table: --target rocm:gfx942@vllm=0.31.0: vLLM 0.31.0 (given "
        "with --target rocm:gfx942@vllm=0.31.0) is outside what the policy is written for: "
        "vLLM 0.33.0 to 0.34.0 (version: policies.yaml:11), so its cells would be another "
        "release's decisions: use --policy @all-releases (vLLM 0.27.1 to 0.34.0, one rule "
        "set for every release read; layer a site policy on it as @all-releases:site.yaml) "
        "or a policy written for vLLM 0.31.0\n"
    )
    # Under the policy of every release, the same column is that release's decision.
    ok = cli("table", *ALL_RELEASES, "--target", "rocm:gfx942@vllm=0.31.0", "-a",
             "GlmMoeDsaForCausalLM")  # fmt: skip
    assert ok.code == 0 and ok.err == "" and "mrv1" in ok.out


def test_a_034_column_runs_through_its_release(cli: Any) -> None:
    target = "rocm:gfx950@vllm=0.34.0"
    doc = cli("table", "--target", target, "-a", "GlmMoeDsaForCausalLM", "--env",
              "VLLM_USE_V2_MODEL_RUNNER=0", "--json").json()  # fmt: skip
    refusal = doc["rows"][0]["cells"][target]["refusal"]
    assert refusal["by"] == "vLLM 0.34.0" and refusal["location"]["line"] == 1483


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ("rocm:gfx942@vllm=banana", "rocm:gfx942@vllm=banana: 'banana' is not a PEP 440 version"),
        ("rocm@vllm", "rocm@vllm: expected @ENGINE=VERSION, e.g. @vllm=0.31.0, got '@vllm'"),
        ("rocm@", "rocm@: expected @ENGINE=VERSION"),
        ("rocm@trtllm=0.4.0", "rocm@trtllm=0.4.0: unknown engine 'trtllm'; known: vllm, sglang"),
        ("rocm@vllm=0.31.0@vllm=0.32.0", "engine 'vllm' is given twice"),
        ("@vllm=0.31.0", "expected PLATFORM[:ARCH][@ENGINE=VERSION]"),
    ],
)
def test_a_malformed_release_is_a_usage_error_naming_it(cli: Any, target: str,
                                                        says: str) -> None:
    result = cli("table", "--target", target, "--json")
    assert result.code == 2 and "Traceback" not in result.err
    assert says in result.err
    assert result.json()["error"]["kind"] == "usage"
