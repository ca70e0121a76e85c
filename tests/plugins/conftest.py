"""Plugin tests: every test starts from a fresh registry and a private cache directory."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from interlock import plugins
from interlock.testing import register_plugin  # noqa: F401  (the fixture plugin authors use)


@pytest.fixture(autouse=True)
def _isolated(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    monkeypatch.setenv("INTERLOCK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    for name in (
        "INTERLOCK_DISABLE_PLUGINS",
        "INTERLOCK_PLUGINS_STRICT",
        "INTERLOCK_NO_PLUGIN_CACHE",
        "INTERLOCK_POLICY",
    ):
        monkeypatch.delenv(name, raising=False)
    path = list(sys.path)
    plugins.reset()
    yield
    sys.path[:] = path
    plugins.reset()
