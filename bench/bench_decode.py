"""Decode speed on a real model, interlock against transformers, in wall and CPU time.

One process loads the model in interlock (the decision the shipped policy resolves for
it) and in transformers (the same config.json and safetensors: a GGUF's cached
conversion), then interleaves the runs (medians of --reps):

* batch-1 decode per output token: (t(--new-tokens) - t(1)) / (--new-tokens - 1) after a
  32-token prompt;
* 16 requests (prompts of 8-64 tokens, each asking for 8-48 tokens): output tokens/s;
  transformers gets them as one left-padded batch run to the longest;
* time to first token of one 512-token prompt.

Each figure is given in wall time and in the process's CPU time: on a shared machine
the CPU time leaves out the waiting for a core that inflates wall times.

    .venv/bin/python bench/bench_decode.py [--model smollm2] [--reps 2] [--new-tokens 24]
        [--dtype float32|bfloat16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
from bench_model import greedy_generators
from transformers import AutoModelForCausalLM

from interlock.llm import LLM
from interlock.runners.model.sources import model_directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="the weights' dtype, for both engines (default float32)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    directory = model_directory(args.model)
    if directory is None:
        raise SystemExit("--model must name a model with weights on disk (not the demo)")
    llm = LLM(args.model, dtype=args.dtype, device="cpu", max_num_seqs=16)
    hf = AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, args.dtype)).eval()
    vocab = hf.config.vocab_size
    generator = torch.Generator().manual_seed(0)

    def draw(low: int, high: int, count: int) -> list[int]:
        return torch.randint(low, high + 1, (count,), generator=generator).tolist()

    prompt, n = draw(3, vocab - 1, 32), args.new_tokens
    prompts = [draw(3, vocab - 1, length) for length in draw(8, 64, 16)]
    mixed = draw(8, 48, 16)

    ours, theirs = greedy_generators(llm, hf)

    print("greedy tokens identical:", ours([prompt], [12]) == theirs([prompt], [12]))
    runs = {"one": ([prompt], [1]), "many": ([prompt], [n]),
            "ttft": ([draw(3, vocab - 1, 512)], [1]), "mixed": (prompts, mixed)}
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(args.reps):
        for run, (batch, outputs) in runs.items():
            for engine, generate in (("interlock", ours), ("transformers", theirs)):
                wall, cpu = time.perf_counter(), time.process_time()
                generate(batch, outputs)
                samples.setdefault((engine, run), []).append(
                    (time.perf_counter() - wall, time.process_time() - cpu))
    median = {key: [statistics.median(s[i] for s in v) for i in (0, 1)]
              for key, v in samples.items()}
    metrics: dict[str, Callable[[str, int], float]] = {
        "batch-1 decode, ms per token": lambda e, i: (
            (median[e, "many"][i] - median[e, "one"][i]) / (n - 1) * 1e3),
        "16 requests, output tokens/s": lambda e, i: sum(mixed) / median[e, "mixed"][i],
        "time to first token, 512-token prompt, ms": lambda e, i: median[e, "ttft"][i] * 1e3,
    }
    print("| metric | time | interlock | transformers | ratio |")
    print("|---|---|---:|---:|---:|")
    for label, metric in metrics.items():
        for i, kind in ((0, "wall"), (1, "CPU")):
            a, b = metric("interlock", i), metric("transformers", i)
            print(f"| {label} | {kind} | {a:.1f} | {b:.1f} | {a / b:.2f}x |")
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
