"""What a server and an engine send back, third hostile pass (issue 38): a request has a
total deadline (a server dripping a byte at a time cannot keep a trial alive), lines read
from a stream or the engine's output are bounded, and malformed answers fail the trial
naming what was wrong, never as a bug."""

from __future__ import annotations

import io
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from interlock.core.errors import PolicyError
from interlock.measure import client as bench_client
from interlock.measure.cells import EngineWorkload
from interlock.measure.client import complete, run_trial, stream_request
from interlock.vllm.process import MAX_LINE_BYTES, EngineFailed, output_lines

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"


@pytest.fixture
def server() -> Iterator[Callable[[Callable[[socket.socket], None]], int]]:
    """server(answer): a port on 127.0.0.1 where ``answer(connection)`` handles each request
    (after its bytes are read); stopped after the test."""
    listeners: list[socket.socket] = []
    stop = threading.Event()

    def start(answer: Callable[[socket.socket], None]) -> int:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.2)
        listeners.append(listener)

        def serve() -> None:
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except OSError:
                    continue
                with conn:
                    conn.settimeout(5)
                    try:
                        conn.recv(65536)
                        answer(conn)
                    except OSError:
                        pass

        threading.Thread(target=serve, daemon=True).start()
        return int(listener.getsockname()[1])

    yield start
    stop.set()
    for listener in listeners:
        listener.close()


def _within(seconds: float, call: Callable[[], object]) -> BaseException | None:
    """Run ``call`` in a thread; the exception it raised, failing if it is still running
    after ``seconds``."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 (handed back to the test)
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"still running after {seconds} s"
    return outcome[0]


def test_a_dripping_server_meets_the_total_deadline(
    server, monkeypatch: pytest.MonkeyPatch
) -> None:
    def drip(conn: socket.socket) -> None:
        conn.sendall(HEAD)
        for _ in range(200):  # a byte every 50 ms: each read is quick, the whole is not
            conn.sendall(b"d")
            time.sleep(0.05)

    port = server(drip)
    monkeypatch.setattr(bench_client, "REQUEST_TIMEOUT_S", 1.0)
    start = time.monotonic()
    error = _within(8, lambda: stream_request(port, "m", "hi", 4))
    assert isinstance(error, EngineFailed), error  # the request's deadline, not a policy's
    assert "did not finish within 1 s" in str(error)
    assert time.monotonic() - start < 4


def test_a_streamed_line_is_bounded(server) -> None:
    port = server(lambda conn: conn.sendall(HEAD + b"data: " + b"x" * 200_000 + b"\n"))
    error = _within(10, lambda: stream_request(port, "m", "hi", 4))
    assert isinstance(error, ValueError), error
    assert "a line longer than 65536 bytes" in str(error)


@pytest.mark.parametrize("event", [
    b"5", b"[]", b'{"choices": "x"}', b'{"choices": [7]}', b'{"choices": [{"text": 5}]}',
    b'{"usage": {"completion_tokens": "many"}}', b'{"usage": 3}', b"NaN", b"{",
])
def test_a_malformed_stream_event_fails_the_trial_naming_it(server, event: bytes) -> None:
    port = server(lambda conn: conn.sendall(HEAD + b"data: " + event + b"\n\ndata: [DONE]\n\n"))
    workload = EngineWorkload(concurrency=1, requests_per_stream=1, output_len=2)
    error = _within(10, lambda: run_trial(port, "m", workload))
    assert isinstance(error, PolicyError), error
    assert "a request failed: /v1/completions answered" in str(error)


def test_an_answer_that_is_not_http_fails_the_trial(server) -> None:
    port = server(lambda conn: conn.sendall(b"garbage\r\n\r\n"))
    workload = EngineWorkload(concurrency=1, requests_per_stream=1, output_len=2)
    error = _within(10, lambda: run_trial(port, "m", workload))
    assert isinstance(error, PolicyError), error


@pytest.mark.parametrize("body", [
    b"[]", b"{}", b'{"choices": []}', b'{"choices": [{"text": 5}]}', b"garbage",
    b'{"choices": [{"text": NaN}]}',
])
def test_a_malformed_completion_is_named(server, body: bytes) -> None:
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n")
    port = server(lambda conn: conn.sendall(head + body))
    error = _within(10, lambda: complete(port, "m", "hi", 4))
    assert isinstance(error, PolicyError), error
    assert "/v1/completions answered" in str(error)


def test_engine_output_lines_are_bounded() -> None:
    pieces = list(output_lines(io.BytesIO(b"y" * (3 * MAX_LINE_BYTES) + b"\nready\n")))
    assert all(len(raw) <= MAX_LINE_BYTES for raw, _ in pieces)
    assert b"".join(raw for raw, _ in pieces) == b"y" * (3 * MAX_LINE_BYTES) + b"\nready\n"
    texts = [text for _, text in pieces if text is not None]
    assert texts == ["y" * MAX_LINE_BYTES, "ready\n"]
