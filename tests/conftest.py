"""Shared test configuration and the fixtures several areas use."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest
from checkout import REPO, WHEEL_SOURCES
from hypothesis import settings
from policy_texts import MINIMAL

from interlock.testing import register_plugin  # noqa: F401  (the fixture plugin authors use)

if TYPE_CHECKING:
    from tiny_models import TinyModels

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


@pytest.fixture
def isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A private cache directory, and none of the caller's policy, vLLM or colour settings."""
    monkeypatch.setenv("INTERLOCK_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("INTERLOCK_POLICY", "VLLM_USE_V2_MODEL_RUNNER", "VLLM_USE_BREAKABLE_CUDAGRAPH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_COLOR", "1")


@pytest.fixture
def fresh_plugins(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """A fresh plugin registry before and after the test, a private cache directory, none of
    the caller's plugin settings, and sys.path restored."""
    from interlock import plugins

    monkeypatch.setenv("INTERLOCK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    for name in (
        "INTERLOCK_DISABLE_PLUGINS",
        "INTERLOCK_PLUGINS_STRICT",
        "INTERLOCK_NO_PLUGIN_CACHE",
        "INTERLOCK_POLICY",
    ):
        monkeypatch.delenv(name, raising=False)
    path = list(sys.path)
    plugins.reset()
    yield
    sys.path[:] = path
    plugins.reset()


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Tiny models gain nothing from a second thread, and on a busy machine two threads
    mostly wait for each other."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    """Tiny transformers checkpoints of each family, built once a session on first use."""
    from tiny_models import TinyModels  # torch and transformers: only where a test needs them

    return TinyModels(tmp_path_factory.mktemp("tiny-checkpoints"))


@pytest.fixture
def tiny_model(tmp_path: Path) -> Path:
    """The tiny Llama checkpoint (tests/tiny_models.py), a fresh copy the test may damage."""
    from tiny_models import write_tiny_model

    return write_tiny_model(tmp_path / "tiny")


@pytest.fixture(scope="session")
def shared_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama checkpoint, one copy for the session: for tests that only read it."""
    from tiny_models import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("shared") / "tiny")


@pytest.fixture
def base() -> str:
    """A small complete policy: two catalog entries, one env binding, no rules."""
    return MINIMAL


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
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / name)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(work / "dist"), str(src)],
        capture_output=True, text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = (work / "dist").glob("interlock-*.whl")
    return wheel
