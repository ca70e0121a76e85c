"""Shared test configuration and the fixtures several areas use."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from checkout import PACKAGE_FOLDERS, REPO
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


#: What the wheel is built from: the package's folders, and the files beside them it needs.
WHEEL_SOURCES = (
    "pyproject.toml", "README.md", "policies.yaml", *PACKAGE_FOLDERS,
)


@pytest.fixture(scope="session")
def interlock_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel ``pip wheel --no-build-isolation`` builds from a copy of this checkout (the
    build writes build/ and *.egg-info beside its sources, so not into the checkout)."""
    import shutil
    import subprocess
    import sys

    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    src.mkdir()
    for name in WHEEL_SOURCES:
        path = REPO / name
        if path.is_dir() and not path.is_symlink():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so")
            shutil.copytree(path, src / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(work / "dist"), str(src)],
        capture_output=True, text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = (work / "dist").glob("interlock-*.whl")
    return wheel
