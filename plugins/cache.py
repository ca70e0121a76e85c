"""A disk cache of the plugin registry, so `policy explain` skips discovery.

Discovery costs importlib.metadata, pluggy and every plugin's declaration
module (tens of ms); the declarations are plain dataclasses, so the registry
is pickled and reused while nothing it came from has changed. Like a ``.pyc``,
validity is checked by stat: every ``sys.path`` entry (installing or removing
a distribution changes its directory) and every source file the declarations
were read from. A registry with a failed plugin or a runner conflict is never
stored, so fixing a plugin takes effect at once.
"""

from __future__ import annotations

import hashlib
import os
import sys
from typing import TYPE_CHECKING

from interlock.core.disk_cache import read_entry, write_entry
from interlock.plugins.api import PLUGIN_API_VERSION
from interlock.plugins.registry import PluginRegistry
from interlock.plugins.settings import Settings

if TYPE_CHECKING:
    from interlock.plugins.discovery import Discovery

NO_CACHE_ENV = "INTERLOCK_NO_PLUGIN_CACHE"
#: Bump when the pickled dataclasses change shape in a way file stats would not reveal.
CACHE_FORMAT = 1

Stat = tuple[str, int, int]


def _search_path() -> list[str]:
    return [os.path.abspath(p or os.curdir) for p in sys.path]


def _key(settings: Settings) -> str:
    identity = [
        str(CACHE_FORMAT),
        sys.executable,
        sys.version,
        PLUGIN_API_VERSION,
        ",".join(sorted(settings.disabled)),
        str(settings.strict),
        *_search_path(),
    ]
    return hashlib.sha256("\0".join(identity).encode()).hexdigest()[:32]


def _stat(path: str) -> Stat:
    try:
        st = os.stat(path)
    except OSError:
        return (path, -1, -1)
    return (path, st.st_mtime_ns, st.st_size)


def load(settings: Settings) -> PluginRegistry | None:
    """The cached registry, or None when there is none or anything it came from changed."""
    entry = read_entry("plugins", _key(settings))
    if not isinstance(entry, tuple) or len(entry) != 2:
        return None
    watched, registry = entry
    if any(_stat(item[0]) != tuple(item) for item in watched):
        return None
    return registry if isinstance(registry, PluginRegistry) else None


def store(settings: Settings, found: Discovery) -> bool:
    """Write the registry if it is clean; False when it was not stored."""
    registry = found.registry
    if registry.failed() or registry.conflicts:
        return False
    watched = [_stat(p) for p in sorted({*_search_path(), *found.watched})]
    return write_entry("plugins", _key(settings), (watched, registry))
