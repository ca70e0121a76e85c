"""Tensor parallelism on the CPU: a model at TP=N (default: the demo model at 2; one thread
per rank) against TP=1 (one thread), side by side in one process, runs interleaved
(medians of --reps):

* batch-1 decode, output tokens/s: (N - 1) / (t(N tokens) - t(1 token));
* 16 concurrent requests, output tokens/s;
* time rank 0 spends in the model's collectives per decoded token (they are synchronous,
  so this includes waiting for the other ranks to reach each collective), and what
  carried them (shared memory on one host unless INTERLOCK_TP_COLLECTIVES=gloo).

    .venv/bin/python bench/bench_tensor_parallel.py [--model demo|smollm2] [--size N]
        [--reps 5] [--new-tokens 32] [--json] [--runner mrv1|mrv2] [--cudagraph MODE]

Both engines run the decision the shipped policy resolves for the demo on the CPU (given
tensor_parallel_size) unless --runner / --cudagraph override it. GPU figures need two GPUs
and are not measured here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from typing import Any

import torch

from interlock.core.env import TP_THREADS
from interlock.llm import LLM
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.contract import Decision
from interlock.runners.parallel.group import CollectiveTimes

PROMPT = list(range(1, 33))
CONCURRENT = [list(range(1 + i, 10 + 3 * i)) for i in range(16)]


def timed(llm: LLM, prompts: list[list[int]], tokens: int) -> float:
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    start = time.perf_counter()
    llm.generate(prompts, params)
    return time.perf_counter() - start


def decode_rate(llm: LLM, new_tokens: int) -> float:
    """Batch-1 decode output tokens/s, prefill and first token subtracted."""
    return (new_tokens - 1) / (timed(llm, [PROMPT], new_tokens) - timed(llm, [PROMPT], 1))


def collective_share(llm: LLM, tp: Any, new_tokens: int) -> tuple[float, float]:
    """(ms, calls) in rank 0's collectives per decoded token, prefill subtracted."""
    runs = []
    for tokens in (new_tokens, 1):
        tp.times = CollectiveTimes()
        timed(llm, [PROMPT], tokens)
        runs.append(tp.times)
    tp.times = None
    steps = new_tokens - 1
    return (1e3 * (runs[0].seconds - runs[1].seconds) / steps,
            (runs[0].calls - runs[1].calls) / steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--size", type=int, default=2, help="tensor_parallel_size")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--runner", choices=("mrv1", "mrv2"))
    parser.add_argument("--cudagraph")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    os.environ[TP_THREADS.name] = "1"  # one thread per rank, whatever the core count
    torch.set_num_threads(1)
    decision = None
    if args.runner or args.cudagraph:
        decision = Decision(runner=args.runner or "mrv2", cudagraph=args.cudagraph or "none")
    options: dict[str, Any] = {"max_num_seqs": 16, "decision": decision}
    size = args.size
    engines = {1: LLM(args.model, **options),
               size: LLM(args.model, tensor_parallel_size=size, **options)}
    tp = engines[size].step_loop.runner.tp  # rank 0's group (the bench process is rank 0)

    for llm in engines.values():  # warm up; tokens must agree
        timed(llm, [PROMPT], 4)
    params = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
    tokens = {n: [o.token_ids for o in llm.generate(CONCURRENT, params)]
              for n, llm in engines.items()}
    assert tokens[1] == tokens[size], f"TP={size} tokens differ from TP=1"

    decode: dict[int, list[float]] = {1: [], size: []}
    batch: dict[int, list[float]] = {1: [], size: []}
    collective_ms: list[float] = []
    calls: list[float] = []
    total = len(CONCURRENT) * args.new_tokens
    for _ in range(args.reps):
        for n, llm in engines.items():
            decode[n].append(decode_rate(llm, args.new_tokens))
            batch[n].append(total / timed(llm, CONCURRENT, args.new_tokens))
        spent, count = collective_share(engines[size], tp, args.new_tokens)
        collective_ms.append(spent)
        calls.append(count)

    result = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}",
        "model": args.model,
        "tensor_parallel_size": size,
        "collectives": tp.collectives,
        "load_average": os.getloadavg(),
        "decision": engines[1].step_loop.runner.decision.__dict__,
        "batch1_decode_tokens_per_s": {n: statistics.median(v) for n, v in decode.items()},
        "batch1_speedup": statistics.median(decode[size]) / statistics.median(decode[1]),
        "concurrent16_tokens_per_s": {n: statistics.median(v) for n, v in batch.items()},
        "concurrent16_speedup": statistics.median(batch[size]) / statistics.median(batch[1]),
        "collective_ms_per_token": statistics.median(collective_ms),
        "collectives_per_token": statistics.median(calls),
        f"decode_ms_per_token_tp{size}": 1e3 / statistics.median(decode[size]),
    }
    engines[size].close()
    if args.json:
        print(json.dumps(result, indent=2, default=str))
        return
    for key, value in result.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
