"""Decision records: the fields (validated against schemas/decision-record.schema.json), atomic
appends from many processes, the file's mode, no prompts unless asked, and `policy log`."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from interlock import decision_log
from interlock.core.env import DECISION_LOG
from interlock.core.errors import InputError

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "schemas" / "decision-record.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def lines_of(path: Path) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for record in records:
        VALIDATOR.validate(record)
    return records


def test_the_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_explain_and_resolve_records_hold_every_field(
    cli: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    log = tmp_path / "decisions.jsonl"
    result = cli("explain", "GlmMoeDsaForCausalLM", "--platform", "cuda", "--device-arch",
                 "sm_90", "--feature", "tensor_parallel_size=8", "--decision-log", str(log))
    assert result.code == 0, result.err
    monkeypatch.setenv(DECISION_LOG.name, str(log))
    assert cli("resolve", "HYV4MTPModel", "--platform", "cuda", "--set", "runner=mrv1").code == 0
    first, second = lines_of(log)
    assert first["command"] == "policy explain" and second["command"] == "policy resolve"
    assert len({first["id"], second["id"]}) == 2
    assert first["time"].endswith("Z") and first["host"] and first["pid"] == os.getpid()
    # The policy: its files with their hashes, version and revision.
    (policy_file,) = first["policy"]["files"]
    assert policy_file["path"] == "policies.yaml" and len(policy_file["sha256"]) == 64
    assert first["policy"]["version"] == "vllm-0.33.0..0.34.0" and first["policy"]["revision"]
    # The whole context with each fact's source.
    ctx = first["context"]
    assert (ctx["architecture"], ctx["platform"], ctx["device_arch"]) == (
        "GlmMoeDsaForCausalLM", "cuda", "sm_90")
    assert ctx["features"]["tensor_parallel_size"] == 8
    assert ctx["sources"]["features.has_triton"].startswith("assumed")
    attention = ctx["resolved_traits"]["attention"]
    assert (attention["value"], attention["origin"]) == ("dsa", "catalog")
    # Per-field provenance: the rule id, its file:line and ref.
    breakable = first["provenance"]["breakable"]
    assert (breakable["stage"], breakable["source"], breakable["file"]) == (
        "rules", "breakable-dsa", "policies.yaml")
    assert breakable["line"] > 0 and breakable["ref"].startswith("https://")
    assert first["decision"]["breakable"] is True and first["decision"]["compile"] is False
    assert first["runner"] == {"name": "mrv2", "plugin": "mrv2", "distribution": "interlock",
                               "version": first["runner"]["version"]}
    assert first["outcome"] is None and first["engine"] is None and "prompts" not in first
    # An override is recorded (a replay needs it), and the model's task.
    assert second["overrides"] == {"runner": "mrv1"}
    assert second["provenance"]["runner"]["stage"] == "overrides"
    assert second["deviations"] == [] and second["refusal"] is None
    assert (first["task"], second["task"]) == ("generate", "pooling")
    assert second["decision"]["cudagraph"] == "piecewise"
    assert second["provenance"]["cudagraph"]["source"] == "pooling-piecewise-graphs"


def test_a_refused_context_is_recorded_with_its_rule(cli: Any, tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    result = cli("explain", "Step5ForCausalLM", "--platform", "cuda", "--device-arch", "sm_90",
                 "--env", "VLLM_USE_V2_MODEL_RUNNER=0", "--decision-log", str(log))
    assert result.code == 5
    assert "REFUSED  by rule step5-refuses-mrv1" in result.out
    assert "refused by rule step5-refuses-mrv1 (policies.yaml:" in result.err
    (record,) = lines_of(log)
    jsonschema.validate(record, SCHEMA)
    assert record["refusal"]["rule"] == "step5-refuses-mrv1"
    assert record["refusal"]["message"] == "Model Runner V1 does not support: Step5"
    assert record["refusal"]["decided"]["runner"]["source"] == "VLLM_USE_V2_MODEL_RUNNER"


def test_a_new_log_is_created_0600_even_under_a_permissive_umask(tmp_path: Path) -> None:
    from interlock.policy.context import make_context
    from interlock.policy.loader import load_policy
    from interlock.policy.resolution import resolve

    resolution = resolve(load_policy(), make_context("LlamaForCausalLM", platform="cuda"))
    log = tmp_path / "new.jsonl"
    old = os.umask(0)
    try:
        decision_log.write(str(log), resolution, "policy resolve")
    finally:
        os.umask(old)
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


WRITER = """
import sys
from interlock import decision_log
from interlock.policy.context import make_context
from interlock.policy.loader import load_policy
from interlock.policy.resolution import resolve

policy = load_policy()
archs = ["LlamaForCausalLM", "GlmMoeDsaForCausalLM", "KimiK3ForConditionalGeneration"]
for i in range(50):
    context = make_context(archs[i % 3], platform=("cuda", "rocm")[i % 2],
                           features={"writer": int(sys.argv[2]), "n": i})
    decision_log.write(sys.argv[1], resolve(policy, context), "policy resolve",
                       model="m" * 2000)  # long lines: several pages each
