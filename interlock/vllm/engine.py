"""Checking a running ``vllm serve`` against the decision it was started with.

vLLM says what it runs in its startup log, and only there. The lines read (messages as
vLLM's own source writes them; the same text in every release 0.27.1–0.34, at the places
each release's ``Release.logs`` lists, :mod:`interlock.vllm.releases`):

- the engine config, once: ``Initializing a V1 LLM engine (v%s) with config: %s``
  (``v1/engine/core.py``), whose ``compilation_config={...}`` holds
  ``'mode': <CompilationMode.NAME: n>`` and ``'cudagraph_mode': <CUDAGraphMode.NAME: ...>``;
- ``Using V2 Model Runner`` (``v1/worker/gpu_worker.py``), logged once when V2 runs and
  **nothing** when V1 runs: V1 is known only once the server is up without that line.
  0.34.0 has no V1 and logs no such line: there the runner is V2 by the release itself;
- ``Breakable CUDA graph enabled`` (``compilation/breakable_cudagraph.py``), logged when a
  model is wrapped for breakable capture (breakable on and a cudagraph mode other than
  NONE), and ``Auto-enabling VLLM_USE_BREAKABLE_CUDAGRAPH=1...`` (``config/vllm.py``) when
  vLLM switched breakable graphs on by itself;
- ``Starting vLLM server on %s`` (``entrypoints/launchers/api_server/entry.py``): the
  engine is built and the server is about to listen (``entrypoints/openai/api_server.py``
  before 0.29); what has not been seen by then will not be.

A line is vLLM's when it has the logger's shape (``LEVEL MM-DD HH:MM:SS [file.py:N]
message``, after any process prefix such as ``(EngineCore pid=12)``); the message is
compared whole. :class:`EngineCheck` reads lines and reaches a verdict as soon as one is
possible; :func:`supervise` runs the engine as a child and feeds it.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Protocol

from interlock.core.errors import PolicyError
from interlock.vllm.releases import NEWEST, RELEASES, Release, UnknownRelease, release

if TYPE_CHECKING:
    import http.client

#: The messages, identical in every release read (each wheel's source; where each release
#: logs them is its ``Release.logs``). 0.34.0 no longer logs the runner: it has only V2.
RUNNER_V2_MESSAGE = "Using V2 Model Runner"
CONFIG_MESSAGE = re.compile(r"^Initializing a V1 LLM engine \(v(?P<version>[^)]*)\) with config: ")
BREAKABLE_MESSAGE = "Breakable CUDA graph enabled"
AUTO_BREAKABLE_MESSAGE = "Auto-enabling VLLM_USE_BREAKABLE_CUDAGRAPH=1."
READY_MESSAGE = "Starting vLLM server on "


#: vLLM's logger: ``LEVEL MM-DD HH:MM:SS [file:line] message`` after any prefix.
_LOG_LINE = re.compile(
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? "
    r"\[(?P<where>[^\]\s]+:\d+)\] (?P<message>.*)$"
)
#: The most breakable lines kept in a verdict (each start logs one or two).
_MAX_SHOWN = 8
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_COMPILATION = re.compile(r"compilation_config=\{")
_MODE = re.compile(r"'mode': <CompilationMode\.(?P<name>[A-Z_]+): \d+>")
_CUDAGRAPH = re.compile(r"'cudagraph_mode': <CUDAGraphMode\.(?P<name>[A-Z_]+): [^>]*>")


def log_release(version: str | None) -> Release:
    """The release whose startup log is read for vLLM ``version`` (None: the newest read). A
    release interlock has not read, or whose startup log it has not read, is refused: its
    lines could mean something else (0.34.0 stopped logging the runner)."""
    rel = NEWEST if version is None else release(version)
    if rel.logs is None:
        raise UnknownRelease(
            f"vLLM {rel.version}'s startup log was not read by interlock (it reads those of "
            f"{', '.join(r.version for r in RELEASES if r.logs)}): what it runs cannot be "
            "confirmed from it"
        )
    return rel


def compile_mode_name(compile_on: bool, platform: str = "") -> str:
    """The ``CompilationMode`` vLLM runs for interlock's ``compile`` field on ``platform``:
    vLLM's CPU platform turns VLLM_COMPILE into DYNAMO_TRACE_ONCE (``platforms/cpu.py``,
    ``check_and_update_config``, 0.30-0.33); NONE stays NONE."""
    if not compile_on:
        return "NONE"
    return "DYNAMO_TRACE_ONCE" if platform == "cpu" else "VLLM_COMPILE"


def expected_from(decision: Mapping[str, Any], platform: str = "") -> dict[str, Any]:
    """What the engine's log must show for ``decision`` (the target profile that ``vllm
    serve`` was started with) on ``platform``."""
    return {
        "runner": decision["runner"],
        "breakable": bool(decision["breakable"]),
        "cudagraph_mode": str(decision["cudagraph"]).upper(),
        "mode": compile_mode_name(bool(decision["compile"]), platform),
    }


@dataclass
class Verification:
    """The verdict on one engine start: ``verified`` with what was expected and seen."""

    verified: bool
    expected: dict[str, Any]
    seen: dict[str, Any]
    #: One sentence per disagreement (empty when verified).
    problems: list[str]
    #: What ended the check: ``ready``, ``mismatch``, ``timeout`` or ``exited``.
    ended_by: str
    vllm_version: str
    formats: dict[str, str | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "verified": self.verified,
            "ended_by": self.ended_by,
            "expected": self.expected,
            "seen": self.seen,
            "problems": self.problems,
            "vllm_version": self.vllm_version,
            "log_formats": self.formats,
        }

    def line(self) -> str:
        """The one line a person reads: loud when the engine did not confirm the decision."""
        if self.verified:
            shown = ", ".join(f"{k}={_show(v)}" for k, v in self.seen.items()
                              if k in self.expected)
            return f"policy vllm: verified: the engine runs the decision ({shown})"
        return ("policy vllm: WARNING: THE ENGINE DID NOT CONFIRM THE DECISION: "
                + "; ".join(self.problems))


def _show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


class EngineCheck:
    """Reads the engine's output line by line and decides whether it runs the decision.

    A contradiction (a line saying otherwise) ends the check at once; a confirmation that
    can only be an absence (V1, breakable off) waits for the ready line."""

    def __init__(self, decision: Mapping[str, Any], version: str | None = None,
                 platform: str = "") -> None:
        #: Whether the release was known before the log: else the config line's is read.
        self.given = version is not None
        self.release = log_release(version)
        self.version = version or self.release.version
        assert self.release.logs is not None  # log_release refuses a release without
        self.formats = self.release.logs
        self.expected = expected_from(decision, platform)
        self.seen: dict[str, Any] = {}
        self.problems: list[str] = []
        self.verdict: Verification | None = None

    def feed(self, text: str) -> Verification | None:
        """One line of output; returns the verdict when this line reached it."""
        if self.verdict is not None:
            return None
        match = _LOG_LINE.search(_ANSI.sub("", text).rstrip("\r\n"))
        if match is None:
            return None
        message, where = match["message"].rstrip(), match["where"]
        if CONFIG_MESSAGE.match(message):
            self._config(message, where)
        elif message == RUNNER_V2_MESSAGE:
            self.seen["runner"] = "mrv2"
            self.seen["runner_line"] = where
            if self.expected["runner"] != "mrv2":
                self.problems.append(
                    f"runner: decided {self.expected['runner']}, but vLLM logged "
                    f"{RUNNER_V2_MESSAGE!r} [{where}]"
                )
        elif message == BREAKABLE_MESSAGE or message.startswith(AUTO_BREAKABLE_MESSAGE):
            self.seen["breakable"] = True
            shown = self.seen.setdefault("breakable_lines", [])
            if len(shown) < _MAX_SHOWN:  # a log repeating the line costs no more memory
                shown.append(f"{where} {message}")
            if not self.expected["breakable"]:
                self.problems.append(
                    f"breakable: decided false, but vLLM logged {message!r} [{where}]"
                )
        elif message.startswith(READY_MESSAGE):
            self.seen["ready_line"] = where
            return self._end("ready")
        if self.problems:
            return self._end("mismatch")
        return None

    def _config(self, message: str, where: str) -> None:
        version = CONFIG_MESSAGE.match(message)["version"]  # type: ignore[index]
        self.seen["vllm_version"] = version
        if not self.given:
            # No version was known before the engine said its own: read its release's lines.
            try:
                self.release = log_release(version)
            except PolicyError as exc:
                self.problems.append(f"the engine is vLLM {version} [{where}]: {exc}")
                return
            assert self.release.logs is not None
            self.formats, self.version = self.release.logs, self.release.version
        self.seen["config_line"] = where
        start = _COMPILATION.search(message)
        tail = message[start.end():] if start else ""
        for key, pattern in (("mode", _MODE), ("cudagraph_mode", _CUDAGRAPH)):
            found = pattern.search(tail)
            value = found["name"] if found else None
            self.seen[key] = value
            if value is None:
                self.problems.append(
                    f"{key}: the engine's config line [{where}] shows no compilation_config "
                    f"{key}"
                )
            elif value != self.expected[key]:
                self.problems.append(
                    f"{key}: decided {self.expected[key]}, but the engine's config "
                    f"[{where}] has {value}"
                )

    def finish(self, ended_by: str, detail: str = "") -> Verification:
        """The verdict when output ends without one: the server came up (``ready``), the
        startup time ran out (``timeout``) or the engine exited (``exited``)."""
        if self.verdict is not None:
            return self.verdict
        if ended_by != "ready":
            self.problems.append(detail)
        return self._end(ended_by)

    def _end(self, ended_by: str) -> Verification:
        expected, seen = self.expected, self.seen
        if ended_by == "ready":
            if "config_line" not in seen:
                self.problems.append(
                    "the engine came up without logging its config ('Initializing a V1 LLM "
                    "engine ... with config'): cudagraph_mode and mode are unconfirmed"
                )
            if self.formats.runner_v2 is None:  # one runner, and no line says it
                seen.setdefault("runner", self.release.runners[0])
                seen.setdefault("runner_line", f"vLLM {self.release.version} has "
                                f"{self.release.runners[0]} only")
            seen.setdefault("runner", "mrv1")  # V1 is the runner that logs nothing
            if expected["runner"] != seen["runner"] and self.formats.runner_v2 is None:
                self.problems.append(
                    f"runner: decided {expected['runner']}, but vLLM {self.release.version} "
                    f"has {seen['runner']} only"
                )
            elif expected["runner"] == "mrv2" and seen["runner"] != "mrv2":
                self.problems.append(
                    f"runner: decided mrv2, but the engine came up without logging "
                    f"{RUNNER_V2_MESSAGE!r}: it runs V1"
                )
            seen.setdefault("breakable", False)
            if expected["breakable"] and expected["cudagraph_mode"] != "NONE" and not (
                seen["breakable"]
            ):
                self.problems.append(
                    f"breakable: decided true, but the engine came up without logging "
                    f"{BREAKABLE_MESSAGE!r}"
                )
        verdict = Verification(
            verified=not self.problems,
            expected=dict(expected),
            seen=dict(seen),
            problems=list(self.problems),
            ended_by=ended_by,
            vllm_version=seen.get("vllm_version", self.version),
            formats={
                "for_version": self.version,
                "version": self.release.version,
                **{name: (str(cite) if cite else None)
                   for name, cite in vars(self.formats).items()},
            },
        )
        self.verdict = verdict
        return verdict


#: Exit status of ``policy vllm serve --strict`` when the engine does not run the decision.
STRICT_EXIT = 4
#: How long a stopped engine gets between SIGTERM and SIGKILL.
STOP_GRACE_S = 10.0
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
    engine (SIGTERM, then SIGKILL after :data:`STOP_GRACE_S`) and the status is
    :data:`STRICT_EXIT`; otherwise it is the engine's own (``128 + N`` when killed by signal
    N). Whatever ends, no process of the engine's group is left running."""
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
        _signal_group(child.pid, signum)

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
                    _stop(child)
        code = child.wait()
        late = _drain(lines, check, open_pipes)
        if late is not None:
            on_verdict(late)
            failed = strict and not late.verified
        elif check.verdict is None:
            ended = check.finish("exited", _exit_text(code))
            on_verdict(ended)
            failed = strict and not ended.verified
    finally:
        if child.poll() is None:
            _stop(child)
        _clean_group(child.pid)
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


