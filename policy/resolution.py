"""Resolution: the decision pipeline (docs/policy-reference.md) over a provenance draft.

Stages: defaults -> rules (file order, later wins per field) -> env bindings ->
explicit overrides -> capabilities (stage 5, supplied by the plugin layer as a
callable) -> implied (``breakable`` => ``compile: false``). Results are
memoized per policy for identical (context, overrides, capabilities).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from interlock.core.decision import (
    DECISION_FIELDS,
    IMPLICATIONS,
    Decision,
    Implication,
    check_field,
)
from interlock.core.errors import PolicyError
from interlock.policy.conditions import Facts
from interlock.policy.context import CATALOG, GIVEN, MODEL_CONFIG, Context
from interlock.policy.model import Deviation, Policy, Rule
from interlock.policy.trace import (
    DEFAULTS,
    ENV,
    IMPLIED,
    OVERRIDES,
    RULES,
    STAGES,
    Provenance,
    Step,
)

_MEMO_LIMIT = 4096


@dataclass(frozen=True)
class TraitFact:
    """A trait of the architecture with its origin: ``catalog``, ``model config`` or ``given``."""

    value: Any
    origin: str
    note: str = ""


class Draft:
    """The decision under construction: field values, their provenance, and steps per stage.

    Stage functions (including the plugin layer's capabilities stage) change it
    only through :meth:`assign` and :meth:`record`.
    """

    def __init__(self, policy: Policy, context: Context, facts: Facts) -> None:
        self.policy = policy
        self.context = context
        self.facts = facts
        self.values: dict[str, Any] = {}
        self.provenance: dict[str, Provenance] = {}
        self.steps: dict[str, list[Step]] = {stage: [] for stage in STAGES}
        #: Indices of the rules that matched (failures are worked out when the trace is built).
        self.matched_rules: set[int] = set()

    def assign(self, provenance: Provenance) -> None:
        self.values[provenance.field] = provenance.value
        self.provenance[provenance.field] = provenance

    def record(self, step: Step) -> None:
        self.steps[step.stage].append(step)


#: Stage 5: inspects the draft after overrides; falls back (assign + record) or raises PolicyError.
CapabilityCheck = Callable[[Draft], None]


@dataclass(frozen=True, eq=False)
class Resolution:
    """A decision with its provenance, the facts it was made on, and its (lazily built) trace."""

    decision: Decision
    provenance: dict[str, Provenance]
    context: Context
    traits: dict[str, TraitFact]
    policy: Policy
    _draft: Draft

    @property
    def in_catalog(self) -> bool:
        return self.context.architecture in self.policy.catalog

    @property
    def matched_rules(self) -> frozenset[int]:
        """Indices of the rules that matched (what the trace shows, without building it)."""
        return frozenset(self._draft.matched_rules)

    @cached_property
    def trace(self) -> tuple[Step, ...]:
        """Every step in stage order; every rule of the policy, matched or not."""
        draft = self._draft
        steps: list[Step] = [*draft.steps[DEFAULTS]]
        for rule in self.policy.rules:
            matched = rule.index in draft.matched_rules
            failure = None if matched else rule.when.first_failure(draft.facts)
            if not matched and failure is None:
                raise RuntimeError(f"the rule index skipped rule {rule.id!r}, which matches")
            sets = {name: s.value for name, s in rule.set.items()}
            overridden = {}
            if matched:
                for name in sets:
                    final = self.provenance[name]
                    if final.source != rule.id:
                        overridden[name] = f"{final.source} ({final.stage})"
            steps.append(
                Step(
                    stage=RULES,
                    name=rule.id,
                    location=rule.location,
                    sets=sets,
                    matched=matched,
                    failure=failure,
                    reason=rule.reason,
                    ref=rule.ref,
                    overridden=overridden,
                )
            )
        for stage in STAGES[2:]:
            steps.extend(draft.steps[stage])
        return tuple(steps)

    @cached_property
    def deviations(self) -> tuple[Deviation, ...]:
        """The policy's declared deviations from the engine that apply to this context."""
        facts, env = self._draft.facts, self.context.env
        return tuple(d for d in self.policy.deviations if d.applies(facts, env))

    def to_dict(self) -> dict[str, Any]:
        """The JSON document of ``policy resolve`` / ``policy explain --json``."""
        context = self.context.to_dict()
        context["traits"] = {
            k: {"value": t.value, "origin": t.origin, "note": t.note}
            for k, t in self.traits.items()
        }
        context["in_catalog"] = self.in_catalog
        return {
            "decision": self.decision.to_dict(),
            "provenance": {k: p.to_dict() for k, p in self.provenance.items()},
            "trace": [step.to_dict() for step in self.trace],
            "deviations": [d.to_dict() for d in self.deviations],
            "context": context,
            "policy": self.policy.stamp(),
        }


def resolve(
    policy: Policy,
    context: Context,
    overrides: Mapping[str, Any] | None = None,
    *,
    capabilities: CapabilityCheck | None = None,
) -> Resolution:
    """Decide for ``context`` under ``policy``; ``overrides`` (field -> typed value) win over all
    policy stages. ``capabilities`` (stage 5) must be hashable. Raises :class:`PolicyError`."""
    frozen = _freeze(overrides) if overrides else None
    key = (context, frozen, capabilities)
    memo = policy.memo
    hit = memo.get(key)
    if hit is not None:
        return hit
    resolution = _resolve(policy, context, frozen or (), capabilities)
    if len(memo) >= _MEMO_LIMIT:
        memo.clear()
    memo[key] = resolution
    return resolution


def _freeze(overrides: Mapping[str, Any]) -> tuple[tuple[str, Hashable], ...]:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in overrides.items()))


