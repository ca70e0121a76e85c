"""Giving the C heap's free memory back to the system, where the C library can.

glibc keeps memory that a program frees for its next allocations, so a process's resident
set stays at its high-water mark: after a model loads, that is the tokenizer's parse of
tokenizer.json (~30 MB for SmolLM2's), the load's temporaries and the activations the
native graphs held before they shared one buffer (``runners.graphs.pool``). Trimming once
the load is done hands those pages back; later allocations take new ones as they need.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS): nothing to trim
        return None
    return trim


def give_back_free_memory() -> bool:
    """Return the heap's free pages to the system (glibc's ``malloc_trim(0)``); False where
    the C library has no such call."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
