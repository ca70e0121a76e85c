"""A live ``policy serve`` child for a test module: started on a free port, stopped by the
fixture that started it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LISTENING = re.compile(r"policy serve: serving .* on http://127\.0\.0\.1:(\d+) ")


class ServeProcess:
    """``python -m interlock.cli serve ARGS --port 0``; ``port`` once it listens."""

    def __init__(self, *args: str, env: dict[str, str] | None = None,
                 timeout: float = 240.0) -> None:
        self.lines: list[str] = []
        self.port: int | None = None
        self._ready = threading.Event()
        self.child = subprocess.Popen(
            [sys.executable, "-m", "interlock.cli", "serve", *args, "--port", "0"],
            cwd=ROOT, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._ready.wait(timeout) or self.port is None:
            self.stop()
            raise AssertionError(f"policy serve did not come up: {self.output()}")

    def _read(self) -> None:
        assert self.child.stdout is not None
        for line in self.child.stdout:
            self.lines.append(line.rstrip("\n"))
            found = LISTENING.search(line)
            if found:
                self.port = int(found.group(1))
                self._ready.set()
        self._ready.set()  # it exited

    def output(self) -> str:
        return "\n".join(self.lines[-30:])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM, then its exit status once it has drained."""
        self.child.send_signal(signal.SIGTERM)
        code = self.child.wait(timeout)
        self._reader.join(5)
        return code

    def stop(self) -> None:
        if self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)
            try:
                self.child.wait(30)
            except subprocess.TimeoutExpired:
                self.child.kill()
                self.child.wait()
        self._reader.join(5)


def wait_for(condition, timeout: float = 30.0, every: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(every)
    return False
