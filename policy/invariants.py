"""Invariants of a policy (the ``invariants:`` of a tests file), checked by enumeration.

A policy only tells contexts apart through what its rules mention, so its finite
:class:`~interlock.policy.domain.Domain` (every architecture x platform x device
arch x feature, config, model, engine and env state it mentions) stands for
every context. An invariant is checked on each context of the domain its
``forall`` selects; each context that violates it is a :class:`Counterexample`
with its decision and the rule (file:line) that decided the fields concerned.

Counterexamples are ordered simplest witness first (:func:`simplest_first`): one per
distinct violation (what decided the fields concerned, on which architecture) with
no env override and the fewest facts set, then the variants; a text report shows the
first :data:`SHOWN` and says how many there are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from interlock.core.errors import LocatedError, PolicyError
from interlock.policy.conditions import build_when
from interlock.policy.context import Context
from interlock.policy.diff import decider, show_value
from interlock.policy.domain import UNNAMED_DEVICE_ARCH, Domain
from interlock.policy.model import Policy
from interlock.policy.resolution import CapabilityCheck, Resolution, context_facts, resolve
from interlock.policy.testfile import LoadedInvariant

#: Counterexamples a text report shows per invariant (all are counted).
SHOWN = 10
#: The `policy test` flag that shows every counterexample.
ALL_FLAG = "--all-counterexamples"


@dataclass(frozen=True)
class Counterexample:
    context: Context
    #: The decision (field -> value); empty when resolution failed.
    decision: dict[str, Any]
    #: Field -> what decided it, ``rule rocm-dsa (p.yaml:40)``; the fields the claim is about.
    deciders: dict[str, str]
    error: str | None = None

    def describe(self) -> str:
        ctx = self.context
        place = f"{ctx.platform}/{ctx.device_arch or '(other)'}"
        facts = [f"{k}={v}" for k, v in sorted(ctx.env.items())] or ["env unset"]
        facts += [f"{k}={show_value(v)}" for k, v in ctx.features.items()]
        facts += [f"{e} {v}" for e, v in ctx.engine.items()]
        facts += [f"model {n}" for n in ctx.model_names]
        if ctx.config is not None:
            shown = ", ".join(f"{k}={show_value(v)}" for k, v in ctx.config.items())
            facts.append(f"config {{{shown}}}")
        head = f"{ctx.architecture} on {place}, {', '.join(facts)}"
        if self.error is not None:
            return f"{head}: resolution fails: {self.error}"
        decision = " ".join(f"{k}={show_value(v)}" for k, v in self.decision.items())
        who = "; ".join(f"{k} by {d}" for k, d in self.deciders.items())
        return f"{head}: decision {decision}; {who}"

    def violation(self) -> tuple[str, tuple[tuple[str, str], ...], str | None]:
        """What tells violations apart: the architecture and what decided the fields
        concerned (or the resolution error)."""
        return self.context.architecture, tuple(self.deciders.items()), self.error

    def complexity(self) -> tuple[int, int]:
        """(env overrides, other facts set): a named device arch, features, a model
        config, model names and engine versions each count one."""
        ctx = self.context
        facts = (
            (ctx.device_arch != UNNAMED_DEVICE_ARCH)
            + len(ctx.features)
            + (ctx.config is not None)
            + len(ctx.identity)
            + len(ctx.engine)
        )
        return len(ctx.env), facts

    def to_dict(self) -> dict[str, Any]:
        return {
            "context": self.context.to_dict(),
            "decision": {k: list(v) if isinstance(v, tuple) else v
                         for k, v in self.decision.items()},
            "decided_by": dict(self.deciders),
            "error": self.error,
        }


@dataclass
class InvariantResult:
    invariant: LoadedInvariant
    #: Contexts of the domain the invariant's ``forall`` selects.
    checked: int = 0
    counterexamples: list[Counterexample] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.counterexamples

    def claim(self) -> str:
        """The invariant in words: ``forall platform=rocm attention=dsa: expect runner=mrv1``."""
        inv = self.invariant.invariant
        forall = inv.forall.model_dump(by_alias=True, exclude_none=True)
        scope = "every context" if not forall else f"forall {_flow(forall)}"
        if inv.env:
            shown = ", ".join(f"{k}={'unset' if v is None else v}" for k, v in inv.env.items())
            scope += f" with {shown}"
        if inv.expect is not None:
            return f"{scope}: expect {_fields_text(_set(inv.expect))}"
        if inv.never is not None:
            return f"{scope}: never {_fields_text(_set(inv.never))}"
        assert inv.implies is not None
        return (f"{scope}: {_fields_text(_set(inv.implies.if_))} implies "
                f"{_fields_text(_set(inv.implies.then))}")

    def render(self, *, limit: int | None = SHOWN) -> list[str]:
        """The report's lines: every counterexample when ``limit`` is None, else the first
        ``limit`` and a line saying how many there are."""
        where = self.invariant.at()
        verdict = "PASS" if self.passed else "FAIL"
        head = f"{verdict}  invariant: {self.invariant.name}"
        if self.passed:
            return [f"{head}  ({self.claim()}; {self.checked} contexts)"]
        lines = [
            f"{head}  ({where.file}:{where.line})",
            f"      {self.claim()}: {len(self.counterexamples)} counterexample(s) in "
            f"{self.checked} contexts",
        ]
        total = len(self.counterexamples)
        if limit is not None and total > limit:
            lines.append(
                f"      showing {limit} of {total} counterexamples, the simplest witness of each "
                f"distinct violation first ({ALL_FLAG} shows all {total})"
            )
        shown = self.counterexamples if limit is None else self.counterexamples[:limit]
        lines += [f"      counterexample: {c.describe()}" for c in shown]
        return lines

    def to_dict(self) -> dict[str, Any]:
        where = self.invariant.at()
        return {
            "name": self.invariant.name,
            "location": where.to_dict(),
            "claim": self.claim(),
            "passed": self.passed,
            "checked": self.checked,
            "counterexamples": [c.to_dict() for c in self.counterexamples],
        }


def check_invariants(
    policy: Policy,
    invariants: Sequence[LoadedInvariant],
    *,
    capabilities: CapabilityCheck | None = None,
) -> list[InvariantResult]:
    """Check every invariant on the policy's domain (resolved once per context)."""
    if not invariants:
        return []
    _check_fields(policy, invariants)
    results = [InvariantResult(inv) for inv in invariants]
    scopes = [
        build_when(inv.invariant.forall.model_dump(by_alias=True, exclude_none=True))
        for inv in invariants
    ]
    for context in Domain.of(policy).contexts():
        facts = context_facts(policy, context)
        chosen = [
            i
            for i, scope in enumerate(scopes)
            if scope.matches(facts)
            and all(context.env.get(k) == v for k, v in invariants[i].invariant.env.items())
        ]
        if not chosen:
            continue
        try:
            resolution: Resolution | None = resolve(policy, context, capabilities=capabilities)
            error = None
        except LocatedError as exc:  # a policy's or a plugin's (stage 5) error
            resolution, error = None, exc.message
        for i in chosen:
            result = results[i]
            result.checked += 1
            example = _violation(result.invariant, context, resolution, error)
            if example is not None:
                result.counterexamples.append(example)
    for result in results:
        result.counterexamples = simplest_first(result.counterexamples)
    return results


