"""A third-party runner's failures reported as the plugin's, not as interlock's.

A runner that raises in ``load()``, ``execute()`` or ``report()``, or returns the wrong
number of tokens, is a plugin problem: a :class:`~interlock.plugins.PluginError` (exit 3)
naming the runner, its plugin and distribution, and the line of the plugin's own code
that raised. Errors interlock defines (a model refused with ``ModelError``, a decision
refused with ``PolicyError``) keep their kind: the runner said what is wrong. The
built-in runners are not wrapped: a failure there is interlock's.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from interlock.core.errors import InterlockError
from interlock.plugins import PluginError
from interlock.runners.contract import (
    Decision,
    KVCacheSpec,
    ModelSpec,
    Runner,
    RunnerOutput,
    RunnerReport,
    ScheduledBatch,
)

T = TypeVar("T")


def _own_files() -> frozenset[str]:
    """The files of interlock's own modules imported so far (``interlock`` and its
    subpackages, wherever the package-dir mapping or a wheel put them). Not a folder prefix:
    a checkout's root also holds its ``.venv`` and any plugin project developed beside it."""
    return frozenset(
        os.path.realpath(file)
        for name, module in list(sys.modules.items())
        if (name == "interlock" or name.startswith("interlock."))
        and isinstance(file := getattr(module, "__file__", None), str)
    )


def plugin_line(exc: BaseException) -> str | None:
    """``file:line`` of the innermost frame of ``exc`` outside interlock's own code (the
    plugin's line; a library it called is below it, so the last frame outside interlock
    that is not in site-packages wins when there is one)."""
    ours = _own_files()
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith("<") and os.path.realpath(f.filename) not in ours
    ]
    own = [f for f in frames if "site-packages" not in f.filename] or frames
    return f"{own[-1].filename}:{own[-1].lineno}" if own else None


class PluginRunner:
    """``inner``, a runner built by the factory of plugin ``provider`` (``name (dist
    version)``), whose failures are reported as that plugin's."""

    def __init__(self, inner: Runner, name: str, provider: str) -> None:
        self.inner = inner
        self.name = name
        self.provider = provider

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        from interlock.plugins.isolation import PluginCrash, plugin_code

        try:
            with plugin_code():
                return fn()
        except InterlockError:
            raise
        except (Exception, PluginCrash) as exc:
            cause = exc.__cause__ if isinstance(exc, PluginCrash) and exc.__cause__ else exc
            where = plugin_line(cause)
            text = str(exc) if isinstance(exc, PluginCrash) else (
                f"{type(exc).__name__}: {' '.join(str(exc).split())}"
            )
            raise PluginError(
                f"runner {self.name!r} of plugin {self.provider} failed in {what}: {text}"
                + (f" (at {where})" if where else "")
                + "; this is the plugin's failure: report it to its authors, or choose another "
                "runner (--set runner=...)"
            ) from exc

    def load(self, model: ModelSpec, kv_cache: KVCacheSpec, decision: Decision) -> None:
        self._call("load()", lambda: self.inner.load(model, kv_cache, decision))

    def execute(self, batch: ScheduledBatch) -> RunnerOutput:
        output = self._call("execute()", lambda: self.inner.execute(batch))
        count = len(getattr(output, "token_ids", ()) or ())
        if count != len(batch.sequences):
            raise PluginError(
                f"runner {self.name!r} of plugin {self.provider}: execute() returned {count} "
                f"token(s) for {len(batch.sequences)} scheduled sequence(s); a runner returns "
                "one token (or None, for a prefill chunk) per scheduled sequence"
            )
        return output

    def report(self) -> RunnerReport:
        return self._call("report()", self.inner.report)

    def __getattr__(self, attribute: str) -> Any:
        # What else the application layer reads from a runner (graph plans, kernel tables).
        return getattr(self.inner, attribute)
