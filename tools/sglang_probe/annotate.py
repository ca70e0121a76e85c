"""Give the shipped SGLang policy its citations and its catalog, from the installed SGLang.

Runs inside the .sglang venv (``make sglang``), like probe.py, and never imports SGLang:
it reads the installed package's source.

- ``ref:``: each rule's reason names the steps of SGLang's resolution that declared its
  values (``(_attention_backend_default, _handle_gpu_memory_settings)``) or the check
  that refused the context (``refuses it in _iquest_q1_overrides``). The first name is
  cited, as ``https://github.com/sgl-project/sglang/blob/v<release>/python/sglang/<path>#L<n>``:
  the line that defines the function of that name, or, for a step known by the source
  label its declarations carry (``declare_resolution(server_args, "_handle_gpu_memory_settings",
  ...)``), the line that defines the one function declaring under that label. A name
  defined twice, found nowhere, or declared from several functions is an error naming it.
- ``catalog:``: every architecture SGLang registers, as its model registry finds them
  (``sglang/srt/models/registry.py``: each module of ``sglang.srt.models`` with an
  ``EntryClass``, keyed by the classes' names). Read from the source rather than
  imported, since most model modules cannot import on this CPU machine (their GPU-only
  dependencies), where the registry itself would skip them with a warning. No traits:
  the registry says which classes exist, nothing of their attention or experts.

Everything else in the file stays byte for byte; a second run changes nothing.

Usage: annotate.py [--policy examples/sglang.yaml] [--check]
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import importlib.util
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
POLICY = REPO / "examples" / "sglang.yaml"
URL = "https://github.com/sgl-project/sglang/blob/v{release}/python/sglang/{path}#L{line}"
#: The step names of a reason: in its closing parentheses, or after "refuses it in".
NAMES_IN_PARENTHESES = re.compile(r"\(([\w, ]+)\)\s*$")
REFUSED_IN = re.compile(r"refuses it in (\w+)\s*$")
#: What records a step's source label (its second positional argument).
DECLARE = "declare_resolution"


class AnnotateError(RuntimeError):
    pass


class StepError(AnnotateError):
    """A step name with no one place in the package."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


def step_names(reason: str) -> list[str]:
    """The names of SGLang's steps a reason names, in order ([] if it names none)."""
    found = NAMES_IN_PARENTHESES.search(reason)
    if found:
        return [name.strip() for name in found.group(1).split(",") if name.strip()]
    refused = REFUSED_IN.search(reason)
    return [refused.group(1)] if refused else []


@dataclass(frozen=True)
class Site:
    """A line of the package's source: ``path`` relative to the package folder."""

    path: str
    line: int


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _label(call: ast.Call) -> str | None:
    """The source label of a ``declare_resolution(server_args, "label", ...)`` call."""
    func = call.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    if name != DECLARE or len(call.args) < 2:
        return None
    label = call.args[1]
    return label.value if isinstance(label, ast.Constant) and isinstance(label.value, str) else None


