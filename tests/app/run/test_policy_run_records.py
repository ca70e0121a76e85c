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
