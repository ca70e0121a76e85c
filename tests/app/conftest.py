"""A site policy of the kind an operator layers on the shipped one, for the workflow tests."""

from __future__ import annotations

from pathlib import Path

import pytest

SITE = """\
schema_version: 1
version: "site-1"
rules:
  - id: site-mi355x-tp-mrv1
    when: {platform: rocm, device_arch: gfx950, features: {tensor_parallel_size: {gt: 1}}}
    set: {runner: mrv1}
    reason: >-
      on our MI355X hosts tensor-parallel serving measured faster on mrv1 than mrv2
      (the site's own bench, TP=8)
    ref: https://example.invalid/site/bench/2026-11
"""


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """``site.yaml``: one rule, no defaults, so it only loads layered on a base."""
    path = tmp_path / "site.yaml"
    path.write_text(SITE)
    return path
