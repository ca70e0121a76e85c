"""bench/bench_cpu_engines.py's llama.cpp side: found through LLAMA_BENCH, its JSON read,
and a clear reason when it is not there (the figures live in BENCHMARKS.md)."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest
from checkout import REPO

spec = importlib.util.spec_from_file_location("bench_cpu_engines",
                                              REPO / "bench" / "bench_cpu_engines.py")
assert spec is not None and spec.loader is not None
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
ARGS = argparse.Namespace(threads=1, prefill=512, new_tokens=64)


def test_without_llama_bench_the_reason_is_given(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("LLAMA_BENCH", raising=False)
    assert bench.run_llama(ARGS, tmp_path / "m.gguf") == (
        "LLAMA_BENCH is not set (no llama-bench to run)")
    monkeypatch.setenv("LLAMA_BENCH", str(tmp_path / "missing"))
    assert "is not a file" in bench.run_llama(ARGS, tmp_path / "m.gguf")


def test_llama_bench_json_becomes_ms(monkeypatch, tmp_path: Path) -> None:
    """llama-bench -o json: one row per test, its tokens/s in avg_ts."""
    rows = [{"n_prompt": 512, "n_gen": 0, "avg_ts": 100.0},
            {"n_prompt": 0, "n_gen": 64, "avg_ts": 50.0}]
    fake = tmp_path / "llama-bench"
    fake.write_text(f"#!/bin/sh\necho '{json.dumps(rows)}'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("LLAMA_BENCH", str(fake))
    monkeypatch.delenv("LLAMA_BATCHED_BENCH", raising=False)
    result = bench.run_llama(ARGS, tmp_path / "m.gguf")
    assert result["prefill_ms"] == pytest.approx(5120.0)
    assert result["decode_ms"] == pytest.approx(20.0)
