"""Opening a GGUF file and reading its key-value metadata, with errors naming the file
and the key (the file is untrusted: the ``gguf`` package parses it)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, BinaryIO

from interlock.core.files import FileProblem, open_regular
from interlock.runners.model.gguf.errors import GGUFError
from interlock.runners.model.gguf.layout import check_layout


def open_reader(path: Path, fh: BinaryIO | None = None) -> Any:
    """The ``gguf.GGUFReader`` of ``path`` (read through ``fh`` when given: the bytes the
    caller hashed), once :func:`~.layout.check_layout` found its layout sound."""
    import gguf

    if fh is None:
        try:
            fh = open_regular(path)
        except FileProblem as exc:
            raise GGUFError(str(exc)) from None
    with fh:
        check_layout(fh, str(path))
        try:
            return gguf.GGUFReader(fh)  # type: ignore[arg-type]  # numpy maps a file object too
        except Exception as exc:  # the reader parses untrusted bytes; any failure: a bad file
            raise GGUFError(
                f"{path}: not a readable GGUF file: {type(exc).__name__}: {exc}"
            ) from None


class Fields:
    """Typed access to the key-value metadata, with errors naming the key."""

    def __init__(self, reader: Any, path: Path) -> None:
        self.fields = reader.fields
        self.path = path

    def get(self, key: str) -> Any:
        field = self.fields.get(key)
        if field is None:
            return None
        try:
            return field.contents()
        except Exception as exc:  # a malformed value in untrusted bytes
            raise GGUFError(f"{self.path}: metadata {key}: unreadable value: {exc}") from None

    def required(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise GGUFError(f"{self.path}: metadata {key} is missing")
        return value

    def string(self, key: str) -> str:
        value = self.required(key)
        if not isinstance(value, str):
            raise GGUFError(f"{self.path}: metadata {key}={value!r} is not a string")
        return value

    def integer(self, key: str, default: int | None = None) -> int:
        value = self.get(key) if default is not None else self.required(key)
        if value is None:
            return default  # type: ignore[return-value]
        if isinstance(value, list):  # per-layer values: only a uniform list is a model here
            if not value or len(set(value)) != 1:
                raise GGUFError(
                    f"{self.path}: metadata {key} differs between layers ({value[:8]}...); "
                    "only uniform layers are supported"
                )
            value = value[0]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise GGUFError(f"{self.path}: metadata {key}={value!r} is not a positive integer")
        return int(value)

    def number(self, key: str, default: float | None = None) -> float:
        value = self.get(key)
        if value is None:
            if default is None:
                raise GGUFError(f"{self.path}: metadata {key} is missing")
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise GGUFError(f"{self.path}: metadata {key}={value!r} is not a number")
        if not math.isfinite(value):  # JSON has no NaN: it would be blamed on the cache
            raise GGUFError(f"{self.path}: metadata {key}={value!r} is not a finite number")
        return float(value)
