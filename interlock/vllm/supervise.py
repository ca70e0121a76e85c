"""``policy vllm serve``: ``vllm serve`` run in the foreground, its startup log checked.

:func:`supervise` starts the engine as a child in its own process group, copies its output
to ours as it comes and feeds each line to an :class:`~interlock.vllm.startup_log.EngineCheck`;
SIGINT and SIGTERM are passed on, and nothing of the engine's group outlives it.
"""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

from interlock.core.errors import PolicyError
from interlock.vllm.process import (
    clean_group,
    exit_text,
    output_lines,
    signal_group,
    stop_child,
)
from interlock.vllm.startup_log import READY_MESSAGE, EngineCheck, Verification

#: Exit status of ``policy vllm serve --strict`` when the engine does not run the decision.
STRICT_EXIT = 4
_FORWARDED = (signal.SIGINT, signal.SIGTERM)


def supervise(
    argv: Sequence[str],
    env: Mapping[str, str],
    check: EngineCheck,
    *,
    startup_timeout: float,
    strict: bool,
    on_verdict: Callable[[Verification], None],
    stdout: IO[bytes] | None = None,
    stderr: IO[bytes] | None = None,
) -> int:
    """Run ``argv`` as a child in its own process group, its output copied to ours as it comes
    (``stdout``/``stderr``: our binary streams by default) and fed to ``check``; SIGINT and
    SIGTERM are passed on to it. ``on_verdict`` is called once, when ``check`` decides (or
    the startup time or the engine ends first). With ``strict`` a failed check stops the
    engine (SIGTERM, then SIGKILL after :data:`~interlock.vllm.process.STOP_GRACE_S`) and
    the status is :data:`STRICT_EXIT`; otherwise it is the engine's own (``128 + N`` when
    killed by signal N). Whatever ends, no process of the engine's group is left running."""
    # The engine's own bytes go to our real streams, as if it had been started directly (the
    # command line's escaping writers are for text interlock writes).
    out = stdout if stdout is not None else sys.__stdout__.buffer  # type: ignore[union-attr]
    err = stderr if stderr is not None else sys.__stderr__.buffer  # type: ignore[union-attr]
    try:
        child = subprocess.Popen(
            list(argv), env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        raise PolicyError(f"cannot start {argv[0]}: {exc.strerror or exc}") from None
    lines: queue.Queue[str | None] = queue.Queue()
    readers = [
        threading.Thread(target=_copy, args=(pipe, sink, lines), daemon=True)
        for pipe, sink in ((child.stdout, out), (child.stderr, err))
    ]
    for reader in readers:
        reader.start()
    previous = {sig: signal.getsignal(sig) for sig in _FORWARDED}

    def forward(signum: int, _frame: Any) -> None:
        signal_group(child.pid, signum)

    in_main = threading.current_thread() is threading.main_thread()
    if in_main:
        for sig in _FORWARDED:
            signal.signal(sig, forward)
    failed = False
    try:
        deadline = time.monotonic() + startup_timeout
        open_pipes = len(readers)
        while child.poll() is None:
            try:
                item = lines.get(timeout=0.2)
            except queue.Empty:
                item = ""
            if item is None:
                open_pipes -= 1
                continue
            verdict = check.feed(item) if item else None
            if verdict is None and check.verdict is None and time.monotonic() >= deadline:
                verdict = check.finish(
                    "timeout",
                    f"the engine did not come up within the startup time of "
                    f"{startup_timeout:g} s (no {READY_MESSAGE.strip()!r} line)",
                )
            if verdict is not None:
                on_verdict(verdict)
                if strict and not verdict.verified:
                    failed = True
                    stop_child(child)
        code = child.wait()
        late = _drain(lines, check, open_pipes)
        if late is not None:
            on_verdict(late)
            failed = strict and not late.verified
        elif check.verdict is None:
            ended = check.finish("exited", exit_text(code))
            on_verdict(ended)
            failed = strict and not ended.verified
    finally:
        if child.poll() is None:
            stop_child(child)
        clean_group(child.pid)
        for reader in readers:
            reader.join(timeout=2.0)
        if in_main:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    if failed:
        return STRICT_EXIT
    return code if code >= 0 else 128 - code


def _drain(
    lines: queue.Queue[str | None], check: EngineCheck, open_pipes: int
) -> Verification | None:
    """Feed what the exited engine left in the pipes (until both close, briefly: a worker
    it left behind may hold them open); returns the verdict those lines reached, if any."""
    verdict = None
    end = time.monotonic() + 2.0
    while open_pipes and time.monotonic() < end:
        try:
            item = lines.get(timeout=0.1)
        except queue.Empty:
            continue
        if item is None:
            open_pipes -= 1
        else:
            verdict = check.feed(item) or verdict
    return verdict


def _copy(pipe: IO[bytes] | None, sink: IO[bytes], lines: queue.Queue[str | None]) -> None:
    """Copy ``pipe`` to ``sink`` line by line, handing each line to ``lines`` (None at EOF;
    a line past :data:`MAX_LINE_BYTES` as its first MAX_LINE_BYTES)."""
    assert pipe is not None
    try:
        for raw, text in output_lines(pipe):
            try:
                sink.write(raw)
                sink.flush()
            except (OSError, ValueError):  # our own output went away: keep reading
                pass
            if text is not None:
                lines.put(text)
    finally:
        lines.put(None)
