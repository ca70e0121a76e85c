"""Helpers of the bench tests: effects from a record, and measuring again after a false alarm."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def effect(record: dict[str, Any], *factors: str, metric: str = "tpot_ms") -> dict[str, Any]:
    """The effect of ``factors`` (a main effect, or their interaction) at batch size 1."""
    effects = record["analysis"]["batch_sizes"]["1"]["effects"][metric]
    return next(e for e in effects if e["factors"] == list(factors))


def contains_zero(estimate: dict[str, Any]) -> bool:
    return estimate["low"] <= 0 <= estimate["high"]


def bench_until(
    run: Callable[[], dict[str, Any]], null: Callable[[dict[str, Any]], list[dict[str, Any]]]
) -> dict[str, Any]:
    """Run a bench whose ``null`` estimates have a true value of 0; measure once more when
    one of their 95 % intervals misses 0. Such a false alarm happens about once in 20 runs
    per interval; twice in a row (about once in 400) means a real effect, and fails."""
    record = run()
    if all(contains_zero(e) for e in null(record)):
        return record
    return run()
