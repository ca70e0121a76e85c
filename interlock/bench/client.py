"""The HTTP client of ``policy bench --engine vllm|interlock``: one way of driving an
OpenAI-compatible server (``vllm serve`` or ``policy serve``), so both are measured alike.

Times are taken per streamed chunk, as ``vllm bench serve`` takes them: TTFT is the first
chunk's arrival after the request, TPOT the rest of the request's time per output token
after the first, ITL the gaps between chunks.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from typing import Any, Protocol

from interlock.core.errors import InputError, PolicyError

#: Seconds a request may stream before the trial fails.
REQUEST_TIMEOUT_S = 300.0


class Workload(Protocol):
    """What a trial sends (``interlock.bench.engine.EngineWorkload``)."""

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
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        detail = response.read(500).decode("utf-8", "replace")
        conn.close()
        raise PolicyError(f"/v1/completions answered {response.status}: {detail}")
    chunks: list[float] = []
    tokens = None
    while True:
        line = response.readline()
        if not line:
            break
        text = line.decode("utf-8", "replace").strip()
        if not text.startswith("data:"):
            continue
        payload = text[len("data:"):].strip()
        if payload == "[DONE]":
            break
        event = json.loads(payload)
        if event.get("choices") and event["choices"][0].get("text"):
            chunks.append(time.perf_counter())
        usage = event.get("usage")
        if usage and usage.get("completion_tokens") is not None:
            tokens = int(usage["completion_tokens"])
    conn.close()
    if not chunks:
        raise PolicyError("/v1/completions streamed no text")
    count = tokens if tokens is not None else len(chunks)
    ttft = chunks[0] - start
    latency = chunks[-1] - start
    return {
        "ttft_s": ttft,
        "tpot_s": (latency - ttft) / (count - 1) if count > 1 else 0.0,
        "itl_s": [b - a for a, b in zip(chunks, chunks[1:], strict=False)],
        "tokens": count,
        "latency_s": latency,
    }


def complete(port: int, model: str, prompt: str, max_tokens: int) -> str:
    """One greedy, non-streaming completion's text."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    if response.status != 200:
        raise PolicyError(f"/v1/completions answered {response.status}: {data[:500]!r}")
    return str(json.loads(data)["choices"][0]["text"])


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
        except (OSError, PolicyError, ValueError) as exc:
            with lock:
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
    tokens = sum(r["tokens"] for r in results)
    return {
        "ttft_ms": round(1e3 * sum(r["ttft_s"] for r in results) / len(results), 4),
        "tpot_ms": round(1e3 * sum(r["tpot_s"] for r in results) / len(results), 4),
        "itl_ms": round(1e3 * itl[len(itl) // 2], 4) if itl else None,
        "throughput_tok_s": round(tokens / wall, 3),
        "wall_ms": round(1e3 * wall, 3),
        "requests": len(results),
    }
