"""Running plugin code: its output and its exits cannot take the host down.

Inside :func:`plugin_code`, ``print()`` goes to stderr (stdout belongs to the
command's own output, e.g. a ``--json`` document), and a ``BaseException``
the plugin raises itself — ``sys.exit()``, a ``KeyboardInterrupt`` of its own,
anything else outside ``Exception`` — becomes :class:`PluginCrash`, which the
caller quarantines like any plugin failure. A real Ctrl-C (SIGINT while plugin
code runs) still stops the process.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from typing import Any


class PluginCrash(Exception):
    """Plugin code raised a BaseException that is not an Exception (its cause)."""


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"plugin code called sys.exit({exc.code!r})"
    return f"plugin code raised {type(exc).__name__}: {' '.join(str(exc).split())}".rstrip(": ")


@contextmanager
def plugin_code() -> Iterator[None]:
    interrupted: list[bool] = []
    previous: Any = None
    if threading.current_thread() is threading.main_thread():

        def on_sigint(signum: int, frame: Any) -> None:
            interrupted.append(True)
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with redirect_stdout(sys.stderr):
            yield
    except KeyboardInterrupt as exc:
        if interrupted:
            raise
        raise PluginCrash(_describe(exc)) from exc
    except Exception:
        raise
    except BaseException as exc:  # SystemExit, GeneratorExit and the like, from the plugin
        raise PluginCrash(_describe(exc)) from exc
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
