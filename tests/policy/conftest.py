"""Fixtures for the policy tests: an isolated environment, the shipped policy."""

from __future__ import annotations

import pytest

from interlock.policy import Policy, load_policy


@pytest.fixture(autouse=True)
def _isolated(isolated_env: None) -> None:
    """Every policy test: a private cache, none of the caller's settings."""


@pytest.fixture(scope="session")
def shipped() -> Policy:
    return load_policy(use_cache=False)
