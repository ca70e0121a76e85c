"""A later file drops an env binding (``NAME: null``) or locks it (``locked: true``) against
the files above it; a drop of nothing and a change to a locked binding are errors at the
later file's key."""

from __future__ import annotations

import pytest
from policy_texts import with_rules

from interlock.core.errors import PolicyError
from interlock.policy.context import Context
from interlock.policy.loader import load_policy_sources
from interlock.policy.resolution import resolve

BASE = with_rules()
HEAD = "schema_version: 1\nversion: site\nenv:\n"
DROP = HEAD + "  USE_V2: null\n"
LOCK = HEAD + '  USE_V2: {field: runner, values: {"0": mrv1, "1": mrv2}, locked: true}\n'
REPLACE = HEAD + '  USE_V2: {field: runner, values: {"1": mrv2}}\n'


def stack(*files: tuple[str, str]):
    return load_policy_sources([(name, text.encode()) for name, text in files], use_cache=False)


def error(*files: tuple[str, str]) -> str:
    with pytest.raises(PolicyError) as info:
        stack(*files)
    return str(info.value)


def test_null_drops_the_binding_so_the_variable_is_not_honoured() -> None:
    policy = stack(("base.yaml", BASE), ("site.yaml", DROP))
    assert "USE_V2" not in policy.env
    # The variable set in the context changes nothing: the policy no longer reads it.
    context = Context("DsaA", "rocm", env={"USE_V2": "0"})
    assert resolve(policy, context).decision.runner == "mrv2"


def test_a_later_file_binds_a_dropped_variable_again() -> None:
    policy = stack(("base.yaml", BASE), ("site.yaml", DROP), ("top.yaml", REPLACE))
    assert list(policy.env["USE_V2"].values) == ["1"]


def test_dropping_what_no_earlier_file_binds_is_an_error() -> None:
    text = error(("base.yaml", BASE), ("site.yaml", DROP.replace("USE_V2", "USE_V3")))
    assert text.startswith("site.yaml:4:3: env.USE_V3: null drops a binding of an earlier file")
    assert text.endswith("(bound: USE_V2) (did you mean 'USE_V2'?)")


def test_a_locked_binding_is_neither_replaced_nor_dropped() -> None:
    locked = ("site.yaml", LOCK)
    assert error(("base.yaml", BASE), locked, ("top.yaml", DROP)) == (
        "top.yaml:4:3: env.USE_V2: the binding is locked at site.yaml:4 (locked: true), so a "
        "later file cannot drop it"
    )
    assert "cannot replace it" in error(("base.yaml", BASE), locked, ("top.yaml", REPLACE))
    # Below the lock, a change is the lower files' own business.
    policy = stack(("base.yaml", BASE), ("mid.yaml", REPLACE), locked)
    assert list(policy.env["USE_V2"].values) == ["0", "1"]


def test_locked_must_be_a_boolean() -> None:
    text = error(("base.yaml", BASE), ("site.yaml", LOCK.replace("locked: true", "locked: 1")))
    assert "site.yaml:4:" in text and "env.USE_V2.locked" in text
