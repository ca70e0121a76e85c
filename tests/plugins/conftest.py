"""Plugin tests: every test starts from a fresh registry and a private cache directory."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated(fresh_plugins: None) -> None:
    """Every plugin test: a fresh registry, none of the caller's plugin settings."""
