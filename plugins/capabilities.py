"""Stage 5 of the decision pipeline: what the chosen runner plugin can serve.

A value from defaults or rules that the runner cannot serve (``PlatformSupport.serves``)
falls back along a declared chain (the runner's ``fallback``; each decision field's own, from
:class:`interlock.core.decision.Decision`: cudagraph ``full_and_piecewise -> piecewise ->
none``, ``full``/``full_decode_only -> none``; breakable and compile -> false), each step
recorded with its reason. A value forced by an env binding or an override that cannot be
served is an error naming every unsupported item and how to choose otherwise. Nothing
changes without a trace step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from interlock.core.decision import FIELDS, Decision
from interlock.core.errors import PolicyError
from interlock.core.fields import show_scalar
from interlock.plugins import PluginRegistry, RegisteredRunner, RunnerSpec, load_registry
from interlock.plugins.spec import (
    CONTEXT,
    FIELD,
    IMPLICATION,
    REQUIRABLE_FACTS,
    SERVED_FIELDS,
    Unserved,
)
from interlock.policy.conditions import FeatureMatch, NameMatch
from interlock.policy.context import ASSUMED
from interlock.policy.trace import CAPABILITIES, ENV, OVERRIDES, RULES, Provenance, Step

if TYPE_CHECKING:
    from interlock.policy.model import Policy
    from interlock.policy.resolution import Draft

#: The context feature naming how many ranks the model is sharded across.
TENSOR_PARALLEL = "tensor_parallel_size"


class CapabilityError(PolicyError):
    """No supported decision exists without changing an input.

    ``forced`` names the forced fields at fault; it is empty when the context
    itself (platform, features, facts) is what no runner on the chain can serve.
    """

    def __init__(self, message: str, *, forced: tuple[str, ...] = (),
                 details: tuple[str, ...] = ()) -> None:
        super().__init__(message, details=details)
        self.forced = forced


class CapabilityStage:
    """Stage 5 as ``interlock.policy.resolution`` takes it: hashable (by identity), callable
    on a draft."""

    def __init__(self, registry: PluginRegistry) -> None:
        self.registry = registry

    def __call__(self, draft: Draft) -> None:
        apply_capabilities(draft, self.registry)


_stages: dict[int, CapabilityStage] = {}


def capability_stage(registry: PluginRegistry | None = None) -> CapabilityStage:
    """The stage for ``registry`` (default: the process's plugin registry); the same object
    for the same registry, so resolutions stay memoized."""
    registry = registry or load_registry()
    stage = _stages.get(id(registry))
    if stage is None or stage.registry is not registry:
        stage = _stages[id(registry)] = CapabilityStage(registry)
    return stage


def capabilities_for(
    policy: Policy, registry: PluginRegistry | None = None,
) -> CapabilityStage | None:
    """Stage 5 for ``registry`` (default: the process's) where ``policy``'s decisions are for
    interlock's runners; None for an engine without a runner axis (SGLang), whose decisions
    no runner plugin serves."""
    return capability_stage(registry) if policy.vocabulary.runners else None


def fact(draft: Draft, name: str) -> tuple[Any, str]:
    """A machine fact the runners may require, with its origin. Without one in the context it is
    assumed true: the platform was then named for another machine, which cannot be probed here."""
    features = draft.context.features
    if name in features:
        return features[name], draft.context.source(f"features.{name}")
    return True, f"{ASSUMED} (not given for a named platform)"


def judge(spec: RunnerSpec, draft: Draft, values: Mapping[str, Any] | None = None
          ) -> list[Unserved]:
    """What ``spec`` does not serve of the draft's decision (or of ``values``) in its
    context: ``RunnerSpec.unserved``, given the context's platform, tensor-parallel size and
    the facts runners may require. Pairs of values that exclude each other are left to the
    implied stage, which follows this one and resolves them (or refuses a forced one)."""
    size = draft.context.features.get(TENSOR_PARALLEL, 1)
    return [
        item for item in spec.unserved(
            Decision(**(draft.values if values is None else values)),
            draft.context.platform,
            tensor_parallel_size=size if isinstance(size, int) else 1,
            facts={name: fact(draft, name)[0] for name in REQUIRABLE_FACTS},
        )
        if item.kind != IMPLICATION
    ]


def unsupported_items(
    spec: RunnerSpec, draft: Draft, forced: Mapping[str, Any]
) -> list[tuple[str, str]]:
    """Everything ``spec`` cannot serve, as (field at fault, message): ``runner`` for the
    context (platform, facts, features), or the forced decision field at fault."""
    platform = draft.context.platform
    unserved = judge(spec, draft)
    items = []
    for item in (u for u in unserved if u.kind == CONTEXT):
        if item.field == "platform":
            return [("runner", f"{spec.name} does not serve platform {platform} "
                               f"(it serves: {item.offered})")]
        if item.field == "requires":
            value, origin = fact(draft, item.value)
            items.append(("runner", f"{spec.name} requires {item.what} on {platform} "
                                    f"({item.value}={show_scalar(value)}, {origin})"))
        else:
            origin = draft.context.source(f"features.{TENSOR_PARALLEL}")
            items.append(("runner", f"{spec.name} does not serve {item.what} on {platform} "
                                    f"({origin}; it serves {item.offered})"))
    for unsupported in spec.unsupported:
        condition = unsupported.condition
        if condition.matches(draft.facts):
            observed = ", ".join(_observed(c, draft) for c in condition.conditions)
            items.append(
                ("runner", f"{spec.name} does not support {unsupported.feature} ({observed})")
            )
    for item in unserved:
        if item.kind == FIELD and item.field in forced:
            offered = f" (it supports: {item.offered})" if item.offered else ""
            items.append(
                (item.field, f"{spec.name} does not support {item.what} on {platform}{offered}")
            )
    return items


def apply_capabilities(draft: Draft, registry: PluginRegistry) -> None:
    """Check the draft's runner, then each decision field the runner declares, against the
    runner's spec; an unserved value falls back along its field's chain."""
    chosen = _choose_runner(draft, registry)
    name, platform = chosen.spec.name, draft.context.platform
    support = chosen.spec.platforms[platform]

    def serves(field: str, value: Any) -> bool:
        tried = {**draft.values, field: value}
        return not any(u.field == field for u in judge(chosen.spec, draft, tried))

    for unserved in [u for u in judge(chosen.spec, draft) if u.kind == FIELD]:
        field, spec = unserved.field, FIELDS[unserved.field]
        chain = [unserved.value]
        while not serves(field, chain[-1]):
            chain.append(spec.next(chain[-1]))
            why = f"{name} does not support {spec.what(chain[-2])} on {platform}"
            draft.record(
                Step(
                    CAPABILITIES,
                    f"{field} {show_scalar(chain[-2])} -> {show_scalar(chain[-1])}",
                    sets={field: chain[-1]},
                    note=why,
                )
            )
        why = f"{name} does not support {unserved.what} on {platform}"
        if unserved.offered:
            why += f" (it supports: {unserved.offered}); downgraded {' -> '.join(chain)}"
        draft.assign(Provenance(field, chain[-1], CAPABILITIES, name, why))
    draft.record(
        Step(
            CAPABILITIES,
            f"runner {name}",
            note=f"provided by plugin {chosen.plugin.provider}; on {platform} it serves "
            + "; ".join(support.describe(f) for f in SERVED_FIELDS)
            + _tensor_parallel_note(support.max_tensor_parallel_size),
        )
    )


def _tensor_parallel_note(limit: int | None) -> str:
    """What a runner's capabilities step says about tensor parallelism (nothing without it)."""
    if limit == 1:
        return ""
    return f"; {TENSOR_PARALLEL} up to {'any size' if limit is None else limit}"


def _choose_runner(draft: Draft, registry: PluginRegistry) -> RegisteredRunner:
    given = draft.provenance["runner"]
    forced = {
        f: draft.values[f]
        for f in SERVED_FIELDS
        if f in draft.provenance and draft.provenance[f].forced
    }
    name = draft.values["runner"]
    tried: dict[str, list[tuple[str, str]]] = {}
    while True:
        chosen = registry.find(name)
        if chosen is None:
            if not tried:
                raise CapabilityError(
                    f"runner={name} ({_origin(given)}): {registry.why_missing(name)}",
                    forced=("runner",) if given.forced else (),
                )
            previous = list(tried)[-1]
            raise CapabilityError(
                f"{previous} cannot serve this context and falls back to "
                f"{name}: {registry.why_missing(name)}"
            )
        items = unsupported_items(chosen.spec, draft, forced)
        if not items:
            break
        tried[name] = items
        fallback = chosen.spec.fallback
        if given.forced or fallback is None or fallback in tried:
            raise _unservable(draft, registry, given, tried, forced)
        draft.record(
            Step(
                CAPABILITIES,
                f"runner {name} -> {fallback}",
                sets={"runner": fallback},
                note="; ".join(text for _, text in items)
                + f"; fallback declared by {name} in plugin {chosen.plugin.provider}",
            )
        )
        name = fallback
    if tried:
        first = list(tried)[0]
        draft.assign(
            Provenance(
                "runner",
                name,
                CAPABILITIES,
                first,
                f"{first} (from {_origin(given)}) cannot serve this context: "
                f"{'; '.join(text for _, text in tried[first])}; "
                f"fell back to {name}",
            )
        )
    return chosen


def _unservable(
    draft: Draft,
    registry: PluginRegistry,
    given: Provenance,
    tried: Mapping[str, list[tuple[str, str]]],
    forced: Mapping[str, Any],
) -> CapabilityError:
    """The error when the runner, or every runner on its chain, cannot serve."""
    if given.forced:
        at_fault = ["runner", *sorted({f for f, _ in tried[given.value] if f != "runner"})]
        head = f"runner={given.value} is forced by {_origin(given)} but cannot be served:"
    else:
        # Forced graph values are at fault when some runner on the chain serves the rest.
        at_fault = sorted(
            {
                f
                for items in tried.values()
                if all(f != "runner" for f, _ in items)
                for f, _ in items
            }
        )
        what = (
            f"forced {', '.join(f'{f}={show_scalar(forced[f])}' for f in at_fault)} "
            "cannot be served"
            if at_fault
            else "no runner can serve this context"
        )
        head = (
            f"{what}: runner={given.value} ({_origin(given)}) and its fallbacks "
            f"({' -> '.join(tried)}):"
        )
    details = (
        *(f"  - {text}" for items in tried.values() for _, text in items),
        "to choose otherwise:",
        *(f"  - {hint}" for hint in _alternatives(draft, registry, at_fault, forced, tried)),
    )
    return CapabilityError(head, forced=tuple(at_fault), details=details)


def _alternatives(
    draft: Draft,
    registry: PluginRegistry,
    at_fault: list[str],
    forced: Mapping[str, Any],
    tried: Mapping[str, list[tuple[str, str]]],
) -> list[str]:
    """How to choose otherwise: the runners that serve the context with every forced value,
    and for each forced graph value at fault, what the runners tried serve instead."""
    servable = [
        r.spec.name
        for r in registry.runners()
        if r.spec.name not in tried and not unsupported_items(r.spec, draft, forced)
    ]
    hints = []
    if "runner" in at_fault:
        hints.append(_runner_hint(draft, draft.provenance["runner"], servable))
    elif servable:
        hints.append(
            f"choose a runner that serves it ({', '.join(servable)}) with a rule or "
            f"--set runner={servable[0]}"
        )
    platform = draft.context.platform
    for field in (f for f in at_fault if f in SERVED_FIELDS):
        prov = draft.provenance[field]
        how = f"unset {prov.source}" if prov.stage == ENV else f"drop the {field} override"
        offers = []
        for name, items in tried.items():
            # Only runners the context itself does not rule out can offer a value.
            if any(f == "runner" for f, _ in items):
                continue
            support = registry.runner(name).spec.platforms[platform]
            verb = "has" if FIELDS[field].kind == "switch" else "serves"
            offers.append(f"{name} {verb} {support.describe(field)}")
        hints.append(
            f"{how} ({field}={show_scalar(forced[field])}); on {platform} {'; '.join(offers)}"
        )
    if not servable:
        values = ", ".join(f"{f}={show_scalar(v)}" for f, v in forced.items())
        hints.append(
            f"no other registered runner serves this context{f' with {values}' if values else ''}"
            f" (registered: {', '.join(registry.runner_names()) or 'none'}); change the context "
            "or install a runner plugin that serves it"
        )
    return hints


def _runner_hint(draft: Draft, prov: Provenance, servable: list[str]) -> str:
    if not servable:
        return f"unset {prov.source}" if prov.stage == ENV else "drop the runner override"
    if prov.stage == ENV:
        binding = draft.policy.env[prov.source]
        values = [
            f"{prov.source}={text} ({value})"
            for text, value in binding.values.items()
            if value in servable
        ]
        choice = " or ".join(values) if values else "no value of it names one of them"
        return (
            f"unset {prov.source} to let the policy decide, or set {choice}; "
            f"runners that serve this context: {', '.join(servable)}"
        )
    return (
        f"drop the runner override, or override with one of: "
        f"{', '.join(f'runner={name}' for name in servable)}"
    )


def _origin(prov: Provenance) -> str:
    """Who set a field, as a message names it."""
    where = f" at {prov.location}" if prov.location else ""
    if prov.stage == ENV:
        return prov.reason or prov.source
    if prov.stage == OVERRIDES:
        return f"an explicit override ({prov.field}={show_scalar(prov.value)})"
    if prov.stage == RULES:
        return f"rule {prov.source}{where}"
    return f"{prov.stage}{where}"


def _observed(condition: Any, draft: Draft) -> str:
    facts = draft.facts
    if isinstance(condition, FeatureMatch):
        return f"{condition.key}={show_scalar(facts.features[condition.key])}"
    if isinstance(condition, NameMatch):
        return f"{condition.key}={getattr(facts, condition.key)}"
    return f"{condition.key}={show_scalar(facts.traits[condition.key])}"

