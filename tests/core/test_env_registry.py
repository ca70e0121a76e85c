"""The ``INTERLOCK_*`` registry is the whole truth: the source reads no other variable,
every registered one is read, and docs/operators.md carries the registry's table."""

from __future__ import annotations

import inspect
import re

from checkout import REPO, layout

from interlock.core import env

NAME = re.compile(r"INTERLOCK_[A-Z_]+")
ENTRIES = {attr: value for attr, value in vars(env).items() if isinstance(value, env.EnvVar)}


def _sources() -> dict[str, str]:
    return {name: path.read_text() for name, path in layout.module_files().items()
            if name != "interlock.core.env"}


def test_the_source_names_only_registered_variables() -> None:
    registered = {v.name for v in env.VARIABLES}
    named = {(module, found) for module, text in _sources().items()
             for found in NAME.findall(text)}
    assert {(module, found) for module, found in named if found not in registered} == set()


def test_every_entry_is_in_the_registry_once_and_read_by_name() -> None:
    assert sorted(ENTRIES.values(), key=env.VARIABLES.index) == list(env.VARIABLES)
    assert len({v.name for v in env.VARIABLES}) == len(env.VARIABLES)
    # Read by a module, or once where a run or a command starts (Settings.read).
    texts = [*_sources().values(), inspect.getsource(env.Settings.read)]
    unread = [attr for attr in ENTRIES if not any(f"{attr}.name" in text for text in texts)]
    assert unread == []


def test_each_variable_is_documented_where_its_entry_says() -> None:
    for variable in env.VARIABLES:
        assert variable.name in (REPO / variable.doc).read_text(), variable


def test_the_operators_page_carries_the_registry_table() -> None:
    assert env.table() in (REPO / "docs" / "operators.md").read_text()
