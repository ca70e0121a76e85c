"""Fixtures of the runners tests: tiny transformers checkpoints and a logits-recording runner."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from runner_fixtures import RecordingRunner, TinyModels


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Tiny models gain nothing from a second thread, and on a busy machine two threads
    mostly wait for each other."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("tiny-checkpoints"))


@pytest.fixture
def recording_runner() -> Callable[[], RecordingRunner]:
    return RecordingRunner
