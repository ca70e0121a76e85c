"""`policy run --decision-log`: a text prompt reaches the record only when asked for (the
token-id prompts and the other fields: tests/app/test_decision_log.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def test_text_prompts_stay_out_of_the_record(cli: Any, tmp_path: Path, tiny_llama: Path) -> None:
    log = tmp_path / "runs.jsonl"
    args = ("run", "--model", str(tiny_llama), "--prompt", "t5 t6 zanzibar-secret",
            "--max-tokens", "2", "--decision-log", str(log))
    assert cli(*args).code == 0
    assert "zanzibar" not in log.read_text()
    assert cli(*args, "--decision-log-prompts").code == 0
    record = json.loads(log.read_text().splitlines()[-1])
    assert record["prompts"] == [{"text": "t5 t6 zanzibar-secret", "truncated": False}]


def test_a_run_resolves_its_model_once_and_records_once(
    cli: Any, tmp_path: Path, tiny_llama: Path, monkeypatch: Any,
) -> None:
    # The decision and the run read one resolution of --model (a named model's or a GGUF
    # file's is a conversion checked on disk), and the run's one record is written from one
    # place, whether it succeeds or fails.
    from interlock import decision_log
    from interlock.runners.model import checkpoint, sources

    resolved: list[str] = []
    written: list[str] = []
    real_resolve, real_write = sources.model_directory, decision_log.write

    def counted(model: Any) -> Any:
        resolved.append(str(model))
        return real_resolve(model)

    def recorded(path: Any, resolution: Any, command: str, **details: Any) -> None:
        written.append(command)
        real_write(path, resolution, command, **details)

    monkeypatch.setattr(sources, "model_directory", counted)
    monkeypatch.setattr(checkpoint, "model_directory", counted)
    monkeypatch.setattr(decision_log, "write", recorded)
    log = tmp_path / "runs.jsonl"
    args = ("run", "--model", str(tiny_llama), "--max-tokens", "2", "--decision-log", str(log))
    assert cli(*args).code == 0
    assert (resolved, written) == ([str(tiny_llama)], ["policy run"])
    resolved.clear()
    written.clear()
    # A run that fails once the model is loaded is recorded once too, with its error.
    from interlock.llm import LLM

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("the generation broke")

    monkeypatch.setattr(LLM, "generate", broken)
    assert cli(*args).code != 0
    assert (resolved, written) == ([str(tiny_llama)], ["policy run"])
    outcomes = [json.loads(line)["outcome"] for line in log.read_text().splitlines()]
    assert outcomes[0]["output_tokens"] == 2
    assert outcomes[1] == {"error": "RuntimeError", "message": "the generation broke"}
