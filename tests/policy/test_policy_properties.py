"""Hypothesis properties of resolution, checked against an independent reference matcher."""

from __future__ import annotations

import json
import operator
from fnmatch import fnmatchcase

import pytest
from hypothesis import given
from hypothesis import strategies as st

from interlock.core.decision import CUDAGRAPH_MODES
from interlock.policy import Context, PolicyError, load_policy_text, resolve
from interlock.policy.trace import DEFAULTS, RULES

ARCHS = ["AlphaModel", "AlphaMoe", "BetaModel", "Gamma"]
CATALOG = {
    "AlphaModel": {"moe": False, "attention": "gqa"},
    "AlphaMoe": {"moe": True, "attention": "dsa"},
    "BetaModel": {"moe": True, "attention": "mla", "mtp": True},
}
PLATFORMS = ["cuda", "rocm", "cpu"]
DEVICES = ["", "gfx942", "gfx950", "sm_90"]
DEFAULTS_SET = {
    "runner": "mrv2",
    "cudagraph": "full_and_piecewise",
    "breakable": False,
    "compile": True,
}
OPS = {
    "gt": operator.gt,
    "ge": operator.ge,
    "lt": operator.lt,
    "le": operator.le,
    "eq": operator.eq,
    "ne": operator.ne,
    "in": lambda v, w: v in w,
}

names = lambda pool: st.one_of(  # noqa: E731
    st.sampled_from(pool), st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique=True)
)
field_values = {
    "runner": st.sampled_from(["mrv1", "mrv2", "mrv3"]),
    "cudagraph": st.sampled_from(CUDAGRAPH_MODES),
    "breakable": st.booleans(),
    "compile": st.booleans(),
    "capture_sizes": st.lists(st.integers(1, 64), min_size=1, max_size=3, unique=True),
}
feature_spec = st.one_of(
    st.integers(1, 8),
    st.lists(st.integers(1, 8), min_size=1, max_size=3),
    st.dictionaries(
        st.sampled_from(["gt", "ge", "lt", "le", "eq", "ne"]), st.integers(1, 8), min_size=1
    ),
    st.builds(lambda v: {"in": v}, st.lists(st.integers(1, 8), min_size=1, max_size=3)),
)
when_parts = {
    "architecture": names([*ARCHS, "Delta", "Alpha*", "*Model", "?eta*"]),
    "platform": names(PLATFORMS),
    "device_arch": names(["gfx9*", "gfx942", "sm_*"]),
    "attention": names(["gqa", "dsa", "mla"]),
    "moe": st.booleans(),
    "features": st.builds(lambda spec: {"tp": spec}, feature_spec),
}


@st.composite
def rules(draw) -> list[dict]:
    out = []
    for i in range(draw(st.integers(0, 8))):
        keys = draw(st.lists(st.sampled_from(sorted(when_parts)), max_size=3, unique=True))
        set_keys = draw(
            st.lists(st.sampled_from(sorted(field_values)), min_size=1, max_size=3, unique=True)
        )
        out.append(
            {
                "id": f"r{i}",
                "when": {k: draw(when_parts[k]) for k in keys},
                "set": {k: draw(field_values[k]) for k in set_keys},
                "reason": f"rule {i}",
            }
        )
    return out


@st.composite
def contexts(draw) -> Context:
    features = draw(st.one_of(st.just({}), st.builds(lambda v: {"tp": v}, st.integers(1, 8))))
    return Context(
        draw(st.sampled_from([*ARCHS, "Delta"])),
        draw(st.sampled_from(PLATFORMS)),
        draw(st.sampled_from(DEVICES)),
        features=features,
    )


def policy_of(rule_list: list[dict]):
    doc = {
        "schema_version": 1,
        "version": "prop",
        "catalog": CATALOG,
        "defaults": DEFAULTS_SET,
        "env": {},
        "rules": rule_list,
    }
    return load_policy_text(json.dumps(doc, indent=1), "prop.yaml")


