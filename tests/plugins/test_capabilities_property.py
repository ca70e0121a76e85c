"""Property: for generated runner capabilities, contexts and decisions, stage 5 ends in a
decision the chosen runner serves, or in an error whose cause is a forced value or a context
that no runner on the chain serves. Checked against a direct reading of the specs."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from plugin_builders import PIPELINE, registry_of, spec

from interlock.core.decision import CUDAGRAPH_MODES
from interlock.plugins import PlatformSupport, PluginRegistry, RunnerSpec, Unsupported
from interlock.plugins.capabilities import CapabilityError, apply_capabilities
from interlock.plugins.spec import SERVED_FIELDS
from interlock.policy import load_policy_text
from interlock.policy.conditions import Facts
from interlock.policy.context import Context
from interlock.policy.resolution import Draft
from interlock.policy.trace import CAPABILITIES, DEFAULTS, ENV, OVERRIDES, RULES, Provenance

NAMES = ("r0", "r1", "r2", "r3")
SPECULATIVE = Unsupported("speculative decoding", {"features": {"speculative": {"ne": False}}})
POLICY = load_policy_text(
    """\
schema_version: 1
version: "p"
defaults: {runner: r0, cudagraph: none, breakable: false, compile: false}
env:
  PICK: {field: runner, values: {"0": r0, "1": r1, "2": r2}}
rules: []
"""
)


@st.composite
def supports(draw: st.DrawFn) -> PlatformSupport:
    modes = {"none", *draw(st.sets(st.sampled_from(CUDAGRAPH_MODES[1:])))}
    return PlatformSupport(
        cudagraph=modes,
        breakable=len(modes) > 1 and draw(st.booleans()),
        compile=draw(st.booleans()),
        requires=draw(st.sets(st.just("has_triton"))),
    )


@st.composite
def registries(draw: st.DrawFn) -> PluginRegistry:
    specs = []
    for name in draw(st.lists(st.sampled_from(NAMES), unique=True, min_size=1)):
        specs.append(
            spec(
                name,
                draw(st.dictionaries(st.sampled_from(["cpu", "cuda"]), supports(), min_size=1)),
                unsupported=tuple(
                    draw(st.lists(st.sampled_from([PIPELINE, SPECULATIVE]), unique_by=id))
                ),
                fallback=draw(st.none() | st.sampled_from([n for n in NAMES if n != name])),
            )
        )
    return registry_of(*specs)


features = st.fixed_dictionaries(
    {},
    optional={
        "pipeline_parallel_size": st.sampled_from([1, 2]),
        "has_triton": st.booleans(),
        "speculative": st.booleans(),
    },
)
stages = st.sampled_from([DEFAULTS, RULES, ENV, OVERRIDES])


def serves(spec_: RunnerSpec, platform: str, feats: dict[str, Any], modes: dict[str, Any]) -> bool:
    """The oracle: a direct reading of a spec, independent of stage 5's code."""
    support = spec_.platforms.get(platform)
    if support is None or any(feats.get(f, True) is not True for f in support.requires):
        return False
    for item in spec_.unsupported:
        if item is PIPELINE and feats.get("pipeline_parallel_size", 1) > 1:
            return False
        if item is SPECULATIVE and feats.get("speculative", False) is not False:
            return False
    if "cudagraph" in modes and modes["cudagraph"] not in support.cudagraph:
        return False
    return all(not modes.get(f) or getattr(support, f) for f in ("breakable", "compile"))


def chain(registry: PluginRegistry, start: str) -> list[str]:
    """``start`` and its fallbacks, up to a missing runner (included) or a repeat."""
    names: list[str] = []
    name: str | None = start
    while name is not None and name not in names:
        names.append(name)
        found = registry.find(name)
        name = found.spec.fallback if found else None
    return names


@given(
    registry=registries(),
    platform=st.sampled_from(["cpu", "cuda", "tpu"]),
    feats=features,
    values=st.fixed_dictionaries(
        {
            "runner": st.sampled_from(NAMES),
            "cudagraph": st.sampled_from(CUDAGRAPH_MODES),
            "breakable": st.booleans(),
            "compile": st.booleans(),
        }
    ),
    field_stages=st.fixed_dictionaries({f: stages for f in ("runner", *SERVED_FIELDS)}),
)
def test_decision_is_served_or_the_error_has_a_cause(
    registry: PluginRegistry,
    platform: str,
    feats: dict[str, Any],
    values: dict[str, Any],
    field_stages: dict[str, str],
) -> None:
    context = Context("Dense", platform, features=feats)
    draft = Draft(POLICY, context, Facts("Dense", platform, "", {}, feats))
    for field, value in values.items():
        stage = field_stages[field]
        source = "PICK" if stage == ENV and field == "runner" else f"src-{field}"
        draft.assign(Provenance(field, value, stage, source, "generated"))
    forced = {f: values[f] for f in SERVED_FIELDS if draft.provenance[f].forced}
    runner_forced = draft.provenance["runner"].forced
    tried = [values["runner"]] if runner_forced else chain(registry, values["runner"])
    servable = [
        n
        for n in tried
        if registry.find(n) is not None and serves(registry.runner(n).spec, platform, feats, forced)
    ]

    try:
        apply_capabilities(draft, registry)
    except CapabilityError as error:
        assert not servable, f"{servable[0]} serves, yet: {error}"
        assert all(draft.provenance[f].forced for f in error.forced)
        context_ok = [
            n
            for n in tried
            if registry.find(n) is not None and serves(registry.runner(n).spec, platform, feats, {})
        ]
        if runner_forced:
            assert "runner" in error.forced
        elif error.forced:
            assert context_ok, "blamed forced values although the context is unserved"
        else:
            assert not context_ok or any(registry.find(n) is None for n in tried)
        return

    final = draft.values
    assert final["runner"] == servable[0]
    assert serves(
        registry.runner(final["runner"]).spec, platform, feats, {f: final[f] for f in SERVED_FIELDS}
    )
    assert all(final[f] == v for f, v in forced.items())
    steps = draft.steps[CAPABILITIES]
    hops = [s.sets["runner"] for s in steps if "runner" in s.sets]
    assert hops == tried[1 : tried.index(final["runner"]) + 1]
    for field in SERVED_FIELDS:
        if final[field] != values[field]:
            assert draft.provenance[field].stage == CAPABILITIES
            assert any(field in s.sets for s in steps)
