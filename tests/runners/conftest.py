"""Fixtures of the runners tests: one torch thread, a logits-recording runner (the tiny
checkpoints are tests/tiny_models.py's)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tiny_models import RecordingRunner


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Every runner test on one torch thread."""


@pytest.fixture
def recording_runner() -> Callable[[], RecordingRunner]:
    return RecordingRunner