def _resolve(
    policy: Policy,
    context: Context,
    overrides: tuple[tuple[str, Any], ...],
    capabilities: CapabilityCheck | None,
) -> Resolution:
    traits = _traits(policy, context)
    facts = facts_of(context, {k: t.value for k, t in traits.items()})
    draft = Draft(policy, context, facts)
    _apply_defaults(draft)
    _apply_rules(draft)
    _apply_env(draft)
    _apply_overrides(draft, overrides)
    if capabilities is not None:
        capabilities(draft)
    _apply_implied(draft)
    decision = Decision(**draft.values)
    return Resolution(decision, dict(draft.provenance), context, traits, policy, draft)


def facts_of(context: Context, traits: Mapping[str, Any]) -> Facts:
    """What conditions see of ``context``, with its traits resolved to ``traits``."""
    return Facts(
        context.architecture,
        context.platform,
        context.device_arch,
        traits,
        context.features,
        context.config,
        context.model_names,
        context.engine,
    )


def context_facts(policy: Policy, context: Context) -> Facts:
    """What conditions see of ``context`` under ``policy`` (traits from the catalog, the
    model config and given ones), without resolving."""
    return facts_of(context, {k: t.value for k, t in _traits(policy, context).items()})


def _traits(policy: Policy, context: Context) -> dict[str, TraitFact]:
    traits: dict[str, TraitFact] = {}
    entry = policy.catalog.get(context.architecture)
    if entry is not None:
        for name, value in entry.traits.items():
            traits[name] = TraitFact(value, CATALOG, str(entry.location))
    for name, value in context.model_traits.items():
        origin = context.sources.get(f"traits.{name}", MODEL_CONFIG)
        known = traits.get(name)
        if known is None:
            traits[name] = TraitFact(value, origin)
        elif known.value != value:
            note = f"{known.note}; {origin} says {value}: the catalog wins"
            traits[name] = TraitFact(known.value, CATALOG, note)
    for name, value in context.traits.items():
        traits[name] = TraitFact(value, GIVEN)
    return traits


def _apply_defaults(draft: Draft) -> None:
    sets = {}
    for name, setting in draft.policy.defaults.items():
        draft.assign(
            Provenance(
                name, setting.value, DEFAULTS, "defaults", "policy default", setting.location
            )
        )
        sets[name] = setting.value
    first = next(iter(draft.policy.defaults.values()), None)
    draft.record(Step(DEFAULTS, "defaults", first.location if first else None, sets))


def _apply_rules(draft: Draft) -> None:
    facts = draft.facts
    rules = draft.policy.rules
    matched = draft.matched_rules
    setters: dict[str, Rule] = {}
    for i in draft.policy.index.candidates(facts.architecture, facts.platform, facts.traits):
        rule = rules[i]
        if rule.when.matches(facts):
            matched.add(i)
            # Later wins per field: only the last setter of each field needs a provenance.
            setters.update(dict.fromkeys(rule.set, rule))
    for name, rule in setters.items():
        setting = rule.set[name]
        draft.assign(
            Provenance(name, setting.value, RULES, rule.id, rule.reason, setting.location, rule.ref)
        )


def _apply_env(draft: Draft) -> None:
    context = draft.context
    for name, binding in draft.policy.env.items():
        if name not in context.env:
            draft.record(Step(ENV, name, binding.location, note="not set"))
            continue
        text = context.env[name]
        origin = context.source(f"env.{name}")
        if text not in binding.values:
            loc = binding.location
            raise PolicyError(
                f"{name}={text!r} ({origin}) is not a declared value; allowed: {binding.allowed()}",
                file=loc.file,
                line=loc.line,
                col=loc.col,
                path=f"env.{name}",
            )
        value = binding.values[text]
        reason = f"{name}={text} ({origin})"
        draft.assign(Provenance(binding.field, value, ENV, name, reason, binding.location))
        draft.record(Step(ENV, name, binding.location, {binding.field: value}, note=reason))


def _apply_overrides(draft: Draft, overrides: tuple[tuple[str, Any], ...]) -> None:
    order = {name: i for i, name in enumerate(DECISION_FIELDS)}
    for name, raw in sorted(overrides, key=lambda kv: order.get(kv[0], len(order))):
        try:
            value = check_field(name, raw)
        except ValueError as exc:
            raise PolicyError(f"override {exc}") from None
        draft.assign(Provenance(name, value, OVERRIDES, "override", "explicit override"))
        draft.record(
            Step(OVERRIDES, f"override {name}", sets={name: value}, note="explicit override")
        )


def _apply_implied(draft: Draft) -> None:
    for implication in IMPLICATIONS:
        _apply_implication(draft, implication)


def _apply_implication(draft: Draft, implication: Implication) -> None:
    """``when`` true sets ``then`` false (an error when ``then`` is forced true)."""
    when, then = implication.when, implication.then
    if draft.values.get(when) is not True or draft.values.get(then) is False:
        return
    then_from = draft.provenance[then]
    when_from = draft.provenance[when]
    if then_from.forced:
        raise PolicyError(
            f"{then}=true was forced by {then_from.source} ({then_from.stage}) but "
            f"{when}=true (from {when_from.source}, {when_from.stage}) {implication.why}; "
            f"force {when}=false or drop the {then} override"
        )
    reason = f"{when}=true (from {when_from.source}) implies {then}=false"
    draft.assign(Provenance(then, False, IMPLIED, when, reason, when_from.location))
    draft.record(
        Step(
            IMPLIED,
            f"{when} implies no {then}",
            when_from.location,
            {then: False},
            note=reason,
        )
    )
