"""Properties of `policy diff` over generated policies."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from interlock.policy import load_policy_text
from interlock.policy.diff import diff_policies

TRAITS = {
    "DsaOne": {"moe": True, "attention": "dsa"},
    "DsaTwo": {"moe": True, "attention": "dsa"},
    "GqaDense": {"moe": False, "attention": "gqa"},
    "GqaMoe": {"moe": True, "attention": "gqa"},
    "Linear": {"moe": False, "attention": "linear"},
}
FIELD_VALUES = {
    "runner": st.sampled_from(["mrv1", "mrv2"]),
    "cudagraph": st.sampled_from(["none", "piecewise", "full_and_piecewise"]),
    "breakable": st.booleans(),
    "compile": st.booleans(),
    "capture_sizes": st.sampled_from([[1, 2, 4], [8]]),
}
CONDITIONS = {
    "architecture": st.one_of(
        st.sampled_from([*TRAITS, "Gqa*", "Uncatalogued"]),
        st.lists(st.sampled_from(list(TRAITS)), min_size=1, max_size=3, unique=True),
    ),
    "platform": st.one_of(st.sampled_from(["cuda", "rocm", "xpu"]), st.just(["cuda", "rocm"])),
    "device_arch": st.sampled_from(["gfx950", "gfx9*", "sm_90"]),
    "attention": st.sampled_from(["dsa", "gqa", ["mla", "linear"]]),
    "moe": st.booleans(),
    # One feature keeps the domain small: features multiply it.
    "features": st.sampled_from(
        [{"tensor_parallel_size": {"gt": 1}}, {"tensor_parallel_size": {"le": 2, "ne": 1}}]
    ),
}


@st.composite
def policies(draw: st.DrawFn) -> str:
    catalog = draw(st.lists(st.sampled_from(list(TRAITS)), min_size=1, max_size=5, unique=True))
    env = {}
    if draw(st.booleans()):
        env["USE_V2"] = {"field": "runner", "values": {"0": "mrv1", "1": "mrv2"}}
    if draw(st.booleans()):
        env["GRAPHS"] = {"field": "cudagraph", "values": {"off": "none", "on": "piecewise"}}
    rules = []
    for i in range(draw(st.integers(0, 4))):
        keys = draw(st.lists(st.sampled_from(list(CONDITIONS)), max_size=3, unique=True))
        fields = draw(
            st.lists(st.sampled_from(list(FIELD_VALUES)), min_size=1, max_size=2, unique=True)
        )
        rules.append(
            {
                "id": f"r{i}",
                "when": {k: draw(CONDITIONS[k]) for k in keys},
                "set": {f: draw(FIELD_VALUES[f]) for f in fields},
                "reason": f"generated rule number {i}",
            }
        )
    return json.dumps(
        {
            "schema_version": 1,
            "version": "gen",
            "catalog": {name: TRAITS[name] for name in catalog},
            "defaults": {
                "runner": "mrv2",
                "cudagraph": "full_and_piecewise",
                "breakable": False,
                "compile": True,
            },
            "env": env,
            "rules": rules,
        }
    )


@given(policies())
def test_a_policy_diffs_empty_against_itself(text: str) -> None:
    assert diff_policies(load_policy_text(text, "a.yaml"), load_policy_text(text, "b.yaml")).equal


@given(policies(), policies())
def test_both_directions_report_the_same_contexts(a_text: str, b_text: str) -> None:
    a, b = load_policy_text(a_text, "a.yaml"), load_policy_text(b_text, "b.yaml")
    forward = {(c.field, c.context) for c in diff_policies(a, b).changes}
    backward = {(c.field, c.context) for c in diff_policies(b, a).changes}
    assert forward == backward
