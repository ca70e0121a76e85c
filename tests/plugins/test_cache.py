"""The registry cache: reused while nothing changed, rebuilt when anything it came from did."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from plugin_builders import make_dist, spec_module

from interlock import plugins
from interlock.plugins import cache, discovery
from interlock.plugins.settings import Settings


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("INTERLOCK_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _no_discovery(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> None:
        raise AssertionError("discovery ran although the cache was valid")

    monkeypatch.setattr(discovery, "discover", refuse)


def test_second_process_reads_the_cache(private_cache: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    first = plugins.load_registry()
    assert list(private_cache.glob("plugins-*.entry"))
    plugins.reset()  # as a new process would start
    _no_discovery(monkeypatch)
    again = plugins.load_registry()
    assert again is not first
    assert [p.to_dict() for p in again.plugins] == [p.to_dict() for p in first.plugins]


def test_a_changed_plugin_source_invalidates(private_cache: Path, tmp_path: Path) -> None:
    root = make_dist(
        tmp_path / "site",
        "edit-dist",
        "1.0",
        {"edit": "edit_plugin"},
        {"edit_plugin": spec_module("before")},
    )
    sys.path.insert(0, str(root))
    assert plugins.load_registry().find("before") is not None
    module = root / "edit_plugin.py"
    module.write_text(spec_module("after"))
    stat = module.stat()
    os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    del sys.modules["edit_plugin"]
    plugins.reset()
    registry = plugins.load_registry()
    assert (registry.find("before"), registry.find("after") is not None) == (None, True)


def test_a_new_distribution_invalidates(private_cache: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    sys.path.insert(0, str(site))
    assert plugins.load_registry().find("late") is None
    make_dist(
        site, "late-dist", "1.0", {"late": "late_plugin"}, {"late_plugin": spec_module("late")}
    )
    plugins.reset()
    assert plugins.load_registry().find("late") is not None


def test_a_registry_with_failures_is_not_stored(private_cache: Path, tmp_path: Path) -> None:
    sys.path.insert(
        0,
        str(
            make_dist(
                tmp_path / "site",
                "bad-dist",
                "1.0",
                {"bad": "bad_plugin"},
                {"bad_plugin": "raise ImportError('broken')\n"},
            )
        ),
    )
    found = discovery.discover(discovery.entry_point_sources(), Settings())
    assert found.registry.failed()
    assert cache.store(Settings(), found) is False


def test_settings_select_their_own_entry(private_cache: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    plugins.load_registry()
    monkeypatch.setenv("INTERLOCK_DISABLE_PLUGINS", "mrv2")
    plugins.reset()
    assert plugins.load_registry().find("mrv2") is None
    assert len(list(private_cache.glob("plugins-*.entry"))) == 2


def test_refresh_and_opt_out_always_discover(private_cache: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    plugins.load_registry()
    calls = []
    real = discovery.discover
    monkeypatch.setattr(discovery, "discover", lambda *a: calls.append(1) or real(*a))
    plugins.load_registry(refresh=True)
    monkeypatch.setenv("INTERLOCK_NO_PLUGIN_CACHE", "1")
    plugins.reset()
    plugins.load_registry()
    assert len(calls) == 2


def test_a_damaged_entry_is_rebuilt(private_cache: Path) -> None:
    plugins.load_registry()
    (entry,) = private_cache.glob("plugins-*.entry")
    entry.write_bytes(b"not an entry")
    plugins.reset()
    assert "mrv1" in plugins.load_registry().runner_names()
    assert entry.read_bytes() != b"not an entry"
