"""bench/load_serve.py's holder, against a listener that closes every connection at once: it
reopens what is closed, never holds more than it is told at once, and stops at its bound on
opens (the bench must stay bounded in count and time). Its latency figures are a
measurement (docs/serve.md), not asserted here."""

from __future__ import annotations

import importlib.util
import socket
import threading

from checkout import REPO
from serve_helpers import wait_for

spec = importlib.util.spec_from_file_location("load_serve", REPO / "bench" / "load_serve.py")
assert spec is not None and spec.loader is not None
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_the_holder_is_bounded_in_count() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        listener.settimeout(0.2)
        accepted: list[bytes] = []
        done = threading.Event()

        def close_each() -> None:
            while not done.is_set():
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                with conn:
                    conn.settimeout(5)
                    accepted.append(conn.recv(4096))

        thread = threading.Thread(target=close_each)
        thread.start()
        try:
            with bench.Holder(listener.getsockname()[1], held=5, max_opens=12) as holder:
                assert wait_for(lambda: holder.closed_by_server >= 7)
        finally:
            done.set()
            thread.join(10)
    assert holder.opens == 12 and holder.peak <= 5
    assert all(first.startswith(b"POST /v1/completions HTTP/1.1\r\n") for first in accepted)
