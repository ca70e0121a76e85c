"""Exhaustive comparison of two policies: every decision that differs on their common domain.

Both policies are resolved (stages 1-4, without a runner's capabilities, which
belong to the installed plugins rather than to the policy) on every context of
:class:`interlock.policy.domain.Domain` over both; a change is a field whose value
differs, reported with what decided it on each side. Changes are grouped by
(field, old value, new value), then by the pair of deciders, and their
contexts are summarised as compactly as the domain allows
(``on rocm/* for KimiK3ForConditionalGeneration, unless VLLM_USE_V2_MODEL_RUNNER is set``).
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from interlock.core.decision import OUTCOME, VOCABULARIES
from interlock.core.errors import PolicyError
from interlock.policy.context import Context
from interlock.policy.domain import UNNAMED_DEVICE_ARCH, Domain, EnvState, Extra
from interlock.policy.model import Policy
from interlock.policy.resolution import (
    PolicyRefused,
    Resolution,
    context_facts,
    matching_rules,
    resolve,
)
from interlock.policy.trace import DEFAULTS, ENV, IMPLIED, OVERRIDES, RULES, Provenance

#: Text reports wrap context summaries at this width.
WIDTH = 100


@dataclass(frozen=True)
class Side:
    """One policy's value for a field in a context, and what decided it."""

    value: Any
    decider: str
    location: str | None = None
    error: str | None = None
    #: The error is a rule's refusal (an outcome), not a failure to resolve.
    refused: bool = False

    @property
    def shown(self) -> str:
        if self.error is None:
            return show_value(self.value)
        return self.error if self.refused else f"error: {self.error}"

    def to_dict(self) -> dict[str, Any]:
        return {"decider": self.decider, "location": self.location, "error": self.error,
                "refused": self.refused}  # fmt: skip


@dataclass(frozen=True)
class Change:
    field: str
    old: Side
    new: Side
    context: Context


@dataclass
class Deciders:
    """The contexts of one change that share the same deciders on both sides."""

    old: Side
    new: Side
    contexts: list[Context] = field(default_factory=list)


@dataclass
class ChangeGroup:
    """All contexts where ``field`` goes from ``old`` to ``new`` (as shown)."""

    field: str
    old: str
    new: str
    # dataclasses.field: the class's own ``field`` attribute shadows the import in the body.
    by_deciders: list[Deciders] = dataclasses.field(default_factory=list)

    @property
    def count(self) -> int:
        return sum(len(d.contexts) for d in self.by_deciders)


@dataclass
class PolicyDiff:
    domain: Domain
    changes: list[Change]
    fields: tuple[str, ...]

    @property
    def equal(self) -> bool:
        return not self.changes

    def groups(self) -> list[ChangeGroup]:
        """Changes grouped by (field, old, new) in field order, then by deciders."""
        groups: dict[tuple[str, str, str], ChangeGroup] = {}
        for change in self.changes:
            key = (change.field, change.old.shown, change.new.shown)
            group = groups.get(key)
            if group is None:
                group = groups[key] = ChangeGroup(*key)
            for deciders in group.by_deciders:
                if (deciders.old, deciders.new) == (change.old, change.new):
                    break
            else:
                deciders = Deciders(change.old, change.new)
                group.by_deciders.append(deciders)
            deciders.contexts.append(change.context)
        known = (OUTCOME, *(n for v in VOCABULARIES.values() for n in v.names))
        order = {name: i for i, name in enumerate(known)}
        return sorted(groups.values(), key=lambda g: (order[g.field], -g.count, g.old, g.new))


#: The most contexts ``policy diff`` compares unless told otherwise (``--max-contexts``): about
#: 100,000 take seconds on a 2-core machine (a match per context and policy, a resolution per
#: distinct set of matching rules).
MAX_CONTEXTS = 100_000


def check_size(domain: Domain, bound: int, command: str) -> int:
    """The number of contexts of ``domain``; a :class:`PolicyError` (exit 1) naming it when it
    is over ``bound``, before any is resolved."""
    size = domain.size()
    if size > bound:
        raise PolicyError(
            f"{command}: the domain holds {size} contexts, over the bound of {bound} that "
            f"keeps it to seconds ({domain.describe_size()}); give --max-contexts {size} to "
            "go through them anyway"
        )
    return size


