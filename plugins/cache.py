"""A disk cache of the plugin registry, so `policy explain` skips discovery.

Discovery costs importlib.metadata, pluggy and every plugin's declaration
module (tens of ms); the declarations are plain dataclasses, so the registry
is stored as JSON (rebuilt with the specs' ``from_dict``) and reused while
nothing it came from has changed. Like a ``.pyc``, validity is checked by
stat: every ``sys.path`` entry (installing or removing a distribution changes
its directory), every ``entry_points.txt`` declaring interlock plugins (an
edit in place changes no directory) and every source file the declarations were read
from. A registry with a failed plugin or a runner conflict is never stored,
so fixing a plugin takes effect at once.
"""

from __future__ import annotations

import hashlib
import os
import sys
from typing import TYPE_CHECKING, Any

from interlock.core.disk_cache import read_json, write_json
from interlock.plugins.api import PLUGIN_API_VERSION
from interlock.plugins.registry import PluginRecord, PluginRegistry
from interlock.plugins.settings import Settings
from interlock.plugins.spec import SERVED_FIELDS, KernelSpec, RunnerSpec

if TYPE_CHECKING:
    from interlock.plugins.discovery import Discovery

#: Bump when the stored form changes in a way file stats would not reveal.
CACHE_FORMAT = 2

Stat = tuple[str, int, int]


def _search_path() -> list[str]:
    return [os.path.abspath(p or os.curdir) for p in sys.path]


def _key(settings: Settings) -> str:
    identity = [
        str(CACHE_FORMAT),
        sys.executable,
        sys.version,
        PLUGIN_API_VERSION,
        # A decision field runners declare changes the stored PlatformSupport (from_dict).
        ",".join(SERVED_FIELDS),
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
    """The cached registry, or None when there is none, it is damaged, or anything it came
    from changed."""
    entry = read_json("plugins", _key(settings))
    if entry is None:
        return None
    try:
        watched = entry["watched"]
        if any(_stat(path) != (path, mtime, size) for path, mtime, size in watched):
            return None
        return PluginRegistry(
            [_record(p) for p in entry["plugins"]], tuple(entry["unknown_disabled"])
        )
    except (KeyError, TypeError, ValueError, AttributeError):  # not what store() wrote
        return None


def store(settings: Settings, found: Discovery) -> bool:
    """Write the registry if it is clean; False when it was not stored."""
    registry = found.registry
    if registry.failed() or registry.conflicts:
        return False
    watched = [_stat(p) for p in sorted({*_search_path(), *found.watched})]
    return write_json(
        "plugins",
        _key(settings),
        {
            "watched": watched,
            "plugins": [p.to_dict() for p in registry.plugins],
            "unknown_disabled": list(registry.unknown_disabled),
        },
    )


def _record(data: dict[str, Any]) -> PluginRecord:
    fields = {k: data[k] for k in ("name", "distribution", "version", "source", "detail")}
    if not all(isinstance(v, str) for v in fields.values()):
        raise ValueError("not a stored plugin record")
    if data["status"] not in ("ok", "failed", "disabled", "incompatible"):
        raise ValueError("not a stored plugin status")
    return PluginRecord(
        **fields,
        status=data["status"],
        runners=tuple(RunnerSpec.from_dict(r) for r in data["runners"]),
        kernels=tuple(KernelSpec.from_dict(k) for k in data["kernels"]),
    )
