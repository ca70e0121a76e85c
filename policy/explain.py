"""Rendering a resolution: text for people (colour on a terminal), JSON for machines, tables."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from interlock.core.decision import DECISION_FIELDS
from interlock.core.terminal import color, one_line
from interlock.policy.conditions import ConfigMatch, Failure
from interlock.policy.model import Policy
from interlock.policy.release import describe
from interlock.policy.resolution import Resolution
from interlock.policy.trace import REFUSAL, RULES, Provenance, Step

_CODES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}
#: Items of a wanted list shown in text before "… +N more" (JSON always has them all).
_SHOWN = 4


def render_json(resolution: Resolution) -> str:
    return json.dumps(resolution.to_dict(), indent=2) + "\n"


class _Style:
    def __init__(self, color: bool) -> None:
        self.color = color

    def __call__(self, text: str, *styles: str) -> str:
        if not self.color or not styles:
            return text
        return color(text, ";".join(_CODES[s] for s in styles))


def render_text(res: Resolution, *, color: bool = False) -> str:
    s = _Style(color)
    ctx = res.context
    stamp = res.policy.stamp()
    where = f" {ctx.device_arch}" if ctx.device_arch else ""
    lines = [
        s(f"{ctx.architecture} on {ctx.platform}{where}", "bold"),
        s(
            f"policy {stamp['version']} (schema {stamp['schema_version']}, revision "
            f"{stamp['revision']}) from {', '.join(stamp['files'])}",
            "dim",
        ),
        s(describe(res.policy), "dim"),
        "",
    ]
    refusal = res.refusal
    if refusal is not None:
        lines += [
            s("REFUSED", "bold", "red")
            + f"  by {'rule ' if refusal.rule is not None else ''}{s(refusal.by, 'bold')}  "
            + s(str(refusal.location or ""), "dim"),
            f"  {refusal.message}",
            f"  {s(refusal.reason, 'dim')}",
        ]
        if refusal.ref:
            lines.append(f"  {s(refusal.ref, 'dim')}")
        lines += ["", s("decision (refused)", "bold")]
    else:
        lines.append(s("decision", "bold"))
    decision = res.decision.to_dict()
    names = res.policy.vocabulary.names
    # The field column is as wide as vLLM's longest name, or the vocabulary's.
    w = max(13, *map(len, names))
    # What chooses an unset field: interlock's runner, or the engine itself.
    chooser = "the runner" if res.policy.vocabulary.runners else res.policy.vocabulary.title
    for name in names:
        prov = res.provenance.get(name)
        if prov is None:
            lines.append(f"  {name:<{w}} {s(f'(not set: {chooser} chooses)', 'dim')}")
            continue
        value = s(f"{_show(decision[name]):<20}", "cyan")
        lines.append(f"  {name:<{w}} {value} {_setter(prov, s)}")
        if prov.stage != "defaults" and prov.reason:
            lines.append(f"  {'':<{w}} {s(prov.reason, 'dim')}")
        if prov.ref:
            lines.append(f"  {'':<{w}} {s(prov.ref, 'dim')}")
        for summary in _evidence(res, prov):
            lines.append(f"  {'':<{w}} {s('evidence: ' + summary, 'dim')}")
    if res.deviations:
        lines += ["", s("deviations (declared: this policy departs from the engine here)", "bold")]
        for dev in res.deviations:
            lines.append(f"  {dev.field:<13} {s(dev.id, 'yellow')}  {s(str(dev.location), 'dim')}")
            lines.append(f"  {'':<13} {s(dev.reason, 'dim')}")
            if dev.ref:
                lines.append(f"  {'':<13} {s(dev.ref, 'dim')}")
    lines += ["", s("context", "bold"), *_context_lines(res, s), "", s("trace", "bold")]
    lines += _trace_lines(res.trace, s)
    # Each entry is one line: a line break in an untrusted value is shown, not obeyed.
    return "\n".join(map(one_line, lines)) + "\n"


def _evidence(res: Resolution, prov: Provenance) -> list[str]:
    """Summaries of the measurement records cited by the rule that set a field."""
    if prov.stage != RULES:
        return []
    rule = next((r for r in res.policy.rules if r.id == prov.source), None)
    if rule is None or not rule.evidence:
        return []
    from interlock.policy.evidence import policy_file_path, summaries

    return list(summaries(rule, policy_file_path(rule.location.file)))


def _setter(prov: Provenance, s: _Style) -> str:
    where = f"  {prov.location}" if prov.location else ""
    if prov.stage == "defaults":
        return s(f"defaults{where}", "dim")
    label = "forced by " if prov.forced else ""
    return f"{s(prov.stage, 'dim')} {label}{s(prov.source, 'bold')}{s(where, 'dim')}"


def _context_lines(res: Resolution, s: _Style) -> list[str]:
    ctx = res.context
    arch_note = ctx.source("architecture")
    if res.in_catalog:
        arch_note += f", in the catalog at {res.policy.catalog[ctx.architecture].location}"
    else:
        from interlock.core.suggest import hint

        arch_note += ", not in the catalog: its traits are unknown unless read from --model"
        arch_note += hint(ctx.architecture, res.policy.catalog)
    rows = [
        ("architecture", ctx.architecture, arch_note),
        ("platform", ctx.platform, ctx.source("platform")),
        ("device_arch", ctx.device_arch or '""', ctx.source("device_arch")),
    ]
    for name, trait in res.traits.items():
        note = trait.origin + (f" {trait.note}" if trait.note else "")
        rows.append((f"trait {name}", _show(trait.value), note))
    for name, value in ctx.features.items():
        rows.append((f"feature {name}", _show(value), ctx.source(f"features.{name}")))
    for name, value in ctx.env.items():
        rows.append((f"env {name}", value, ctx.source(f"env.{name}")))
    for name, version in ctx.engine.items():
        rows.append((f"engine {name}", version, ctx.source(f"engine.{name}")))
    for name, origin in ctx.identity:
        rows.append(("model", name, origin))
    for path in mentioned_config_paths(res.policy):
        value, origin = ctx.config_fact(path)
        rows.append((f"config {path}", "-" if value is None else _show(value), origin))
    width = max(len(r[0]) for r in rows)
    vwidth = max(len(r[1]) for r in rows)
    return [f"  {k:<{width}}  {v:<{vwidth}}  {s(n, 'dim')}" for k, v, n in rows]


def mentioned_config_paths(policy: Policy) -> list[str]:
    """The config paths the policy's rules and deviations test, in file order."""
    conditions = [c for r in policy.rules for c in r.when.conditions]
    conditions += [c for d in policy.deviations for c in d.when.conditions]
    return list(dict.fromkeys(c.key for c in conditions if isinstance(c, ConfigMatch)))