def diff_policies(old: Policy, new: Policy, fields: Sequence[str] | None = None,
                  max_contexts: int = MAX_CONTEXTS) -> PolicyDiff:
    """Every decision of ``fields`` (default: every field of the policies' vocabulary) that
    differs between ``old`` and ``new`` on their domain (refused, naming its size, past
    ``max_contexts`` contexts). Policies for two engines decide different fields: an error."""
    if old.engine != new.engine:
        raise PolicyError(
            f"the old policy decides for {old.vocabulary.title} and the new one for "
            f"{new.vocabulary.title}: their decisions have different fields, so no diff"
        )
    names = old.vocabulary.names
    fields = names if fields is None else fields
    unknown = [f for f in fields if f not in names]
    if unknown:
        raise PolicyError(
            f"unknown decision field {unknown[0]!r}; allowed: {', '.join(names)}"
        )
    domain = Domain.of(old, new)
    check_size(domain, max_contexts, "policy diff")
    changes: list[Change] = []
    # A context reaches a resolution without overrides or stage 5 only through the rules
    # it makes match (its architecture, place, traits, features, config, model and engine)
    # and its environment, which acts after the rules: so the contexts in which the same
    # rules of both policies match decide alike, env state by env state. Each such class is
    # resolved once per env state; every other context costs one match per policy.
    decided: dict[tuple[Any, ...], list[list[tuple[str, Side, Side]]]] = {}
    for base in domain.contexts(with_env=False):
        key = (_matched(old, base), _matched(new, base))
        per_env = decided.get(key)
        if per_env is None:
            per_env = decided[key] = [
                _differences(old, new, dataclasses.replace(base, env=dict(env)), fields)
                for env in domain.env_states
            ]
        for env, found in zip(domain.env_states, per_env, strict=True):
            if found:
                context = dataclasses.replace(base, env=dict(env))
                changes += [Change(name, a, b, context) for name, a, b in found]
    return PolicyDiff(domain, changes, tuple(fields))


def _matched(policy: Policy, context: Context) -> tuple[int, ...]:
    return tuple(matching_rules(policy, context_facts(policy, context)))


def _differences(
    old: Policy, new: Policy, context: Context, fields: Sequence[str]
) -> list[tuple[str, Side, Side]]:
    """What differs between the two policies' outcomes for ``context``: the outcome itself
    (one fails to resolve), or each field of ``fields`` whose values differ."""
    before, before_error = _outcome(old, context)
    after, after_error = _outcome(new, context)
    if before is None or after is None:
        if before_error == after_error:
            return []
        return [(OUTCOME, _outcome_side(before_error), _outcome_side(after_error))]
    return [
        (name, _side(before, name), _side(after, name)) for name in fields
        if getattr(before.decision, name) != getattr(after.decision, name)
    ]


def _outcome(policy: Policy, context: Context) -> tuple[Resolution | None, str | None]:
    try:
        return resolve(policy, context), None
    except PolicyRefused as exc:
        # Compared by rule and message: the same rule read from another path refuses alike.
        return None, f"{REFUSED_PREFIX}{exc.refusal.by}: {exc.refusal.message}"
    except PolicyError as exc:
        return None, "\n".join([exc.message, *exc.details])


#: How a refusal reads as an outcome (``refused by rule R: MESSAGE``).
REFUSED_PREFIX = "refused by rule "


def _outcome_side(error: str | None) -> Side:
    if error is None:
        return Side("resolves", "")
    return Side(None, "", error=error, refused=error.startswith(REFUSED_PREFIX))


def _side(resolution: Resolution, name: str) -> Side:
    prov = resolution.provenance.get(name)
    if prov is None:  # an optional field (capture_sizes) nothing set
        return Side(None, "not set")
    return Side(prov.value, decider(prov), str(prov.location) if prov.location else None)


def decider(prov: Provenance) -> str:
    """What set a field, in words: ``rule rocm-dsa-stays-on-mrv1``, ``defaults``, ``env VAR=1``…"""
    if prov.stage == RULES:
        return f"rule {prov.source}"
    if prov.stage == DEFAULTS:
        return "defaults"
    if prov.stage == ENV:
        return f"env {prov.reason}" if prov.reason else f"env {prov.source}"
    if prov.stage == IMPLIED:
        return f"implied: {prov.reason}"
    if prov.stage == OVERRIDES:
        return "override"
    return f"{prov.stage} {prov.source}"


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def show_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "(unset)"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


# -- summarising context sets ---------------------------------------------------------------

Point = tuple[str, str, str]  # architecture, platform, device arch
Condition = tuple[EnvState, Extra]


def extra_of(context: Context) -> Extra:
    """The feature, config, model and engine state of a domain context."""
    config = None if context.config is None else tuple(context.config.items())
    return (
        tuple(context.features.items()),
        config,
        context.model_names,
        tuple(context.engine.items()),
    )


