"""bench/bench_runners.py plumbing on CPU (the figures themselves live in BENCHMARKS.md)."""

from __future__ import annotations

import json
import subprocess
import sys

from checkout import REPO
from tiny_models import TinyModels

from interlock.kernels.native import unavailable as native_unavailable

BENCH = REPO / "bench" / "bench_runners.py"
# What a float32 CPU run captures with: tapes of native kernels where they are built.
CPU_GRAPHS = "debug" if native_unavailable("cpu") else "native"


def test_every_runner_and_mode_is_measured_against_its_own_eager_run(graph_models: TinyModels):
    # The tiny checkpoint: this checks the output's shape, the figures come from the demo model.
    out = subprocess.run(
        [sys.executable, str(BENCH), "--model", str(graph_models.path("llama")), "--reps", "1",
         "--steps", "2", "--batch-sizes", "1", "--threads", "1", "--json"],
        capture_output=True, text=True, check=True, timeout=600,
    )
    result = json.loads(out.stdout)
    rows = result["rows"]
    assert {(r["runner"], r["mode"], r["breakable"]) for r in rows} == {
        (runner, mode, breakable)
        for runner in ("mrv1", "mrv2")
        for mode, breakable in (
            ("none", False), ("piecewise", False), ("full", False), ("full_decode_only", False),
            ("full_and_piecewise", False), ("piecewise", True), ("full", True),
        )
    }
    for row in rows:
        assert row["backend"] == ("none" if row["mode"] == "none" else CPU_GRAPHS)
        assert row["tpot_ms"] > 0 and row["vs_eager"] > 0
        if row["mode"] == "none":
            assert row["vs_eager"] == 1.0
    assert "gpu" not in result  # GPU figures only with a GPU