def render_trace(steps: tuple[Step, ...], *, color: bool = False) -> list[str]:
    """Trace lines as `policy explain` prints them, for any selection of a resolution's steps
    (e.g. those about one field, in `policy test` reports)."""
    return [one_line(line) for line in _trace_lines(steps, _Style(color))]


def _trace_lines(trace: tuple[Step, ...], s: _Style) -> list[str]:
    width = max((len(step.name) for step in trace), default=0)
    stage_width = max((len(step.stage) for step in trace), default=0)
    lines = []
    stage = None
    for step in trace:
        label = step.stage if step.stage != stage else ""
        stage = step.stage
        where = str(step.location) if step.location else ""
        if step.stage == RULES and step.refuse is not None:
            mark = s("+", "green") if step.matched else s("-", "red")
            detail = _failure(step.failure, s) if not step.matched else s(step.note, "yellow")
        elif step.stage == REFUSAL:
            mark = s("!", "red")
            detail = s(f"refused: {step.note}", "red")
        elif step.stage == RULES:
            mark = s("+", "green") if step.matched else s("-", "red")
            detail = _sets(step.sets) if step.matched else _failure(step.failure, s)
            if not step.matched and step.failure is None and step.note:
                # Its `when` held, but not its `decided` values.
                detail = s(step.note, "dim")
            if step.overridden:
                later = ", ".join(f"{f} by {who}" for f, who in step.overridden.items())
                detail += s(f"  (overridden: {later})", "yellow")
        else:
            mark = " "
            detail = "  ".join(p for p in (_sets(step.sets), s(step.note, "dim")) if p)
        where = s(f"{where:<18}", "dim")
        lines.append(f"  {label:<{stage_width}} {mark} {step.name:<{width}}  {where} {detail}")
    return lines


