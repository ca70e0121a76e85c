"""`policy serve` against `policy run`: generated tokens per second of 1 and 16 concurrent
streaming clients, and of the same number of prompts run offline.

One `policy serve --model M` child serves every round (started on a free port, warmed up
with one request, stopped at the end); its clients are `policy measure --engine`'s own
(interlock.measure.client: streaming /v1/completions, greedy, end of sequence ignored, each
of the C streams sending --requests requests one after another). The offline figure is
`policy run --json`'s `output_tokens_per_s` for C prompts of the same length and
--output-len tokens (a fresh process per run: its load time is not counted). Rounds
alternate offline and served runs; the medians are reported, with the load average
(the machine is shared: read the figures beside it).

    .venv/bin/python bench/bench_serve.py [--model smollm2] [--concurrency 1,16]
        [--input-len 32] [--output-len 64] [--requests 2] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
from pathlib import Path

from interlock.measure.cells import EngineWorkload
from interlock.measure.client import prompt_ids, run_trial, stream_request

ROOT = Path(__file__).resolve().parents[1]
LISTENING = re.compile(r"serving .* on http://127\.0\.0\.1:(\d+) ")


def offline(model: str, concurrency: int, input_len: int, output_len: int) -> float:
    """`policy run`'s generated tokens per second for ``concurrency`` prompts."""
    ids = ",".join(map(str, prompt_ids(input_len)))
    argv = [sys.executable, "-m", "interlock.cli", "run", "--model", model, "--json",
            "--max-tokens", str(output_len), "--ignore-eos"]
    for _ in range(concurrency):
        argv += ["--prompt-token-ids", ids]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True)
    return float(json.loads(done.stdout)["metrics"]["output_tokens_per_s"])


class Server:
    """A `policy serve` child on a free port."""

    def __init__(self, model: str, max_num_seqs: int) -> None:
        self.child = subprocess.Popen(
            [sys.executable, "-m", "interlock.cli", "serve", "--model", model, "--port", "0",
             "--max-num-seqs", str(max_num_seqs)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            stdin=subprocess.DEVNULL)
        self.port = 0
        ready = threading.Event()

        def read() -> None:
            assert self.child.stdout is not None
            for line in self.child.stdout:
                found = LISTENING.search(line)
                if found:
                    self.port = int(found.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        ready.wait(600)
        if not self.port:
            self.stop()
            raise SystemExit("policy serve did not come up")

    def stop(self) -> None:
        if self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)
            self.child.wait(120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--requests", type=int, default=2, help="requests per stream")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    load_before = os.getloadavg()
    server = Server(args.model, max(levels))
    figures: dict[int, dict[str, list[float]]] = {c: {"offline": [], "served": []}
                                                  for c in levels}
    try:
        stream_request(server.port, args.model, prompt_ids(args.input_len), 4)  # warm-up
        for _ in range(args.rounds):
            for c in levels:
                figures[c]["offline"].append(
                    offline(args.model, c, args.input_len, args.output_len))
                workload = EngineWorkload(concurrency=c, input_len=args.input_len,
                                          output_len=args.output_len,
                                          requests_per_stream=args.requests)
                trial = run_trial(server.port, args.model, workload)
                figures[c]["served"].append(trial["throughput_tok_s"])
    finally:
        server.stop()
    load_after = os.getloadavg()
    rows = []
    for c in levels:
        off = statistics.median(figures[c]["offline"])
        served = statistics.median(figures[c]["served"])
        rows.append({"concurrency": c, "offline_tok_s": round(off, 1),
                     "served_tok_s": round(served, 1), "served_vs_offline": round(served / off, 2),
                     "offline_runs": figures[c]["offline"], "served_runs": figures[c]["served"]})
    result = {"model": args.model, "input_len": args.input_len, "output_len": args.output_len,
              "requests_per_stream": args.requests, "rounds": args.rounds,
              "loadavg_before": [round(x, 2) for x in load_before],
              "loadavg_after": [round(x, 2) for x in load_after], "rows": rows}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"{args.model}: {args.input_len} prompt tokens, {args.output_len} generated per "
          f"request, medians of {args.rounds} rounds")
    print(f"{'clients':>8} {'policy run tok/s':>17} {'policy serve tok/s':>19} {'ratio':>6}")
    for row in rows:
        print(f"{row['concurrency']:>8} {row['offline_tok_s']:>17} {row['served_tok_s']:>19} "
              f"{row['served_vs_offline']:>6}")
    print(f"load average (1, 5, 15 min): before {result['loadavg_before']}, "
          f"after {result['loadavg_after']}")


if __name__ == "__main__":
    main()
