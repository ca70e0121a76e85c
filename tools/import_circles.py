"""Circles in this checkout's import graph: sets of modules each of which imports the others.

An import inside a function body (or under ``if TYPE_CHECKING:``) still ties two modules
together; it only keeps Python from noticing the circle at import time. grimp reads every
import statement of a module, wherever it stands, so the graph here (the one ``make lint``
hands import-linter: tools/lint_imports.py) shows the circles such imports hide.

    python tools/import_circles.py [--wing]

prints each circle, one a line, its modules sorted (a strongly connected set of more than one
module). ``--wing`` first collapses each module to its first two dotted components
(``interlock.runners.model.gguf.reader`` -> ``interlock.runners``): the circles between
packages. Exit status 1 when modules form a circle, with or without ``--wing``: a circle between
wings is shown, not failed, as the layers contract lets its ``:`` siblings import each other.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import tomllib
from layout import ROOT
from lint_imports import MappedGraphBuilder

#: Module -> the modules of the graph it imports directly.
Edges = Mapping[str, frozenset[str]]


def root_packages(root: Path = ROOT) -> list[str]:
    """The packages import-linter checks (``[tool.importlinter]``'s root package or packages),
    else the top-level packages the distribution ships."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    linter = pyproject.get("tool", {}).get("importlinter", {})
    if "root_packages" in linter:
        return list(linter["root_packages"])
    if "root_package" in linter:
        return [linter["root_package"]]
    return sorted(name for name in pyproject["tool"]["setuptools"]["packages"] if "." not in name)


def import_graph(roots: list[str]) -> dict[str, frozenset[str]]:
    """Every module under ``roots`` (the mapped root folders included) -> what it imports.

    No cache: a stale one would hide the circle just written.
    """
    graph = MappedGraphBuilder().build(roots, cache_dir=None)
    return {module: frozenset(graph.find_modules_directly_imported_by(module))
            for module in graph.modules}


def wing(module: str) -> str:
    """The first two dotted components of ``module``: ``interlock.policy.lint`` ->
    ``interlock.policy``."""
    return ".".join(module.split(".")[:2])


def collapse(edges: Edges, name: Callable[[str], str]) -> dict[str, frozenset[str]]:
    """The graph of ``name(module)``s; a group's imports of its own members are dropped."""
    merged: dict[str, set[str]] = {}
    for module, targets in edges.items():
        group = name(module)
        merged.setdefault(group, set()).update(name(t) for t in targets)
    return {group: frozenset(targets - {group}) for group, targets in merged.items()}


def circles(edges: Edges) -> list[list[str]]:
    """The strongly connected sets of more than one node, each sorted, in sorted order.

    Tarjan's algorithm, with an explicit stack: a chain of imports may be longer than
    Python's recursion limit.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    path: list[str] = []
    on_path: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> tuple[str, Iterator[str]]:
        index[node] = low[node] = len(index)
        path.append(node)
        on_path.add(node)
        return node, iter(sorted(edges.get(node, ())))

    for start in sorted(edges):
        if start in index:
            continue
        work = [visit(start)]
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    work.append(visit(target))
                    break
                if target in on_path:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component: list[str] = []
                    while not component or component[-1] != node:
                        component.append(path.pop())
                        on_path.discard(component[-1])
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="import_circles.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--wing", action="store_true",
                        help="collapse modules to their first two dotted components")
    args = parser.parse_args(argv)
    edges = import_graph(root_packages())
    between_modules = circles(edges)
    if args.wing:
        wings = collapse(edges, wing)
        shown, among = circles(wings), f"{len(wings)} wings of {len(edges)} modules"
    else:
        shown, among = between_modules, f"{len(edges)} modules"
    for circle in shown:
        print("circle:", " ".join(circle))
    print(f"{len(shown)} circle(s) among {among}")
    return 1 if between_modules else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
