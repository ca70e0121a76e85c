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
import pickle
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from plugins.api import PLUGIN_API_VERSION
from plugins.registry import PluginRegistry
from plugins.settings import Settings
from policy.loader import cache_dir

if TYPE_CHECKING:
    from plugins.discovery import Discovery

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


def _file(key: str) -> Path:
    return cache_dir() / f"plugins-{key}.pickle"


def load(settings: Settings) -> PluginRegistry | None:
    """The cached registry, or None when there is none or anything it came from changed."""
    try:
        with open(_file(_key(settings)), "rb") as fh:
            watched, registry = pickle.load(fh)
        if any(_stat(entry[0]) != entry for entry in watched):
            return None
    except FileNotFoundError:
        return None
    except Exception:  # written by another version, or damaged: discover afresh and overwrite
        return None
    return registry if isinstance(registry, PluginRegistry) else None


def store(settings: Settings, found: Discovery) -> bool:
    """Write the registry if it is clean; False when it was not stored."""
    registry = found.registry
    if registry.failed() or registry.conflicts:
        return False
    import tempfile  # only for writing: a warm start never needs it

    watched = [_stat(p) for p in sorted({*_search_path(), *found.watched})]
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".plugins-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                pickle.dump((watched, registry), fh, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, _file(_key(settings)))
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return False  # an unwritable cache only costs speed
    return True
