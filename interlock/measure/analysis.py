"""The analysis of a measurement record's samples: per configuration medians with bootstrap
intervals, the 2^k effects, the fastest configuration and its lead, and the policy's pick
against the fastest alternative (all per batch size)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from interlock.measure.stats import (
    CONFIDENCE,
    MIN_TRIALS,
    RESAMPLES,
    factorial_effects,
    interval,
    lead,
    resample_medians,
)

#: Metrics summarised per configuration; lower is better for the first two.
METRICS = ("tpot_ms", "ttft_ms", "throughput_tok_s")
#: Metrics the effects are computed for.
EFFECT_METRICS = ("tpot_ms", "ttft_ms")
#: The metric that names the fastest configuration.
SPEED_METRIC = "tpot_ms"


def analyse(
    samples: Sequence[Mapping[str, Any]],
    config_ids: Sequence[str],
    factors: Mapping[str, Sequence[Any]],
    batch_sizes: Sequence[int],
    *,
    complete: bool,
    seed: int,
    pick: str | None = None,
) -> dict[str, Any]:
    """The ``analysis`` of a record. ``complete``: every combination of the factors ran, so
    with two levels each the effects are defined. ``pick``: the configuration the policy
    decides here (see :mod:`interlock.measure.pick`), compared with the alternatives."""
    two_level = bool(factors) and all(len(levels) == 2 for levels in factors.values())
    effects_note = None
    if not factors:
        effects_note = "no factor varied"
    elif not two_level:
        effects_note = "effects need two levels per factor (a 2^k design)"
    elif not complete:
        effects_note = "some combinations were skipped, so the design is not a complete 2^k"
    rng = np.random.default_rng(seed)
    per_batch: dict[str, Any] = {}
    trials = 0
    for batch_size in batch_sizes:
        tables = {m: _table(samples, config_ids, batch_size, m) for m in METRICS}
        draws = {m: resample_medians(t, rng, RESAMPLES) for m, t in tables.items()}
        medians = {m: np.median(t, axis=1) for m, t in tables.items()}
        trials = tables[SPEED_METRIC].shape[1]
        configurations = {
            cid: {m: interval(draws[m][:, i], float(medians[m][i])).to_dict() for m in METRICS}
            for i, cid in enumerate(config_ids)
        }
        entry: dict[str, Any] = {"configurations": configurations}
        if effects_note is None:
            entry["effects"] = {
                m: [
                    {
                        "factors": list(e.factors),
                        "levels": [list(pair) for pair in e.levels],
                        **e.estimate.to_dict(),
                    }
                    for e in factorial_effects(
                        list(factors.items()), medians[m], draws[m], trials
                    )
                ]
                for m in EFFECT_METRICS
            }
        found = lead(medians[SPEED_METRIC], draws[SPEED_METRIC], trials)
        if found is not None:
            best, second, gap = found
            entry["fastest"] = {
                "config": config_ids[best],
                "runner_up": config_ids[second],
                "metric": SPEED_METRIC,
                "lead": gap.to_dict(),
            }
        elif config_ids:
            entry["fastest"] = {"config": config_ids[0], "runner_up": None, "metric": SPEED_METRIC}
        if pick is not None and len(config_ids) > 1:
            entry["pick"] = _pick(
                config_ids, config_ids.index(pick), medians[SPEED_METRIC], draws[SPEED_METRIC],
                trials,
            )
        per_batch[str(batch_size)] = entry
    return {
        "method": "median per configuration; percentile bootstrap over whole blocks "
        f"(the same blocks for every configuration), {RESAMPLES} resamples; no difference "
        f"is called significant from fewer than {MIN_TRIALS} trials",
        "confidence": CONFIDENCE,
        "resamples": RESAMPLES,
        "effects_note": effects_note,
        "trials": trials,
        "min_trials": MIN_TRIALS,
        "claims": trials >= MIN_TRIALS,
        "batch_sizes": per_batch,
    }


def _pick(
    config_ids: Sequence[str], pick: int, medians: np.ndarray, draws: np.ndarray, trials: int
) -> dict[str, Any]:
    """The pick against the fastest alternative that beats it significantly (its TPOT minus
    the alternative's, on the same bootstrap draws as every other interval), else against
    the fastest alternative."""
    margins = {
        j: interval(draws[:, pick] - draws[:, j], float(medians[pick] - medians[j]),
                    trials=trials)
        for j in range(len(config_ids)) if j != pick
    }
    faster = [j for j, m in margins.items() if m.significant and m.low > 0]
    alternative = min(faster or margins, key=lambda j: (medians[j], j))
    return {
        "config": config_ids[pick],
        "alternative": config_ids[alternative],
        "metric": SPEED_METRIC,
        "margin": margins[alternative].to_dict(),
        "beaten": bool(faster),
    }


def _table(
    samples: Sequence[Mapping[str, Any]], config_ids: Sequence[str], batch_size: int, metric: str
) -> np.ndarray:
    """``[configurations, blocks]`` of ``metric`` over the measured (not warm-up) samples."""
    rows: dict[str, dict[int, float]] = {cid: {} for cid in config_ids}
    for s in samples:
        if not s["warmup"] and s["batch_size"] == batch_size:
            rows[s["config"]][s["block"]] = s[metric]
    blocks = sorted(next(iter(rows.values())).keys()) if rows else []
    return np.array([[rows[cid][b] for b in blocks] for cid in config_ids], dtype=float)
