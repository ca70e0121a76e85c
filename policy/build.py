"""From parsed, validated files to one layered :class:`~interlock.policy.model.Policy`
(cache misses)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from interlock.core.decision import VOCABULARIES, Vocabulary
from interlock.core.errors import PolicyError
from interlock.policy.conditions import build_when
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
from interlock.policy.release import engine_of
from interlock.policy.schema import SCHEMA_VERSION, PolicyFileModel, validate_file
from interlock.policy.source import Path_, SourceDoc, parse_yaml


@dataclass
class _Layer:
    """What one file contributes, with locations."""

    file: PolicyFile
    catalog: dict[str, CatalogEntry] = field(default_factory=dict)
    defaults: dict[str, Setting] = field(default_factory=dict)
    env: dict[str, EnvBinding] = field(default_factory=dict)
    #: Bindings of earlier files this one drops (``NAME: null``), at their key.
    dropped: dict[str, Location] = field(default_factory=dict)
    #: Bindings later files may neither replace nor drop (``locked: true``).
    locked: set[str] = field(default_factory=set)
    rules: list[Rule] = field(default_factory=list)
    deviations: list[Deviation] = field(default_factory=list)


def build_policy(sources: list[tuple[str, bytes, str]], revision: str) -> Policy:
    """Parse, validate and layer ``(display name, content, sha256)`` sources, in order."""
    docs = [(parse_yaml(content, name), sha) for name, content, sha in sources]
    engine = engine_of_docs([doc for doc, _ in docs])
    vocabulary = VOCABULARIES[engine]
    layers = [_layer(doc, validate_file(doc, vocabulary), sha, vocabulary) for doc, sha in docs]
    return _merge(layers, revision, engine)


def engine_of_docs(docs: list[SourceDoc]) -> str:
    """The one engine the files' versions name (``vllm-…``, ``sglang-…``); a file naming
    none (a site layer) decides for the engine of the others, and a stack naming none is
    vLLM's."""
    named: dict[str, SourceDoc] = {}
    for doc in docs:
        version = doc.data.get("version") if isinstance(doc.data, dict) else None
        engine = engine_of(version) if isinstance(version, str) else None
        if engine is not None:
            named.setdefault(engine, doc)
    if len(named) > 1:
        (first, a), (second, b) = list(named.items())[:2]
        raise b.error(
            ("version",),
            f"this file decides for {second} but {a.name} for {first}: a policy decides for "
            "one engine (its decision fields are that engine's)",
        )
    return next(iter(named), "vllm")


def _loc(doc: SourceDoc, path: Path_, *, key: bool = False) -> Location:
    m = doc.mark(path, key=key)
    return Location(doc.name, m.line, m.col)


def _settings(
    doc: SourceDoc, fields: Any, path: Path_, vocabulary: Vocabulary
) -> dict[str, Setting]:
    return {
        name: Setting(vocabulary.check(name, getattr(fields, name)), _loc(doc, (*path, name)))
        for name in type(fields).model_fields
        if name in fields.model_fields_set
    }


def _layer(doc: SourceDoc, model: PolicyFileModel, sha: str, vocabulary: Vocabulary) -> _Layer:
    layer = _Layer(PolicyFile(doc.name, model.version, sha, _loc(doc, ("version",)).line))
    for arch, traits in model.catalog.items():
        layer.catalog[arch] = CatalogEntry(
            arch, traits.model_dump(exclude_none=True), _loc(doc, ("catalog", arch), key=True)
        )
    layer.defaults = _settings(doc, model.defaults, ("defaults",), vocabulary)
    for name, binding in model.env.items():
        if binding is None:
            layer.dropped[name] = _loc(doc, ("env", name), key=True)
            continue
        if binding.locked:
            layer.locked.add(name)
        values = {}
        for text, value in binding.values.items():
            try:
                values[text] = vocabulary.check(binding.field, value)
            except ValueError as exc:
                raise doc.error(("env", name, "values", text), str(exc)) from None
        layer.env[name] = EnvBinding(
            name, binding.field, values, _loc(doc, ("env", name), key=True)
        )
    for i, rule in enumerate(model.rules):
        layer.rules.append(
            Rule(
                id=rule.id,
                index=i,
                when=build_when(rule.when.model_dump(by_alias=True, exclude_none=True)),
                set=_settings(doc, rule.set, ("rules", i, "set"), vocabulary) if rule.set else {},
                reason=rule.reason,
                ref=rule.ref,
                location=_loc(doc, ("rules", i)),
                evidence=tuple(rule.evidence or ()),
                refuse=rule.refuse,
                decided=(
                    _settings(doc, rule.decided, ("rules", i, "decided"), vocabulary)
                    if rule.decided else {}
                ),
            )
        )
    for i, deviation in enumerate(model.deviations):
        layer.deviations.append(
            Deviation(
                id=deviation.id,
                when=build_when(deviation.when.model_dump(by_alias=True, exclude_none=True)),
                env=dict(deviation.env),
                field=deviation.field,
                reason=deviation.reason,
                ref=deviation.ref,
                location=_loc(doc, ("deviations", i)),
            )
        )
    return layer


