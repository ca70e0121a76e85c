"""Where a load's float placeholders live, under glibc's malloc.

A model is built with an uninitialised float weight in every layer; a weight kept
quantized (``runners.model.quantized``) replaces its placeholder, which is freed without
ever being written. glibc serves a request above its mmap threshold with a mapping of its
own and returns it to the system on free, and one below from its heap, where a freed
block stays. The threshold is dynamic: it rises to the size of each mapped block freed
(up to 32 MiB), so whether SmolLM2's 2-7 MB placeholders were mapped depended on what the
process had freed before. Served from the heap, they left a hole of ~420 MB of untouched
heap below the quantized records, and every eager step after the load spread its
activations into it, touching new pages: the resident set grew by ~90 MB over the
bench's three workloads, above llama.cpp's whole peak (issue 53).

``placeholders_mapped`` fixes the threshold at 128 KiB (glibc's default) while the model
is built and loaded, so that every placeholder is a mapping of its own and its free
returns it, and then at 32 MiB (glibc's ceiling), so that the steps' activations are
served from the heap and reused, as the dynamic threshold would have settled on, without
a mapping and its page faults per tensor. Fixing the threshold turns off its dynamic
adjustment for the rest of the process (``mallopt``); elsewhere than glibc nothing is done,
and ``HeapReport.line`` says which.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

#: mallopt's parameter for the mmap threshold (malloc.h).
M_MMAP_THRESHOLD = -3
#: The threshold while a model loads: glibc's default, every placeholder a mapping.
LOADING = 128 * 1024
#: The threshold afterwards: glibc's ceiling for the dynamic one.
SERVING = 32 * 1024 * 1024


@dataclass(frozen=True)
class HeapReport:
    """What ``placeholders_mapped`` did, for the run report."""

    fixed: bool
    why_not: str = ""

    def line(self) -> str:
        if not self.fixed:
            return f"malloc left as it is: {self.why_not}"
        return (f"glibc malloc: mmap threshold {LOADING // 1024} KiB while loading (the float "
                f"placeholders returned when freed), then {SERVING // 2**20} MiB")


def _mallopt() -> Callable[[int, int], int] | str:
    """glibc's mallopt, or why there is none."""
    name = ctypes.util.find_library("c")
    if name is None:
        return "no C library found"
    try:
        libc = ctypes.CDLL(name)
        if not hasattr(libc, "gnu_get_libc_version"):
            return f"{name} is not glibc"
        fn = libc.mallopt
    except (OSError, AttributeError) as exc:
        return f"{name}: {exc}"
    fn.argtypes = (ctypes.c_int, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


@contextmanager
def placeholders_mapped() -> Iterator[HeapReport]:
    """Hold glibc's mmap threshold at ``LOADING`` inside, at ``SERVING`` after (above)."""
    fn = _mallopt()
    if isinstance(fn, str):
        yield HeapReport(False, fn)
        return
    if fn(M_MMAP_THRESHOLD, LOADING) != 1:
        yield HeapReport(False, "mallopt refused the mmap threshold")
        return
    try:
        yield HeapReport(True)
    finally:
        fn(M_MMAP_THRESHOLD, SERVING)
