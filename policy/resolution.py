"""Resolution: the decision pipeline (docs/policy-reference.md) over a provenance draft.

Stages: defaults -> rules (file order, later wins per field) -> env bindings ->
explicit overrides -> capabilities (stage 5, supplied by the plugin layer as a
callable) -> implied (``breakable`` => ``compile: false``). Results are
memoized per policy for identical (context, overrides, capabilities).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from interlock.core.decision import Decision, Implication
from interlock.core.errors import PolicyError
from interlock.policy.conditions import Facts
from interlock.policy.context import (
    ARCHITECTURE_NAME,
    CATALOG,
    GIVEN,
    MODEL_CONFIG,
    Context,
    task_from_name,
)
from interlock.policy.model import Deviation, Location, Policy, Rule
from interlock.policy.release import releases
from interlock.policy.trace import (
    DEFAULTS,
    ENV,
    IMPLIED,
    OVERRIDES,
    REFUSAL,
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
        #: The refusing rule that refused the final decision, if one did.
        self.refusal: Refusal | None = None
        #: Indices of the matched rules with ``decided`` whose values the decision had.
        self.decided_rules: set[int] = set()

    def assign(self, provenance: Provenance) -> None:
        self.values[provenance.field] = provenance.value
        self.provenance[provenance.field] = provenance

    def record(self, step: Step) -> None:
        self.steps[step.stage].append(step)


#: Stage 5: inspects the draft after overrides; falls back (assign + record) or raises PolicyError.
CapabilityCheck = Callable[[Draft], None]
#: The engine stage: what the engine release the decision is handed to makes of the draft
#: (assign + record), or its refusal (``Draft.refusal``); raises PolicyError where it would
#: change a forced value.
EngineStage = Callable[[Draft], None]


@dataclass(frozen=True)
class Refusal:
    """Why a context is not to be run: a refusing rule of the policy (``rule``), or the engine
    release the decision is handed to (the engine stage: ``rule`` None, ``by`` naming the
    release and ``location`` the engine's own ``file:line``)."""

    by: str
    location: Location | None
    message: str
    reason: str
    ref: str | None
    #: The decided fields refused, each with what decided its value.
    decided: dict[str, Provenance]
    rule: Rule | None = None

    @classmethod
    def of_rule(cls, rule: Rule, decided: dict[str, Provenance]) -> Refusal:
        return cls(rule.id, rule.location, rule.refuse or "", rule.reason, rule.ref, decided,
                   rule)

    @property
    def who(self) -> str:
        """``rule R`` for the policy's refusal, the engine release's name for the engine's."""
        return f"rule {self.by}" if self.rule is not None else self.by

    def describe(self) -> str:
        """``refused by rule R (file:line): MESSAGE [runner=mrv1 from VLLM_USE_V2_MODEL_RUNNER
        (env)]``: one line naming who refuses and what decided the refused values."""
        where = f" ({self.location})" if self.location is not None else ""
        text = f"refused by {self.who}{where}: {self.message}"
        if self.decided:
            why = ", ".join(
                f"{name}={_shown(p.value)} from {p.source} ({p.stage})"
                for name, p in self.decided.items()
            )
            text += f" [{why}]"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.by if self.rule is not None else None,
            "by": self.by,
            "message": self.message,
            "reason": self.reason,
            "ref": self.ref,
            "location": self.location.to_dict() if self.location is not None else None,
            "decided": {name: p.to_dict() for name, p in self.decided.items()},
        }


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class PolicyRefused(PolicyError):
    """The policy refuses the context (a rule's ``refuse``): exit code ``refused``.

    ``resolution`` is the refused resolution, trace and all, for those who show it."""

    kind = "refused"

    def __init__(self, resolution: Resolution) -> None:
        refusal = resolution.refusal
        assert refusal is not None
        # The rule's (or the engine's) file:line is in the message, which names it.
        super().__init__(refusal.describe(), details=(f"why: {refusal.reason}",))
        self.resolution = resolution
        self.refusal = refusal


