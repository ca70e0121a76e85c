"""The `when` condition language: what a rule (or a plugin's "unsupported" list) asks of a context.

A :class:`When` is a tuple of conditions, all of which must hold. They are
checked in a fixed order (architecture, platform, device_arch, traits in
catalog order, features in file order, then engine versions, model identity
and config values) so that "the first failing condition" is well defined and
independent of how rules are indexed.

Three kinds of condition test facts about the model and the engine rather than
the architecture:

- ``config``: dotted paths into the model's config.json
  (``"quantization_config.quant_method": fp8``), compared like features, with
  the values typed as JSON types them;
- ``model``: globs on the model's identity (its directory name,
  ``_name_or_path``, a given model id), case-insensitive;
- ``engine``: PEP 440 specifier sets on an engine's version (``vllm: ">=0.32,<0.34"``).

Each is *unknown* when the fact is missing (no model config, the key absent,
no identity, no engine version): an unknown condition never matches, and the
trace says why.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import translate
from typing import TYPE_CHECKING, Any

from interlock.core.fields import TRAITS

if TYPE_CHECKING:
    # Imported where used: `packaging` is slow to import, and only engine conditions need it.
    from packaging.specifiers import SpecifierSet

NAME_KEYS = ("architecture", "platform", "device_arch")
#: Engines whose version a rule can test (``when: {engine: {vllm: ">=0.32"}}``).
ENGINES = ("vllm", "sglang")
#: A config path has at most this many dotted parts and characters (real ones have 1-3).
MAX_CONFIG_DEPTH = 8
MAX_CONFIG_PATH = 200
#: Why a config fact is unknown.
NO_CONFIG = "no model config"
KEY_ABSENT = "absent from the model config"
_GLOB_CHARS = frozenset("*?[")

Scalar = bool | int | float | str
_UNKNOWN = object()


@dataclass(frozen=True)
class NonScalar:
    """A config.json value a condition cannot compare: a JSON ``object`` or ``array``."""

    kind: str

    def __str__(self) -> str:
        return f"a JSON {self.kind}, not a scalar"


@dataclass(frozen=True)
class Facts:
    """What conditions are evaluated against: one context with its traits resolved."""

    architecture: str
    platform: str
    device_arch: str
    traits: Mapping[str, Any]
    features: Mapping[str, Any]
    #: The model's config.json flattened to dotted paths (:func:`flatten_config`); None: no
    #: model config was given.
    config: Mapping[str, Any] | None = None
    #: The model's identity: directory name, ``_name_or_path``, given model id.
    model: tuple[str, ...] = ()
    #: Engine name -> its version (PEP 440 text).
    engine: Mapping[str, str] = field(default_factory=dict)


def flatten_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": [1]}`` -> ``{"a": NonScalar("object"), "a.b": 1,
    "c": NonScalar("array")}``: every path a condition may name, down to
    :data:`MAX_CONFIG_DEPTH` parts (deeper ones no condition can spell)."""
    out: dict[str, Any] = {}

    def walk(prefix: str, data: Mapping[str, Any], depth: int) -> None:
        for key, value in data.items():
            path = f"{prefix}{key}"
            if isinstance(value, Mapping):
                out[path] = NonScalar("object")
                if depth < MAX_CONFIG_DEPTH:
                    walk(f"{path}.", value, depth + 1)
            elif isinstance(value, list):
                out[path] = NonScalar("array")
            else:
                out[path] = value

    walk("", config, 1)
    return out


@dataclass(frozen=True)
class Failure:
    """The first condition of a `when` that did not hold."""

    condition: str
    wanted: Any
    observed: Any
    #: True when the observed fact is unknown (trait not in the catalog/config, feature not given).
    unknown: bool = False
    #: Why the fact is unknown, when that is worth saying (``no model config``).
    why: str = ""

    def describe(self, limit: int | None = None) -> str:
        """``attention: wanted dsa, observed hybrid``; ``limit`` abbreviates long wanted lists."""
        observed = "unknown" if self.unknown else _show(self.observed)
        if self.unknown and self.why:
            observed = f"unknown ({self.why})"
        elif self.unknown and self.condition.startswith("features."):
            observed = "not given"
        wanted = wanted_text(self.wanted, limit)
        return f"{self.condition}: wanted {wanted}, observed {observed}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "condition": self.condition,
            "wanted": self.wanted,
            "observed": self.observed,
            "unknown": self.unknown,
            **({"why": self.why} if self.why else {}),
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