def _own_calls(function: ast.AST) -> Iterator[ast.Call]:
    """The calls in ``function``'s body, not in the functions nested in it (each is its own)."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Call):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def locate(package: Path, names: set[str]) -> dict[str, Site]:
    """Where each of ``names``, steps of SGLang's resolution, is declared in ``package``."""
    defined: dict[str, list[Site]] = {name: [] for name in names}
    declaring: dict[str, dict[Site, None]] = {name: {} for name in names}
    # One pass; only the files that hold a name are parsed (the package has thousands).
    for path in sorted(package.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if not any(name in text for name in names):
            continue
        tree = ast.parse(text, filename=str(path))
        relative = path.relative_to(package).as_posix()
        for function in _functions(tree):
            site = Site(relative, function.lineno)
            if function.name in defined:
                defined[function.name].append(site)
            for call in _own_calls(function):
                label = _label(call)
                if label in declaring:
                    declaring[label][site] = None
    return {name: _one(name, defined[name], list(declaring[name]), package)
            for name in sorted(names)}


def _one(name: str, defined: list[Site], declaring: list[Site], package: Path) -> Site:
    """The one site of ``name``: the function of that name, else the one function that
    declares under that label."""
    if len(defined) == 1:
        return defined[0]
    if len(defined) > 1:
        where = ", ".join(f"{s.path}:{s.line}" for s in defined)
        raise StepError(name, f"{name!r} is defined {len(defined)} times ({where})")
    if len(declaring) == 1:
        return declaring[0]
    if declaring:
        where = ", ".join(f"{s.path}:{s.line}" for s in declaring)
        raise StepError(name, f"{name!r} is declared from {len(declaring)} functions ({where})")
    raise StepError(
        name,
        f"{name!r} is neither a function of SGLang's nor a source label its "
        f"{DECLARE} calls give, in {package}",
    )


def registered(package: Path) -> list[str]:
    """The architectures SGLang's model registry registers: the names of the classes each
    module of ``sglang/srt/models`` lists as its ``EntryClass``."""
    models = package / "srt" / "models"
    names: dict[str, str] = {}
    for path in sorted(models.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in tree.body:
            if not (isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets
            )):
                continue
            value = node.value
            entries = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
            for entry in entries:
                name = _class_name(tree, entry, path)
                if name in names:
                    raise AnnotateError(
                        f"{name} is registered twice ({names[name]}, {path.name}), as "
                        "SGLang's registry refuses"
                    )
                names[name] = path.name
    if not names:
        raise AnnotateError(f"no EntryClass in {models}: not SGLang's model registry")
    return sorted(names)


def _class_name(tree: ast.Module, entry: ast.expr, path: Path) -> str:
    """The registry key of ``entry``: its class's ``__name__``, which is the name it is
    listed by only where the module defines or imports the class under that name."""
    where = f"{path.name}:{entry.lineno}"
    if not isinstance(entry, ast.Name):
        raise AnnotateError(f"EntryClass lists {ast.unparse(entry)!r} ({where}), not a class name")
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == entry.id:
            return entry.id
        if isinstance(node, ast.ImportFrom) and any(
            alias.name == entry.id and alias.asname is None for alias in node.names
        ):
            return entry.id
    raise AnnotateError(
        f"EntryClass lists {entry.id} ({where}), neither a class of the module nor imported "
        "by that name: its registry key is not known from the source"
    )


def _last_line(node: yaml.Node) -> int:
    """The 0-based last line of ``node``'s text (a block ends at the next line's column 0)."""
    end = node.end_mark
    return int(end.line if end.column > 0 else end.line - 1)


def _entry(mapping: yaml.MappingNode, key: str) -> tuple[yaml.Node, yaml.Node] | None:
    for k, v in mapping.value:
        if isinstance(k, yaml.ScalarNode) and k.value == key:
            return k, v
    return None


@dataclass(frozen=True)
class Edit:
    """Replace lines ``start`` to ``stop`` (0-based, exclusive) with ``lines``."""

    start: int
    stop: int
    lines: tuple[str, ...]


def annotate(text: str, package: Path, release: str) -> str:
    """``text``, a policy file, with each rule's ``ref:`` and the ``catalog:`` rewritten."""
    root = yaml.compose(text)
    if not isinstance(root, yaml.MappingNode):
        raise AnnotateError("the policy is not a mapping")
    version = _entry(root, "version")
    if version is None or version[1].value != f"sglang-{release}":
        said = version[1].value if version else None
        raise AnnotateError(f"version is {said!r}, not sglang-{release}: the installed SGLang's")
    listed = _entry(root, "rules")
    if listed is not None and not isinstance(listed[1], yaml.SequenceNode):
        raise AnnotateError(f"line {listed[0].start_mark.line + 1}: rules is not a list")
    rules = [_rule(node) for node in (listed[1].value if listed else [])]
    try:
        sites = locate(package, {name for _, name, _ in rules})
    except StepError as exc:
        citing = ", ".join(rule_id for _, name, rule_id in rules if name == exc.name)
        raise AnnotateError(f"rule {citing}: {exc}") from None
    edits = [_ref_edit(rule, sites[name], release) for rule, name, _ in rules]
    catalog = ["catalog:", *(f"  {name}: {{}}" for name in registered(package))]
    present = _entry(root, "catalog")
    if present is None:
        end = len(text.splitlines())
        edits.append(Edit(end, end, ("", *catalog)))
    else:
        key, value = present
        if key.start_mark.column != 0:
            raise AnnotateError(f"line {key.start_mark.line + 1}: catalog is not a block key")
        edits.append(Edit(key.start_mark.line, _last_line(value) + 1, tuple(catalog)))
    lines = text.splitlines()
    # From the bottom up, so that each edit's lines are where the text had them; of two at
    # one line, the later in the file first (the catalog after the last rule's ref).
    for _, edit in sorted(enumerate(edits), key=lambda p: (p[1].start, p[0]), reverse=True):
        lines[edit.start:edit.stop] = edit.lines
    return "\n".join(lines) + "\n"


def _rule(rule: yaml.Node) -> tuple[yaml.MappingNode, str, str]:
    """A rule's node, the first step its reason names, and its id."""
    line = rule.start_mark.line + 1
    if not isinstance(rule, yaml.MappingNode) or rule.flow_style:
        raise AnnotateError(f"line {line}: a rule is not a block mapping")
    rule_id = _entry(rule, "id")
    reason = _entry(rule, "reason")
    if rule_id is None or reason is None:
        raise AnnotateError(f"line {line}: a rule without an id or a reason")
    names = step_names(reason[1].value)
    if not names:
        raise AnnotateError(
            f"rule {rule_id[1].value}: its reason names no step of SGLang's "
            f"({reason[1].value!r})"
        )
    return rule, names[0], rule_id[1].value


def _ref_edit(rule: yaml.MappingNode, site: Site, release: str) -> Edit:
    """The edit that gives ``rule`` its ``ref:`` to ``site``, in its reason's indent."""
    reason = _entry(rule, "reason")
    assert reason is not None  # _rule checked it
    ref = " " * reason[0].start_mark.column + "ref: " + URL.format(
        release=release, path=site.path, line=site.line
    )
    present = _entry(rule, "ref")
    if present is None:
        after = _last_line(reason[1]) + 1
        return Edit(after, after, (ref,))
    return Edit(present[0].start_mark.line, _last_line(present[1]) + 1, (ref,))


def installed() -> tuple[Path, str]:
    """The installed SGLang's package folder and release, found without importing it."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise AnnotateError("no sglang package in this Python: run it with .sglang/bin/python")
    return Path(spec.submodule_search_locations[0]), importlib.metadata.version("sglang")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", type=Path, default=POLICY)
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if the file would change"
    )
    args = parser.parse_args(argv)
    try:
        package, release = installed()
        text = args.policy.read_text(encoding="utf-8")
        annotated = annotate(text, package, release)
    except (AnnotateError, OSError, yaml.YAMLError) as exc:
        print(f"sglang annotate: {exc}", file=sys.stderr)
        return 1
    if args.check:
        if annotated != text:
            print(f"{args.policy}: not what annotate.py writes (run make sglang-annotate)",
                  file=sys.stderr)
            return 1
        return 0
    if annotated != text:
        args.policy.write_text(annotated, encoding="utf-8")
    print(f"{args.policy}: refs and catalog from SGLang {release} ({package})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
