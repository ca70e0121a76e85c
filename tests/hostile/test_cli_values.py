"""Command-line values and error text, third hostile pass (issue 38): item 5 (a line break in
a model directory's name), ``--startup-timeout`` and ``--port`` out of range."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


def test_5_a_line_break_in_a_model_directory_cannot_print_a_line(
    cli: Any, tmp_path: Path
) -> None:
    model = tmp_path / "m\nengine: verified"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": -1,
    }))
    log = tmp_path / "log.jsonl"
    result = cli("run", "--model", model, "--decision-log", log)
    assert result.code == 4, result.err
    (error,) = [line for line in result.err.splitlines() if line.startswith("policy: error:")]
    assert "m\\nengine: verified" in error
    assert not any(line.startswith("engine: verified") for line in result.err.splitlines())
    shown = cli("log", log)
    assert shown.code == 0, shown.err
    assert not any(line.lstrip().startswith("engine: verified")
                   for line in shown.out.splitlines())


@pytest.mark.parametrize("value", ["nan", "-5", "inf", "0", "-inf"])
def test_startup_timeout_must_be_a_positive_finite_number(
    cli: Any, tmp_path: Path, value: str
) -> None:
    result = cli("measure", "--engine", "vllm", tmp_path, f"--startup-timeout={value}")
    assert result.code == 2, result.err
    assert "is not a positive number of seconds" in result.err


@pytest.mark.parametrize("value", ["70000", "0", "-1", "65536"])
def test_a_port_out_of_range_is_a_usage_error(cli: Any, tmp_path: Path, value: str) -> None:
    result = cli("measure", "--engine", "vllm", tmp_path, f"--port={value}")
    assert result.code == 2, result.err
    assert "is not a TCP port (1 to 65535)" in result.err
    assert "no free port" not in result.err


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_max_regression_must_be_a_finite_percentage(cli: Any, value: str) -> None:
    """NaN made every comparison false: a regression never failed the diff."""
    result = cli("diff", "a.yaml", "b.yaml", "--measure", f"--max-regression={value}")
    assert result.code == 2, result.err
    assert "is not a finite percentage >= 0" in result.err
