"""Runners benchmark: decode time per token for each runner x graph mode x batch size.

Every configuration (mrv1/mrv2 x none, piecewise, full, full_decode_only,
full_and_piecewise, and breakable piecewise/full) is loaded once, with capture
sizes 1, 2, 4, 8, 16; then, for each batch size, the configurations take turns
(--reps rounds): B requests are prefilled in one step and each following
decode step is timed on its own. Reported per configuration: the median decode
step time (= time per output token of each request), throughput (B / step
time), and the ratio to the same runner's eager (cudagraph=none) run.

On a GPU (cuda graphs) it also reports whether full-graph batch-1 decode is
>= 2x faster than eager, and batch-1 decode against the roofline: weight bytes
read per token / the device bandwidth measured here.

    .venv/bin/python bench/bench_runners.py [--model demo] [--reps 3] [--steps 24] [--threads N]
        [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass, field

import torch
from bench_model import decode_weight_bytes, machine

from interlock.llm import LLM
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.contract import Decision

RUNNERS = ("mrv1", "mrv2")
MODES = (
    ("none", False),
    ("piecewise", False),
    ("full", False),
    ("full_decode_only", False),
    ("full_and_piecewise", False),
    ("piecewise", True),
    ("full", True),
)
PROMPT_LEN = 16


@dataclass
class Config:
    runner: str
    mode: str
    breakable: bool
    llm: LLM
    steps: dict[int, list[float]] = field(default_factory=dict)  # batch -> decode step seconds

    @property
    def label(self) -> str:
        return f"{self.runner} {self.mode}{' +breakable' if self.breakable else ''}"


def decode_steps(llm: LLM, batch: int, steps: int, sync: bool) -> list[float]:
    """Seconds of each decode step after one prefill step of ``batch`` requests."""
    engine = llm.step_loop
    params = SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True)
    for i in range(batch):
        prompt = [(7 * i + j) % 1000 + 3 for j in range(PROMPT_LEN)]
        engine.add_request(engine.make_request(prompt, params))
    engine.step()
    times = []
    while engine.has_unfinished():
        start = time.perf_counter()
        engine.step()
        if sync:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def device_bandwidth(device: torch.device, megabytes: int = 1024, reps: int = 10) -> float:
    """Bytes/s moved by a device-to-device copy (read + write), median of reps."""
    source = torch.empty(megabytes * 2**20 // 4, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        target.copy_(source)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 2 * source.numel() * 4 / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default="demo", help="demo (the built-in model) or a model directory"
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=24, help="decode steps timed per run")
    parser.add_argument("--batch-sizes", default="1,4,16")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"

    configs = []
    for runner in RUNNERS:
        for mode, breakable in MODES:
            decision = Decision(runner, mode, breakable, capture_sizes=(1, 2, 4, 8, 16))
            llm = LLM(
                args.model, device=device, max_num_seqs=max(batches),
                max_num_batched_tokens=max(batches) * PROMPT_LEN,
                max_model_len=PROMPT_LEN + args.steps + 16, decision=decision,
            )
            configs.append(Config(runner, mode, breakable, llm))
    for batch in batches:
        for _ in range(args.reps):
            for config in configs:
                config.steps.setdefault(batch, []).extend(
                    decode_steps(config.llm, batch, args.steps, gpu)
                )

    rows = []
    for batch in batches:
        eager = {
            c.runner: statistics.median(c.steps[batch]) for c in configs if c.mode == "none"
        }
        for c in configs:
            step = statistics.median(c.steps[batch])
            rows.append({
                "config": c.label, "runner": c.runner, "mode": c.mode, "breakable": c.breakable,
                "batch": batch,
                "tpot_ms": round(step * 1e3, 3), "tokens_per_s": round(batch / step, 1),
                "vs_eager": round(step / eager[c.runner], 3),
                "backend": c.llm.report().graphs.backend,
            })
    result: dict[str, object] = {"machine": machine(), "device": device, "rows": rows}
    if gpu:
        model = configs[0].llm.step_loop.runner.model
        weights = decode_weight_bytes(model)
        bandwidth = device_bandwidth(torch.device("cuda"))
        roofline_ms = weights / bandwidth * 1e3
        result["gpu"] = torch.cuda.get_device_name()
        result["roofline"] = {"weight_bytes": weights, "bandwidth_gbs": round(bandwidth / 1e9, 1),
                              "batch1_roofline_ms": round(roofline_ms, 4)}
        for row in rows:
            if row["batch"] == 1:
                row["vs_roofline"] = round(row["tpot_ms"] / roofline_ms, 2)
        full = {r["runner"]: r for r in rows if r["batch"] == 1 and r["mode"] == "full"
                and not r["breakable"]}
        result["full_graph_batch1_speedup"] = {
            name: round(1 / row["vs_eager"], 2) for name, row in full.items()
        }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{args.model} model on {device} ({result.get('gpu', machine()['cpu'])}), "
          f"{args.reps} reps x {args.steps} decode steps, capture sizes 1,2,4,8,16")
    print(f"{'config':<34} {'batch':>5} {'tpot ms':>9} {'tok/s':>9} {'vs eager':>9}"
          + (f" {'vs roofline':>12}" if gpu else ""))
    for row in rows:
        line = (f"{row['config']:<34} {row['batch']:>5} {row['tpot_ms']:>9.3f} "
                f"{row['tokens_per_s']:>9.1f} {row['vs_eager']:>9.3f}")
        if "vs_roofline" in row:
            line += f" {row['vs_roofline']:>12.2f}"
        print(line)
    if gpu:
        print(f"roofline: {result['roofline']}; full-graph batch-1 speedup over eager: "
              f"{result['full_graph_batch1_speedup']}")


if __name__ == "__main__":
    main()
