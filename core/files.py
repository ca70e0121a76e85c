"""Reading files interlock does not trust (policies, config.json, checkpoint indexes).

Only regular files are read (a FIFO would block forever, a device never ends),
sizes are bounded before reading, and text and JSON errors say where (line
and column) and what, never with a traceback. Each function raises
:class:`FileProblem`, a message the caller wraps in its own error type.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from interlock.core.errors import InputError


class FileProblem(InputError):
    """Why a file cannot be used: ``str()`` is ``file:line:col: detail`` (as much of the
    location as is known); the parts are kept for structured errors."""

    def __init__(
        self, file: str | None, detail: str, line: int | None = None, col: int | None = None
    ) -> None:
        where = ":".join(str(p) for p in (file, line, col) if p is not None)
        super().__init__(f"{where}: {detail}" if where else detail)
        self.file, self.detail, self.line, self.col = file, detail, line, col


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def check_regular(path: str | os.PathLike[str], name: str | None = None) -> os.stat_result:
    """The stats of ``path`` if it is (or links to) a regular file; FileProblem otherwise."""
    shown = name or os.fspath(path)
    if os.fspath(path) == "":
        raise FileProblem(None, "an empty path names no file")
    try:
        st = os.stat(path)
    except OSError as exc:
        raise FileProblem(shown, f"{exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise FileProblem(shown, f"is {_kind(st.st_mode)}, not a regular file")
    return st


def open_regular(path: str | os.PathLike[str], name: str | None = None) -> BinaryIO:
    """``path`` opened for reading in binary, if it is (or links to) a regular file: a FIFO
    is refused without waiting for a writer, a device or directory as what it is."""
    shown = name or os.fspath(path)
    if os.fspath(path) == "":
        raise FileProblem(None, "an empty path names no file")
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise FileProblem(shown, f"{exc.strerror or exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise FileProblem(shown, f"is {_kind(st.st_mode)}, not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_regular(path: str | os.PathLike[str], limit: int, name: str | None = None) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes."""
    shown = name or os.fspath(path)
    with open_regular(path, name) as fh:
        st = os.fstat(fh.fileno())
        if st.st_size > limit:
            raise FileProblem(shown, f"is {st.st_size} bytes, larger than the {limit} byte limit")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise FileProblem(shown, f"is larger than the {limit} byte limit")
    return data


def line_col(data: bytes, offset: int) -> tuple[int, int]:
    """1-based line and column (in characters) of byte ``offset``."""
    before = data[:offset]
    line = before.count(b"\n") + 1
    start = before.rfind(b"\n") + 1
    return line, len(before[start:].decode("utf-8", "replace")) + 1


def decode_utf8(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, col = line_col(data, exc.start)
        detail = f"not UTF-8 (byte 0x{data[exc.start]:02x}); save the file as UTF-8"
        raise FileProblem(name, detail, line, col) from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def load_json(data: bytes, name: str) -> Any:
    """Parse JSON strictly: UTF-8, no NaN/Infinity, bounded nesting; errors give line:col."""
    text = decode_utf8(data, name)
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise FileProblem(name, f"invalid JSON: {exc.msg}", exc.lineno, exc.colno) from None
    except RecursionError:
        raise FileProblem(name, "invalid JSON: nested too deeply") from None
    except ValueError as exc:  # NaN/Infinity, or an integer past Python's digit limit
        raise FileProblem(name, f"invalid JSON: {exc}") from None


def read_json(path: Path, limit: int, name: str | None = None) -> Any:
    shown = name or str(path)
    return load_json(read_regular(path, limit, shown), shown)
