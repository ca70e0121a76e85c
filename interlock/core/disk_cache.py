"""Where interlock caches validated data on disk, and how entries are read and written.

Entries are pickles of plain dataclasses. A missing, damaged or foreign entry
reads as None (the caller rebuilds and overwrites it); writes are atomic
(temp file + rename); an unwritable cache only costs speed.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    """``$INTERLOCK_CACHE_DIR``, else ``$XDG_CACHE_HOME/interlock``, else ``~/.cache/interlock``."""
    explicit = os.environ.get("INTERLOCK_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "interlock"


def entry_path(kind: str, key: str) -> Path:
    return cache_dir() / f"{kind}-{key}.pickle"


def read_entry(kind: str, key: str) -> Any | None:
    """The unpickled entry, or None when there is none or it cannot be read."""
    try:
        with open(entry_path(kind, key), "rb") as fh:
            return pickle.load(fh)
    except Exception:  # absent, written by another version, or damaged
        return None


def write_entry(kind: str, key: str, value: Any) -> bool:
    """Store atomically; False when the cache could not be written."""
    import tempfile  # only for writing: a warm start never needs it

    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{kind}-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, entry_path(kind, key))
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return False
    return True
