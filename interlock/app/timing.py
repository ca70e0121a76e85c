"""The serving metrics, defined once: what ``policy run --json``, ``policy measure`` (its
engine steps and its HTTP client) and ``bench/bench_cpu_engines.py`` report for every engine.

Each engine's timings become :class:`RequestTimes` (seconds on one clock), and every figure
is computed from those by the functions here:

* TTFT: a request's arrival (sent, or added to the engine) to its first output token;
* TPOT, decode ms per token: the rest of the request's time per output token after the
  first, ``(finish - first token) / (output tokens - 1)``: one decode step per token;
* prefill tokens/s: the prompt's tokens over TTFT (a request alone, asking for one token);
* output tokens/s: all output tokens over the wall time from the first arrival to the last
  finish, so the prompts' prefill counts in the time;
* memory: peak RSS above a baseline process (the interpreter with torch imported), for an
  engine that needs one; an engine in a process of its own is counted whole.

An engine that reports phases rather than requests (llama.cpp's ``llama-batched-bench``)
is mapped with :func:`batched_requests` and measured by the same functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RequestTimes:
    """One request's clock readings (seconds) and token counts."""

    arrival: float
    first_token: float
    finish: float
    output_tokens: int
    prompt_tokens: int = 0


def ttft_s(request: RequestTimes) -> float:
    """Arrival to first output token."""
    return request.first_token - request.arrival


def tpot_s(request: RequestTimes) -> float | None:
    """Time per output token after the first; None for a request of one token (no decode
    step to time)."""
    if request.output_tokens < 2:
        return None
    return (request.finish - request.first_token) / (request.output_tokens - 1)


def mean_ttft_ms(requests: Sequence[RequestTimes]) -> float:
    """The requests' mean TTFT, in ms."""
    if not requests:
        raise ValueError("no requests to measure")
    return 1e3 * sum(ttft_s(r) for r in requests) / len(requests)


def decode_ms_per_token(requests: Sequence[RequestTimes]) -> float | None:
    """The mean TPOT of the requests that decoded (two tokens or more), in ms; None when
    none did."""
    times = [t for t in (tpot_s(r) for r in requests) if t is not None]
    return 1e3 * sum(times) / len(times) if times else None


def prefill_tokens_per_s(request: RequestTimes) -> float:
    """The prompt's tokens over the request's TTFT."""
    if request.prompt_tokens < 1:
        raise ValueError("prefill needs the prompt's token count")
    return request.prompt_tokens / ttft_s(request)


def wall_s(requests: Sequence[RequestTimes]) -> float:
    """First arrival to last finish."""
    if not requests:
        raise ValueError("no requests to measure")
    return max(r.finish for r in requests) - min(r.arrival for r in requests)


def output_tokens_per_s(requests: Sequence[RequestTimes]) -> float:
    """All output tokens over :func:`wall_s`: prompts' prefill included in the time."""
    return sum(r.output_tokens for r in requests) / wall_s(requests)


def rss_above_baseline_mb(peak_mb: float, baseline_mb: float) -> float:
    """An engine's peak RSS less the baseline process's (the interpreter with torch)."""
    return peak_mb - baseline_mb


def batched_requests(parallel: int, prompt_tokens: int, decode_steps: int, prefill_s: float,
                     decode_s: float) -> list[RequestTimes]:
    """Requests from a batched run's phases: ``parallel`` prompts prefilled together in
    ``prefill_s`` (each request's first token is the prefill's), then ``decode_steps`` batched
    decode steps in ``decode_s``, each giving every request one more token."""
    return [RequestTimes(arrival=0.0, first_token=prefill_s, finish=prefill_s + decode_s,
                         output_tokens=decode_steps + 1, prompt_tokens=prompt_tokens)
            for _ in range(parallel)]
