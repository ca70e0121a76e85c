"""Issue 24, done when: the operator story (fleet table, a site policy layered and diffed,
site tests under pytest, the ``vllm serve`` line for TP=8 on MI355X) is docs/operators.md,
and this test runs it: the files it shows are written, each ``$ command`` is run in a shell
in that folder, and its standard output must be what the page shows (``…`` matches any
text; a line of only ``…`` any lines)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operators.md"
ELLIPSIS = "…"


def blocks() -> list[tuple[str, str]]:
    return re.findall(r"```(\w+)\n(.*?)```", PAGE.read_text(), flags=re.S)


def files() -> dict[str, str]:
    out = {}
    for _, body in blocks():
        first, _, rest = body.partition("\n")
        if first.startswith("# file: "):
            out[first.removeprefix("# file: ")] = rest
    return out


def commands() -> list[tuple[str, list[str]]]:
    out = []
    for kind, body in blocks():
        if kind == "console":
            command, *lines = body.rstrip("\n").split("\n")
            out.append((command.removeprefix("$ "), lines))
    return out


def matches(expected: list[str], actual: list[str]) -> bool:
    if not expected:
        return not actual
    head, *rest = expected
    if head == ELLIPSIS:
        return any(matches(rest, actual[i:]) for i in range(len(actual) + 1))
    if not actual:
        return False
    pattern = ".*".join(re.escape(part) for part in head.split(ELLIPSIS))
    return re.fullmatch(pattern, actual[0]) is not None and matches(rest, actual[1:])


def test_the_page_shows_the_whole_story() -> None:
    shown = [command.split()[:2] for command, _ in commands()]
    assert ["policy", "table"] in shown and ["policy", "diff"] in shown
    assert ["pytest", "-q"] in shown and ["policy", "vllm"] in shown
    assert {"site.yaml", "site.tests.yaml", "GLM-5.2/config.json"} <= set(files())


def test_the_ci_line_fails_on_a_misspelled_architecture() -> None:
    # Issue 52 item 12: the check a reader copies into CI passed a site rule whose
    # architecture was misspelled (a warning, exit 0 without --strict).
    checks = [command for command, _ in commands() if command.startswith("policy check")]
    assert "policy check --strict --policy @shipped:site.yaml" in checks
    typo = next(c for c in commands() if "typo.yaml" in c[0])
    assert typo[1][-1] == "exit 1" and "did you mean 'LlamaForCausalLM'" in typo[1][0]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("operator")
    for name, text in files().items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize(("command", "shown"), commands(), ids=lambda v: str(v)[:50])
def test_each_command_prints_what_the_page_shows(folder: Path, command: str, shown) -> None:
    bin_dir = os.path.dirname(sys.executable)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("INTERLOCK_POLICY", "VLLM_USE_"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", NO_COLOR="1", COLUMNS="80")
    done = subprocess.run(["bash", "-c", command], cwd=folder, env=env, capture_output=True,
                          text=True, check=False, timeout=300)
    actual = done.stdout.rstrip("\n").split("\n") if done.stdout.strip() else []
    assert matches(shown, actual), f"{command}\n--- shown\n" + "\n".join(shown) + (
        "\n--- printed\n" + done.stdout + "\n--- stderr\n" + done.stderr
    )
    wanted = 1 if "check --policy site.yaml" in command else 0
    assert done.returncode == wanted, done.stderr
