"""How long `policy table`, `policy check` and `policy diff` take on a 200-rule policy whose
rules make distinctions on features, config values, model names and engine versions.

Run from the repository root:  .venv/bin/python bench/bench_enumeration.py [--rules 200]

The policy (written to a temporary folder, and printed with --print) has a catalog of 20
architectures; its rules cycle through five shapes: a feature threshold for one
architecture, a config threshold for one architecture, a feature value for every
architecture, a config value for every architecture, and a device arch with a model glob
and an engine range for one architecture. Each command runs once, end to end; the diff
compares the policy with itself minus its last rule. Before issue 38 the enumeration was
the product of every key's values: 20 rules with one config condition each never finished.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARCHS = [f"Arch{i:02d}ForCausalLM" for i in range(20)]


def policy_text(rules: int) -> str:
    lines = ['schema_version: 1', 'version: "enumeration-bench"', "catalog:"]
    lines += [f"  {a}: {{moe: {str(i % 2 == 0).lower()}, attention: gqa}}"
              for i, a in enumerate(ARCHS)]
    lines += ["defaults: {runner: mrv2, cudagraph: full_and_piecewise, breakable: false, "
              "compile: true}", "rules:"]
    modes = ("piecewise", "full", "none", "full_decode_only", "full_and_piecewise")
    for i in range(rules):
        arch = ARCHS[i % len(ARCHS)]
        shape = i % 5
        if shape == 0:
            when = f"{{architecture: {arch}, features: {{f{i % 16}: {{gt: {i % 4}}}}}}}"
        elif shape == 1:
            when = f'{{architecture: {arch}, config: {{"k{i % 40}": {{ge: {i}}}}}}}'
        elif shape == 2:
            when = f"{{features: {{g{i % 16}: {i % 3}}}}}"
        elif shape == 3:
            when = f'{{config: {{"p{i % 20}.q": v{i % 3}}}}}'
        else:
            when = (f'{{architecture: {arch}, device_arch: sm_{80 + i % 10}, model: "m{i}*", '
                    f'engine: {{vllm: ">=0.{i % 40}"}}}}')
        lines += [f"  - id: rule-{i}", f"    when: {when}",
                  f"    set: {{cudagraph: {modes[i % len(modes)]}}}",
                  f"    reason: generated rule {i} of the enumeration benchmark, shape {shape}"]
    return "\n".join(lines) + "\n"


def timed(cmd: list[str], limit: float) -> str:
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, timeout=limit, check=False)
    except subprocess.TimeoutExpired:
        return f"> {limit:g} s (stopped)"
    elapsed = time.perf_counter() - start
    return f"{elapsed:.2f} s (exit {done.returncode})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rules", type=int, default=200)
    parser.add_argument("--limit", type=float, default=300.0, help="seconds per command")
    parser.add_argument("--print", action="store_true", help="print the policy and stop")
    args = parser.parse_args()
    if args.print:
        sys.stdout.write(policy_text(args.rules))
        return
    script = shutil.which("policy", path=str(Path(sys.executable).parent))
    policy = [script] if script else [sys.executable, "-m", "interlock.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        full, less = Path(tmp) / "rules.yaml", Path(tmp) / "less.yaml"
        full.write_text(policy_text(args.rules))
        less.write_text(policy_text(args.rules - 1))
        cases = {
            "policy table": [*policy, "table", "--policy", str(full), "--platform", "cuda"],
            "policy check": [*policy, "check", "--policy", str(full)],
            "policy diff": [*policy, "diff", str(less), str(full)],
        }
        for name, cmd in cases.items():
            print(f"{name} ({args.rules} rules): {timed(cmd, args.limit)}", flush=True)


if __name__ == "__main__":
    main()
