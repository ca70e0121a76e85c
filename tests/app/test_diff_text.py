"""How `policy diff` words a change (issue 52 item 14): engine states are the ranges of
releases they stand for, never a representative version shown as if it were a release, and
an env condition every state shares is said once."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

SITE = """\
schema_version: 1
version: site-1
rules:
  - id: glm-tp8-mrv1
    when: {architecture: GlmMoeDsaForCausalLM, platform: rocm, features: {tensor_parallel_size: 8}}
    set: {runner: mrv1}
    reason: a site rule over every release
"""


def test_the_diff_names_release_ranges_and_says_the_env_once(cli: Any, tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(SITE)
    result = cli("diff", "@shipped", f"@shipped:{site}")
    assert result.code == 0, result.err
    out = result.out
    assert out.startswith("compared over engine: no version, and one per truth assignment of "
                          "the engine conditions (vllm <0.30, vllm >=0.30,<0.34, vllm >=0.34)")
    # No representative version is printed as a release ("vllm 0.29", "vllm 0.34").
    assert not re.search(r"vllm \d", out)
    change = " ".join(out[out.index("runner: mrv2 → mrv1"):].split())  # lines wrapped at 100
    assert change.count("unless VLLM_USE_V2_MODEL_RUNNER is set") == 1
    assert change.endswith("vllm >=0.34, unless VLLM_USE_V2_MODEL_RUNNER is set")
