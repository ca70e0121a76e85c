"""``policy measure --engine interlock``: the cells of ``--vary runner=mrv1,mrv2`` as real
``policy serve`` children on SmolLM2, driven through ``--engine vllm``'s HTTP client; each
cell's startup line checked against its decision, nothing left running. And the flags that
only apply to the other engine refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def policy(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "interlock.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


@pytest.mark.slow
@pytest.mark.timeout(900)  # four server starts and loads on a busy 2-core machine
def test_bench_on_policy_serve_runs_each_cell_as_decided(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The capital of France is\nWater boils at\n")
    record = tmp_path / "record.json"
    result = policy("measure", "--engine", "interlock", "smollm2", "--vary", "runner=mrv1,mrv2",
                    "--trials", "2", "--warmup", "0", "--concurrency", "2",
                    "--requests-per-stream", "1", "--input-len", "8", "--output-len", "8",
                    "--accuracy-prompts", str(prompts), "--accuracy-tokens", "4",
                    "--startup-timeout", "300", "--record", str(record))
    assert result.returncode == 0, result.stderr
    data = json.loads(record.read_text())
    assert data["engine"]["name"] == "interlock"
    cells = {c["levels"]["runner"]: c for c in data["configurations"]}
    assert set(cells) == {"mrv1", "mrv2"}
    for runner, cell in cells.items():
        assert cell["verification"]["verified"] is True
        assert cell["verification"]["seen"]["runner"] == runner
        assert "--set" in cell["argv"] and f"runner={runner}" in cell["argv"]
    assert len([s for s in data["samples"] if not s["warmup"]]) == 4
    assert all(s["requests"] == 2 and s["throughput_tok_s"] > 0 for s in data["samples"])
    # Both runners answer greedily alike.
    assert data["accuracy"]["flagged"] == []


def test_vllm_flags_are_refused_on_the_interlock_engine() -> None:
    result = policy("measure", "--engine", "interlock", "smollm2", "--vary", "runner=mrv1,mrv2",
                    "--vllm-arg=--enforce-eager", timeout=120)
    assert result.returncode == 1
    assert "apply to --engine vllm" in result.stderr


def test_diff_measure_refuses_the_interlock_engine() -> None:
    result = policy("diff", "@shipped", "@shipped", "--measure", "--model", "demo",
                    "--engine", "interlock", timeout=120)
    assert result.returncode == 1
    assert "--engine interlock" in result.stderr