@dataclass(frozen=True)
class ConfigMatch:
    """A dotted path into the model's config.json with comparisons that must all hold."""

    key: str
    ops: tuple[tuple[str, Any], ...]

    def holds(self, facts: Facts) -> bool:
        # As ``check(facts) is None``, without building the failure (resolution's hot path).
        config = facts.config
        if config is None or self.key not in config:
            return False
        return self.value_holds(config[self.key])

    def check(self, facts: Facts) -> Failure | None:
        name = f"config.{self.key}"
        if facts.config is None:
            return Failure(name, dict(self.ops), None, unknown=True, why=NO_CONFIG)
        if self.key not in facts.config:
            return Failure(name, dict(self.ops), None, unknown=True, why=KEY_ABSENT)
        observed = facts.config[self.key]
        if isinstance(observed, NonScalar):
            return Failure(name, dict(self.ops), str(observed))
        if all(_compare(op, observed, wanted) for op, wanted in self.ops):
            return None
        return Failure(name, dict(self.ops), observed)

    def value_holds(self, value: Any) -> bool:
        """Whether the comparisons hold for ``value`` (the path present with it)."""
        return not isinstance(value, NonScalar) and all(
            _compare(op, value, wanted) for op, wanted in self.ops
        )

    def to_data(self) -> Any:
        return dict(self.ops)


@dataclass(frozen=True)
class ModelMatch:
    """Globs on the model's identity (case-insensitive); no identity never matches."""

    patterns: tuple[str, ...]
    regex: re.Pattern[str]

    key = "model"

    @classmethod
    def of(cls, patterns: tuple[str, ...]) -> ModelMatch:
        joined = "|".join(f"(?:{translate(p)})" for p in patterns)
        return cls(patterns, re.compile(joined, re.IGNORECASE))

    def matches(self, name: str) -> bool:
        return self.regex.match(name) is not None

    def holds(self, facts: Facts) -> bool:
        return any(self.matches(name) for name in facts.model)

    def check(self, facts: Facts) -> Failure | None:
        if not facts.model:
            why = "no model identity"
            return Failure("model", list(self.patterns), None, unknown=True, why=why)
        if self.holds(facts):
            return None
        return Failure("model", list(self.patterns), list(facts.model))

    def to_data(self) -> Any:
        return self.patterns[0] if len(self.patterns) == 1 else list(self.patterns)


@dataclass(frozen=True)
class EngineMatch:
    """An engine's version within a PEP 440 specifier set; an unknown version never matches.

    Pre-releases and dev builds count (``0.33.1.dev5`` is within ``>=0.32,<0.34``): a fleet
    runs them, and a policy means their release line."""

    engine: str
    #: The specifier set as written (``SpecifierSet`` sorts its clauses), checked by
    #: :func:`engine_spec` when the policy was read.
    text: str

    @property
    def spec(self) -> SpecifierSet:
        """Parsed on first use: a context without the engine's version never needs it, and
        `packaging` is slow to import (a warm `policy explain` does without)."""
        return _parsed_spec(self.text)

    @property
    def key(self) -> str:
        return f"engine.{self.engine}"

    def version_holds(self, version: str) -> bool:
        return self.spec.contains(version, prereleases=True)

    def holds(self, facts: Facts) -> bool:
        version = facts.engine.get(self.engine)
        return version is not None and self.version_holds(version)

    def check(self, facts: Facts) -> Failure | None:
        version = facts.engine.get(self.engine)
        if version is None:
            why = f"no {self.engine} version: give --engine-version {self.engine}=X.Y.Z"
            return Failure(self.key, self.text, None, unknown=True, why=why)
        if self.version_holds(version):
            return None
        return Failure(self.key, self.text, version)

    def to_data(self) -> Any:
        return self.text