#: The longest line of the engine's output that is read as one: a longer one is copied
#: whole, but only its first MAX_LINE_BYTES are checked (an engine writing without a line
#: break cannot grow a line in memory without bound).
MAX_LINE_BYTES = 64 * 1024


def output_lines(pipe: IO[bytes]) -> Iterator[tuple[bytes, str | None]]:
    """``(bytes, text)`` for each piece of ``pipe`` up to a line break or
    :data:`MAX_LINE_BYTES`: ``text`` is the piece decoded when it starts a line, None when
    it continues a line cut at the bound."""
    continuing = False
    while raw := pipe.readline(MAX_LINE_BYTES):
        yield raw, None if continuing else raw.decode("utf-8", "replace")
        continuing = not raw.endswith(b"\n")


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


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the engine was killed by {name} before it came up"
    return f"the engine exited with status {code} before it came up"


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _stop(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the engine's group; SIGKILL after the grace time."""
    _signal_group(child.pid, signal.SIGTERM)
    try:
        child.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        _signal_group(child.pid, signal.SIGKILL)
        child.wait()


def _clean_group(pgid: int) -> None:
    """The engine has exited: stop what it started and left behind (its workers)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return
    _signal_group(pgid, signal.SIGTERM)
    end = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.05)
    _signal_group(pgid, signal.SIGKILL)


class EngineFailed(PolicyError):
    """A started engine did not come up, or died (``policy measure --engine vllm``)."""

    kind = "runtime"


class StartupCheck(Protocol):
    """What :class:`EngineProcess` feeds a server's output to: :class:`EngineCheck` for
    ``vllm serve``, ``interlock.measure.serve_engine.ServeCheck`` for ``policy serve``."""

    verdict: Any

    def feed(self, text: str) -> Any: ...

    def finish(self, ended_by: str, detail: str = "") -> Any: ...


class Deadline:
    """A request's whole time: shuts the connection's socket down when ``seconds`` have
    passed since it began, which ends any read blocked on it, however slowly the server
    sends (a socket timeout bounds each read, not their sum); raises ``EngineFailed``
    naming ``what`` then."""

    def __init__(self, conn: http.client.HTTPConnection, seconds: float, what: str) -> None:
        self.conn, self.seconds, self.what, self.expired = conn, seconds, what, False
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def _expire(self) -> None:
        import socket

        self.expired = True
        try:
            # The connection's own socket: the response reads through it even after the
            # connection lets go of it (an answer with "Connection: close").
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def __enter__(self) -> Deadline:
        self._timer.start()
        self.conn.connect()
        self.sock = self.conn.sock
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        self.conn.close()
        if self.expired:
            raise EngineFailed(
                f"{self.what} did not finish within {self.seconds:g} s (the request's whole "
                "time, however slowly the server sends)"
            )


class EngineProcess:
    """One ``vllm serve`` child for a measurement: started in its own process group, its
    output kept (the last lines, for errors) and fed to ``check``; :meth:`wait_ready`
    returns once the check has a verdict and ``/health`` answers; :meth:`stop` leaves
    nothing of it running."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], check: StartupCheck,
                 port: int, name: str) -> None:
        self.check, self.port, self.name = check, port, name
        self.tail: list[str] = []
        self._lock = threading.Lock()
        try:
            self.child = subprocess.Popen(
                list(argv), env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        except OSError as exc:
            raise EngineFailed(f"{name}: cannot start {argv[0]}: {exc.strerror or exc}") from None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.child.stdout is not None
        for _, piece in output_lines(self.child.stdout):
            if piece is None:  # the rest of a line cut at MAX_LINE_BYTES
                continue
            text = piece.rstrip("\r\n")
            with self._lock:
                self.tail = [*self.tail[-19:], text]
                self.check.feed(text)

    def output(self) -> str:
        """Its last lines of output, on one line (an error message is one line)."""
        with self._lock:
            return " | ".join(_ANSI.sub("", line).strip() for line in self.tail[-5:]) or "none"

    def exit_status(self, wait: float = 0.0) -> int | None:
        """Its exit status, waiting up to ``wait`` s for it (a dropped connection comes
        before the dying server is reaped); None while it runs."""
        try:
            return self.child.wait(timeout=wait) if wait else self.child.poll()
        except subprocess.TimeoutExpired:
            return None

    def wait_ready(self, timeout: float) -> Any:
        """The verdict on the engine's startup log, once ``/health`` answers 200 (raises
        :class:`EngineFailed` naming the engine when it exits or the time runs out)."""
        import http.client

        deadline = time.monotonic() + timeout
        while True:
            code = self.child.poll()
            if code is not None:
                self._reader.join(timeout=2.0)
                raise EngineFailed(
                    f"{self.name}: {_exit_text(code)}; its last output: {self.output()}"
                )
            if time.monotonic() >= deadline:
                raise EngineFailed(
                    f"{self.name}: not healthy within {timeout:g} s (GET "
                    f"http://127.0.0.1:{self.port}/health); its last output: {self.output()}"
                )
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2.0)
                with Deadline(conn, 2.0, "GET /health"):
                    conn.request("GET", "/health")
                    healthy = conn.getresponse().status == 200
            except (OSError, http.client.HTTPException, EngineFailed):
                healthy = False
            if healthy:
                with self._lock:
                    verdict = self.check.verdict
                if verdict is None:
                    # Up and answering: the ready line may still be in the pipe.
                    time.sleep(0.05)
                    with self._lock:
                        verdict = self.check.verdict or self.check.finish("ready")
                return verdict
            time.sleep(0.05)

    def alive(self) -> bool:
        return self.child.poll() is None

    def stop(self) -> None:
        if self.child.poll() is None:
            _stop(self.child)
        _clean_group(self.child.pid)
        self._reader.join(timeout=2.0)