def summarize(contexts: Iterable[Context], domain: Domain) -> list[str]:
    """Lines like ``on rocm/* for A, B, unless VLLM_USE_V2_MODEL_RUNNER is set`` covering
    exactly ``contexts``."""
    conditions_of: dict[Point, set[Condition]] = {}
    for c in contexts:
        point = (c.architecture, c.platform, c.device_arch)
        condition = (tuple(sorted(c.env.items())), extra_of(c))
        conditions_of.setdefault(point, set()).add(condition)
    by_conditions: dict[frozenset[Condition], dict[str, set[tuple[str, str]]]] = {}
    order_of: dict[frozenset[Condition], list[Extra]] = {}
    for (arch, platform, device), point_conditions in conditions_of.items():
        extras = domain.extras_at(arch, platform, device)
        key = _everywhere(frozenset(point_conditions), extras)
        order_of.setdefault(key, extras)
        arch_places = by_conditions.setdefault(key, {})
        arch_places.setdefault(arch, set()).add((platform, device))
    arch_order = {a: i for i, a in enumerate(domain.architectures)}
    lines = []
    for conditions, places_of in by_conditions.items():
        by_places: dict[frozenset[tuple[str, str]], list[str]] = {}
        for arch, where in places_of.items():
            by_places.setdefault(frozenset(where), []).append(arch)
        suffix = _conditions_text(conditions, domain, order_of[conditions])
        for places, archs in by_places.items():
            archs.sort(key=lambda a: arch_order.get(a, len(arch_order)))
            lines.append(
                f"on {_places_text(places, domain)} for {_archs_text(archs, domain)}{suffix}"
            )
    return sorted(lines)


def _archs_text(archs: list[str], domain: Domain) -> str:
    if len(archs) == len(domain.architectures):
        return "every architecture"
    return ", ".join(archs)


def _places_text(places: frozenset[tuple[str, str]], domain: Domain) -> str:
    if len(places) == sum(len(d) for d in domain.device_archs.values()):
        return "every platform"
    parts = []
    for platform, devices in domain.device_archs.items():
        present = [d for d in devices if (platform, d) in places]
        if len(present) == len(devices):
            parts.append(f"{platform}/*")
        else:
            parts.extend(f"{platform}/{_device_text(d)}" for d in present)
    return ", ".join(parts)


def _device_text(device: str) -> str:
    return "(other)" if device == UNNAMED_DEVICE_ARCH else device


#: Stands for "every feature, config, model and engine state of the place" in a summary.
_EVERY: Extra = ((("*", "*"),), None, ("*",), ())


def _everywhere(conditions: frozenset[Condition], extras: list[Extra]) -> frozenset[Condition]:
    """``conditions`` with every state of the place (``extras``) under one env set written
    as :data:`_EVERY`, so that places whose states differ still read alike."""
    envs_by_extra: dict[Extra, set[EnvState]] = {}
    for env, extra in conditions:
        envs_by_extra.setdefault(extra, set()).add(env)
    env_sets = {frozenset(envs) for envs in envs_by_extra.values()}
    if len(envs_by_extra) == len(extras) and len(env_sets) == 1:
        return frozenset((env, _EVERY) for env in next(iter(env_sets)))
    return conditions


def _conditions_text(
    conditions: frozenset[Condition], domain: Domain, extras: list[Extra]
) -> str:
    envs_by_extra: dict[Extra, set[EnvState]] = {}
    for env, extra in conditions:
        envs_by_extra.setdefault(extra, set()).add(env)
    if _EVERY in envs_by_extra:
        text = _env_text(frozenset(envs_by_extra[_EVERY]), domain)
        return f", {text}" if text else ""
    present = [state for state in extras if state in envs_by_extra]
    texts = [_env_text(frozenset(envs_by_extra[state]), domain) for state in present]
    if len(set(texts)) == 1:  # the same env condition for every state: said once
        shared = f", {texts[0]}" if texts[0] else ""
        return ", with " + "; ".join(_extra_text(s, domain) for s in present) + shared
    parts = [_extra_text(state, domain) + (f" ({text})" if text else "")
             for state, text in zip(present, texts, strict=True)]
    return ", with " + "; ".join(parts)


def _extra_text(state: Extra, domain: Domain) -> str:
    """``tensor_parallel_size=2 and config {num_hidden_layers=71} and vllm 0.32``: the parts
    of a state the domain varies (a fact the domain never varies is not mentioned)."""
    features, config, model, engine = state
    parts = []
    if len(domain.feature_states) > 1:
        parts.append(
            " and ".join(f"{k}={show_value(v)}" for k, v in features) or "no features given"
        )
    if len(domain.config_states) > 1:
        if config is None:
            parts.append("no model config")
        else:
            shown = ", ".join(f"{k}={show_value(v)}" for k, v in config)
            parts.append(f"config {{{shown}}}" if shown else "a config without those keys")
    if len(domain.model_states) > 1:
        parts.append(f"model {model[0]}" if model else "no model identity")
    if len(domain.engine_states) > 1:
        parts.append(" ".join(domain.engine_text(e, v) for e, v in engine) if engine
                     else "no engine version")
    return " and ".join(parts) or "no features given"