def check_refusal(resolution: Resolution) -> None:
    """Raise :class:`PolicyRefused` when a rule of the policy refuses ``resolution``.

    The one call for code that holds a resolution and must not run a refused one (an
    engine plugin, the ``LLM`` API); :func:`resolve` makes it unless asked not to."""
    if resolution.refusal is not None:
        raise PolicyRefused(resolution)


@dataclass(frozen=True, eq=False)
class Resolution:
    """A decision with its provenance, the facts it was made on, and its (lazily built) trace."""

    #: The decision in the policy's vocabulary: a :class:`Decision` for a vLLM policy (what
    #: interlock's runners and vLLM are handed), an ``SglangDecision`` for an SGLang one.
    decision: Decision
    provenance: dict[str, Provenance]
    context: Context
    traits: dict[str, TraitFact]
    policy: Policy
    _draft: Draft

    @property
    def refusal(self) -> Refusal | None:
        """The rule that refuses this context's decision, if one does."""
        return self._draft.refusal

    @property
    def task(self) -> str:
        """The model's task as the policy sees it (the ``task`` trait, always known)."""
        return str(self.traits["task"].value)

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
            if rule.refuse is not None:
                steps.append(_refusing_step(rule, matched, failure, draft))
                continue
            if matched and rule.decided and rule.index not in draft.decided_rules:
                steps.append(
                    Step(
                        stage=RULES, name=rule.id, location=rule.location, sets=sets,
                        matched=False, reason=rule.reason, ref=rule.ref,
                        note=f"decided: wanted {_wanted(rule)}, the decision has "
                        f"{_found(rule, draft)}",
                    )
                )
                continue
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
            "refusal": self.refusal.to_dict() if self.refusal else None,
            "task": self.task,
            "provenance": {k: p.to_dict() for k, p in self.provenance.items()},
            "trace": [step.to_dict() for step in self.trace],
            "deviations": [d.to_dict() for d in self.deviations],
            "context": context,
            "policy": self.policy.stamp(),
            # The vLLM releases the policy's files are written for (policy/release.py).
            "releases": [r.to_dict() for r in releases(self.policy)],
        }


def resolve(
    policy: Policy,
    context: Context,
    overrides: Mapping[str, Any] | None = None,
    *,
    capabilities: CapabilityCheck | None = None,
    refused: bool = False,
    engine: EngineStage | None = None,
) -> Resolution:
    """Decide for ``context`` under ``policy``; ``overrides`` (field -> typed value) win over all
    policy stages. ``capabilities`` (stage 5) and ``engine`` (the engine release's stage) must
    be hashable. Raises :class:`PolicyError`,
    and :class:`PolicyRefused` where a rule refuses the context unless ``refused`` asks for
    the refused resolution back (its ``refusal`` set) to show it."""
    frozen = _freeze(overrides) if overrides else None
    key = (context, frozen, capabilities, engine)
    memo = policy.memo
    resolution = memo.get(key)
    if resolution is None:
        resolution = _resolve(policy, context, frozen or (), capabilities, engine)
        if len(memo) >= _MEMO_LIMIT:
            memo.clear()
        memo[key] = resolution
    if not refused:
        check_refusal(resolution)
    return resolution


def _freeze(overrides: Mapping[str, Any]) -> tuple[tuple[str, Hashable], ...]:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in overrides.items()))


def _resolve(
    policy: Policy,
    context: Context,
    overrides: tuple[tuple[str, Any], ...],
    capabilities: CapabilityCheck | None,
    engine: EngineStage | None = None,
) -> Resolution:
    traits = _traits(policy, context)
    facts = facts_of(context, {k: t.value for k, t in traits.items()})
    draft = Draft(policy, context, facts)
    _apply_defaults(draft)
    _apply_rules(draft)
    _apply_env(draft)
    _apply_overrides(draft, overrides)
    _apply_decided_rules(draft)
    if capabilities is not None:
        capabilities(draft)
    _apply_implied(draft)
    if engine is not None:
        engine(draft)
    _apply_refusals(draft)
    decision = policy.vocabulary.decision(**draft.values)
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
    if "task" not in traits:
        # vLLM always settles on a task; without a reviewed or given one, its name decides.
        task, why = task_from_name(context.architecture)
        traits["task"] = TraitFact(task, ARCHITECTURE_NAME, why)
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


