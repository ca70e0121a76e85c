"""Plugin benchmarks: what discovery and stage 5 add to `policy explain` and to a resolve.

Run from the repository root:  .venv/bin/python bench/bench_plugins.py [--runs N]

Start-up commands run interleaved (one of each per round), medians reported with
ratios to a bare interpreter, as in bench_policy.py (whose helpers this reuses).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_policy import EXPLAIN, per_call, policy_command, wall

from interlock import plugins
from interlock.plugins.capabilities import capability_stage
from interlock.policy import Context, load_policy, resolve


def child_env(work: Path) -> dict[str, str]:
    """Bytecode caching on (as installed), interlock's caches in ``work``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPYCACHEPREFIX=str(work / "pycache"), INTERLOCK_CACHE_DIR=str(work / "cache"))
    return env


def startup(runs: int, work: Path) -> list[tuple[str, float, float]]:
    env = child_env(work)
    explain = [*policy_command(), *EXPLAIN]
    cases = {
        "python -c pass": ([sys.executable, "-c", "pass"], env),
        "policy explain (policy and plugin caches warm)": (explain, env),
        "policy explain (plugin cache off: discovery each run)": (
            explain,
            {**env, "INTERLOCK_NO_PLUGIN_CACHE": "1"},
        ),
    }
    for cmd, run_env in cases.values():  # warm bytecode and both caches
        wall(cmd, run_env)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    for _ in range(runs):
        for name, (cmd, run_env) in cases.items():
            times[name].append(wall(cmd, run_env))
    return [
        (name, statistics.median(w for w, _ in t), statistics.median(c for _, c in t))
        for name, t in times.items()
    ]


def in_process() -> list[tuple[str, tuple[float, float]]]:
    os.environ["INTERLOCK_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-plugins-cache-")
    plugins.load_registry(refresh=True)  # imports everything discovery needs, once

    def from_cache() -> None:
        plugins.reset()
        plugins.load_registry()

    policy = load_policy(use_cache=False)
    ctx = Context("GlmMoeDsaForCausalLM", "rocm", "gfx950")
    stage = capability_stage()

    def cold(capabilities: object) -> None:
        policy.memo.clear()
        resolve(policy, ctx, capabilities=capabilities)

    return [
        (
            "registry: discovery (entry points, pluggy, hooks)",
            per_call(lambda: plugins.load_registry(refresh=True), 50),
        ),
        ("registry: from the disk cache (stat + JSON)", per_call(from_cache, 500)),
        ("registry: memoized in the process", per_call(plugins.load_registry, 100_000)),
        ("cold resolve, shipped policy, without stage 5", per_call(lambda: cold(None), 5_000)),
        ("cold resolve, shipped policy, with stage 5", per_call(lambda: cold(stage), 5_000)),
    ]


def import_cost(runs: int, work: Path) -> tuple[float, float]:
    """Median CPU seconds to import what a warm explain needs from the plugin side, measured as
    (engine + plugins + stage 5) minus (engine alone) in fresh interpreters."""
    engine = (
        "import interlock.policy.loader, interlock.policy.resolution, interlock.policy.context, "
        "interlock.commands.common"
    )
    with_plugins = (
        engine + "; import interlock.plugins as plugins, interlock.plugins.capabilities; "
        "plugins.load_registry()"
    )
    code = "import time; t = time.process_time(); {}; print(time.process_time() - t)"
    env = child_env(work)
    samples: dict[str, list[float]] = {"engine": [], "plugins": []}
    for i in range(runs + 1):
        for name, stmt in (("engine", engine), ("plugins", with_plugins)):
            cmd = [sys.executable, "-c", code.format(stmt)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
            if i:  # the first round writes bytecode and the caches
                samples[name].append(float(out))
    return statistics.median(samples["engine"]), statistics.median(samples["plugins"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-plugins-"))
    rows = startup(args.runs, work)
    base = rows[0][1]
    print(f"start-up, median of {args.runs} interleaved runs:")
    base_cpu = rows[0][2]
    for name, w, c in rows:
        print(
            f"  {name:<56} {w * 1e3:7.1f} ms wall {w / base:5.2f}x  "
            f"{c * 1e3:7.1f} ms cpu {c / base_cpu:5.2f}x"
        )
    engine, both = import_cost(args.runs, work)
    shutil.rmtree(work, ignore_errors=True)
    print(
        f"import + load_registry on top of the engine (cache warm), cpu: "
        f"{(both - engine) * 1e3:.1f} ms (engine {engine * 1e3:.1f} ms, "
        f"engine + plugins {both * 1e3:.1f} ms)"
    )
    print("in process (median of 5 batches):")
    for name, (w, c) in in_process():
        print(f"  {name:<56} {w * 1e6:9.1f} us wall {c * 1e6:9.1f} us cpu")


if __name__ == "__main__":
    main()
