"""The line naming who chose each decision field a run acts on: ``runner=mrv2 (defaults,
policies.yaml:59), ...``, one format for `policy run`, `policy serve`, ``LLM`` and vLLM."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from interlock.core.fields import show_scalar
from interlock.policy.trace import Provenance

if TYPE_CHECKING:
    from interlock.core.decision import Decision
    from interlock.policy.resolution import Resolution

#: Each decision field a run acts on, in the order the log line names them.
LOGGED_FIELDS = ("runner", "cudagraph", "breakable")
GIVEN_BY_CALLER = "given by the caller"


def decided_by(resolution: Resolution) -> str:
    """``runner=mrv2 (defaults, policies.yaml:59), ...``: each field with who chose it."""
    decision = resolution.decision.to_dict()
    return decision_line(
        {name: decision[name] for name in LOGGED_FIELDS},
        {name: chooser(resolution.provenance[name]) for name in LOGGED_FIELDS},
    )


def decision_line(values: Mapping[str, Any], choosers: Mapping[str, str]) -> str:
    """The one format of that line: ``name=value (who chose it)`` per logged field."""
    return ", ".join(
        f"{name}={show_scalar(values[name])} ({choosers[name]})" for name in LOGGED_FIELDS
    )


def given_by_caller(decision: Decision) -> str:
    """That line for a decision the caller gave: every field chosen by the caller."""
    values = {name: getattr(decision, name) for name in LOGGED_FIELDS}
    return decision_line(values, dict.fromkeys(LOGGED_FIELDS, GIVEN_BY_CALLER))


def chooser(prov: Provenance) -> str:
    """Who chose one field: ``defaults, policies.yaml:59`` or ``rules rocm-dsa, FILE:LINE``."""
    who = "defaults" if prov.stage == "defaults" else f"{prov.stage} {prov.source}"
    return f"{who}, {prov.location}" if prov.location else who
