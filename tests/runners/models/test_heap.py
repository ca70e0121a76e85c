"""A quantized load's float placeholders are glibc mappings of their own, returned when
freed, and afterwards the steps' activations come from the heap (``runners.model.heap``)."""

from __future__ import annotations

import ctypes
import ctypes.util

import pytest
import torch

from interlock.runners.model.heap import LOADING, SERVING, HeapReport, placeholders_mapped


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mapped_bytes() -> int:
    """Bytes glibc holds in mappings of their own (mallinfo2's hblkhd)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.mallinfo2.restype = MallInfo2
    return int(libc.mallinfo2().hblkhd)


GLIBC = pytest.mark.skipif(
    not hasattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"),
                "gnu_get_libc_version"), reason="glibc's malloc only")


@GLIBC
def test_a_block_is_mapped_while_loading_and_from_the_heap_after() -> None:
    size = 4 * 2**20  # between LOADING and SERVING
    assert LOADING < size < SERVING
    with placeholders_mapped() as heap:
        before = _mapped_bytes()
        placeholder = torch.empty(size, dtype=torch.uint8)
        assert _mapped_bytes() >= before + size
        del placeholder
        assert _mapped_bytes() == before  # freed: returned to the system
    assert heap.fixed
    assert heap.line() == ("glibc malloc: mmap threshold 128 KiB while loading (the float "
                           "placeholders returned when freed), then 32 MiB")
    before = _mapped_bytes()
    activation = torch.empty(size, dtype=torch.uint8)
    assert _mapped_bytes() == before  # from the heap, reused step after step
    del activation


def test_elsewhere_than_glibc_the_report_says_nothing_was_done() -> None:
    assert HeapReport(False, "libc.so is not glibc").line() == (
        "malloc left as it is: libc.so is not glibc")
