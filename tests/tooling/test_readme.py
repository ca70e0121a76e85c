"""The README's `policy check/test/diff` examples show what the commands really print."""

from __future__ import annotations

import re
import shlex

import pytest

from interlock.cli import main

from .conftest import REPO

SECTION = "## Checking, testing and diffing a policy"
ELLIPSIS = "…"


def console_blocks() -> list[tuple[str, list[str]]]:
    text = (REPO / "README.md").read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start : end if end != -1 else len(text)]
    blocks = re.findall(r"```console\n(.*?)```", section, flags=re.S)
    out = []
    for block in blocks:
        command, *lines = block.rstrip("\n").split("\n")
        out.append((command.removeprefix("$ "), lines))
    return out


def test_the_section_has_examples() -> None:
    commands = [command for command, _ in console_blocks()]
    assert len(commands) == 5 and all(c.startswith("policy ") for c in commands)


@pytest.mark.parametrize(("command", "shown"), console_blocks(), ids=lambda v: str(v)[:60])
def test_readme_example_is_current(command: str, shown: list[str], monkeypatch, capsys) -> None:
    monkeypatch.chdir(REPO)
    main(shlex.split(command)[1:])
    captured = capsys.readouterr()
    printed = (captured.out + captured.err).rstrip("\n").split("\n")
    if shown and shown[-1] == ELLIPSIS:
        assert printed[: len(shown) - 1] == shown[:-1]
    else:
        assert printed == shown
