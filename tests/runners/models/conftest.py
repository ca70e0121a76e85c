"""Fixtures of the model-source tests: a private cache directory for the session."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch) -> None:
    """GGUF conversions of a test session go to one private cache directory, not the user's."""
    monkeypatch.setenv("INTERLOCK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
