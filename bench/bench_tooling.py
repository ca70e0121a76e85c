"""Policy tooling benchmarks: `policy check`, `policy diff` (shipped vs itself), `policy test`.

Run from the repository root:  .venv/bin/python bench/bench_tooling.py [--runs N]

The goal (issue 3) is under 1 s for `policy check` and for `policy diff` of the
shipped policy against itself. Commands run interleaved, one of each per round,
so machine noise hits them alike; medians are reported with the ratio to a bare
interpreter. In-process timings isolate the work from interpreter start-up.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from interlock.plugins.checks import lint_sources
from interlock.policy.diff import diff_policies
from interlock.policy.loader import load_policy

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "policies.yaml"


def policy_command() -> list[str]:
    script = shutil.which("policy", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "interlock.cli"]


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr.decode()}")
    return elapsed


def end_to_end(runs: int) -> dict[str, float]:
    policy = policy_command()
    cases = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "policy check": [*policy, "check"],
        "policy diff policies.yaml policies.yaml": [
            *policy,
            "diff",
            "policies.yaml",
            "policies.yaml",
        ],
        "policy test": [*policy, "test"],
    }
    for cmd in cases.values():  # warm bytecode and the policy cache once
        wall(cmd)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(runs):
        for name, cmd in cases.items():
            times[name].append(wall(cmd))
    return {name: statistics.median(values) for name, values in times.items()}


def in_process(runs: int) -> dict[str, float]:
    source = [("policies.yaml", SHIPPED.read_bytes())]
    lint_times, diff_times = [], []
    for _ in range(runs):
        start = time.perf_counter()
        findings = lint_sources(source)
        lint_times.append(time.perf_counter() - start)
        assert findings == [], findings
        # Fresh policies each round: resolutions are memoized per policy object.
        old, new = load_policy([SHIPPED], use_cache=False), load_policy([SHIPPED], use_cache=False)
        start = time.perf_counter()
        diff = diff_policies(old, new)
        diff_times.append(time.perf_counter() - start)
        assert diff.equal
    return {
        "lint_sources(shipped)": statistics.median(lint_times),
        f"diff_policies(shipped, shipped) [{diff.domain.size()} contexts]": statistics.median(
            diff_times
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    measured = end_to_end(args.runs)
    bare = measured["python -c pass"]
    print(f"end to end, median of {args.runs} interleaved runs")
    for name, seconds in measured.items():
        print(f"  {name:<42} {seconds * 1000:8.1f} ms  {seconds / bare:6.1f}x bare python")
    print(f"in process, median of {args.runs} runs")
    for name, seconds in in_process(args.runs).items():
        print(f"  {name:<58} {seconds * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
