"""The built policy as plain JSON data and back: what the disk cache stores.

Rebuilding the objects from data (never unpickling them) means a cache entry
can at worst be wrong data, and the reader checks its shape: anything off
raises :class:`ValueError`, which the loader treats as a missing entry.
"""

from __future__ import annotations

from typing import Any

from interlock.core.decision import OUTCOME, VOCABULARIES, Vocabulary
from interlock.core.fields import TRAITS
from interlock.policy.conditions import (
    ENGINES,
    Condition,
    ConfigMatch,
    EngineMatch,
    FeatureMatch,
    ModelMatch,
    NameMatch,
    TraitMatch,
    When,
)
from interlock.policy.index import RuleIndex
from interlock.policy.model import (
    CatalogEntry,
    Deviation,
    EnvBinding,
    Location,
    Policy,
    PolicyFile,
    Rule,
    Setting,
)

_SCALARS = (bool, int, float, str)
_OPS = ("gt", "ge", "lt", "le", "eq", "ne", "in")


def policy_to_data(policy: Policy) -> dict[str, Any]:
    return {
        "schema_version": policy.schema_version,
        "version": policy.version,
        "revision": policy.revision,
        "engine": policy.engine,
        "files": [[f.path, f.version, f.sha256, f.version_line] for f in policy.files],
        "catalog": [[e.architecture, e.traits, _loc(e.location)] for e in policy.catalog.values()],
        "defaults": _settings(policy.defaults),
        "env": [
            [b.name, b.field, [[k, _value(v)] for k, v in b.values.items()], _loc(b.location)]
            for b in policy.env.values()
        ],
        "rules": [
            {
                "id": r.id,
                "when": [_condition(c) for c in r.when.conditions],
                "set": _settings(r.set),
                "reason": r.reason,
                "ref": r.ref,
                "location": _loc(r.location),
                "evidence": list(r.evidence),
                "refuse": r.refuse,
                "decided": _settings(r.decided),
            }
            for r in policy.rules
        ],
        "deviations": [
            {
                "id": d.id,
                "when": [_condition(c) for c in d.when.conditions],
                "env": [[k, v] for k, v in d.env.items()],
                "field": d.field,
                "reason": d.reason,
                "ref": d.ref,
                "location": _loc(d.location),
            }
            for d in policy.deviations
        ],
    }


def policy_from_data(data: Any) -> Policy:
    """The policy :func:`policy_to_data` wrote; ValueError when ``data`` has another shape."""
    try:
        return _policy(data)
    except (KeyError, TypeError, AttributeError, IndexError) as exc:
        raise ValueError(f"not a stored policy: {exc!r}") from None


def _loc(loc: Location) -> list[Any]:
    return [loc.file, loc.line, loc.col]


def _value(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _settings(settings: dict[str, Setting]) -> list[Any]:
    return [[name, _value(s.value), _loc(s.location)] for name, s in settings.items()]


def _condition(c: Condition) -> list[Any]:
    if isinstance(c, NameMatch):
        return ["name", c.key, list(c.patterns)]
    if isinstance(c, TraitMatch):
        return ["trait", c.key, list(c.values)]
    if isinstance(c, ModelMatch):
        return ["model", "model", list(c.patterns)]
    if isinstance(c, EngineMatch):
        return ["engine", c.engine, c.text]
    kind = "config" if isinstance(c, ConfigMatch) else "feature"
    return [kind, c.key, [[op, _value(v)] for op, v in c.ops]]


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"not a stored policy: bad {what}")


def _str(value: Any, what: str) -> str:
    _need(isinstance(value, str), what)
    return value


def _int(value: Any, what: str) -> int:
    _need(type(value) is int, what)
    return value


def _location(data: Any) -> Location:
    file, line, col = data
    return Location(_str(file, "location"), _int(line, "location"), _int(col, "location"))


def _setting_map(data: Any, vocabulary: Vocabulary) -> dict[str, Setting]:
    out = {}
    for name, value, loc in data:
        try:
            out[_str(name, "field")] = Setting(vocabulary.check(name, value), _location(loc))
        except ValueError as exc:
            raise ValueError(f"not a stored policy: {exc}") from None
    return out


