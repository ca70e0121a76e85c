"""Checking a GGUF file's layout before the ``gguf`` package parses it.

The ``gguf`` reader trusts every count and offset it reads: an array declaring 2^62
elements makes it loop past the end of the file, two million empty strings take a
minute and gigabytes, and tensors may overlap, precede the data section or run past
the end (a 5 MB file once became a 338 MB conversion). :func:`check_layout` walks the
header itself, bounding every declared count and length by the bytes that remain (and
the string arrays by :data:`MAX_STRINGS`), and checks that the tensors are aligned,
inside the data section and disjoint, as llama.cpp does. Each error names the file,
the key or tensor, and the number at fault.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import BinaryIO

from interlock.runners.model.gguf.errors import GGUFError

#: Strings in one array at most: real vocabularies hold 150 k - 260 k tokens, and about as
#: many merges; each string costs the ``gguf`` reader a Python object.
MAX_STRINGS = 1 << 20
#: Dimensions of a tensor at most (GGML_MAX_DIMS).
MAX_DIMS = 4
DEFAULT_ALIGNMENT = 32
# Value types (GGUFValueType) -> struct format of a scalar; 8 is STRING, 9 ARRAY.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorRange:
    name: str
    start: int  # from the start of the file
    nbytes: int


class _Cursor:
    def __init__(self, data: mmap.mmap, name: str, order: str) -> None:
        self.data, self.name, self.order, self.at = data, name, order, 0

    @property
    def left(self) -> int:
        return len(self.data) - self.at

    def need(self, nbytes: int, what: str) -> None:
        if nbytes > self.left:
            raise GGUFError(
                f"{self.name}: truncated: {what} needs {nbytes} bytes at offset {self.at}, "
                f"but the file has {self.left} left"
            )

    def scalar(self, fmt: str, what: str) -> int | float | bool:
        size = struct.calcsize(fmt)
        self.need(size, what)
        (value,) = struct.unpack_from(self.order + fmt, self.data, self.at)
        self.at += size
        return value

    def count(self, what: str) -> int:
        return int(self.scalar("Q", what))

    def string(self, what: str) -> bytes:
        length = self.count(f"the length of {what}")
        self.need(length, f"{what} ({length} bytes)")
        value = self.data[self.at : self.at + length]
        self.at += length
        return value


def _value(cur: _Cursor, kind: int, key: str, *, in_array: bool = False) -> object:
    if kind in _SCALARS:
        return cur.scalar(_SCALARS[kind], f"metadata {key}")
    if kind == _STRING:
        cur.string(f"metadata {key}")
        return None
    if kind == _ARRAY and not in_array:
        inner = int(cur.scalar("I", f"the element type of metadata {key}"))
        count = cur.count(f"the length of metadata {key}")
        if inner in _SCALARS:
            size = struct.calcsize(_SCALARS[inner])
            cur.need(count * size, f"metadata {key} ({count} elements of {size} bytes)")
            cur.at += count * size
        elif inner == _STRING:
            if count > MAX_STRINGS:
                raise GGUFError(
                    f"{cur.name}: metadata {key} declares {count} strings, more than the "
                    f"{MAX_STRINGS} allowed"
                )
            cur.need(count * 8, f"metadata {key} ({count} strings of 8 bytes or more)")
            for i in range(count):
                cur.string(f"metadata {key}[{i}]")
        else:
            raise GGUFError(f"{cur.name}: metadata {key} is an array of type {inner}, which "
                            "is not supported (scalars or strings only)")
        return None
    raise GGUFError(f"{cur.name}: metadata {key} has unknown value type {kind}")


def check_layout(fh: BinaryIO, name: str) -> list[TensorRange]:
    """Check the header, metadata and tensor ranges of the GGUF file open as ``fh``; the
    tensors' byte ranges. Reads the header only (up to the data section)."""

    size = os.fstat(fh.fileno()).st_size
    if size < 24:
        raise GGUFError(f"{name}: not a GGUF file ({size} bytes, shorter than a GGUF header)")
    # Mapped, not read: a hostile count fails against the bytes left before anything is
    # allocated for it, and only the header's pages are touched.
    with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as head:
        return _check(head, size, name)


def _check(head: mmap.mmap, size: int, name: str) -> list[TensorRange]:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    if head[:4] != b"GGUF":
        raise GGUFError(f"{name}: not a GGUF file (it does not start with the GGUF magic)")
    order = "<" if struct.unpack_from("<I", head, 4)[0] & 0xFFFF else ">"
    cur = _Cursor(head, name, order)
    cur.at = 4
    version = cur.scalar("I", "the version")
    if version not in (2, 3):
        raise GGUFError(f"{name}: GGUF version {version} is not supported; supported: 2, 3")
    tensor_count = cur.count("the tensor count")
    kv_count = cur.count("the metadata count")
    # A key-value pair takes 13 bytes at least, a tensor's description 28.
    for what, count, least in (("kv_count", kv_count, 13), ("tensor_count", tensor_count, 28)):
        if count * least > cur.left:
            raise GGUFError(
                f"{name}: truncated: {what} {count} needs {count * least} bytes or more, but "
                f"the file has {cur.left} left"
            )
    alignment = DEFAULT_ALIGNMENT
    for _ in range(kv_count):
        key = cur.string("a metadata key").decode("utf-8", "replace")
        kind = int(cur.scalar("I", f"the type of metadata {key}"))
        value = _value(cur, kind, key)
        if key == "general.alignment":
            if not isinstance(value, int) or value < 1 or value & (value - 1) or kind != 4:
                raise GGUFError(f"{name}: metadata general.alignment={value!r} is not a "
                                "power of two (uint32)")
            alignment = value
    described = []
    for i in range(tensor_count):
        tensor = cur.string(f"the name of tensor {i}").decode("utf-8", "replace")
        dims = int(cur.scalar("I", f"the dimensions of tensor {tensor}"))
        if not 1 <= dims <= MAX_DIMS:
            raise GGUFError(f"{name}: tensor {tensor} has {dims} dimensions; allowed 1..{MAX_DIMS}")
        shape = [cur.count(f"the shape of tensor {tensor}") for _ in range(dims)]
        code = int(cur.scalar("I", f"the type of tensor {tensor}"))
        offset = cur.count(f"the offset of tensor {tensor}")
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(code)]
        except (ValueError, KeyError):
            raise GGUFError(f"{name}: tensor {tensor} has unknown type {code}") from None
        elements = 1
        for d in shape:
            elements *= d
        if elements == 0 or elements % block:
            raise GGUFError(f"{name}: tensor {tensor} has shape {shape}, not a whole number of "
                            f"{block}-element blocks")
        described.append((tensor, offset, elements // block * type_size))
    start = -(-cur.at // alignment) * alignment
    data_size = size - start
    ranges = []
    for tensor, offset, nbytes in described:
        if offset % alignment:
            raise GGUFError(f"{name}: tensor {tensor} at offset {offset} is not aligned to "
                            f"{alignment} bytes")
        if offset + nbytes > data_size:
            raise GGUFError(
                f"{name}: tensor {tensor} ({nbytes} bytes at offset {offset}) runs past the end "
                f"of the data section ({data_size} bytes)"
            )
        ranges.append(TensorRange(tensor, start + offset, nbytes))
    ordered = sorted(ranges, key=lambda r: r.start)
    for before, after in zip(ordered, ordered[1:], strict=False):
        if after.start < before.start + before.nbytes:
            raise GGUFError(f"{name}: tensors {before.name} and {after.name} overlap; each "
                            "tensor must have bytes of its own")
    return ranges
