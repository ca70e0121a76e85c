"""What a resolution records: the ordered trace of steps and each field's provenance.

Stages run in this order; ``capabilities`` (stage 5: what the chosen runner
plugin can serve) is filled in by the plugin layer, ``implied`` applies
``breakable => compile: false``, and ``engine`` (supplied by the application for the engine
release the decision is handed to) applies what that release does with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from interlock.policy.conditions import Failure
from interlock.policy.model import Location

DEFAULTS = "defaults"
RULES = "rules"
ENV = "env"
OVERRIDES = "overrides"
CAPABILITIES = "capabilities"
IMPLIED = "implied"
#: What the engine release the decision is handed to makes of it (its adjustments, its
#: optimization level's defaults) and what it refuses: the decision is what it runs.
ENGINE = "engine"
#: Not a stage that sets fields: the refusing rules, checked on the final decision.
REFUSAL = "refusal"
STAGES = (DEFAULTS, RULES, ENV, OVERRIDES, CAPABILITIES, IMPLIED, ENGINE, REFUSAL)
#: Stages whose values the user forced: stage 5 must refuse, not fall back, when unsupported.
FORCED_STAGES = frozenset({ENV, OVERRIDES})


@dataclass(frozen=True)
class Provenance:
    """Where a decision field's final value came from."""

    field: str
    value: Any
    stage: str
    #: Who set it: "defaults", a rule id, an env var name, "--set"/"override", a runner name.
    source: str
    reason: str = ""
    location: Location | None = None
    ref: str | None = None

    @property
    def forced(self) -> bool:
        return self.stage in FORCED_STAGES

    def to_dict(self) -> dict[str, Any]:
        return {
            "value": _jsonable(self.value),
            "stage": self.stage,
            "source": self.source,
            "reason": self.reason,
            "file": self.location.file if self.location else None,
            "line": self.location.line if self.location else None,
            "ref": self.ref,
            "forced": self.forced,
        }


def rule_deciders(provenance: Iterable[Provenance]) -> set[str]:
    """Ids of the rules that set a field of a decision (its provenance values)."""
    return {p.source for p in provenance if p.stage == RULES}


@dataclass(frozen=True)
class Step:
    """One entry of the trace.

    For a rule: ``matched`` with the fields it ``sets`` (and which of them a later
    step ``overridden`` by id), or the first ``failure``. For other stages
    ``matched`` is None and ``sets`` holds what the step assigned.
    """

    stage: str
    name: str
    location: Location | None = None
    sets: dict[str, Any] = field(default_factory=dict)
    matched: bool | None = None
    failure: Failure | None = None
    reason: str = ""
    ref: str | None = None
    note: str = ""
    #: For a matched rule: field -> who set its final value instead ("rocm-no-breakable (rules)").
    overridden: dict[str, str] = field(default_factory=dict)
    #: For a refusing rule: its message.
    refuse: str | None = None
    #: For an engine stage's step: the values it replaced (field -> value before).
    before: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "name": self.name,
            "file": self.location.file if self.location else None,
            "line": self.location.line if self.location else None,
            "matched": self.matched,
            "sets": {k: _jsonable(v) for k, v in self.sets.items()},
            "failure": self.failure.to_dict() if self.failure else None,
            "reason": self.reason,
            "ref": self.ref,
            "note": self.note,
            "overridden": dict(self.overridden),
            "refuse": self.refuse,
            "before": {k: _jsonable(v) for k, v in self.before.items()},
        }


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
