"""Fixtures of the model-source tests: a private cache directory, one torch thread."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch) -> None:
    """GGUF conversions of a test session go to one private cache directory, not the user's."""
    monkeypatch.setenv("INTERLOCK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Small models gain nothing from a second thread on a busy two-core machine."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
