"""The factorial design and the order trials run in.

Trials run in blocks: each block runs every unit (a configuration at a batch
size) once, so whatever the machine does over time (other jobs, heat, caches)
spreads over all arms. The order inside the blocks follows the rows of a
balanced Latin square (Williams design) with the units randomly relabelled:
over a full square each unit runs in each position equally often, and (for an
even number of units) follows every other unit equally often, so neither
position nor the previous trial favours an arm.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence
from typing import Any


def combinations(factors: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination of the factors' levels, the last factor varying fastest."""
    names = list(factors)
    levels = itertools.product(*factors.values())
    return [dict(zip(names, values, strict=True)) for values in levels]


def williams_rows(n: int) -> list[list[int]]:
    """A balanced Latin square of ``n`` symbols: ``n`` rows for even ``n``, ``2n`` for odd."""
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    rows = [[(v + shift) % n for v in first] for shift in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    return rows


def block_order(units: int, blocks: int, seed: int) -> list[list[int]]:
    """``blocks`` permutations of ``range(units)``: the square's rows in turn (cycling),
    the units relabelled by a permutation drawn from ``seed``."""
    if units == 0:
        return [[] for _ in range(blocks)]
    labels = list(range(units))
    random.Random(seed).shuffle(labels)
    rows = williams_rows(units)
    return [[labels[v] for v in rows[b % len(rows)]] for b in range(blocks)]


def square_size(units: int) -> int:
    """Blocks in one full square: position balance holds for every multiple of it."""
    return units if units % 2 == 0 else 2 * units
