"""The fleet view of ``policy table``: architectures x the machines an operator runs.

Rows are architectures, columns are targets (a platform and a device arch, e.g.
``rocm:gfx950``, and the engine releases the machine runs, e.g.
``rocm:gfx942@vllm=0.31.0``), each cell the decision there. Given a base policy (the shipped
one, for a site policy layered on it), a cell records which fields the layered
policy changes, so the table shows what the site policy does to the fleet.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from interlock.core.errors import LocatedError, PolicyError
from interlock.policy.context import Context, make_context
from interlock.policy.model import Policy
from interlock.policy.resolution import Resolution

#: Marks a changed cell in the text table.
CHANGED = "*"


@dataclass(frozen=True)
class Target:
    platform: str
    device_arch: str = ""
    #: ``(engine, version)`` pairs the column's contexts have as facts, over the table's own:
    #: two hosts on different releases are two columns of one table.
    engine: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        name = f"{self.platform}:{self.device_arch}" if self.device_arch else self.platform
        return name + "".join(f"@{engine}={version}" for engine, version in self.engine)

    def engine_facts(
        self, engine: Mapping[str, str], sources: Mapping[str, str]
    ) -> tuple[dict[str, str], dict[str, str]]:
        """The column's engine versions over the table's, and where each was given."""
        own = dict(self.engine)
        given = {f"engine.{name}": f"given with --target {self.name}" for name in own}
        return {**engine, **own}, {**sources, **given}


@dataclass(frozen=True)
class Cell:
    resolution: Resolution | None
    error: str | None = None
    #: The base policy's resolution (None without a base, or when it failed).
    base: Resolution | None = None
    base_error: str | None = None

    def changed(self) -> list[str]:
        """Decision fields the policy decides differently from the base (``outcome`` when only
        one side resolves)."""
        if self.base is None and self.base_error is None:
            return []
        if (self.resolution is None) != (self.base is None):
            return ["outcome"]
        if self.resolution is None or self.base is None:
            return []
        if _refused_by(self.resolution) != _refused_by(self.base):
            return ["outcome"]
        new, old = self.resolution.decision.to_dict(), self.base.decision.to_dict()
        return [k for k in new if new[k] != old[k]]


@dataclass(frozen=True)
class Fleet:
    targets: tuple[Target, ...]
    rows: tuple[tuple[str, tuple[Cell, ...]], ...]
    policy: Policy
    base: Policy | None

    @property
    def failed(self) -> bool:
        return any(cell.error is not None for _, cells in self.rows for cell in cells)


Resolver = Callable[[Policy, Context], Resolution]


def fleet(
    policy: Policy,
    architectures: Sequence[str],
    targets: Sequence[Target],
    resolver: Resolver,
    *,
    base: Policy | None = None,
    features: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    engine: dict[str, str] | None = None,
    sources: dict[str, str] | None = None,
) -> Fleet:
    """Resolve every architecture on every target (and under ``base``, when given); the
    keywords are every context's."""

    def one(p: Policy, context: Context | str) -> tuple[Resolution | None, str | None]:
        if isinstance(context, str):
            return None, context
        try:
            return resolver(p, context), None
        # A policy error, or a plugin's (a runner no plugin registers), is that cell's alone.
        except LocatedError as exc:
            return None, str(exc)

    rows = []
    for arch in architectures:
        cells = []
        for target in targets:
            column_engine, column_sources = target.engine_facts(engine or {}, sources or {})
            try:
                context: Context | str = make_context(
                    arch, platform=target.platform, device_arch=target.device_arch or None,
                    features=features, env=env, engine=column_engine, sources=column_sources,
                )
            except PolicyError as exc:  # a context that cannot be built is its cell's error
                context = str(exc)
            res, err = one(policy, context)
            if base is not None:
                old, old_err = one(base, context)
                cells.append(Cell(res, err, old, old_err))
            else:
                cells.append(Cell(res, err))
        rows.append((arch, tuple(cells)))
    return Fleet(tuple(targets), tuple(rows), policy, base)


def _refused_by(res: Resolution) -> str | None:
    return res.refusal.by if res.refusal is not None else None


def _cell_text(cell: Cell) -> str:
    if cell.resolution is None:
        return f"error: {(cell.error or '').splitlines()[0]}"
    refused = _refused_by(cell.resolution)
    if refused is not None:  # a resolver that returns refusals (``refused=True``)
        return f"refused by {refused}" + (f" {CHANGED}" if cell.changed() else "")
    d = cell.resolution.decision
    text = f"{d.runner} {d.cudagraph}"
    if d.breakable:
        text += " breakable"
    elif not d.compile:
        text += " no-compile"
    return text + (f" {CHANGED}" if cell.changed() else "")


def render_fleet(table: Fleet, fmt: str) -> str:
    """``text`` (a grid, changed cells marked and a legend), ``csv`` or ``json``."""
    if fmt == "json":
        return json.dumps(fleet_to_dict(table), indent=2) + "\n"
    header = ["architecture", *(t.name for t in table.targets)]
    grid = [[arch, *(_cell_text(c) for c in cells)] for arch, cells in table.rows]
    if fmt == "csv":
        import csv
        import io

        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(grid)
        return out.getvalue()
    widths = [max(len(header[i]), *(len(r[i]) for r in grid)) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in grid]
    if table.base is not None:
        changed = sum(bool(c.changed()) for _, cells in table.rows for c in cells)
        new = [f.path for f in table.policy.files]
        old = [f.path for f in table.base.files]
        added = [p for p in new if p not in old] or new
        lines += ["", f"{CHANGED} {changed} cell(s) where {' + '.join(added)} changes the "
                  f"decision of {' + '.join(old)}"]
    lines.append("cell: runner cudagraph [breakable | no-compile]")
    return "\n".join(lines) + "\n"


def fleet_to_dict(table: Fleet) -> dict[str, Any]:
    rows = []
    for arch, cells in table.rows:
        out = {}
        for target, cell in zip(table.targets, cells, strict=True):
            res = cell.resolution
            entry: dict[str, Any] = {
                "decision": None if res is None else res.decision.to_dict(),
                "set_by": None if res is None else {
                    k: p.source for k, p in res.provenance.items()
                },
                "error": cell.error,
                "refusal": None if res is None or res.refusal is None else res.refusal.to_dict(),
            }
            if table.base is not None:
                entry["changed"] = cell.changed()
                entry["base"] = None if cell.base is None else cell.base.decision.to_dict()
                entry["base_error"] = cell.base_error
            out[target.name] = entry
        rows.append({"architecture": arch, "cells": out})
    return {
        "targets": [
            {"name": t.name, "platform": t.platform, "device_arch": t.device_arch,
             "engine": dict(t.engine)}
            for t in table.targets
        ],
        "policy": table.policy.stamp(),
        "base": None if table.base is None else table.base.stamp(),
        "rows": rows,
    }
