"""Run one hostile case in a fresh interpreter under CPU, memory and wall-time limits.

Each case is a module-level function (so that the child imports it by name) with picklable
arguments. The child is spawned, never forked: pytest's process has started torch's thread
pool, and a forked child of a threaded process can deadlock in its first torch op. The child
classifies its own outcome and sends it back over a pipe; a child still running at the wall
limit is killed with SIGKILL, which holds even inside C code.
"""

from __future__ import annotations

import multiprocessing
import resource
import signal
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import pytest

from interlock.core.errors import EXIT_CODES, error_kind

#: Per case: CPU seconds, seconds in all, and address space (the interpreter, torch, which
#: maps about 0.6 GiB, and 3 GiB more).
CPU_SECONDS = 30
WALL_SECONDS = 90
ADDRESS_SPACE = 4 << 30


def _child(send: Connection, case: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
        resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))
        try:
            outcome: tuple[str, Any] = ("ok", case(*args))
        except BaseException as exc:  # noqa: BLE001 - classified here
            kind = error_kind(exc)
            outcome = ("error", kind) if kind else ("bug", traceback.format_exc())
        send.send(outcome)
    except BaseException:  # noqa: BLE001 - the outcome could not be sent
        send.send(("bug", traceback.format_exc()))
    finally:
        send.close()


def bounded(case: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    """``case(*args)`` in a spawned child: ``("ok", result)``, ``("error", kind)`` for a
    documented error, and a failed test for anything else (a traceback, a signal, a limit)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the per-case limits need Linux's resource limits")
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(send, case, args), daemon=True)
    child.start()
    send.close()
    try:
        if not receive.poll(WALL_SECONDS):
            child.kill()
            child.join()
            pytest.fail(f"the case ran past {WALL_SECONDS} s and was killed")
        try:
            outcome: tuple[str, Any] = receive.recv()
        except EOFError:  # the child died before it could answer
            outcome = ("died", None)
    finally:
        receive.close()
    child.join(WALL_SECONDS)
    if child.is_alive():  # answered, then hung on the way out
        child.kill()
        child.join()
    if outcome[0] == "died":
        code = child.exitcode or 0
        cause = signal.Signals(-code).name if code < 0 else f"exit status {code}"
        pytest.fail(f"the case died ({cause}; limits: {CPU_SECONDS} s of CPU, "
                    f"{ADDRESS_SPACE >> 30} GiB of address space; or a crash)")
    assert outcome[0] != "bug", outcome[1]
    if outcome[0] == "error":
        assert outcome[1] in EXIT_CODES
    return outcome
