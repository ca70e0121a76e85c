"""Process ids read from names others can create (``/dev/shm``, a cache's staging folders):
parsed with bounds, then asked about without signalling anything."""

from __future__ import annotations

import os

#: The largest pid Linux hands out (``PID_MAX_LIMIT``, 2^22); a name carrying a larger one
#: was not made by a process of this machine.
MAX_PID = 1 << 22


def parse_pid(text: str) -> int | None:
    """``text`` as a pid (ASCII digits, no sign or leading zero, 1..MAX_PID), else None:
    ``os.kill`` overflows on 99999999999 and signals a whole process group for 0."""
    if not (text.isascii() and text.isdigit()) or text.startswith("0") or len(text) > 7:
        return None
    pid = int(text)
    return pid if pid <= MAX_PID else None


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (signal 0: nothing is sent); another user's counts."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