def matching_rules(policy: Policy, facts: Facts) -> Iterator[int]:
    """The indices, in file order, of the rules of ``policy`` whose ``when`` holds for
    ``facts``: all a context's features, config, model and engine mean to a resolution."""
    rules = policy.rules
    for i in policy.index.candidates(facts.architecture, facts.platform, facts.traits):
        if rules[i].when.matches(facts):
            yield i


def _apply_rules(draft: Draft) -> None:
    rules = draft.policy.rules
    matched = draft.matched_rules
    setters: dict[str, Rule] = {}
    for i in matching_rules(draft.policy, draft.facts):
        rule = rules[i]
        matched.add(i)
        if rule.decided:  # applied on the decision, after env bindings and overrides
            continue
        # Later wins per field: only the last setter of each field needs a provenance.
        setters.update(dict.fromkeys(rule.set, rule))  # a refusing rule sets nothing
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
    vocabulary = draft.policy.vocabulary
    order = {name: i for i, name in enumerate(vocabulary.names)}
    for name, raw in sorted(overrides, key=lambda kv: order.get(kv[0], len(order))):
        try:
            value = vocabulary.check(name, raw)
        except ValueError as exc:
            raise PolicyError(f"override {exc}") from None
        draft.assign(Provenance(name, value, OVERRIDES, "override", "explicit override"))
        draft.record(
            Step(OVERRIDES, f"override {name}", sets={name: value}, note="explicit override")
        )


def _apply_implied(draft: Draft) -> None:
    for implication in draft.policy.vocabulary.implications:
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


def _apply_refusals(draft: Draft) -> None:
    """The first refusing rule (file order) whose ``when`` held and whose ``decided`` values
    the final decision has refuses the context: the policy's own word comes before an engine
    stage's refusal."""
    for index in sorted(draft.matched_rules):
        rule = draft.policy.rules[index]
        if rule.refuses(draft.values):
            decided = {name: draft.provenance[name] for name in rule.decided}
            draft.refusal = Refusal.of_rule(rule, decided)
            draft.record(
                Step(REFUSAL, rule.id, rule.location, note=rule.refuse or "", refuse=rule.refuse)
            )
            return


def _apply_decided_rules(draft: Draft) -> None:
    """Rules with ``decided`` (and ``set``), in file order, on the decision after env bindings
    and overrides: where it has their ``decided`` values they set their fields, except those
    an env binding or an override forced (as an engine's defaults fill only what was not
    given)."""
    for index in sorted(draft.matched_rules):
        rule = draft.policy.rules[index]
        if not rule.decided or rule.refuse is not None:
            continue
        if not all(draft.values.get(k) == s.value for k, s in rule.decided.items()):
            continue
        draft.decided_rules.add(index)
        for name, setting in rule.set.items():
            if draft.provenance[name].forced:
                continue
            draft.assign(
                Provenance(
                    name, setting.value, RULES, rule.id, rule.reason, setting.location, rule.ref
                )
            )


def _wanted(rule: Rule) -> str:
    return " ".join(f"{k}={_shown(s.value)}" for k, s in rule.decided.items())


def _found(rule: Rule, draft: Draft) -> str:
    """The decision's values of the fields ``rule.decided`` names, as ``runner=mrv1``."""
    return " ".join(f"{k}={_shown(draft.values.get(k))}" for k in rule.decided)


def _refusing_step(rule: Rule, matched: bool, failure: Any, draft: Draft) -> Step:
    """A refusing rule's trace entry: its ``when`` failed, or the decision it found."""
    if not matched:
        note = ""
    elif rule.refuses(draft.values):
        note = "refuses this decision"
    else:
        note = f"does not refuse: the decision has {_found(rule, draft)}"
    return Step(
        stage=RULES, name=rule.id, location=rule.location, sets={}, matched=matched,
        failure=failure, reason=rule.reason, ref=rule.ref, note=note, refuse=rule.refuse,
    )
