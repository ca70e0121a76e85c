"""The capture sizes a run can use: a run of token-id prompts never steps more tokens than
its prompts hold, so the larger sizes are not captured."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from interlock.app.outputs import Prompt
    from interlock.policy.trace import Step
    from interlock.runners.contract import Decision


def step_tokens(prompts: Sequence[Prompt]) -> int | None:
    """The most tokens one step of this run can hold (every prompt prefilled at once), when
    the prompts are token ids; None for text (its length is known only once tokenized)."""
    if any(isinstance(p, str) for p in prompts):
        return None
    return max(len(prompts), sum(len(p) for p in prompts))


def cap_capture_sizes(decision: Decision, steps: int) -> tuple[Decision, Step | None]:
    """Keep the sizes a step of this run can pad to: those up to ``steps`` and the next one
    (``decision.capture_sizes`` is set: the runner's automatic sizes are its own)."""
    from dataclasses import replace

    from interlock.policy.trace import Step

    assert decision.capture_sizes is not None
    sizes = sorted(decision.capture_sizes)
    kept = [s for s in sizes if s < steps]
    kept += [s for s in sizes if s >= steps][:1]
    if len(kept) == len(sizes):
        return decision, None
    note = Step(
        stage="run",
        name="capture_sizes",
        sets={"capture_sizes": tuple(kept)},
        reason=f"this run's steps hold at most {steps} token(s): {len(sizes) - len(kept)} of "
        f"the {len(sizes)} capture sizes could never be used and are not captured",
    )
    return replace(decision, capture_sizes=tuple(kept)), note
