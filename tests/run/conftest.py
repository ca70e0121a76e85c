"""`policy run` tests: a tiny checkpoint (shared with the runners tests' builder) and a runner."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "runners"))
from runner_fixtures import TinyModels  # noqa: E402

from policy.cli import main  # noqa: E402


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str

    def json(self) -> dict:
        return json.loads(self.out)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama checkpoint with a word-level tokenizer (tokens t0 .. t127)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    models = TinyModels(tmp_path_factory.mktemp("run-checkpoints"))
    path = tmp_path_factory.mktemp("tiny-llama-with-tokenizer")
    shutil.copytree(models.path("llama"), path, dirs_exist_ok=True)
    tokenizer = Tokenizer(WordLevel({f"t{i}": i for i in range(128)}, unk_token="t0"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    tokenizer.save(str(path / "tokenizer.json"))
    return path


@pytest.fixture
def policy_run(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """``policy_run("--model", path, ...)``: `policy run` in-process, with its exit code and
    output."""

    def run(*args: str) -> Result:
        code = main(["run", *map(str, args)])
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run
