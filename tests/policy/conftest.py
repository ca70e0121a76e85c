"""Fixtures for the policy tests: an isolated cache dir, the shipped policy, a small base policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from interlock.policy import Policy, load_policy


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("INTERLOCK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("INTERLOCK_POLICY", raising=False)
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    monkeypatch.delenv("VLLM_USE_BREAKABLE_CUDAGRAPH", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")


@pytest.fixture(scope="session")
def shipped() -> Policy:
    return load_policy(use_cache=False)


BASE = """\
schema_version: 1
version: "t1"
catalog:
  DsaModel: {moe: true, attention: dsa}
  DenseModel: {moe: false, attention: gqa}
defaults: {runner: mrv2, cudagraph: full_and_piecewise, breakable: false, compile: true}
env:
  USE_V2: {field: runner, values: {"0": mrv1, "1": mrv2}}
rules: []
"""


@pytest.fixture
def base() -> str:
    """A small complete policy: two catalog entries, one env binding, no rules."""
    return BASE

