"""The plugin-API range grammar is checked without ``packaging``; it must stay a subset of
PEP 440 specifier sets, and ``packaging`` decides what it contains."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.specifiers import SpecifierSet

from interlock.plugins.api import api_incompatibility, check_api_range

_release = st.lists(st.integers(0, 30), min_size=1, max_size=3).map(
    lambda parts: ".".join(map(str, parts))
)


@st.composite
def _clause(draw: st.DrawFn) -> str:
    op = draw(st.sampled_from(["~=", "==", "!=", ">=", "<=", ">", "<"]))
    version = draw(_release)
    if op == "~=" and "." not in version:
        version += ".0"
    if op in ("==", "!=") and draw(st.booleans()):
        version += ".*"
    space = draw(st.sampled_from(["", " "]))
    return f"{space}{op}{space}{version}{space}"


@given(st.lists(_clause(), min_size=1, max_size=4).map(",".join))
def test_every_accepted_range_is_a_pep440_specifier_set(text: str) -> None:
    assert check_api_range(text) == text
    expected = SpecifierSet(text).contains("1.0", prereleases=True)
    assert (api_incompatibility(text, "1.0") is None) == expected


@pytest.mark.parametrize(
    "text", ["1.x", ">=1.0;<2", "~=1", ">=1.*", "latest", ">= 1.0, ", "=== 1.0", ",>=1"]
)
def test_ranges_outside_the_grammar_are_refused_with_an_example(text: str) -> None:
    with pytest.raises(ValueError, match="is not a version range: write clauses such as"):
        check_api_range(text)


def test_an_empty_range_is_refused() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        check_api_range("  ")