def _failure(failure: Failure | None, s: _Style) -> str:
    return s(failure.describe(limit=_SHOWN), "dim") if failure else ""


def _sets(sets: dict[str, Any]) -> str:
    return " ".join(f"{k}={_show(v)}" for k, v in sets.items())


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


@dataclass(frozen=True)
class TableError:
    """A context of the table that did not resolve: its cell shows the error."""

    architecture: str
    platform: str
    message: str
    config: Mapping[str, Any] | None = None


def config_label(config: Mapping[str, Any] | None) -> str:
    """A table's config cell: ``num_hidden_layers=71``, ``(none)`` for no model config."""
    if config is None:
        return "(none)"
    return ",".join(f"{k}={_show(v)}" for k, v in config.items()) or "(without those keys)"


def render_table(
    rows: list[Resolution | TableError], fmt: str, fields: tuple[str, ...] = DECISION_FIELDS
) -> str:
    """The decision matrix as ``text``, ``csv`` or ``json``; a context that failed to resolve
    shows ``error: ...`` in its runner cell (``error`` in JSON), one a rule refuses ``refused
    by RULE (file:line)`` (the decision and ``refusal`` in JSON); ``fields``: the policy's
    decision fields, the first of which carries those cells. Rows with a model config
    (one per truth assignment of the policy's config predicates) add a ``config`` column."""
    first_field = fields[0]
    configs = [r.config if isinstance(r, TableError) else r.context.config for r in rows]
    with_config = any(c is not None for c in configs)
    columns = ("architecture", "platform", *fields)
    if with_config:
        columns = (*columns[:2], "config", *columns[2:])
    records = []
    for res, config in zip(rows, configs, strict=True):
        if isinstance(res, TableError):
            first = res.message.splitlines()[0]
            record: dict[str, Any] = {"architecture": res.architecture, "platform": res.platform}
            record.update(dict.fromkeys(fields))
            record[first_field] = f"error: {first}" if fmt != "json" else None
            if fmt == "json":
                record["error"] = res.message
        else:
            record = {
                "architecture": res.context.architecture,
                "platform": res.context.platform,
                **res.decision.to_dict(),
            }
            if res.refusal is not None:
                # The decision is not run: the cells say refused, naming the rule.
                if fmt == "json":
                    record["refusal"] = res.refusal.to_dict()
                else:
                    record.update(dict.fromkeys(fields))
                    record[first_field] = (
                        f"refused by {res.refusal.by} ({res.refusal.location})"
                    )
        if with_config:
            as_data = None if config is None else dict(config)
            record["config"] = as_data if fmt == "json" else config_label(config)
        records.append(record)
    if fmt == "json":
        for record, res in zip(records, rows, strict=True):
            if not isinstance(res, TableError):
                record["set_by"] = {k: p.source for k, p in res.provenance.items()}
        return json.dumps(records, indent=2) + "\n"
    if fmt == "csv":
        import csv
        import io

        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(
            [_show(r[c]) if r[c] is not None else "" for c in columns] for r in records
        )
        return out.getvalue()
    cells = [[one_line(_show(r[c])) for c in columns] for r in records]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += [
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join(lines) + "\n"
