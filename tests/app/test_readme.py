"""The README and docs/ say what is true: the examples print what the commands print, the
file:line citations point where they say, and every relative link resolves."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from checkout import REPO

from interlock.cli import main

pytestmark = pytest.mark.usefixtures("isolated_env")

ELLIPSIS = "…"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
#: Sections whose ```console blocks run as they are, and print exactly what they show.
EXECUTED = [("docs/explain-and-tooling.md", "## Checking, testing and diffing a policy")]


def section(path: str, heading: str) -> str:
    text = (REPO / path).read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end != -1 else len(text)]


def console_blocks() -> list[tuple[str, list[str]]]:
    out = []
    for path, heading in EXECUTED:
        for block in re.findall(r"```console\n(.*?)```", section(path, heading), flags=re.S):
            command, *lines = block.rstrip("\n").split("\n")
            out.append((command.removeprefix("$ "), lines))
    return out


def run(command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> list[str]:
    monkeypatch.chdir(REPO)
    try:
        main(shlex.split(command)[1:])
    except SystemExit:
        pass  # an example may show an error
    captured = capsys.readouterr()
    return (captured.out + captured.err).rstrip("\n").split("\n")


def test_the_section_has_examples() -> None:
    commands = [command for command, _ in console_blocks()]
    assert len(commands) == 5 and all(c.startswith("policy ") for c in commands)


@pytest.mark.parametrize(("command", "shown"), console_blocks(), ids=lambda v: str(v)[:60])
def test_readme_example_is_current(command: str, shown: list[str], monkeypatch, capsys) -> None:
    printed = run(command, monkeypatch, capsys)
    if shown and shown[-1] == ELLIPSIS:
        assert printed[: len(shown) - 1] == shown[:-1]
    else:
        assert printed == shown


def explain_samples() -> list[tuple[Path, str, list[str]]]:
    """Each `$ policy explain` run a ```text block shows: page, command, lines shown."""
    out = []
    for page in PAGES:
        for block in re.findall(r"```text\n(\$ policy explain .*?)```", page.read_text(),
                                flags=re.S):
            for run_ in re.split(r"^\$ ", block, flags=re.M)[1:]:
                command, *shown = run_.rstrip("\n").split("\n")
                out.append((page, command, [line for line in shown if line != "..."]))
    return out


@pytest.mark.parametrize(("page", "command", "shown"), explain_samples(),
                         ids=lambda v: v.name if isinstance(v, Path) else str(v)[:40])
def test_explain_samples_are_lines_of_the_real_output(page: Path, command: str,
                                                      shown: list[str], monkeypatch,
                                                      capsys) -> None:
    """A sample may leave lines out (the front page cuts it), never change one."""
    printed = run(command, monkeypatch, capsys)
    missing = [line for line in shown if line and line not in printed]
    assert not missing, f"{page.name}: lines `{command}` no longer prints: {missing}"
    # A sample shown from its first line shows the header whole (what was decided for, by
    # which policy, for which release): the `for vLLM ...` line went missing once.
    if "" in printed and shown[:1] == printed[:1]:
        head = printed[:printed.index("")]
        assert shown[:len(head)] == head, f"{page.name}: `{command}` begins with {head}"


def test_there_are_explain_samples() -> None:
    assert {page.name for page, _, _ in explain_samples()} >= {"README.md",
                                                               "explain-and-tooling.md"}


CITATION = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w.-]+\.yaml):(\d+)\b")
#: Words too common in an explain line to tie a citation to its line.
COMMON = {"policies", "yaml", "defaults", "rules", "given", "catalog", "trait", "env", "true",
          "false", "from", "set", "not"}


def _rules(lines: list[str]) -> dict[str, range]:
    """rule or deviation id -> the lines (1-based) of its block."""
    starts = [(i + 1, m.group(1)) for i, line in enumerate(lines)
              if (m := re.match(r"\s*- id: ([\w.-]+)", line))]
    spans = {}
    for k, (line, rid) in enumerate(starts):
        stop = starts[k + 1][0] if k + 1 < len(starts) else len(lines) + 1
        spans[rid] = range(line, stop)
    return spans


FIELDS = ("runner", "cudagraph", "breakable", "compile", "capture_sizes")


def _block(lines: list[str], key: str) -> range:
    """The lines (1-based) of a top-level key's block."""
    first = next((i for i, line in enumerate(lines) if line.startswith(f"{key}:")), None)
    if first is None:
        return range(0)
    stop = next((i for i in range(first + 1, len(lines))
                 if lines[i][:1] not in ("", " ", "#", "\t")), len(lines))
    return range(first + 1, stop + 1)


def citations() -> list[tuple[str, str, str, str, int]]:
    """(page:line, text before, text after, cited file, cited line) for every
    `FILE.yaml:N` in the docs; before/after stop at the neighbouring citations."""
    out = []
    for page in PAGES:
        text = page.read_text()
        # A page that writes its own files (docs/operators.md: `# file: site.yaml`) cites them.
        own = set(re.findall(r"^# file: (\S+)$", text, flags=re.M))
        for number, line in enumerate(text.split("\n"), 1):
            found = [m for m in CITATION.finditer(line) if m.group(1) not in own]
            for k, m in enumerate(found):
                lo = found[k - 1].end() if k else 0
                hi = found[k + 1].start() if k + 1 < len(found) else len(line)
                out.append((f"{page.name}:{number}", line[lo : m.start()], line[m.end() : hi],
                            m.group(1), int(m.group(2))))
    return out


def test_cited_lines_are_where_the_docs_say() -> None:
    """A citation beside rule X must be a line of rule X; beside `defaults`, a line of the
    defaults (the field's own line where a field is named just before it); any other, a line
    that holds one of the words around it (the trait, the variable, the test's name)."""
    assert any(cited == "policies.yaml" for *_, cited, _ in citations()), "no citation found"
    wrong = []
    for where, before, after, cited, line in citations():
        path = REPO / cited
        if not path.is_file():  # a file the page's own example writes (site.yaml)
            continue
        lines = path.read_text().split("\n")
        if not 1 <= line <= len(lines):
            wrong.append(f"{where}: {cited}:{line} is past the end ({len(lines)} lines)")
            continue
        text, segment = lines[line - 1], before + after
        rules = _rules(lines)
        named = [rid for rid in rules
                 if re.search(rf"(?<![\w-]){re.escape(rid)}(?![\w-])", segment)]
        if named:
            if not any(line in rules[rid] for rid in named):
                wrong.append(f"{where}: {cited}:{line} is not in rule {named[0]}")
        elif "defaults" in before:
            field = next((f for f in reversed(re.findall(r"[a-z_]+", before)) if f in FIELDS),
                         None)
            if line not in _block(lines, "defaults"):
                wrong.append(f"{where}: {cited}:{line} is not in the defaults")
            elif field is not None and not text.strip().startswith(f"{field}:"):
                wrong.append(f"{where}: {cited}:{line} ({text.strip()!r}) is not {field}")
        else:
            words = {w for w in re.findall(r"[A-Za-z_][\w-]{2,}", segment)
                     if w.lower() not in COMMON}
            if not any(w in text for w in words):
                wrong.append(f"{where}: {cited}:{line} ({text.strip()!r}) holds none of "
                             f"{sorted(words)}")
    assert not wrong, "\n".join(wrong)


def test_relative_links_resolve() -> None:
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, broken


def test_the_front_page_is_a_front_page() -> None:
    assert len((REPO / "README.md").read_text().split("\n")) <= 250
