"""Medians with percentile-bootstrap confidence intervals, 2^k factorial effects, and the
fastest configuration's lead.

Samples come as a table ``[configurations, blocks]``: block ``b`` ran every
configuration once, interleaved (see :mod:`interlock.measure.design`). The
bootstrap resamples whole blocks, the same ones for every configuration, so a
slow moment of the machine that hit every arm of one block stays paired
instead of widening every interval.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 2000
#: Below this many trials (blocks) no difference is called significant: a percentile
#: bootstrap over 3 blocks has a handful of distinct resamples, and its interval is far
#: narrower than the spread the next run shows (a -2.16 ms "significant" effect at 3 trials
#: flipped sign in the next run). The intervals are reported as computed; only the claim is
#: withheld (``significant`` false, ``claimable`` false in the analysis).
MIN_TRIALS = 5


@dataclass(frozen=True)
class Estimate:
    """A point estimate and its confidence interval."""

    value: float
    low: float
    high: float
    #: Enough trials to call a difference significant (see :data:`MIN_TRIALS`).
    claimable: bool = True

    @property
    def significant(self) -> bool:
        """The interval excludes 0, from enough trials to say so."""
        return self.claimable and (self.low > 0 or self.high < 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "value": round(self.value, 4),
            "low": round(self.low, 4),
            "high": round(self.high, 4),
            "significant": self.significant,
        }


@dataclass(frozen=True)
class Effect:
    """The effect of a set of two-level factors: for one factor, the mean change from its
    first level to its second over the other factors' levels; for several, the difference
    of those differences (0 when the factors add up)."""

    factors: tuple[str, ...]
    levels: tuple[tuple[Any, Any], ...]
    estimate: Estimate


def interval(
    draws: np.ndarray, value: float, confidence: float = CONFIDENCE, *, trials: int | None = None
) -> Estimate:
    """``value`` with the percentile interval of its bootstrap ``draws``, from ``trials``
    blocks (None: not known, the claim is not withheld)."""
    tail = 50 * (1 - confidence)
    low, high = np.percentile(draws, [tail, 100 - tail])
    claimable = trials is None or trials >= MIN_TRIALS
    return Estimate(float(value), float(low), float(high), claimable)


def resample_medians(
    table: np.ndarray, rng: np.random.Generator, resamples: int = RESAMPLES
) -> np.ndarray:
    """``[resamples, configurations]`` medians of block-resampled ``table``
    (``[configurations, blocks]``)."""
    blocks = table.shape[1]
    picks = rng.integers(0, blocks, size=(resamples, blocks))
    return np.median(table[:, picks], axis=2).T


def median_interval(
    samples: Sequence[float], rng: np.random.Generator, resamples: int = RESAMPLES
) -> Estimate:
    """The median of ``samples`` with its bootstrap interval."""
    table = np.asarray(samples, dtype=float)[None, :]
    draws = resample_medians(table, rng, resamples)[:, 0]
    return interval(draws, float(np.median(table)))


def factorial_effects(
    factors: Sequence[tuple[str, Sequence[Any]]],
    medians: np.ndarray,
    draws: np.ndarray,
    trials: int | None = None,
) -> list[Effect]:
    """Every main effect and interaction of a complete 2^k design. ``factors`` are (name,
    (first level, second level)) in the order the configurations enumerate them (the
    last factor varies fastest); ``medians`` ``[configurations]`` and ``draws``
    ``[resamples, configurations]`` are in that order too."""
    k = len(factors)
    # signs[c, i]: -1 where configuration c has factor i's first level, +1 for its second.
    signs = np.array(list(itertools.product((-1.0, 1.0), repeat=k)))
    effects = []
    for size in range(1, k + 1):
        for subset in itertools.combinations(range(k), size):
            weights = np.prod(signs[:, list(subset)], axis=1) * 2.0 ** (size - k)
            effects.append(
                Effect(
                    tuple(factors[i][0] for i in subset),
                    tuple(tuple(factors[i][1]) for i in subset),
                    interval(draws @ weights, float(medians @ weights), trials=trials),
                )
            )
    return effects


def lead(
    medians: np.ndarray, draws: np.ndarray, trials: int | None = None
) -> tuple[int, int, Estimate] | None:
    """``(fastest, runner-up, lead)``: the configuration with the lowest median, the next
    one, and how much slower the runner-up is (significant when its interval excludes 0).
    None with fewer than two configurations."""
    if len(medians) < 2:
        return None
    order = np.argsort(medians, kind="stable")
    best, second = int(order[0]), int(order[1])
    gap = draws[:, second] - draws[:, best]
    return best, second, interval(gap, float(medians[second] - medians[best]), trials=trials)