Condition = NameMatch | TraitMatch | FeatureMatch | ConfigMatch | ModelMatch | EngineMatch


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
        nested: dict[str, dict[str, Any]] = {"features": {}, "engine": {}, "config": {}}
        for c in self.conditions:
            if isinstance(c, FeatureMatch):
                nested["features"][c.key] = c.to_data()
            elif isinstance(c, ConfigMatch):
                nested["config"][c.key] = c.to_data()
            elif isinstance(c, EngineMatch):
                nested["engine"][c.engine] = c.to_data()
            else:
                data[c.key] = c.to_data()
        data.update({key: value for key, value in nested.items() if value})
        return data


def build_when(data: Mapping[str, Any]) -> When:
    """Build a :class:`When` from an already validated `when` mapping.

    :func:`interlock.policy.schema.parse_when` validates and builds in one call.
    """
    conditions: list[Condition] = []
    for key in NAME_KEYS:
        if data.get(key) is not None:
            conditions.append(NameMatch.of(key, _as_tuple(data[key])))
    for key in TRAITS:
        if data.get(key) is not None:
            conditions.append(TraitMatch(key, _as_tuple(data[key])))
    for key, spec in (data.get("features") or {}).items():
        conditions.append(FeatureMatch(key, _ops(spec)))
    for engine, text in (data.get("engine") or {}).items():
        engine_spec(text)  # refused here, with the file's line, when it is not a specifier set
        conditions.append(EngineMatch(engine, text))
    if data.get("model") is not None:
        conditions.append(ModelMatch.of(_as_tuple(data["model"])))
    for key, spec in (data.get("config") or {}).items():
        conditions.append(ConfigMatch(key, _ops(spec)))
    return When(tuple(conditions))


def _ops(spec: Any) -> tuple[tuple[str, Any], ...]:
    """A feature or config comparison: ``{gt: 1}``, a list (``in``) or a value (``eq``)."""
    if isinstance(spec, Mapping):
        return tuple((op, tuple(v) if op == "in" else v) for op, v in spec.items() if v is not None)
    if isinstance(spec, (list, tuple)):
        return (("in", tuple(spec)),)
    return (("eq", spec),)


@functools.lru_cache(maxsize=256)
def _parsed_spec(text: str) -> SpecifierSet:
    return engine_spec(text)


def engine_spec(text: str) -> SpecifierSet:
    """Parse a PEP 440 specifier set (``">=0.32,<0.34"``); ValueError saying what is wrong."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        spec = SpecifierSet(text)
    except InvalidSpecifier:
        raise ValueError(
            f"{text!r} is not a PEP 440 version specifier set (e.g. \">=0.32,<0.34\")"
        ) from None
    if not str(spec):
        raise ValueError("an empty version specifier matches every version; drop the condition")
    return spec


def check_version(text: str) -> str:
    """A PEP 440 version as given (``0.29.0``); ValueError when it is not one."""
    from packaging.version import InvalidVersion, Version

    try:
        Version(text)
    except InvalidVersion:
        raise ValueError(f"{text!r} is not a PEP 440 version (e.g. 0.29.0)") from None
    return text


def check_config_path(path: str) -> str:
    """A dotted config path within bounds; ValueError naming what is wrong."""
    if len(path) > MAX_CONFIG_PATH:
        raise ValueError(
            f"config path of {len(path)} characters; a path has at most {MAX_CONFIG_PATH}"
        )
    parts = path.split(".")
    if len(parts) > MAX_CONFIG_DEPTH:
        raise ValueError(
            f"config path {path!r} has {len(parts)} parts; a path has at most {MAX_CONFIG_DEPTH}"
        )
    if any(not part for part in parts):
        raise ValueError(f"config path {path!r} has an empty part")
    return path


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


def wanted_text(wanted: Any, limit: int | None = None) -> str:
    """What a condition wants, in words: ``> 70``, ``one of [a, b]``, ``>=0.32,<0.34``."""
    if isinstance(wanted, str):  # an engine version specifier set
        return wanted
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
