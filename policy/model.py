"""The validated policy as plain frozen dataclasses: what the resolver and the cache use.

Mappings inside are ordinary dicts (fast); treat them as read-only. The disk cache stores
the policy as plain data (:mod:`interlock.policy.stored`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from interlock.core.decision import VOCABULARIES, FieldValue, Vocabulary
from interlock.policy.conditions import Facts, When


@dataclass(frozen=True)
class Location:
    file: str
    line: int
    col: int = 1

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "col": self.col}


@dataclass(frozen=True)
class Setting:
    """One decision-field value as written in the policy (in `defaults` or a rule's `set`)."""

    value: FieldValue
    location: Location


@dataclass(frozen=True)
class Rule:
    id: str
    #: Position in the layered rule list; later rules win per field.
    index: int
    when: When
    set: dict[str, Setting]
    reason: str
    ref: str | None
    location: Location
    #: Paths of the measurement records the rule cites, as written (relative to its file).
    evidence: tuple[str, ...] = ()
    #: A refusing rule's message (its ``set`` is empty): the context is refused.
    refuse: str | None = None
    #: With ``refuse``: the final decision's values it refuses (empty: every decision).
    decided: dict[str, Setting] = field(default_factory=dict)

    def refuses(self, values: Mapping[str, Any]) -> bool:
        """Whether this refusing rule, its ``when`` holding, refuses the decision ``values``."""
        return self.refuse is not None and all(
            values.get(name) == s.value for name, s in self.decided.items()
        )


@dataclass(frozen=True)
class Deviation:
    """Where the policy departs from the engine it mirrors on purpose (``deviations:``).

    ``field`` is a decision field or ``outcome`` (the engine refuses the context).
    Conformance counts these apart; ``explain`` shows those that apply.
    """

    id: str
    when: When
    env: dict[str, str]
    field: str
    reason: str
    ref: str | None
    location: Location

    def applies(self, facts: Facts, env: Mapping[str, str]) -> bool:
        return all(env.get(k) == v for k, v in self.env.items()) and self.when.matches(facts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "field": self.field,
            "when": self.when.to_data(),
            "env": dict(self.env),
            "reason": self.reason,
            "ref": self.ref,
            "location": self.location.to_dict(),
        }


@dataclass(frozen=True)
class EnvBinding:
    """An environment variable the policy honours, mapping its values onto one field."""

    name: str
    field: str
    values: dict[str, FieldValue]
    location: Location

    def allowed(self) -> str:
        return ", ".join(f'"{k}"' for k in self.values)


@dataclass(frozen=True)
class CatalogEntry:
    architecture: str
    traits: dict[str, Any]
    location: Location


@dataclass(frozen=True)
class PolicyFile:
    path: str
    version: str
    sha256: str
    #: The line of its ``version:``, which the release it names is cited by.
    version_line: int


@dataclass(frozen=True, eq=False)
class Policy:
    schema_version: int
    version: str
    #: Content hash of the files used, in order.
    revision: str
    files: tuple[PolicyFile, ...]
    catalog: dict[str, CatalogEntry]
    defaults: dict[str, Setting]
    env: dict[str, EnvBinding]
    rules: tuple[Rule, ...]
    index: Any = field(repr=False)
    deviations: tuple[Deviation, ...] = ()
    #: Resolutions memoized by (context, overrides, capabilities); never stored.
    memo: dict[Any, Any] = field(default_factory=dict, repr=False)
    #: The engine the policy decides for, named by its files' ``version:`` prefix
    #: (``interlock.policy.release``); it chooses the decision vocabulary.
    engine: str = "vllm"

    @property
    def vocabulary(self) -> Vocabulary:
        return VOCABULARIES[self.engine]

    def stamp(self) -> dict[str, Any]:
        """What every decision is stamped with."""
        return {
            "schema_version": self.schema_version,
            "version": self.version,
            "revision": self.revision,
            "files": [f.path for f in self.files],
        }
