"""The `when` condition language: what a rule (or a plugin's "unsupported" list) asks of a context.

A :class:`When` is a tuple of conditions, all of which must hold. They are
checked in a fixed order (architecture, platform, device_arch, traits in
catalog order, features in file order) so that "the first failing condition"
is well defined and independent of how rules are indexed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import translate
from typing import Any

from interlock.core.fields import TRAITS

NAME_KEYS = ("architecture", "platform", "device_arch")
_GLOB_CHARS = frozenset("*?[")

Scalar = bool | int | float | str
_UNKNOWN = object()


@dataclass(frozen=True)
class Facts:
    """What conditions are evaluated against: one context with its traits resolved."""

    architecture: str
    platform: str
    device_arch: str
    traits: Mapping[str, Any]
    features: Mapping[str, Any]


@dataclass(frozen=True)
class Failure:
    """The first condition of a `when` that did not hold."""

    condition: str
    wanted: Any
    observed: Any
    #: True when the observed fact is unknown (trait not in the catalog/config, feature not given).
    unknown: bool = False

    def describe(self, limit: int | None = None) -> str:
        """``attention: wanted dsa, observed hybrid``; ``limit`` abbreviates long wanted lists."""
        observed = "unknown" if self.unknown else _show(self.observed)
        if self.unknown and self.condition.startswith("features."):
            observed = "not given"
        wanted = _wanted_text(self.wanted, limit)
        return f"{self.condition}: wanted {wanted}, observed {observed}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "condition": self.condition,
            "wanted": self.wanted,
            "observed": self.observed,
            "unknown": self.unknown,
        }


def is_glob(pattern: str) -> bool:
    return not _GLOB_CHARS.isdisjoint(pattern)


@dataclass(frozen=True)
class NameMatch:
    """``architecture``/``platform``/``device_arch``: literal names and globs (``gfx9*``)."""

    key: str
    patterns: tuple[str, ...]
    literals: frozenset[str]
    regex: re.Pattern[str] | None

    @classmethod
    def of(cls, key: str, patterns: tuple[str, ...]) -> NameMatch:
        globs = [p for p in patterns if is_glob(p)]
        regex = re.compile("|".join(f"(?:{translate(g)})" for g in globs)) if globs else None
        return cls(key, patterns, frozenset(p for p in patterns if not is_glob(p)), regex)

    def matches(self, value: str) -> bool:
        return value in self.literals or (
            self.regex is not None and self.regex.match(value) is not None
        )

    def holds(self, facts: Facts) -> bool:
        value = getattr(facts, self.key)
        return value in self.literals or (
            self.regex is not None and self.regex.match(value) is not None
        )

    def check(self, facts: Facts) -> Failure | None:
        value = getattr(facts, self.key)
        if self.matches(value):
            return None
        return Failure(self.key, list(self.patterns), value)

    def to_data(self) -> Any:
        return self.patterns[0] if len(self.patterns) == 1 else list(self.patterns)


@dataclass(frozen=True)
class TraitMatch:
    """A trait key with its accepted values; an unknown trait never matches."""

    key: str
    values: tuple[Any, ...]

    def holds(self, facts: Facts) -> bool:
        observed = facts.traits.get(self.key, _UNKNOWN)
        if observed is _UNKNOWN:
            return False
        for value in self.values:
            if _same(observed, value):
                return True
        return False

    def check(self, facts: Facts) -> Failure | None:
        if self.key not in facts.traits:
            return Failure(self.key, list(self.values), None, unknown=True)
        observed = facts.traits[self.key]
        if any(_same(observed, v) for v in self.values):
            return None
        return Failure(self.key, list(self.values), observed)

    def to_data(self) -> Any:
        return self.values[0] if len(self.values) == 1 else list(self.values)


@dataclass(frozen=True)
class FeatureMatch:
    """A deployment feature with comparisons that must all hold (``{gt: 1}``, ``{in: [...]}``)."""

    key: str
    ops: tuple[tuple[str, Any], ...]

    def holds(self, facts: Facts) -> bool:
        observed = facts.features.get(self.key, _UNKNOWN)
        if observed is _UNKNOWN:
            return False
        for op, wanted in self.ops:
            if not _compare(op, observed, wanted):
                return False
        return True

    def check(self, facts: Facts) -> Failure | None:
        name = f"features.{self.key}"
        if self.key not in facts.features:
            return Failure(name, dict(self.ops), None, unknown=True)
        observed = facts.features[self.key]
        if all(_compare(op, observed, wanted) for op, wanted in self.ops):
            return None
        return Failure(name, dict(self.ops), observed)

    def to_data(self) -> Any:
        return dict(self.ops)


Condition = NameMatch | TraitMatch | FeatureMatch


@dataclass(frozen=True)
class When:
    """All conditions of a rule; an empty `when` matches every context."""

    conditions: tuple[Condition, ...] = ()

    def first_failure(self, facts: Facts) -> Failure | None:
        for condition in self.conditions:
            failure = condition.check(facts)
            if failure is not None:
                return failure
        return None

    def matches(self, facts: Facts) -> bool:
        """Same as ``first_failure(facts) is None``, without building the failure."""
        for condition in self.conditions:
            if not condition.holds(facts):
                return False
        return True

    def name_match(self, key: str) -> NameMatch | None:
        for condition in self.conditions:
            if isinstance(condition, NameMatch) and condition.key == key:
                return condition
        return None

    def to_data(self) -> dict[str, Any]:
        """The `when` mapping in canonical form (as a policy file would spell it)."""
        data: dict[str, Any] = {}
        features = {}
        for c in self.conditions:
            if isinstance(c, FeatureMatch):
                features[c.key] = c.to_data()
            else:
                data[c.key] = c.to_data()
        if features:
            data["features"] = features
        return data


def build_when(data: Mapping[str, Any]) -> When:
    """Build a :class:`When` from an already validated `when` mapping (see :func:`parse_when`)."""
    conditions: list[Condition] = []
    for key in NAME_KEYS:
        if data.get(key) is not None:
            conditions.append(NameMatch.of(key, _as_tuple(data[key])))
    for key in TRAITS:
        if data.get(key) is not None:
            conditions.append(TraitMatch(key, _as_tuple(data[key])))
    for key, spec in (data.get("features") or {}).items():
        if isinstance(spec, Mapping):
            ops = tuple(
                (op, tuple(v) if op == "in" else v) for op, v in spec.items() if v is not None
            )
        elif isinstance(spec, (list, tuple)):
            ops = (("in", tuple(spec)),)
        else:
            ops = (("eq", spec),)
        conditions.append(FeatureMatch(key, ops))
    return When(tuple(conditions))


def parse_when(data: Mapping[str, Any]) -> When:
    """Validate a `when` mapping (the policy-file syntax) and build it; for plugins and tools.

    Raises :class:`interlock.core.errors.PolicyError` naming the offending key and value.
    """
    from interlock.policy.schema import validate_when

    return build_when(validate_when(data))


def _as_tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def _same(a: Any, b: Any) -> bool:
    # True == 1 in Python; a policy that says `moe: 1` must not match `moe: true`.
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _compare(op: str, observed: Any, wanted: Any) -> bool:
    if op == "eq":
        return _same(observed, wanted)
    if op == "ne":
        return not _same(observed, wanted)
    if op == "in":
        return any(_same(observed, w) for w in wanted)
    if not _is_number(observed):
        return False
    if op == "gt":
        return observed > wanted
    if op == "ge":
        return observed >= wanted
    if op == "lt":
        return observed < wanted
    return observed <= wanted


_OP_TEXT = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "eq": "=", "ne": "!="}


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == "":
        return '""'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)


def _wanted_text(wanted: Any, limit: int | None = None) -> str:
    if isinstance(wanted, dict):
        parts = [
            f"one of {_show(v)}" if op == "in" else f"{_OP_TEXT[op]} {_show(v)}"
            for op, v in wanted.items()
        ]
        return " and ".join(parts)
    if isinstance(wanted, list) and len(wanted) == 1:
        return _show(wanted[0])
    if limit is not None and len(wanted) > limit:
        shown = ", ".join(_show(w) for w in wanted[:limit])
        return f"one of [{shown}, … +{len(wanted) - limit} more]"
    return f"one of {_show(wanted)}"
