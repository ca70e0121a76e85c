"""Policy engine benchmarks: `policy explain` start-up, warm and cold resolution, 10,000 rules.

Run from the repository root:  .venv/bin/python bench/bench_policy.py [--runs N]

Start-up commands run interleaved (one of each per round, in a shuffled order) so
machine noise hits them alike; medians are reported with ratios to a bare interpreter. Bytecode
caching is on (in a private PYTHONPYCACHEPREFIX, warmed first), as in a normal
install, even when the calling environment sets PYTHONDONTWRITEBYTECODE.

``--baseline VENV`` times another interlock (an earlier revision) in the same rounds, for a
regression check: e.g. ``git worktree add /tmp/base REV``, then a venv with this tree's
dependencies and ``pip install --no-deps -e /tmp/base`` in it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from interlock.policy import Context, Facts, load_policy, load_policy_text, resolve

EXPLAIN = ["explain", "GlmMoeDsaForCausalLM", "--platform", "rocm", "--gfx", "gfx950"]


def policy_command() -> list[str]:
    script = shutil.which("policy", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "interlock.cli"]


def wall(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """``(wall, cpu)`` seconds of one run; cpu is the child's user + system time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr.decode()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


BASELINE = "baseline: "


def startup(runs: int, baseline: Path | None = None) -> list[tuple[str, float, float]]:
    """Start-up rows; with ``baseline`` (a venv holding another interlock, e.g. an earlier
    revision) its bare interpreter and warm explain run in the same rounds."""
    work = Path(tempfile.mkdtemp(prefix="bench-policy-"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    warm_env = {**env, "INTERLOCK_CACHE_DIR": str(work / "warm-cache")}
    explain = [*policy_command(), *EXPLAIN]
    cases = {
        "python -c pass": ([sys.executable, "-c", "pass"], None),
        "python -c 'import pydantic, yaml, pluggy'": (
            [sys.executable, "-c", "import pydantic, yaml, pluggy"],
            None,
        ),
        "policy explain (cold policy cache)": (explain, "cold"),
        "policy explain (warm policy cache)": (explain, warm_env),
    }
    if baseline is not None:
        python = str(baseline / "bin" / "python")
        cases[f"{BASELINE}python -c pass"] = ([python, "-c", "pass"], None)
        cases[f"{BASELINE}policy explain (warm policy cache)"] = (
            [str(baseline / "bin" / "policy"), *EXPLAIN],
            {**env, "INTERLOCK_CACHE_DIR": str(work / "baseline-cache")},
        )
    for cmd, how in cases.values():  # warm bytecode and the policy cache
        wall(cmd, warm_env if how in (None, "cold") else how)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    order = list(cases)
    shuffle = random.Random(0).shuffle
    for i in range(runs):
        # A fresh order each round: a command run right after a cold one (which parses YAML
        # and writes the cache) finds the CPU's caches cold, and would always pay for it.
        shuffle(order)
        for name in order:
            cmd, how = cases[name]
            if how == "cold":
                run_env = {**env, "INTERLOCK_CACHE_DIR": str(work / f"cold-{i}")}
            else:
                run_env = how or env
            times[name].append(wall(cmd, run_env))
    shutil.rmtree(work, ignore_errors=True)
    return [
        (name, statistics.median(w for w, _ in t), statistics.median(c for _, c in t))
        for name, t in times.items()
    ]


def per_call(fn, n: int) -> tuple[float, float]:
    """Seconds per call, ``(wall, cpu)``: medians over 5 batches. CPU time is what the code
    costs; wall time also counts waiting for a core on a shared machine."""
    walls, cpus = [], []
    for _ in range(5):
        wall0, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            fn()
        walls.append((time.perf_counter() - wall0) / n)
        cpus.append((time.process_time() - cpu0) / n)
    return statistics.median(walls), statistics.median(cpus)


def shipped_resolution() -> list[tuple[str, float]]:
    policy = load_policy(use_cache=False)
    ctx = Context("GlmMoeDsaForCausalLM", "rocm", "gfx950")
    resolve(policy, ctx)
    same = per_call(lambda: resolve(policy, ctx), 200_000)
    equal = per_call(
        lambda: resolve(policy, Context("GlmMoeDsaForCausalLM", "rocm", "gfx950")), 50_000
    )

    def cold() -> None:
        policy.memo.clear()
        resolve(policy, ctx).trace  # noqa: B018 - building the full trace is the point

    return [
        ("warm resolve, memo hit (same Context object)", same),
        ("warm resolve incl. building an equal Context", equal),
        (
            f"cold resolve + full trace, shipped policy ({len(policy.rules)} rules)",
            per_call(cold, 5_000),
        ),
    ]


def synthetic_policy(n_rules: int, seed: int = 0):
    """``n_rules`` rules over 2,000 architectures: literal names, globs, platform-only and
    trait-only rules (the last two are candidates for every context)."""
    rng = random.Random(seed)
    archs = [f"Fam{i // 20}Model{i}ForCausalLM" for i in range(2000)]
    catalog = {
        a: {"moe": rng.random() < 0.5, "attention": rng.choice(["gqa", "mla", "dsa"])}
        for a in archs
    }
    rules = []
    for i in range(n_rules):
        kind = rng.random()
        if kind < 0.7:
            when = {"architecture": rng.sample(archs, rng.randint(1, 3))}
        elif kind < 0.8:
            when = {
                "architecture": f"Fam{rng.randrange(100)}*",
                "platform": rng.choice(["cuda", "rocm"]),
            }
        elif kind < 0.9:
            when = {"platform": rng.choice(["cuda", "rocm", "xpu"]), "device_arch": "gfx9*"}
        else:
            when = {
                "attention": rng.choice(["mla", "dsa"]),
                "features": {"tensor_parallel_size": {"gt": rng.randint(1, 8)}},
            }
        field, value = rng.choice(
            [
                ("runner", "mrv1"),
                ("runner", "mrv2"),
                ("breakable", True),
                ("breakable", False),
                ("cudagraph", "piecewise"),
            ]
        )
        rules.append({"id": f"r{i}", "when": when, "set": {field: value}, "reason": "synthetic"})
    doc = {
        "schema_version": 1,
        "version": "synthetic",
        "catalog": catalog,
        "defaults": {
            "runner": "mrv2",
            "cudagraph": "full_and_piecewise",
            "breakable": False,
            "compile": True,
        },
        "rules": rules,
    }
    return load_policy_text(json.dumps(doc), "synthetic.yaml"), archs


def synthetic_resolution(n_rules: int) -> list[tuple[str, float]]:
    wall0, cpu0 = time.perf_counter(), time.process_time()
    policy, archs = synthetic_policy(n_rules)
    load_s = (time.perf_counter() - wall0, time.process_time() - cpu0)
    rng = random.Random(1)
    contexts = [
        Context(
            rng.choice(archs),
            rng.choice(["cuda", "rocm"]),
            "gfx950",
            features={"tensor_parallel_size": 8},
        )
        for _ in range(400)
    ]
    it = iter(contexts * 1000)

    def cold() -> None:
        # A context never seen: memo and the index's candidate cache both miss.
        policy.memo.clear()
        policy.index.clear_cache()
        resolve(policy, next(it))

    def cold_trace() -> None:
        policy.memo.clear()
        policy.index.clear_cache()
        resolve(policy, next(it)).trace  # noqa: B018

    facts = [
        Facts(
            c.architecture,
            c.platform,
            c.device_arch,
            policy.catalog[c.architecture].traits,
            c.features,
        )
        for c in contexts
    ]
    each_facts = iter(facts * 1000)

    def scan() -> None:
        f = next(each_facts)
        for rule in policy.rules:
            rule.when.matches(f)

    return [
        (f"load + validate {n_rules} rules (YAML, pydantic, index; once)", load_s),
        (f"cold resolve, {n_rules} rules (indexed; decision + provenance)", per_call(cold, 50)),
        (
            f"cold resolve, {n_rules} rules, with the full {n_rules}-step trace",
            per_call(cold_trace, 10),
        ),
        (f"for comparison: matching all {n_rules} rules (no index)", per_call(scan, 20)),
    ]


def fmt(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.2f} µs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21, help="start-up rounds (default 21)")
    parser.add_argument("--rules", type=int, default=10_000, help="synthetic rules (default 10000)")
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="VENV",
        help="a venv with another interlock installed (an earlier revision): its bare "
        "interpreter and warm explain are timed in the same rounds, for a regression check",
    )
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}")
    print(f"\n## start-up, median of {args.runs} interleaved runs\n")
    rows = startup(args.runs, args.baseline)
    print("| command | wall | × bare | CPU | × bare |")
    print("|---|---:|---:|---:|---:|")
    # Each row against the bare interpreter of its own venv.
    bare = {
        False: rows[0],
        True: next((r for r in rows if r[0] == f"{BASELINE}python -c pass"), rows[0]),
    }
    for name, wall_s, cpu_s in rows:
        _, bare_wall, bare_cpu = bare[name.startswith(BASELINE)]
        print(
            f"| {name} | {fmt(wall_s)} | {wall_s / bare_wall:.1f}× "
            f"| {fmt(cpu_s)} | {cpu_s / bare_cpu:.1f}× |"
        )
    if args.baseline is not None:
        by_name = {name: (wall_s, cpu_s) for name, wall_s, cpu_s in rows}
        this = by_name["policy explain (warm policy cache)"]
        before = by_name[f"{BASELINE}policy explain (warm policy cache)"]
        over = [
            fmt(t[i] - b[i])
            for t, b in ((this, bare[False][1:]), (before, bare[True][1:]))
            for i in (0, 1)
        ]
        print(
            f"\nwarm explain, this tree against the baseline: {this[0] / before[0]:.2f}× the wall "
            f"time, {this[1] / before[1]:.2f}× the CPU time; above its own bare interpreter: "
            f"{over[0]} wall / {over[1]} CPU against {over[2]} / {over[3]}"
        )
    print("\n## resolution (in process, median of 5 batches)\n")
    print("| what | wall per call | CPU per call |")
    print("|---|---:|---:|")
    for name, (wall_s, cpu_s) in [*shipped_resolution(), *synthetic_resolution(args.rules)]:
        print(f"| {name} | {fmt(wall_s)} | {fmt(cpu_s)} |")


if __name__ == "__main__":
    main()