def _layer_env(env: dict[str, EnvBinding], locked: dict[str, Location], layer: _Layer) -> None:
    """Apply one file's env bindings over the earlier files': replace, drop (``null``) and
    lock (``locked: true``), refusing a change to a locked binding or a drop of nothing."""
    changed = {**{n: b.location for n, b in layer.env.items()}, **layer.dropped}
    for name, where in changed.items():
        if name in locked:
            verb = "drop" if name in layer.dropped else "replace"
            raise PolicyError(
                f"the binding is locked at {locked[name]} (locked: true), so a later file "
                f"cannot {verb} it",
                file=where.file, line=where.line, col=where.col, path=f"env.{name}",
            )
    for name, where in layer.dropped.items():
        if name not in env:
            from interlock.core.suggest import hint

            bound = ", ".join(env) or "none"
            raise PolicyError(
                f"null drops a binding of an earlier file, but none binds {name} "
                f"(bound: {bound}){hint(name, env)}",
                file=where.file, line=where.line, col=where.col, path=f"env.{name}",
            )
        del env[name]
    env.update(layer.env)
    locked.update({name: layer.env[name].location for name in layer.locked})


def _merge(layers: list[_Layer], revision: str, engine: str) -> Policy:
    """Later files append rules and deviations and replace defaults fields, env bindings and
    catalog entries; they drop env bindings (``NAME: null``) unless locked."""
    catalog: dict[str, CatalogEntry] = {}
    defaults: dict[str, Setting] = {}
    env: dict[str, EnvBinding] = {}
    rules: list[Rule] = []
    deviations: list[Deviation] = []
    seen_ids: dict[str, Rule] = {}
    #: Locked binding -> where it was locked.
    locked: dict[str, Location] = {}
    for layer in layers:
        deviations.extend(layer.deviations)
        catalog.update(layer.catalog)
        defaults.update(layer.defaults)
        _layer_env(env, locked, layer)
        for rule in layer.rules:
            if rule.id in seen_ids:
                first = seen_ids[rule.id]
                raise PolicyError(
                    f"duplicate rule id {rule.id!r} (first defined at {first.location})",
                    file=rule.location.file,
                    line=rule.location.line,
                    col=rule.location.col,
                    path=f"rules[{rule.index}].id",
                )
            rule = dataclasses.replace(rule, index=len(rules))
            seen_ids[rule.id] = rule
            rules.append(rule)
    missing = [f for f in VOCABULARIES[engine].required if f not in defaults]
    if missing:
        last = layers[-1].file.path
        # Usually a site policy given alone: say how to layer it on the shipped one.
        raise PolicyError(
            f"defaults must set {', '.join(missing)} (in at least one of the layered files); "
            f"to layer {last} on the shipped policy, give --policy @shipped --policy {last} "
            f"(or INTERLOCK_POLICY=@shipped:{last})",
            file=last,
            path="defaults",
        )
    rule_tuple = tuple(rules)
    return Policy(
        schema_version=SCHEMA_VERSION,
        version="+".join(layer.file.version for layer in layers),
        revision=revision,
        files=tuple(layer.file for layer in layers),
        catalog=catalog,
        defaults=defaults,
        env=env,
        rules=rule_tuple,
        index=RuleIndex.build(rule_tuple),
        deviations=tuple(deviations),
        engine=engine,
    )
