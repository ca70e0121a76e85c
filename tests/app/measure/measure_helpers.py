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
    run: Callable[[], dict[str, Any]], acceptable: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """Run a bench and measure once more when the record is not ``acceptable`` (an effect
    with a true value of 0 whose 95 % interval misses 0, a known effect out of tolerance).
    A false alarm of one interval happens about once in 20 runs, and a busy machine can
    stretch one run's sleeps; twice in a row means the harness is wrong, and fails."""
    record = run()
    return record if acceptable(record) else run()
