"""Where interlock caches derived data on disk, and the rules every entry obeys.

The cache directory is untrusted: whoever can write to it controls what a
careless reader would load. So:

- the directory must belong to the effective user and must not be writable by
  group or others; it is created with mode 0700. Otherwise the process runs
  uncached and says so once on stderr;
- entries are bytes, never code: callers store plain data (JSON) and rebuild
  their objects from it. Nothing is unpickled;
- an entry is opened without following symbolic links, must be a regular file
  owned by the user, and starts with a header holding a digest of its kind,
  key and payload: a damaged, planted or renamed entry reads as absent, so at
  worst it costs a rebuild;
- writes are atomic (a temporary file in the same directory, then a rename);
  something else left where an entry belongs (a directory) is removed first.

Other caches (e.g. converted checkpoints) use :func:`safe_cache_dir`,
:func:`write_entry` / :func:`read_entry` or, for files too large to hold in
memory, :func:`write_entry_file` / :func:`entry_file`.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from interlock.core.env import CACHE_DIR

_MAGIC = b"interlock-cache 1 "
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
#: Why the cache is off in this process (said once on stderr), or None.
_refused: str | None = None
_warned = False


def cache_dir() -> Path:
    """``$INTERLOCK_CACHE_DIR``, else ``$XDG_CACHE_HOME/interlock``, else ``~/.cache/interlock``."""
    explicit = os.environ.get(CACHE_DIR.name)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "interlock"


def entry_name(kind: str, key: str) -> str:
    return f"{kind}-{key}.entry"


def _unsafe(st: os.stat_result) -> str | None:
    """Why a directory with these stats may not hold the cache, or None."""
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _refuse(directory: Path, why: str) -> None:
    global _refused, _warned
    _refused = why
    if not _warned:
        _warned = True
        print(
            f"interlock: not using the cache directory {str(directory)!r}: it {why}; "
            "running without the cache (set INTERLOCK_CACHE_DIR to a private directory)",
            file=sys.stderr,
        )


@contextmanager
def _open_dir(create: bool) -> Iterator[int | None]:
    """A descriptor of the checked cache directory (None when it is absent or refused).

    Entries are then reached relative to the descriptor, so a directory swapped
    in after the check is never used.
    """
    directory = cache_dir()
    if create:
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError:
            pass  # an unwritable location only costs speed; opening below says the rest
    try:
        fd = os.open(directory, os.O_RDONLY | _DIRECTORY | _NOFOLLOW)
    except OSError as exc:
        if os.path.islink(directory):
            _refuse(directory, "is a symbolic link")
        elif create and os.path.lexists(directory):
            _refuse(directory, f"cannot be opened ({exc.strerror})")
        yield None
        return
    try:
        why = _unsafe(os.fstat(fd))
        if why is not None:
            _refuse(directory, why)
            yield None
        else:
            yield fd
    finally:
        os.close(fd)


def safe_cache_dir(create: bool = True) -> Path | None:
    """The cache directory if it passes the rules above (created 0700 when ``create``), else
    None (after saying why once on stderr). For caches that work with paths."""
    with _open_dir(create) as fd:
        return None if fd is None else cache_dir()


def refused() -> str | None:
    """Why this process runs uncached, or None."""
    return _refused


def _digest(kind: str, key: str, payload: bytes) -> str:
    h = hashlib.sha256(f"{kind}\0{key}\0".encode())
    h.update(payload)
    return h.hexdigest()


def _open_entry(fd: int, name: str) -> IO[bytes] | None:
    """The entry opened for reading if it is a regular file owned by the user, else None."""
    try:
        entry = os.open(name, os.O_RDONLY | _NOFOLLOW, dir_fd=fd)
    except OSError:
        return None  # absent, a symbolic link, or unreadable
    st = os.fstat(entry)
    if not stat.S_ISREG(st.st_mode) or (hasattr(os, "geteuid") and st.st_uid != os.geteuid()):
        os.close(entry)
        return None
    return os.fdopen(entry, "rb")


def read_entry(kind: str, key: str) -> bytes | None:
    """The payload stored under ``(kind, key)``, or None when there is none or it fails a rule."""
    with _open_dir(create=False) as fd:
        if fd is None:
            return None
        fh = _open_entry(fd, entry_name(kind, key))
        if fh is None:
            return None
        with fh:
            try:
                data = fh.read()
            except OSError:
                return None
    header, sep, payload = data.partition(b"\n")
    if not sep or not header.startswith(_MAGIC):
        return None
    if header[len(_MAGIC) :].decode("ascii", "replace") != _digest(kind, key, payload):
        return None
    return payload


def _write_atomically(fd: int, name: str, write: Callable[[IO[bytes]], object]) -> bool:
    tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    try:
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600, dir_fd=fd)
    except OSError:
        return False
    try:
        with os.fdopen(out, "wb") as fh:
            write(fh)
        _clear(fd, name)
        os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException as exc:
        try:
            os.unlink(tmp, dir_fd=fd)
        except OSError:
            pass
        if isinstance(exc, OSError):
            return False
        raise
    return True


def _clear(fd: int, name: str) -> None:
    """Remove a directory left where an entry belongs (a rename cannot replace one)."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        import shutil

        if sys.version_info < (3, 11):
            # rmtree takes dir_fd from 3.11 on; unwritten, the entry only costs speed.
            raise IsADirectoryError(name)
        shutil.rmtree(name, dir_fd=fd)


def write_entry(kind: str, key: str, payload: bytes) -> bool:
    """Store ``payload`` atomically with its digest; False when the cache could not be written."""
    header = _MAGIC + _digest(kind, key, payload).encode() + b"\n"
    with _open_dir(create=True) as fd:
        if fd is None:
            return False
        return _write_atomically(fd, entry_name(kind, key), lambda fh: fh.write(header + payload))


def read_json(kind: str, key: str) -> Any | None:
    """A JSON entry (see :func:`read_entry`), or None; the caller still checks its shape."""
    payload = read_entry(kind, key)
    if payload is None:
        return None
    try:
        return json.loads(payload)
    except ValueError:  # includes bad UTF-8 and integers past Python's digit limit
        return None


def write_json(kind: str, key: str, value: Any) -> bool:
    data = json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    return write_entry(kind, key, data)


def write_entry_file(kind: str, key: str, write: Callable[[IO[bytes]], None]) -> Path | None:
    """Store a large entry by streaming it into ``write(fh)``, atomically; its path, or None.

    No digest is kept (checking one would read the whole file on every use):
    :func:`entry_file` checks the directory and the file's type and owner only.
    """
    name = entry_name(kind, key)
    with _open_dir(create=True) as fd:
        if fd is None or not _write_atomically(fd, name, write):
            return None
    return cache_dir() / name


def entry_file(kind: str, key: str) -> Path | None:
    """The path of a file entry written by :func:`write_entry_file` if it passes the directory
    and file rules (regular file, owned by the user, no symbolic link), else None."""
    name = entry_name(kind, key)
    with _open_dir(create=False) as fd:
        if fd is None:
            return None
        fh = _open_entry(fd, name)
        if fh is None:
            return None
        fh.close()
    return cache_dir() / name
