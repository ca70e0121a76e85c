"""A serving engine run as a child process: its output read in bounded lines, its process
group stopped and cleaned, and :class:`EngineProcess`, one server of a measurement
(``vllm serve`` for ``policy measure --engine vllm``, ``policy serve`` for ``--engine
interlock``) with its startup check and ``/health`` wait.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, Protocol

from interlock.core.errors import LocatedError
from interlock.vllm.startup_log import ANSI

if TYPE_CHECKING:
    import http.client

#: How long a stopped engine gets between SIGTERM and SIGKILL.
STOP_GRACE_S = 10.0

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


def exit_text(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the engine was killed by {name} before it came up"
    return f"the engine exited with status {code} before it came up"


def signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def stop_child(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the engine's group; SIGKILL after the grace time."""
    signal_group(child.pid, signal.SIGTERM)
    try:
        child.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        signal_group(child.pid, signal.SIGKILL)
        child.wait()


def clean_group(pgid: int) -> None:
    """The engine has exited: stop what it started and left behind (its workers)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return
    signal_group(pgid, signal.SIGTERM)
    end = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.05)
    signal_group(pgid, signal.SIGKILL)


class EngineFailed(LocatedError):
    """A started engine did not come up, or died (``policy measure --engine vllm``)."""

    kind = "runtime"


class StartupCheck(Protocol):
    """What :class:`EngineProcess` feeds a server's output to: :class:`EngineCheck` for
    ``vllm serve``, ``interlock.measure.policy_serve.ServeCheck`` for ``policy serve``."""

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
            return " | ".join(ANSI.sub("", line).strip() for line in self.tail[-5:]) or "none"

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
                    f"{self.name}: {exit_text(code)}; its last output: {self.output()}"
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
            stop_child(self.child)
        clean_group(self.child.pid)
        self._reader.join(timeout=2.0)
