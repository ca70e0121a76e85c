"""Fixtures of the runners tests: tiny transformers checkpoints and a logits-recording runner."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from runner_fixtures import RecordingRunner, TinyModels


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("tiny-checkpoints"))


@pytest.fixture
def recording_runner() -> Callable[[], RecordingRunner]:
    return RecordingRunner
