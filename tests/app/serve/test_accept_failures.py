"""A failed ``accept()`` (no file descriptors left) is logged once, not once a second: asyncio
retries the accept every second and reported each failure with a traceback, 174k of them
(70 MB) in a minute of a connection flood (issue 51). Other loop errors still reach
asyncio's own handler."""

from __future__ import annotations

import asyncio
import errno
import logging

import pytest
import uvicorn
from starlette.applications import Starlette

from interlock.serve.app import _Uvicorn


def test_an_exhausted_accept_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    server = _Uvicorn(uvicorn.Config(Starlette()), lambda: None, loop=None,  # type: ignore[arg-type]
                      drain_timeout=1)
    loop = asyncio.new_event_loop()
    seen: list[dict] = []
    loop.default_exception_handler = seen.append  # type: ignore[method-assign]
    try:
        with caplog.at_level(logging.ERROR, logger="interlock.serve"):
            for _ in range(1000):
                server._loop_exception(loop, {
                    "message": "socket.accept() out of system resource",
                    "exception": OSError(errno.EMFILE, "Too many open files")})
            server._loop_exception(loop, {"message": "something else"})
    finally:
        loop.close()
    [record] = caplog.records
    assert "cannot accept connections" in record.getMessage()
    assert "Too many open files" in record.getMessage() and record.exc_info is None
    assert seen == [{"message": "something else"}]
