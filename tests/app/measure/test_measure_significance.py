"""Issue 24 item 14 (the parts done): no difference is called significant from fewer than
``MIN_TRIALS`` trials (the claim is refused, the intervals are kept as computed), and the
plot marks each effect's significance with a legend, its SVG text drawn as text."""

from __future__ import annotations

import json

import numpy as np

from interlock.measure.stats import MIN_TRIALS, factorial_effects

ARGS = ("--load-format", "dummy", "--vary", "runner=fast,slow", "--prompt-len", "4",
        "--max-tokens", "3", "--warmup", "0")


def test_few_trials_make_no_claim_however_large_the_effect() -> None:
    medians = np.array([10.0, 40.0])
    draws = np.array([[10.0, 40.0], [10.5, 39.5], [9.5, 40.5]] * 10)
    factors = [("runner", ("fast", "slow"))]
    (few,) = factorial_effects(factors, medians, draws, trials=MIN_TRIALS - 1)
    (enough,) = factorial_effects(factors, medians, draws, trials=MIN_TRIALS)
    assert few.estimate.low > 0 and not few.estimate.significant
    assert enough.estimate.significant
    assert few.estimate.to_dict()["significant"] is False


def test_bench_with_three_trials_refuses_the_claim(cli, shared_tiny_model, tmp_path) -> None:
    plot, record = tmp_path / "few.svg", tmp_path / "few.json"
    res = cli("measure", shared_tiny_model, *ARGS, "--trials", "3", "--plot", plot,
              "--record", record)
    assert res.code == 0, res.err
    assert f"(no claim: fewer than {MIN_TRIALS} trials)" in res.out
    assert f"significance: not claimed, 3 trials per configuration is fewer than {MIN_TRIALS}"\
        in res.out
    analysis = json.loads(record.read_text())["analysis"]
    assert analysis["claims"] is False and analysis["trials"] == 3
    assert analysis["min_trials"] == MIN_TRIALS
    svg = plot.read_text()
    assert "<text" in svg  # text as text, not glyph paths
    assert f"n/a: fewer than {MIN_TRIALS} trials, no significance claimed" in svg


def test_bench_with_enough_trials_marks_significance(cli, shared_tiny_model, tmp_path) -> None:
    plot, record = tmp_path / "enough.svg", tmp_path / "enough.json"
    res = cli("measure", shared_tiny_model, *ARGS, "--trials", str(MIN_TRIALS), "--plot", plot,
              "--record", record)
    assert res.code == 0, res.err
    assert "runner fast→slow: +" in res.out and "(significant)" in res.out
    assert json.loads(record.read_text())["analysis"]["claims"] is True
    svg = plot.read_text()
    assert "* significant: the 95% interval excludes 0" in svg
    assert ">*<" in svg  # the mark beside the runner effect's bar