def _scalar(value: Any, what: str) -> Any:
    _need(isinstance(value, _SCALARS), what)
    return value


def _build_condition(data: Any) -> Condition:
    kind, key, body = data
    _str(key, "condition")
    if kind == "name":
        return NameMatch.of(key, tuple(_str(p, "pattern") for p in body))
    if kind == "trait":
        _need(key in TRAITS, "trait")
        return TraitMatch(key, tuple(_scalar(v, "trait value") for v in body))
    if kind == "model":
        return ModelMatch.of(tuple(_str(p, "pattern") for p in body))
    if kind == "engine":
        _need(key in ENGINES, "engine")
        try:
            return EngineMatch(key, _str(body, "specifier"))
        except ValueError as exc:
            raise ValueError(f"not a stored policy: {exc}") from None
    _need(kind in ("feature", "config"), "condition kind")
    ops = []
    for op, value in body:
        _need(op in _OPS, "operator")
        if op == "in":
            ops.append((op, tuple(_scalar(v, "feature value") for v in value)))
        else:
            ops.append((op, _scalar(value, "feature value")))
    if kind == "config":
        return ConfigMatch(key, tuple(ops))
    return FeatureMatch(key, tuple(ops))


def _policy(data: Any) -> Policy:
    engine = data["engine"]
    _need(engine in VOCABULARIES, "engine")
    vocabulary = VOCABULARIES[engine]
    catalog = {}
    for arch, traits, loc in data["catalog"]:
        _need(isinstance(traits, dict), "traits")
        for key, value in traits.items():
            _need(key in TRAITS, "trait")
            _scalar(value, "trait value")
        catalog[_str(arch, "architecture")] = CatalogEntry(arch, traits, _location(loc))
    env = {}
    for name, field, values, loc in data["env"]:
        try:
            mapped = {_str(k, "env value"): vocabulary.check(field, v) for k, v in values}
        except ValueError as exc:
            raise ValueError(f"not a stored policy: {exc}") from None
        env[_str(name, "env")] = EnvBinding(name, field, mapped, _location(loc))
    rules = []
    for index, r in enumerate(data["rules"]):
        ref = r["ref"]
        _need(ref is None or isinstance(ref, str), "ref")
        evidence = r["evidence"]
        _need(isinstance(evidence, list), "evidence")
        rules.append(
            Rule(
                id=_str(r["id"], "rule id"),
                index=index,
                when=When(tuple(_build_condition(c) for c in r["when"])),
                set=_setting_map(r["set"], vocabulary),
                reason=_str(r["reason"], "reason"),
                ref=ref,
                location=_location(r["location"]),
                evidence=tuple(_str(path, "evidence") for path in evidence),
                refuse=None if r["refuse"] is None else _str(r["refuse"], "refuse"),
                decided=_setting_map(r["decided"], vocabulary),
            )
        )
    deviations = []
    for d in data["deviations"]:
        ref = d["ref"]
        _need(ref is None or isinstance(ref, str), "ref")
        _need(d["field"] in (*vocabulary.names, OUTCOME), "deviation field")
        deviations.append(
            Deviation(
                id=_str(d["id"], "deviation id"),
                when=When(tuple(_build_condition(c) for c in d["when"])),
                env={_str(k, "env"): _str(v, "env value") for k, v in d["env"]},
                field=d["field"],
                reason=_str(d["reason"], "reason"),
                ref=ref,
                location=_location(d["location"]),
            )
        )
    rule_tuple = tuple(rules)
    return Policy(
        schema_version=_int(data["schema_version"], "schema_version"),
        version=_str(data["version"], "version"),
        revision=_str(data["revision"], "revision"),
        files=tuple(
            PolicyFile(_str(p, "file"), _str(v, "file"), _str(s, "file"), _int(n, "file"))
            for p, v, s, n in data["files"]
        ),
        catalog=catalog,
        defaults=_setting_map(data["defaults"], vocabulary),
        env=env,
        rules=rule_tuple,
        index=RuleIndex.build(rule_tuple),
        deviations=tuple(deviations),
        engine=engine,
    )