def _env_text(envs: frozenset[EnvState], domain: Domain) -> str:
    """How a set of env states reads: empty for all of them, else "unless X is set" or a list."""
    every = set(domain.env_states)
    if envs == every:
        return ""
    if () in envs:
        missing = [state for state in domain.env_states if state not in envs]
        return "unless " + " or ".join(_bindings_text(missing, domain))
    listed = [state for state in domain.env_states if state in envs]
    return "only with " + " or ".join(_bindings_text(listed, domain, set_verb=False))


def _bindings_text(states: list[EnvState], domain: Domain, *, set_verb: bool = True) -> list[str]:
    values: dict[str, list[str]] = {}
    for state in states:
        for name, value in state:
            values.setdefault(name, []).append(value)
    declared: dict[str, int] = {}
    for state in domain.env_states:
        for name, _ in state:
            declared[name] = declared.get(name, 0) + 1
    out = []
    for name, vs in values.items():
        if len(vs) == declared[name]:
            out.append(f"{name} is set" if set_verb else f"{name} set")
        else:
            out.extend(f"{name}={v}" for v in vs)
    return out


# -- rendering --------------------------------------------------------------------------------


def render_text(diff: PolicyDiff) -> str:
    """The human report; when the policies decide alike, one line saying so and over how many
    contexts. When the domain enumerates config, model or engine states, the report says so
    first."""
    if diff.equal:
        every = any(tuple(diff.fields) == v.names for v in VOCABULARIES.values())
        fields = "" if every else f" (fields {', '.join(diff.fields)})"
        return f"no decision differs over {diff.domain.size()} contexts{fields}\n"
    lines: list[str] = []
    enumerated = diff.domain.describe_enumeration()
    if enumerated:
        lines += [f"compared over {line}" for line in enumerated] + [""]
    for group in diff.groups():
        lines.append(f"{group.field}: {group.old} → {group.new}")
        for deciders in group.by_deciders:
            lines.append(f"  old: {_decider_text(deciders.old)}")
            lines.append(f"  new: {_decider_text(deciders.new)}")
            for line in summarize(deciders.contexts, diff.domain):
                lines.extend(
                    textwrap.wrap(
                        line,
                        WIDTH,
                        initial_indent="    ",
                        subsequent_indent="      ",
                        break_on_hyphens=False,
                    )
                )
        lines.append("")
    return "\n".join(lines)


def _decider_text(side: Side) -> str:
    if side.refused:
        return "a rule of the policy refuses the context"
    if side.error is not None:
        return "resolution fails"
    if not side.decider:
        return "resolves"
    return f"{side.decider} ({side.location})" if side.location else side.decider


def to_json(diff: PolicyDiff, old: Policy, new: Policy) -> dict[str, Any]:
    """The ``--json`` document: every change with its contexts listed one by one."""
    domain = diff.domain
    return {
        "equal": diff.equal,
        "old": old.stamp(),
        "new": new.stamp(),
        "fields": list(diff.fields),
        "domain": {
            "architectures": list(domain.architectures),
            "device_archs": {p: list(d) for p, d in domain.device_archs.items()},
            "env_states": [dict(s) for s in domain.env_states],
            "feature_states": [dict(s) for s in domain.feature_states],
            "config_states": [
                None if s is None else dict(s) for s in domain.config_states
            ],
            "config_predicates": list(domain.config_predicates),
            "model_states": [list(s) for s in domain.model_states],
            "engine_states": [dict(s) for s in domain.engine_states],
            "contexts": domain.size(),
        },
        "changes": [
            {
                "field": g.field,
                "old": _jsonable(g.by_deciders[0].old.value),
                "new": _jsonable(g.by_deciders[0].new.value),
                "count": g.count,
                "deciders": [
                    {
                        "old": d.old.to_dict(),
                        "new": d.new.to_dict(),
                        "summary": summarize(d.contexts, domain),
                        "contexts": [
                            {
                                "architecture": c.architecture,
                                "platform": c.platform,
                                "device_arch": c.device_arch,
                                "env": dict(c.env),
                                "features": dict(c.features),
                                "config": None if c.config is None else dict(c.config),
                                "model": list(c.model_names),
                                "engine": dict(c.engine),
                            }
                            for c in d.contexts
                        ],
                    }
                    for d in g.by_deciders
                ],
            }
            for g in diff.groups()
        ],
    }
