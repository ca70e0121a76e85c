"""The metrics every CPU engine is measured by (interlock/app/timing.py), llama.cpp's
phase times mapped onto them (bench/bench_cpu_engines.py), and a clear reason when
llama.cpp is not there. No timing is asserted: the figures live in BENCHMARKS.md."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
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
sys.modules["bench_cpu_engines"] = bench  # its dataclasses look their module up
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
    (tmp_path / bench.LLAMA_ISA_FILE).write_text("avx2\n")
    result = bench.run_llama(ARGS, tmp_path / "m.gguf", 2)
    assert result["isa"] == "avx2"
    calls = log.read_text().splitlines()
    assert [c.split(" -c ")[1].split()[0] for c in calls] == ["95", "513", "944"]
    assert all("-t 2 " in c for c in calls)
    assert result["decode_ms"] == pytest.approx(2000.0 / 63)
    assert result["memory_mb"] == result["peak_rss_mb"] > 0


def test_goal_ratios_are_interlock_over_llama() -> None:
    table = {"interlock": {"decode_ms": 12.0, "prefill_ms": 1000.0,
                           "requests_tokens_per_s": 150.0, "memory_mb": 300.0,
                           "isa": "avx512"},
             "llama.cpp": {"decode_ms": 20.0, "prefill_ms": 4000.0,
                           "requests_tokens_per_s": 100.0, "memory_mb": 150.0,
                           "isa": "avx512"}}
    got, refused = bench.ratios(table)
    assert refused == []
    assert got["decode_time_vs_llama.cpp"] == pytest.approx(0.6)
    assert got["prefill_time_vs_llama.cpp"] == pytest.approx(0.25)
    assert got["requests_throughput_vs_llama.cpp"] == pytest.approx(1.5)
    assert got["memory_vs_llama.cpp"] == pytest.approx(2.0)
    alone, _ = bench.ratios({"interlock": table["interlock"]})
    assert alone["decode_time_vs_llama.cpp"] is None


def test_figures_of_two_instruction_sets_are_not_compared() -> None:
    """The 0.5x of issue 53: interlock on AVX-512 against an AVX2 llama.cpp. No ratio, and
    the reason; an ISA not known is refused alike."""
    table = {"interlock": {"decode_ms": 9.0, "isa": "avx512"},
             "llama.cpp": {"decode_ms": 17.0, "isa": "avx2"}}
    got, refused = bench.ratios(table)
    assert got["decode_time_vs_llama.cpp"] is None
    assert refused == ["interlock ran avx512, llama.cpp avx2: figures of two instruction "
                       "sets are not compared"]
    table["llama.cpp"]["isa"] = None
    got, refused = bench.ratios(table)
    assert got["decode_time_vs_llama.cpp"] is None
    assert "llama.cpp an unknown ISA" in refused[0]


def test_llama_cpp_isa_is_what_its_build_recorded(tmp_path: Path) -> None:
    """bench/build_llama_cpp.sh writes the ISA next to the tools; none, or anything else,
    is an unknown ISA (and so no ratio)."""
    binary = tmp_path / "llama-batched-bench"
    assert bench.llama_isa(binary) is None
    for isa in ("avx512", "avx2"):
        (tmp_path / bench.LLAMA_ISA_FILE).write_text(isa + "\n")
        assert bench.llama_isa(binary) == isa
    (tmp_path / bench.LLAMA_ISA_FILE).write_text("other\n")
    assert bench.llama_isa(binary) is None


def test_the_build_script_records_the_isa_it_builds() -> None:
    script = (REPO / "bench" / "build_llama_cpp.sh").read_text()
    assert "ISA=${ISA:-native}" in script and "-DGGML_NATIVE=ON" in script
    assert f'> "$SRC/build-$ISA/bin/{bench.LLAMA_ISA_FILE}"' in script


def test_the_medians_are_of_the_valid_reps_only() -> None:
    reps = [{"decode_ms": 10.0, "isa": "avx2"}, {"decode_ms": 12.0, "isa": "avx2"},
            {"invalid": "others took 1.2 of 2 cores", "isa": "avx2"}]
    row = bench.medians(reps)
    assert row["decode_ms"] == pytest.approx(11.0)
    assert (row["valid_reps"], row["reps"], row["isa"]) == (2, 3, "avx2")
    assert bench.medians(reps[2:])["decode_ms"] is None
    assert bench.medians([*reps, {"decode_ms": 9.0, "isa": "avx512"}])["isa"] is None


def test_decode_as_a_fraction_of_the_roofline() -> None:
    """100 MB a token at 20 GB/s is 5 ms; 10 ms per token is half the roofline."""
    table: dict = {"interlock": {"decode_ms": 10.0}, "llama.cpp": {"decode_ms": None}}
    bench.roofline(table, 100_000_000, 20.0)
    assert table["interlock"]["decode_of_roofline"] == pytest.approx(0.5)
    assert table["llama.cpp"]["decode_of_roofline"] is None
    bench.roofline(table, 100_000_000, None)  # no valid bandwidth probe: no fraction
    assert table["interlock"]["decode_of_roofline"] is None


def test_token_bytes_count_the_tied_head_once(tmp_path: Path) -> None:
    gguf_writer = pytest.importorskip("gguf").GGUFWriter
    import numpy as np

    def write(name: str, head: bool) -> Path:
        path = tmp_path / name
        writer = gguf_writer(str(path), "llama")
        writer.add_tensor("token_embd.weight", np.zeros((8, 16), dtype=np.float32))
        writer.add_tensor("blk.0.ffn_up.weight", np.zeros((4, 16), dtype=np.float32))
        if head:
            writer.add_tensor("output.weight", np.zeros((8, 16), dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path

    assert bench.token_bytes(write("tied.gguf", False)) == (8 + 4) * 16 * 4
    assert bench.token_bytes(write("untied.gguf", True)) == (4 + 8) * 16 * 4


# /proc/stat as the kernel writes it (ticks of 1 / CLK_TCK s): user nice system idle iowait
# irq softirq steal guest guest_nice, then a line per core.
def proc_stat(user: int, system: int, idle: int, steal: int = 0, cores: int = 2) -> str:
    lines = [f"cpu  {user} 0 {system} {idle} 0 0 0 {steal} 0 0"]
    lines += [f"cpu{i} 0 0 0 0 0 0 0 0 0 0" for i in range(cores)]
    return "\n".join(lines + ["intr 1 2 3", "ctxt 5", "procs_running 3"]) + "\n"


def readings(rows: list[tuple[float, int, int, int, float]], cores: int = 2
             ) -> list:
    """Samples from (seconds, every process's busy ticks, steal ticks, this bench's own
    ticks, load)."""
    tick = bench.CLK_TCK
    return [bench.Sample(t, bench.parse_proc_stat(proc_stat(busy, 0, 0, steal, cores)),
                         own / tick, load) for t, busy, steal, own, load in rows]


def test_proc_stat_is_read_in_seconds_and_cores() -> None:
    tick = bench.CLK_TCK
    got = bench.parse_proc_stat(proc_stat(3 * tick, tick, 10 * tick, steal=tick // 2,
                                          cores=4))
    assert (got.busy_s, got.steal_s, got.cores) == (pytest.approx(4.0), pytest.approx(0.5), 4)
    with pytest.raises(ValueError, match="no aggregate cpu line"):
        bench.parse_proc_stat("intr 1\n")
    parent, seconds = bench.parse_pid_stat(
        f"123 (a (tricky) name) R 7 123 123 0 -1 0 0 0 0 0 {2 * tick} {tick} 0 0 20 0 3 0")
    assert (parent, seconds) == (7, pytest.approx(3.0))


def test_a_rep_with_its_cores_free_is_valid() -> None:
    """1 thread on 2 cores, 2 s: the engine took a core, others half of the other one."""
    tick = bench.CLK_TCK
    rows = [(i * 0.5, int(i * 0.5 * 1.5 * tick), 0, int(i * 0.5 * tick), 0.9)
            for i in range(5)]
    got = bench.judge(readings(rows), threads=1)
    assert got["valid"] and got["why"] is None
    assert got["others_cores"] == pytest.approx(0.5, abs=0.02)
    assert got["own_cores"] == pytest.approx(1.0, abs=0.02)
    assert got["load"] == [0.9, 0.9]


def test_others_on_the_engines_cores_make_the_rep_invalid() -> None:
    """2 threads on 2 cores while another job takes a third of a core: no figure."""
    tick = bench.CLK_TCK
    rows = [(i * 0.5, int(i * 0.5 * 2.33 * tick), 0, int(i * 0.5 * 2 * tick), 1.8)
            for i in range(5)]
    got = bench.judge(readings(rows), threads=2)
    assert not got["valid"]
    assert "others took 0.33" in got["why"] and "leave 0.10" in got["why"]
    # the same others at 1 thread leave the engine its core
    assert bench.judge(readings(rows), threads=1)["valid"]


def test_steal_counts_against_the_engine() -> None:
    tick = bench.CLK_TCK
    rows = [(i * 0.5, int(i * 0.5 * 2 * tick), int(i * 0.5 * 0.3 * tick),
             int(i * 0.5 * 2 * tick), 2.0) for i in range(5)]
    got = bench.judge(readings(rows), threads=2)
    assert not got["valid"] and "steal 0.30" in got["why"]


def test_a_burst_in_one_window_is_enough_to_invalidate() -> None:
    """20 s at 2 threads, quiet but for one second in which others took a whole core: over
    the whole rep others averaged 0.05 cores, within what 2 threads leave, in that window 1."""
    tick = bench.CLK_TCK
    busy, rows = 0, []
    for i in range(41):
        t = i * 0.5
        rows.append((t, busy, 0, int(t * 2 * tick), 1.0))
        busy += int(0.5 * (3 if 6 <= i < 8 else 2) * tick)
    got = bench.judge(readings(rows), threads=2)
    assert got["others_cores"] == pytest.approx(0.05, abs=0.01)
    assert got["others_cores"] < got["allowed_cores"]
    assert not got["valid"] and "from 3.0 s into the rep" in got["why"]


def test_more_threads_than_cores_is_never_valid() -> None:
    rows = [(0.0, 0, 0, 0, 0.0), (1.0, 0, 0, 0, 0.0)]
    got = bench.judge(readings(rows), threads=4)
    assert not got["valid"] and got["why"] == "4 threads on 2 cores"
    with pytest.raises(ValueError, match="two readings"):
        bench.judge(readings(rows[:1]), threads=1)


def test_a_watched_rep_reads_proc() -> None:
    """The real /proc: a rep of a few readings, judged (what it finds depends on the
    machine's load, so only its shape is asserted)."""
    with bench.CpuWatch(1) as watch:
        sum(range(200_000))
    got = watch.verdict()
    assert len(watch.samples) >= 2 and got["cores"] >= 1
    assert isinstance(got["valid"], bool) and got["own_cores"] >= 0


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


def test_an_invalid_rep_keeps_no_figure(monkeypatch) -> None:
    """run_rep drops every figure of a rep its watch judged invalid, and keeps the mark,
    why, the CPU readings and the ISA."""
    verdict = {"valid": False, "why": "others took 1.50 and steal 0.00 of 2 cores",
               "others_cores": 1.5, "steal_cores": 0.0, "own_cores": 0.5, "load": [7.0, 8.0]}

    class Watch:
        def __init__(self, threads: int) -> None:
            self.threads = threads

        def __enter__(self) -> Watch:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def verdict(self) -> dict:
            return dict(verdict)

    monkeypatch.setattr(bench, "CpuWatch", Watch)
    figures = {"decode_ms": 9.0, "prefill_ms": 900.0, "isa": "avx512"}
    got = bench.run_rep("interlock", 2, lambda: dict(figures), None)
    assert got == {"invalid": verdict["why"], "cpu": verdict, "isa": "avx512"}
    assert "INVALID (others took 1.50" in bench.describe_rep(got, bench.KEYS)
    verdict.update(valid=True, why=None)
    kept = bench.run_rep("llama.cpp", 2, lambda: {"decode_ms": 9.0}, "avx2")
    assert kept["decode_ms"] == 9.0 and kept["isa"] == "avx2" and kept["cpu"]["valid"]
    assert bench.run_rep("llama.cpp", 2, lambda: "not built", None) == "not built"
