"""Fixtures for the core tests: an isolated environment."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated(isolated_env: None) -> None:
    """Every core test: a private cache, none of the caller's settings."""
