"""One step loop, many HTTP requests: a thread steps interlock's continuous-batching loop
(:class:`~interlock.runners.batching.step_loop.StepLoop`) while the server's event loop adds
and aborts requests and receives each one's tokens.

The step loop is not thread-safe, so only this thread touches it once it runs: other
threads hand it requests to add and to abort through :meth:`StepThread.submit` and
:meth:`StepThread.abort`, which it applies between steps. After each step every request
that got a token (or finished) is reported to the callback it was submitted with, from
the loop's thread. Requests admitted at once are bounded (``capacity``): past it,
``submit`` raises :class:`Overloaded` rather than queueing without end.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from interlock.core.errors import InterlockError
from interlock.runners.batching.request import Request
from interlock.runners.batching.step_loop import StepLoop

LOG = logging.getLogger("interlock.serve")


class Overloaded(InterlockError):
    """More requests than the server admits at once (HTTP 503)."""

    kind = "runtime"


class Closed(InterlockError):
    """The server is draining or its step loop has stopped (HTTP 503)."""

    kind = "runtime"


@dataclass(frozen=True)
class Update:
    """A request's progress after a step: how many tokens it has now, and whether it has
    finished (``error``: the step failed and the request was aborted)."""

    request: Request
    num_tokens: int
    finished: bool
    error: str | None = None


Deliver = Callable[[Update], None]


class Observer(Protocol):
    """What the loop tells the metrics, from its thread."""

    def tokens(self, request: Request, before: int, now: float) -> None: ...

    def finished(self, request: Request) -> None: ...

    def stepped(self, step_loop: StepLoop) -> None: ...


class StepThread:
    """Steps ``step_loop`` on a thread of its own while requests are unfinished.

    ``stop_strings(request)`` is called between steps for a request with stop strings that
    got tokens (the step loop sees tokens, the caller text: ``LLM.check_stop_strings``)."""

    def __init__(self, step_loop: StepLoop, capacity: int,
                 stop_strings: Callable[[Request], None], observer: Observer) -> None:
        self.step_loop, self.capacity = step_loop, capacity
        self._stop_strings, self._observer = stop_strings, observer
        self._cond = threading.Condition()
        self._adds: list[tuple[Request, Deliver]] = []
        self._aborts: list[Request] = []
        self._active: dict[Request, tuple[Deliver, int]] = {}
        self._admitted = 0  # submitted and not yet finished (guarded by _cond)
        self._closing = False
        self._abort_everything = False
        self.failure: str | None = None  # why the thread died, if it did
        self._thread = threading.Thread(target=self._run, name="interlock-step-loop", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive() and not self._closing

    def submit(self, requests: Sequence[Request], deliver: Deliver) -> None:
        """Queue ``requests`` (all or none); ``deliver`` gets their updates."""
        with self._cond:
            if self._closing or not self._thread.is_alive():
                raise Closed("the server is shutting down; it takes no new requests")
            if self._admitted + len(requests) > self.capacity:
                raise Overloaded(
                    f"the server has {self._admitted} requests in flight and admits at most "
                    f"{self.capacity} (--max-num-seqs plus --max-queue); retry later"
                )
            self._admitted += len(requests)
            self._adds.extend((r, deliver) for r in requests)
            self._cond.notify()

    def abort(self, requests: Sequence[Request]) -> None:
        """End ``requests`` that have not finished, freeing their KV-cache blocks."""
        with self._cond:
            self._aborts.extend(requests)
            self._cond.notify()

    def abort_all(self) -> None:
        """End every request admitted so far between two steps (a drain ran out of time):
        each finishes ``aborted`` and its caller is told, as for :meth:`abort`."""
        with self._cond:
            self._abort_everything = True
            self._cond.notify()

    def in_flight(self) -> int:
        with self._cond:
            return self._admitted

    def close(self, timeout: float = 10.0) -> None:
        """Abort what is still running and stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # the thread's death must be visible, never silent
            self.failure = f"{type(exc).__name__}: {exc}"
            LOG.error("policy serve: the step loop stopped: %s", self.failure)
            with self._cond:
                self._closing = True
            raise

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._adds or self._aborts or self._active or self._closing
                           or self._abort_everything):
                    self._cond.wait()
                adds, self._adds = self._adds, []
                aborts, self._aborts = self._aborts, []
                closing, everything = self._closing, self._abort_everything
                self._abort_everything = False
            for request, deliver in adds:
                self.step_loop.add_request(request)
                self._active[request] = (deliver, 0)
            if closing or everything:
                aborts = list(self._active)
            self._abort([r for r in aborts if r in self._active])
            if closing:
                self._observer.stepped(self.step_loop)
                return
            if self.step_loop.has_unfinished():
                self._step()

    def _step(self) -> None:
        try:
            self.step_loop.step()
        except Exception as exc:
            # A failed step (out of memory, a runner error) fails the requests in it, not
            # the server: they are aborted, each told why, and the step loop is clean again.
            message = f"the step failed: {type(exc).__name__}: {exc}"
            LOG.error("policy serve: %s", message)
            self._abort(list(self._active), message)
            return
        # The gauges first: a client that has a token sees the state that produced it.
        self._observer.stepped(self.step_loop)
        now = time.perf_counter()
        for request, (deliver, seen) in list(self._active.items()):
            count = len(request.output_token_ids)
            if count == seen and request.finish_reason is None:
                continue
            if count != seen:
                if request.params.stop:
                    self._stop_strings(request)
                self._observer.tokens(request, seen, now)
            self._report(request, deliver, count)

    def _abort(self, requests: list[Request], error: str | None = None) -> None:
        if not requests:
            return
        self.step_loop.abort(requests)
        self._observer.stepped(self.step_loop)
        for request in requests:
            deliver, _ = self._active[request]
            self._report(request, deliver, len(request.output_token_ids), error)

    def _report(self, request: Request, deliver: Deliver, count: int,
                error: str | None = None) -> None:
        finished = request.finish_reason is not None
        if finished:
            del self._active[request]
            self._observer.finished(request)
            with self._cond:
                self._admitted -= 1
        else:
            self._active[request] = (deliver, count)
        deliver(Update(request, count, finished, error))
