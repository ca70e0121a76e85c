"""`policy run` tests: a tiny checkpoint (shared with the runners tests' builder) and a runner."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tiny_models import TinyModels


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory, tiny_models: TinyModels) -> Path:
    """A tiny Llama checkpoint with a word-level tokenizer (tokens t0 .. t127)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    path = tmp_path_factory.mktemp("tiny-llama-with-tokenizer")
    shutil.copytree(tiny_models.path("llama"), path, dirs_exist_ok=True)
    tokenizer = Tokenizer(WordLevel({f"t{i}": i for i in range(128)}, unk_token="t0"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    tokenizer.save(str(path / "tokenizer.json"))
    return path


@pytest.fixture
def policy_run(cli: Callable[..., Any]) -> Callable[..., Any]:
    """``policy_run("--model", path, ...)``: `policy run` in-process, with its exit code and
    output."""
    return lambda *args: cli("run", *args)