"""


def test_concurrent_writers_append_whole_lines(tmp_path: Path) -> None:
    log = tmp_path / "shared.jsonl"
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(log), str(w)], cwd=REPO)
        for w in range(8)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0] * 8
    records = lines_of(log)
    assert len(records) == 400
    assert len({r["id"] for r in records}) == 400
    seen = {(r["context"]["features"]["writer"], r["context"]["features"]["n"]) for r in records}
    assert seen == {(w, n) for w in range(8) for n in range(50)}


def _run(cli: Any, log: Path, *extra: str) -> dict[str, Any]:
    result = cli("run", "--model", "demo", "--prompt-token-ids", "11,22,33", "--max-tokens", "3",
                 "--decision-log", str(log), *extra)
    assert result.code == 0, result.err
    return lines_of(log)[-1]


def test_a_run_records_its_outcome_and_no_prompt_unless_asked(cli: Any, tmp_path: Path) -> None:
    log = tmp_path / "runs.jsonl"
    record = _run(cli, log)
    assert record["command"] == "policy run" and record["model"] == "demo"
    outcome = record["outcome"]
    assert outcome["requests"] == 1 and outcome["output_tokens"] == 3
    assert outcome["ttft_ms"] > 0 and outcome["tpot_ms"] > 0
    assert outcome["graphs"]["captured_sizes"]
    assert record["runner"]["plugin"] == record["decision"]["runner"]
    assert "prompts" not in record and "11, 22, 33" not in log.read_text()
    assert "[11,22,33]" not in log.read_text()
    record = _run(cli, log, "--decision-log-prompts")
    assert record["prompts"] == [{"token_ids": [11, 22, 33], "truncated": False}]


def test_llm_appends_its_resolution(tmp_path: Path) -> None:
    from interlock.llm import LLM
    from interlock.runners.contract import Decision

    log = tmp_path / "llm.jsonl"
    llm = LLM("demo", decision_log=log, overrides={"cudagraph": "none"})
    llm.close()
    (record,) = lines_of(log)
    assert record["command"] == "LLM" and record["model"] == "demo"
    assert record["overrides"] == {"cudagraph": "none"}
    assert record["decision"] == llm.resolution.decision.to_dict()  # type: ignore[union-attr]
    with pytest.raises(InputError, match="decision_log="):
        LLM("demo", decision=Decision(runner="mrv1"), decision_log=log)


def _record(**context: Any) -> dict[str, Any]:
    from interlock.policy.context import make_context
    from interlock.policy.loader import load_policy
    from interlock.policy.resolution import resolve

    resolution = resolve(load_policy(), make_context(**context))
    return decision_log.build_record(resolution, "policy resolve")


def test_an_oversized_record_loses_its_prompts_then_is_refused(tmp_path: Path) -> None:
    record = _record(architecture="LlamaForCausalLM", platform="cuda")
    record["prompts"] = [{"text": "x" * decision_log.MAX_LINE_BYTES, "truncated": False}]
    line = decision_log.encode(record)
    assert b"prompts_dropped" in line and b"xxxx" not in line
    record.pop("prompts")
    record["model"] = "m" * decision_log.MAX_LINE_BYTES
    with pytest.raises(decision_log.DecisionLogError, match="line limit"):
        decision_log.append_record(tmp_path / "log.jsonl", record)
    assert not (tmp_path / "log.jsonl").exists() or (tmp_path / "log.jsonl").read_bytes() == b""


def test_a_log_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    record = _record(architecture="LlamaForCausalLM", platform="cuda")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target in (fifo, tmp_path):
        with pytest.raises(decision_log.DecisionLogError, match="not a regular file|cannot open"):
            decision_log.append_record(target, record)


def test_policy_log_lists_filters_and_skips_damage(cli: Any, tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    old = _record(architecture="LlamaForCausalLM", platform="cuda")
    old["time"] = "2020-01-01T00:00:00.000000Z"
    new = _record(architecture="GlmMoeDsaForCausalLM", platform="rocm", device_arch="gfx950")
    for record in (old, new):
        decision_log.append_record(log, record)
    with log.open("ab") as f:
        f.write(b'{"record": 1, "time": "2026-\n{"unfinished')
    result = cli("log", str(log))
    assert result.code == 0
    assert "LlamaForCausalLM on cuda" in result.out
    assert "GlmMoeDsaForCausalLM on rocm/gfx950  runner=mrv2" in result.out
    assert f"{log}:3: not JSON" in result.err and f"{log}:4: an unfinished line" in result.err
    result = cli("log", str(log), "--since", "2025-06-01", "--json")
    assert [r["context"]["architecture"] for r in result.json()["records"]] == [
        "GlmMoeDsaForCausalLM"]
    assert [s["line"] for s in result.json()["skipped"]] == [3, 4]
    result = cli("log", str(log), "--architecture", "LlamaForCausalLM", "--since", "100000d")
    assert "LlamaForCausalLM" in result.out and "Glm" not in result.out
    assert cli("log", str(log), "--since", "yesterday").code == 2
    assert cli("log", str(tmp_path / "absent.jsonl")).code == 1
