"""The process-wide plugin registry: discovered once, cached on disk, resettable for tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from interlock.core.env import NO_PLUGIN_CACHE
from interlock.plugins import cache
from interlock.plugins.registry import PluginRegistry
from interlock.plugins.settings import Settings

if TYPE_CHECKING:
    from interlock.plugins.discovery import PluginSource

_in_process: dict[str, PluginSource] = {}
_memo: dict[tuple[object, ...], PluginRegistry] = {}


def load_registry(env: Mapping[str, str] | None = None, *, refresh: bool = False) -> PluginRegistry:
    """The registry for this environment.

    Memoized per process; across processes the disk cache answers unless
    ``refresh`` (always discover, then store) or plugins were registered in-process.
    """
    env = os.environ if env is None else env
    settings = Settings.from_env(env)
    memo_key = (settings, tuple(sys.path), tuple(_in_process))
    if not refresh and memo_key in _memo:
        return _memo[memo_key]
    use_cache = not _in_process and not env.get(NO_PLUGIN_CACHE.name)
    registry = cache.load(settings) if use_cache and not refresh else None
    if registry is None:
        # Only a cache miss pays for importlib.metadata, pluggy and the plugins' modules.
        from interlock.plugins.discovery import discover, entry_point_sources

        found = discover([*entry_point_sources(), *_in_process.values()], settings)
        if use_cache:
            cache.store(settings, found)
        registry = found.registry
    _memo[memo_key] = registry
    return registry


def add_plugin(
    plugin: object, name: str, *, distribution: str = "in-process", version: str = "0"
) -> None:
    """Register a plugin object without installing it (tests, notebooks)."""
    from interlock.plugins.discovery import PluginSource

    if name in _in_process:
        raise ValueError(f"an in-process plugin named {name!r} is already registered")
    _in_process[name] = PluginSource(
        name=name,
        distribution=distribution,
        version=version,
        source=f"in-process {type(plugin).__name__} {getattr(plugin, '__name__', '')}".strip(),
        load=lambda: plugin,
    )
    _memo.clear()


def remove_plugin(name: str) -> None:
    del _in_process[name]
    _memo.clear()


def reset() -> None:
    """Forget every memoized registry (after changing sys.path or the environment)."""
    _memo.clear()
