"""Fixtures for the hostile-input tests: an isolated cache and environment per test."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from plugin_builders import make_dist
from policy_texts import MINIMAL_BASE, with_rules

from interlock import plugins
from interlock.core import disk_cache


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("INTERLOCK_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("INTERLOCK_POLICY", "VLLM_USE_V2_MODEL_RUNNER", "VLLM_USE_BREAKABLE_CUDAGRAPH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    # The "running without the cache" notice is said once per process; each test is one.
    monkeypatch.setattr(disk_cache, "_warned", False)
    monkeypatch.setattr(disk_cache, "_refused", None)
    for name in (
        "INTERLOCK_DISABLE_PLUGINS",
        "INTERLOCK_PLUGINS_STRICT",
        "INTERLOCK_NO_PLUGIN_CACHE",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def install(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """install(dist, entry_points, modules): an installed-looking distribution on sys.path for
    one test (the plugin registry is rediscovered)."""
    path = list(sys.path)
    site = tmp_path / "site"

    def _install(dist: str, entry_points: dict[str, str], modules: dict[str, str]) -> Path:
        make_dist(site, dist, "1.0", entry_points, modules)
        if str(site) not in sys.path:
            sys.path.insert(0, str(site))
        plugins.reset()
        return site

    yield _install
    sys.path[:] = path
    for name in [m for m in sys.modules if m.startswith("hostile_")]:
        del sys.modules[name]
    plugins.reset()


POLICY = with_rules("""\
  - id: dsa-on-mrv1
    when: {attention: dsa, features: {tensor_parallel_size: {gt: 1}}}
    set: {runner: mrv1}
    reason: a reason long enough to pass
""", base=MINIMAL_BASE)


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(POLICY)
    return path
