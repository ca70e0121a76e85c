"""Shared test configuration and the fixtures several areas use."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import settings

settings.register_profile("ci", max_examples=50, deadline=None)
settings.register_profile("dev", max_examples=25, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA/ROCm GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class CliResult(NamedTuple):
    """What one `policy` command left: exit code, stdout, stderr."""

    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """``cli("explain", "X", ...)``: the `policy` command run in-process."""
    from interlock.cli import main

    def run(*argv: object) -> CliResult:
        code = main([str(arg) for arg in argv])
        out, err = capsys.readouterr()
        return CliResult(code, out, err)

    return run


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str, str], Path]:
    """write(name, text) -> path of a file under tmp_path."""

    def _write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return _write