def ref_matches(when: dict, ctx: Context) -> bool:
    """The `when` semantics written out independently of policy.conditions."""
    for key, want in when.items():
        if key in ("architecture", "platform", "device_arch"):
            patterns = want if isinstance(want, list) else [want]
            if not any(fnmatchcase(getattr(ctx, key), p) for p in patterns):
                return False
        elif key == "features":
            for name, spec in want.items():
                if name not in ctx.features:
                    return False
                ops = (
                    spec
                    if isinstance(spec, dict)
                    else {"in": spec}
                    if isinstance(spec, list)
                    else {"eq": spec}
                )
                if not all(OPS[op](ctx.features[name], w) for op, w in ops.items()):
                    return False
        else:
            traits = CATALOG.get(ctx.architecture, {})
            allowed = want if isinstance(want, list) else [want]
            if key not in traits or traits[key] not in allowed:
                return False
    return True


def expected(rule_list: list[dict], ctx: Context) -> dict:
    fields = dict(DEFAULTS_SET, capture_sizes=None)
    for rule in rule_list:
        if ref_matches(rule["when"], ctx):
            fields.update(rule["set"])
    if fields["breakable"]:
        fields["compile"] = False
    if fields["capture_sizes"] is not None:
        fields["capture_sizes"] = list(fields["capture_sizes"])
    return fields


@given(rules(), contexts())
def test_per_field_later_wins(rule_list, ctx) -> None:
    assert resolve(policy_of(rule_list), ctx).decision.to_dict() == expected(rule_list, ctx)


@given(rules(), contexts())
def test_trace_marks_exactly_the_matching_rules(rule_list, ctx) -> None:
    res = resolve(policy_of(rule_list), ctx)
    matched = [s.name for s in res.trace if s.stage == RULES and s.matched]
    assert matched == [r["id"] for r in rule_list if ref_matches(r["when"], ctx)]
    failed = [s for s in res.trace if s.stage == RULES and not s.matched]
    assert all(s.failure is not None for s in failed)


@given(rules(), contexts())
def test_deterministic(rule_list, ctx) -> None:
    first = resolve(policy_of(rule_list), ctx).to_dict()
    second = resolve(policy_of(rule_list), ctx).to_dict()
    assert first == second


@given(rules(), contexts(), st.sampled_from(sorted(field_values)), st.data())
def test_an_override_always_wins(rule_list, ctx, field, data) -> None:
    value = data.draw(field_values[field])
    policy = policy_of(rule_list)
    breakable = expected(rule_list, ctx)["breakable"]
    if field == "compile" and value is True and breakable:
        with pytest.raises(PolicyError, match="compile=true was forced"):
            resolve(policy, ctx, {field: value})
        return
    decision = resolve(policy, ctx, {field: value}).decision.to_dict()
    assert decision[field] == value


@given(rules(), contexts())
def test_the_named_setter_matches_and_sets_that_value(rule_list, ctx) -> None:
    res = resolve(policy_of(rule_list), ctx)
    by_id = {r["id"]: r for r in rule_list}
    for field, prov in res.provenance.items():
        if prov.stage == RULES:
            rule = by_id[prov.source]
            assert ref_matches(rule["when"], ctx)
            value = rule["set"][field]
            assert prov.value == (tuple(value) if isinstance(value, list) else value)
        elif prov.stage == DEFAULTS:
            assert not any(ref_matches(r["when"], ctx) and field in r["set"] for r in rule_list)


@given(rules(), st.lists(contexts(), min_size=1, max_size=4), st.data())
def test_a_rule_matching_nothing_changes_no_decision(rule_list, ctxs, data) -> None:
    inert = {
        "id": "inert",
        "when": data.draw(
            st.sampled_from(
                [{"architecture": "NoSuchArch*"}, {"platform": "tpu"}, {"attention": "linear"}]
            )
        ),
        "set": {"runner": "mrv9", "breakable": True},
        "reason": "matches nothing",
    }
    position = data.draw(st.integers(0, len(rule_list)))
    before = policy_of(rule_list)
    after = policy_of([*rule_list[:position], inert, *rule_list[position:]])
    for ctx in ctxs:
        assert resolve(after, ctx).decision == resolve(before, ctx).decision