def simplest_first(examples: Sequence[Counterexample]) -> list[Counterexample]:
    """The simplest witness of each distinct violation (fewest env overrides, then fewest
    facts set; domain order breaks ties), in that order, then every other counterexample
    in the same order: the plain case an edit changed is not buried under env variants."""
    ranked = sorted(examples, key=Counterexample.complexity)  # stable: domain order on ties
    first: dict[Any, Counterexample] = {}
    for example in ranked:
        first.setdefault(example.violation(), example)
    heads = {id(e) for e in first.values()}
    return [*first.values(), *(e for e in ranked if id(e) not in heads)]


def _violation(
    loaded: LoadedInvariant, context: Context, res: Resolution | None, error: str | None
) -> Counterexample | None:
    inv = loaded.invariant
    if res is None:
        # No decision: an expected one is missing; `never` and `implies` hold vacuously.
        if inv.expect is None:
            return None
        return Counterexample(context, {}, {}, error)
    decision = {k: v for k, v in res.decision.to_dict().items() if v is not None}
    if inv.expect is not None:
        wanted = _set(inv.expect)
        bad = [k for k, v in wanted.items() if not _has(decision, k, v)]
    elif inv.never is not None:
        wanted = _set(inv.never)
        bad = list(wanted) if all(_has(decision, k, v) for k, v in wanted.items()) else []
    else:
        assert inv.implies is not None
        premise, conclusion = _set(inv.implies.if_), _set(inv.implies.then)
        holds = all(_has(decision, k, v) for k, v in premise.items())
        missed = [k for k, v in conclusion.items() if not _has(decision, k, v)]
        bad = [*premise, *missed] if holds and missed else []
    if not bad:
        return None
    deciders = {}
    for name in dict.fromkeys(bad):
        prov = res.provenance.get(name)
        if prov is None:
            deciders[name] = "nothing (the runner chooses)"
        else:
            deciders[name] = decider(prov) + (f" ({prov.location})" if prov.location else "")
    return Counterexample(context, decision, deciders)


def _check_fields(policy: Policy, invariants: Sequence[LoadedInvariant]) -> None:
    """Every field an invariant names is one of the policy's (a tests file may name any
    engine's): else a :class:`PolicyError` at the invariant, not a claim that never holds."""
    vocabulary = policy.vocabulary
    for loaded in invariants:
        inv = loaded.invariant
        parts = [inv.expect, inv.never]
        if inv.implies is not None:
            parts += [inv.implies.if_, inv.implies.then]
        for part in parts:
            unknown = [n for n in _set(part) if n not in vocabulary.fields] if part else []
            if unknown:
                where = loaded.at()
                raise PolicyError(
                    f"invariant {inv.name!r}: {unknown[0]} is not a decision field of a "
                    f"{vocabulary.title} policy; its fields: {', '.join(vocabulary.names)}",
                    file=where.file, line=where.line,
                )


def _set(fields: Any) -> dict[str, Any]:
    return {name: getattr(fields, name) for name in type(fields).model_fields
            if name in fields.model_fields_set}


def _has(decision: Mapping[str, Any], name: str, wanted: Any) -> bool:
    got = decision.get(name)
    if isinstance(wanted, list):
        return got is not None and tuple(got) == tuple(wanted)
    return bool(got == wanted and type(got) is type(wanted))


def _fields_text(fields: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={show_value(v)}" for k, v in fields.items())


def _flow(data: Mapping[str, Any]) -> str:
    """``{platform: rocm, attention: dsa}``: a mapping as the file would write it inline."""
    parts = []
    for key, value in data.items():
        if isinstance(value, Mapping):
            parts.append(f"{key}: {_flow(value)}")
        elif isinstance(value, list):
            parts.append(f"{key}: [{', '.join(show_value(v) for v in value)}]")
        else:
            parts.append(f"{key}: {show_value(value)}")
    return "{" + ", ".join(parts) + "}"
