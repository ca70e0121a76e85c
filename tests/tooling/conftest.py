"""Fixtures for the tooling tests: isolation from the caller's environment, policy texts."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from checkout import REPO, layout

from interlock.policy import Policy, load_policy

HISTORY = REPO / "examples" / "history"
BEFORE_51653 = HISTORY / "2026-08-12-before-vllm-51653.yaml"
BEFORE_53155 = HISTORY / "2026-08-31-before-vllm-53155.yaml"
SHIPPED = REPO / "policies.yaml"
#: The shipped policy as it stood after vLLM #53155, until interlock tracked vLLM releases.
SEED_53155 = HISTORY / "2026-09-01-vllm-53155.yaml"
SEED_53155_TESTS = HISTORY / "2026-09-01-vllm-53155.tests.yaml"

#: A minimal valid policy without its rules; see :func:`with_rules`.
BASE = """\
schema_version: 1
version: "t1"
catalog:
  DsaA: {family: a, moe: true, attention: dsa}
  DsaB: {family: b, moe: true, attention: dsa}
  DsaC: {family: c, moe: true, attention: dsa}
  GqaA: {family: a, moe: false, attention: gqa}
  GqaB: {family: b, moe: false, attention: gqa}
  MlaA: {family: a, moe: true, attention: mla}
  LinA: {family: c, moe: false, attention: linear}
defaults: {runner: mrv2, cudagraph: full_and_piecewise, breakable: false, compile: true}
env:
  USE_V2: {field: runner, values: {"0": mrv1, "1": mrv2}}
"""


def with_rules(rules: str = "", base: str = BASE) -> str:
    """``base`` plus a ``rules:`` block (YAML list items indented by two spaces)."""
    return base + ("rules:\n" + rules if rules.strip() else "rules: []\n")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("INTERLOCK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("INTERLOCK_POLICY", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")


@pytest.fixture(scope="session")
def shipped() -> Policy:
    return load_policy([SHIPPED], use_cache=False)



def copy_package(dest: Path) -> Path:
    """A copy of the ``interlock`` package laid out as an install has it (``interlock/policy/``
    ...) with pyproject.toml beside it; returns ``dest``, to put on PYTHONPATH."""
    return layout.assemble(dest)


def python_in(
    path: Path,
    *args: str,
    cwd: Path | None = None,
    pythonpath: Sequence[Path] = (),
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """``python args...`` with ``path`` (then ``pythonpath``) first on the import path, in place
    of the caller's own PYTHONPATH (which points at this checkout)."""
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    environ.update(PYTHONPATH=os.pathsep.join(map(str, [path, *pythonpath])), NO_COLOR="1")
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, *args], cwd=cwd or path, env=environ, capture_output=True, text=True,
        timeout=600,
    )
