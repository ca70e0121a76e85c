"""The HTTP client of ``policy measure --engine vllm|interlock``: one way of driving an
OpenAI-compatible server (``vllm serve`` or ``policy serve``), so both are measured alike.

Times are taken per streamed chunk, as ``vllm bench serve`` takes them: the request's
arrival is when it is sent, its first token the first chunk's arrival, its finish the
last's; TTFT, TPOT and tokens/s are :mod:`interlock.app.timing`'s, as for every engine;
ITL the gaps between chunks.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from typing import Any, Protocol

from interlock.app.timing import (
    RequestTimes,
    decode_ms_per_token,
    mean_ttft_ms,
    output_tokens_per_s,
    tpot_s,
    ttft_s,
)
from interlock.core.errors import InputError, LocatedError, PolicyError
from interlock.vllm.process import Deadline

#: Seconds a request may take, from sending it to its last byte, before the trial fails: a
#: total deadline, not one per read (a server dripping a byte a second would never trip that).
REQUEST_TIMEOUT_S = 300.0
#: The longest line of a streamed answer (an event is a few hundred bytes).
MAX_STREAM_LINE = 64 * 1024
#: The largest non-streamed answer read.
MAX_ANSWER_BYTES = 4 * 1024 * 1024


def _answer(payload: bytes | str) -> Any:
    """A server's JSON, strictly (no NaN, bounded nesting); ``ValueError`` naming what is
    wrong, as any malformed answer is (``run_trial`` reports it as a failed request)."""
    from interlock.core.files import FileProblem, load_json

    data = payload.encode() if isinstance(payload, str) else payload
    try:
        return load_json(data, "the server's answer")
    except FileProblem as exc:
        raise ValueError(f"/v1/completions answered malformed JSON: {exc.detail}") from None


def _field(value: Any, path: str, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ValueError(f"/v1/completions answered {path} of the wrong type "
                         f"({type(value).__name__})")
    return value


class Workload(Protocol):
    """What a trial sends (``interlock.measure.cells.EngineWorkload``)."""

    @property
    def concurrency(self) -> int: ...

    @property
    def input_len(self) -> int: ...

    @property
    def output_len(self) -> int: ...

    @property
    def prompts(self) -> tuple[str, ...]: ...

    @property
    def requests_per_stream(self) -> int: ...


def prompt_ids(length: int) -> list[int]:
    """The token ids of the speed prompt: ``length`` ids cycling from 10 (not special ids)."""
    return [10 + i % 1000 for i in range(length)]


def free_port(start: int | None, taken: set[int]) -> int:
    """A port free on 127.0.0.1 now: the first from ``start`` on (skipping ports in use and
    ``taken``), else one the system picks."""
    candidates = range(start, min(start + 200, 65536)) if start else [0]
    for port in candidates:
        if port in taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise InputError(f"--port {start}: no free port among the 200 from it")


def stream_request(
    port: int, model: str, prompt: str | list[int], max_tokens: int
) -> dict[str, Any]:
    """One streaming ``/v1/completions`` request; the arrival time of each chunk."""
    body = json.dumps({
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True},
    })
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
    chunks: list[float] = []
    tokens = prompt_tokens = None
    with Deadline(conn, REQUEST_TIMEOUT_S, "/v1/completions"):
        start = time.perf_counter()
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            detail = response.read(500).decode("utf-8", "replace")
            raise PolicyError(f"/v1/completions answered {response.status}: {detail}")
        while True:
            line = response.readline(MAX_STREAM_LINE + 1)
            if not line:
                break
            if len(line) > MAX_STREAM_LINE:
                raise ValueError(f"/v1/completions streamed a line longer than "
                                 f"{MAX_STREAM_LINE} bytes")
            text = line.decode("utf-8", "replace").strip()
            if not text.startswith("data:"):
                continue
            payload = text[len("data:"):].strip()
            if payload == "[DONE]":
                break
            event = _field(_answer(payload), "an event", dict)
            choices = _field(event.get("choices") or [], "choices", list)
            if choices:
                text_of = _field(choices[0], "choices[0]", dict).get("text")
                if _field(text_of if text_of is not None else "", "choices[0].text", str):
                    chunks.append(time.perf_counter())
            usage = _field(event.get("usage") or {}, "usage", dict)
            if usage.get("completion_tokens") is not None:
                tokens = _field(usage["completion_tokens"], "usage.completion_tokens", int)
                if tokens < 1:
                    raise ValueError(f"/v1/completions counted {tokens} completion tokens")
            if usage.get("prompt_tokens") is not None:
                prompt_tokens = _field(usage["prompt_tokens"], "usage.prompt_tokens", int)
    if not chunks:
        raise PolicyError("/v1/completions streamed no text")
    count = tokens if tokens is not None else len(chunks)
    times = RequestTimes(arrival=start, first_token=chunks[0], finish=chunks[-1],
                         output_tokens=count, prompt_tokens=prompt_tokens or 0)
    return {
        "ttft_s": ttft_s(times),
        "tpot_s": tpot_s(times) or 0.0,
        "itl_s": [b - a for a, b in zip(chunks, chunks[1:], strict=False)],
        "tokens": count,
        "latency_s": times.finish - times.arrival,
        "times": times,
    }


def complete(port: int, model: str, prompt: str, max_tokens: int) -> str:
    """One greedy, non-streaming completion's text."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
    with Deadline(conn, REQUEST_TIMEOUT_S, "/v1/completions"):
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read(MAX_ANSWER_BYTES + 1)
    if response.status != 200:
        raise PolicyError(f"/v1/completions answered {response.status}: {data[:500]!r}")
    if len(data) > MAX_ANSWER_BYTES:
        raise PolicyError(f"/v1/completions answered more than {MAX_ANSWER_BYTES} bytes")
    try:
        answer = _field(_answer(data), "the answer", dict)
        choices = _field(answer.get("choices"), "choices", list)
        if not choices:
            raise ValueError("/v1/completions answered no choices")
        return str(_field(_field(choices[0], "choices[0]", dict).get("text"),
                          "choices[0].text", str))
    except ValueError as exc:
        raise PolicyError(str(exc)) from None


def run_trial(port: int, model: str, workload: Workload) -> dict[str, Any]:
    """``concurrency`` streams of requests at once; the trial's metrics (ms)."""
    results: list[dict[str, Any]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def stream(index: int) -> None:
        try:
            for n in range(workload.requests_per_stream):
                prompt: str | list[int] = prompt_ids(workload.input_len)
                if workload.prompts:
                    k = index * workload.requests_per_stream + n
                    prompt = workload.prompts[k % len(workload.prompts)]
                result = stream_request(port, model, prompt, workload.output_len)
                with lock:
                    results.append(result)
        except (OSError, http.client.HTTPException, LocatedError, ValueError) as exc:
            with lock:  # a server's malformed answer fails the trial, naming what it was
                errors.append(exc)

    start = time.perf_counter()
    threads = [threading.Thread(target=stream, args=(i,)) for i in range(workload.concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    if errors:
        raise PolicyError(f"a request failed: {errors[0]}")
    itl = sorted(gap for r in results for gap in r["itl_s"])
    times = [r["times"] for r in results]
    decode = decode_ms_per_token(times)
    return {
        "ttft_ms": round(mean_ttft_ms(times), 4),
        "tpot_ms": None if decode is None else round(decode, 4),
        "itl_ms": round(1e3 * itl[len(itl) // 2], 4) if itl else None,
        "throughput_tok_s": round(output_tokens_per_s(times), 3),
        "wall_ms": round(1e3 * wall, 3),
        "requests": len(results),
    }
