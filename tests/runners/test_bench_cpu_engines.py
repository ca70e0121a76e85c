"""The metrics every CPU engine is measured by (interlock/app/timing.py), llama.cpp's
phase times mapped onto them (bench/bench_cpu_engines.py), and a clear reason when
llama.cpp is not there. No timing is asserted: the figures live in BENCHMARKS.md."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest
from checkout import REPO

from interlock.app.timing import (
    RequestTimes,
    batched_requests,
    decode_ms_per_token,
    mean_ttft_ms,
    output_tokens_per_s,
    prefill_tokens_per_s,
    rss_above_baseline_mb,
    tpot_s,
    ttft_s,
    wall_s,
)

spec = importlib.util.spec_from_file_location("bench_cpu_engines",
                                              REPO / "bench" / "bench_cpu_engines.py")
assert spec is not None and spec.loader is not None
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
ARGS = argparse.Namespace(model="smollm2")


def test_ttft_and_tpot_of_one_request() -> None:
    request = RequestTimes(arrival=1.0, first_token=1.25, finish=2.25, output_tokens=5,
                           prompt_tokens=100)
    assert ttft_s(request) == pytest.approx(0.25)
    assert tpot_s(request) == pytest.approx(0.25)  # 4 decode steps in 1 s
    assert prefill_tokens_per_s(request) == pytest.approx(400.0)


def test_one_token_has_no_decode_and_is_left_out_of_the_mean() -> None:
    one = RequestTimes(arrival=0.0, first_token=0.5, finish=0.5, output_tokens=1)
    two = RequestTimes(arrival=0.0, first_token=0.1, finish=0.13, output_tokens=2)
    assert tpot_s(one) is None
    assert decode_ms_per_token([one, two]) == pytest.approx(30.0)
    assert decode_ms_per_token([one]) is None
    assert mean_ttft_ms([one, two]) == pytest.approx(300.0)


def test_throughput_counts_the_prompts_time() -> None:
    """Output tokens over first arrival to last finish: the prefill is in the wall time."""
    requests = [RequestTimes(arrival=0.0, first_token=1.0, finish=2.0, output_tokens=10),
                RequestTimes(arrival=0.5, first_token=1.0, finish=3.0, output_tokens=20)]
    assert wall_s(requests) == pytest.approx(3.0)
    assert output_tokens_per_s(requests) == pytest.approx(10.0)
    with pytest.raises(ValueError, match="no requests"):
        output_tokens_per_s([])


def test_prefill_needs_the_prompt_length() -> None:
    with pytest.raises(ValueError, match="prompt's token count"):
        prefill_tokens_per_s(RequestTimes(0.0, 1.0, 1.0, 1))


def test_memory_is_above_the_baseline() -> None:
    assert rss_above_baseline_mb(600.0, 250.0) == 350.0


def test_batched_phases_become_requests_measured_alike() -> None:
    """16 prompts prefilled together in 2 s, then 27 decode steps in 5.4 s: 28 tokens each."""
    requests = batched_requests(16, 32, 27, prefill_s=2.0, decode_s=5.4)
    assert len(requests) == 16
    assert mean_ttft_ms(requests) == pytest.approx(2000.0)
    assert decode_ms_per_token(requests) == pytest.approx(200.0)
    assert output_tokens_per_s(requests) == pytest.approx(16 * 28 / 7.4)


def test_llama_batched_bench_rows_map_to_each_workload() -> None:
    rows = [{"pp": 32, "tg": 63, "pl": 1, "t_pp": 0.1, "t_tg": 1.26},
            {"pp": 512, "tg": 1, "pl": 1, "t_pp": 2.56, "t_tg": 0.02},
            {"pp": 32, "tg": 27, "pl": 16, "t_pp": 2.0, "t_tg": 5.4}]
    out = "build: ...\n" + "\n".join(json.dumps(r) for r in rows) + "\n"
    decode = bench.llama_requests(bench.batched_bench_row(out, bench.DECODE), bench.DECODE)
    prefill = bench.llama_requests(bench.batched_bench_row(out, bench.PREFILL), bench.PREFILL)
    many = bench.llama_requests(bench.batched_bench_row(out, bench.REQUESTS), bench.REQUESTS)
    got = bench.figures(decode, prefill, many)
    assert got["decode_ms"] == pytest.approx(20.0)  # 1.26 s / 63 steps
    assert got["ttft_32_ms"] == pytest.approx(100.0)
    assert got["prefill_ms"] == pytest.approx(2560.0)  # its one decode step left out
    assert got["prefill_tokens_per_s"] == pytest.approx(200.0)
    assert got["requests_tokens_per_s"] == pytest.approx(16 * 28 / 7.4)
    with pytest.raises(ValueError, match="no row for pp=32 tg=63 pl=1"):
        bench.batched_bench_row("{\"pp\": 32, \"tg\": 7, \"pl\": 1}\n", bench.DECODE)


def test_interlock_kv_cache_holds_the_16_requests_and_no_more() -> None:
    prompt, tokens, count = bench.REQUESTS
    assert bench.KV_BLOCKS * bench.BLOCK >= count * (prompt + tokens)
    assert (bench.KV_BLOCKS - count) * bench.BLOCK < count * (prompt + tokens)


def test_without_llama_batched_bench_the_reason_is_given(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("LLAMA_BATCHED_BENCH", raising=False)
    assert bench.run_llama(ARGS, tmp_path / "m.gguf", 1) == (
        "LLAMA_BATCHED_BENCH is not set (no llama-batched-bench to run)")
    monkeypatch.setenv("LLAMA_BATCHED_BENCH", str(tmp_path / "missing"))
    assert "is not a file" in bench.run_llama(ARGS, tmp_path / "m.gguf", 1)


def test_llama_runs_once_per_workload_with_its_context_sized(monkeypatch,
                                                             tmp_path: Path) -> None:
    """A stand-in llama-batched-bench that logs its arguments and prints the row asked."""
    log = tmp_path / "calls"
    fake = tmp_path / "llama-batched-bench"
    fake.write_text(
        "#!/usr/bin/env python3\nimport json, sys\n"
        f"open({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        "a = dict(zip(sys.argv[1::2], sys.argv[2::2]))\n"
        "print(json.dumps({'pp': int(a['-npp']), 'tg': int(a['-ntg']), 'pl': int(a['-npl']),"
        " 't_pp': 1.0, 't_tg': 2.0, 'flash_attn': -1}))\n")
    fake.chmod(0o755)
    monkeypatch.setenv("LLAMA_BATCHED_BENCH", str(fake))
    result = bench.run_llama(ARGS, tmp_path / "m.gguf", 2)
    calls = log.read_text().splitlines()
    assert [c.split(" -c ")[1].split()[0] for c in calls] == ["95", "513", "944"]
    assert all("-t 2 " in c for c in calls)
    assert result["decode_ms"] == pytest.approx(2000.0 / 63)
    assert result["memory_mb"] == result["peak_rss_mb"] > 0


def test_goal_ratios_are_interlock_over_llama() -> None:
    table = {"interlock": {"decode_ms": 12.0, "prefill_ms": 1000.0,
                           "requests_tokens_per_s": 150.0, "memory_mb": 300.0},
             "llama.cpp": {"decode_ms": 20.0, "prefill_ms": 4000.0,
                           "requests_tokens_per_s": 100.0, "memory_mb": 150.0}}
    got = bench.ratios(table)
    assert got["decode_time_vs_llama.cpp"] == pytest.approx(0.6)
    assert got["prefill_time_vs_llama.cpp"] == pytest.approx(0.25)
    assert got["requests_throughput_vs_llama.cpp"] == pytest.approx(1.5)
    assert got["memory_vs_llama.cpp"] == pytest.approx(2.0)
    assert bench.ratios({"interlock": table["interlock"]})["decode_time_vs_llama.cpp"] is None


def test_a_servers_memory_sums_its_process_tree() -> None:
    """A server's RSS is its process and its children's (vLLM runs its engine in a child)."""
    import os
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        def status_mb(pid: int) -> float:
            lines = Path(f"/proc/{pid}/status").read_text().splitlines()
            return next(int(x.split()[1]) for x in lines if x.startswith("VmRSS:")) / 1024

        alone = status_mb(os.getpid())
        assert bench.tree_rss_mb(child.pid) == pytest.approx(status_mb(child.pid), abs=1)
        assert bench.tree_rss_mb(os.getpid()) >= alone + status_mb(child.pid) - 1
    finally:
        child.communicate(b"")
