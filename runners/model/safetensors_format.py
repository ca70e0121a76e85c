"""The safetensors file format, read and written in one place (torch- and numpy-free).

A file is an 8-byte little-endian header length, a JSON header (each tensor's dtype,
shape and byte range after the header; ``__metadata__`` optional) and the tensors' bytes.
The checkpoint reader (``runners.model.weights``) takes the byte offsets from here; the
GGUF converter and the demo checkpoint write through :func:`write_safetensors`, one
tensor in memory at a time.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

#: Bytes per element of the dtypes this project writes.
ITEM_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "U8": 1}
#: A header larger than this is refused (the format's own reader has a limit too).
MAX_HEADER_BYTES = 100 * 2**20
_LENGTH = struct.Struct("<Q")


def data_offsets(path: Path) -> dict[str, int]:
    """Where each tensor's bytes start in the file at ``path``. Raises ``OSError`` or
    ``ValueError`` (``struct.error``, ``KeyError``, ``TypeError``, ``IndexError`` for a
    header that is not one) naming what is wrong."""
    with open(path, "rb") as fh:
        (size,) = _LENGTH.unpack(fh.read(_LENGTH.size))
        if size > MAX_HEADER_BYTES:
            raise ValueError(f"a {size}-byte header")
        header = json.loads(fh.read(size))
    start = _LENGTH.size + size
    return {
        key: start + int(entry["data_offsets"][0])
        for key, entry in header.items()
        if key != "__metadata__"
    }


@dataclass(frozen=True)
class TensorEntry:
    """One tensor to write: its name, dtype (``ITEM_SIZE``'s names), shape, and a function
    giving its bytes (little-endian, row-major), called only when it is written."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data: Callable[[], bytes | memoryview]


def write_safetensors(
    path: Path, tensors: Sequence[TensorEntry], metadata: Mapping[str, str] | None = None
) -> None:
    """Write ``tensors`` into one file, streaming: the header (names, dtypes, shapes, byte
    ranges) is known before any tensor's bytes are made, so each is written as soon as it
    is, and only one is in memory at a time."""
    header: dict[str, Any] = {} if metadata is None else {"__metadata__": dict(metadata)}
    offset = 0
    for t in tensors:
        size = ITEM_SIZE[t.dtype] * prod(t.shape)
        header[t.name] = {
            "dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + size]
        }
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as fh:
        fh.write(_LENGTH.pack(len(encoded)))
        fh.write(encoded)
        for t in tensors:
            data = t.data()
            expected = ITEM_SIZE[t.dtype] * prod(t.shape)
            if len(memoryview(data).cast("B")) != expected:
                raise ValueError(
                    f"tensor {t.name}: {len(memoryview(data).cast('B'))} bytes, expected "
                    f"{expected} for {t.dtype} {t.shape}"
                )
            fh.write(data)
