"""``policy serve``'s startup refusals, each before any model loads: a port in use, a bad
policy, a model name of no accepted form, a model without a tokenizer, more connections
than the process may open files for; each one line on
stderr with its documented exit code (docs/serve.md), no traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "interlock.cli", "serve", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_a_port_in_use_is_exit_1_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = serve("--model", "smollm2", "--port", str(port))
    assert result.returncode == 1, result.stderr
    assert f"--port {port}: 127.0.0.1:{port} is in use" in result.stderr
    assert "Traceback" not in result.stderr
    assert "policy serve: runner=" not in result.stderr  # refused before deciding


def test_a_bad_policy_is_exit_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema_version: 1\nversion: x\ndefaults: {runner: 7}\n")
    result = serve("--model", "smollm2", "--policy", str(bad), "--port", "0")
    assert result.returncode == 1, result.stderr
    assert "bad.yaml" in result.stderr and "Traceback" not in result.stderr


def test_an_unknown_model_is_exit_1() -> None:
    result = serve("--model", "no-such-model", "--port", "0")
    assert result.returncode == 1, result.stderr
    assert "no-such-model" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("args", [["--port", "70000"], ["--max-num-seqs", "0"]])
def test_bad_flags_are_usage_errors(args: list[str]) -> None:
    result = serve("--model", "smollm2", *args)
    assert result.returncode == 2, result.stderr


def test_the_demo_model_has_no_tokenizer_so_exit_4() -> None:
    result = serve("--model", "demo", "--port", "0")
    assert result.returncode == 4, result.stderr
    assert "tokenizer.json" in result.stderr and "Traceback" not in result.stderr


def test_more_connections_than_the_open_file_limit_is_exit_1() -> None:
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard limit on open files here")
    result = serve("--model", "smollm2", "--max-connections", str(hard), "--port", "0")
    assert result.returncode == 1, result.stderr
    assert f"--max-connections {hard}: needs" in result.stderr
    assert f"at most {hard} (ulimit -Hn)" in result.stderr and "Traceback" not in result.stderr
    assert "policy serve: runner=" not in result.stderr  # refused before deciding
