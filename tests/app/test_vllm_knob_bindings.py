"""Issue 39 point 2: a policy's env bindings for vLLM's knobs read them as vLLM does. The
knob table (`VLLM_KNOBS`) holds each knob's texts once; `vllm serve`'s env and the plugin
take them from it, and a policy that maps them otherwise is refused before any command."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from interlock.policy.loader import load_policy
from interlock.vllm.releases import BREAKABLE_KNOB, RUNNER_KNOB, binding_problems

REPO = Path(__file__).resolve().parents[2]
POLICIES = sorted(
    [REPO / "policies.yaml", REPO / "examples" / "vllm-all-releases.yaml",
     *(REPO / "examples" / "history").glob("*.yaml")]
)


@pytest.mark.parametrize("path", [p for p in POLICIES if not p.name.endswith(".tests.yaml")],
                         ids=lambda p: p.name)
def test_every_shipped_and_history_policy_reads_the_knobs_as_vllm_does(path: Path) -> None:
    policy = load_policy([str(path)])
    assert RUNNER_KNOB.name in policy.env
    assert binding_problems(policy.env) == []


def test_the_serve_env_comes_from_the_knob_table() -> None:
    assert dict(RUNNER_KNOB.values) == {"mrv1": "0", "mrv2": "1"}
    assert BREAKABLE_KNOB.text(True) == "1" and BREAKABLE_KNOB.text(False) == "0"


SWAPPED = """\
schema_version: 1
version: "site"
env:
  VLLM_USE_V2_MODEL_RUNNER: {field: runner, values: {"1": mrv1, "0": mrv2}}
  VLLM_USE_BREAKABLE_CUDAGRAPH: {field: compile, values: {"1": true}}
"""


def test_a_policy_reading_a_knob_otherwise_is_refused_naming_its_line(
    cli: Any, tmp_path: Path
) -> None:
    (tmp_path / "site.yaml").write_text(SWAPPED)
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    result = cli("vllm", "args", "--policy", f"@shipped:{tmp_path / 'site.yaml'}",
                 "--platform", "cuda", "--device-arch", "sm_90",
                 "--engine-version", "vllm=0.33.0", str(model))  # fmt: skip
    assert result.code == 1 and result.out == ""
    assert 'site.yaml:4: env binding VLLM_USE_V2_MODEL_RUNNER maps "1" to mrv1; vLLM reads ' \
        '"1" as runner=mrv2' in result.err
    assert "site.yaml:5: env binding VLLM_USE_BREAKABLE_CUDAGRAPH sets compile; vLLM reads " \
        "it as breakable" in result.err
