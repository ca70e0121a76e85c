"""``policy log FILE``: list the decision records of a log, newest last, filtered.

Lines that are not records (damaged, unfinished, too long, a field of the wrong type) are
named on stderr by line number, skipped and counted. Every value shown is escaped: a line
break in a record cannot print a line of its own. Exit 1 when the log cannot be read, 2 when
``--since`` is malformed.
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import datetime, timedelta, timezone
from typing import Any

from interlock.commands.common import write_json
from interlock.core.terminal import escape, one_line

_AGO = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "log",
        help="list and filter decision records",
        description="List the decision records of FILE (written with --decision-log or "
        "$INTERLOCK_DECISION_LOG): time, host, command, context, decision and, for vllm "
        "serve, whether the engine confirmed it.",
    )
    parser.add_argument("file", metavar="FILE", help="a decision log (JSON lines)")
    parser.add_argument(
        "--since", metavar="WHEN", type=_since,
        help="only records at or after WHEN: an ISO time (2026-12-01, 2026-12-01T20:00Z; "
        "UTC unless it says) or an age (30m, 2h, 7d)",
    )
    parser.add_argument("--architecture", metavar="ARCH", help="only records for ARCH")
    parser.add_argument("--json", action="store_true", help="print the records as JSON")
    parser.set_defaults(run=run)


def since_of(text: str, now: datetime | None = None) -> datetime:
    """``--since``'s moment (aware, UTC when the text names no zone); ``ValueError`` saying
    what is wrong."""
    from interlock.decision_log import parse_time

    ago = _AGO.match(text.strip())
    if ago:
        now = now or datetime.now(timezone.utc)
        try:
            return now - timedelta(**{_UNITS[ago[2]]: int(ago[1])})
        except OverflowError:  # before year 1, or more days than a timedelta holds
            raise ValueError(f"--since {text!r}: an age reaching before year 1") from None
    try:
        return parse_time(text.strip())
    except ValueError:
        raise ValueError(
            f"--since {text!r}: not an ISO time (2026-12-01T20:00Z) or an age (30m, 2h, 7d)"
        ) from None


def _since(text: str) -> datetime:
    try:
        return since_of(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(one_line(escape(str(exc)))) from None


def run(args: argparse.Namespace) -> int:
    from interlock.decision_log import parse_time, records

    since = args.since
    found, problems = records(args.file)
    name = one_line(escape(args.file))
    for problem in problems:
        print(f"policy log: {name}:{problem.line}: {one_line(escape(problem.detail))} (skipped)",
              file=sys.stderr)
    kept = []
    for number, record in found:
        if args.architecture and record["context"].get("architecture") != args.architecture:
            continue
        if since is not None:
            try:
                when = parse_time(record["time"])
            except ValueError:
                print(f"policy log: {name}:{number}: time {_show(record['time'])} is not ISO "
                      "8601 (skipped)", file=sys.stderr)
                continue
            if when < since:
                continue
        kept.append(record)
    if args.json:
        write_json({"records": kept, "skipped": [
            {"line": p.line, "detail": p.detail} for p in problems
        ]})
        return 0
    for record in kept:
        sys.stdout.write(render(record) + "\n")
    if problems:
        print(f"policy log: {len(problems)} line(s) of {name} skipped", file=sys.stderr)
    return 0


def render(record: dict[str, Any]) -> str:
    """One record as a line (and a second for an engine check or a run's outcome); every
    value from the record is escaped (:func:`_show`)."""
    ctx, decision = record["context"], record["decision"]
    where = _show(ctx.get("platform"))
    if ctx.get("device_arch"):
        where += f"/{_show(ctx.get('device_arch'))}"
    fields = " ".join(f"{_show(k)}={_show(v)}" for k, v in decision.items() if v is not None)
    revision = (record.get("policy") or {}).get("revision", "?")
    lines = [f"{_show(record['time'])}  {_show(record['host'])}  {_show(record['command'])}  "
             f"{_show(ctx.get('architecture'))} on {where}  {fields}  (policy {_show(revision)})"]
    engine, outcome = record.get("engine"), record.get("outcome")
    if engine and "verified" in engine:
        if engine["verified"]:
            lines.append(f"    engine: verified ({_show(engine.get('vllm_version'))})")
        else:
            problems = "; ".join(map(_show, engine.get("problems", [])))
            lines.append("    engine: NOT VERIFIED: " + problems)
    if outcome and "error" in outcome:
        lines.append(f"    outcome: failed: {_show(outcome['error'])}: "
                     f"{_show(outcome.get('message', ''))}")
    elif outcome:
        tpot = outcome.get("tpot_ms")
        graphs = outcome.get("graphs")
        graphs = graphs if isinstance(graphs, dict) else {}
        lines.append(
            f"    outcome: {_show(outcome.get('output_tokens'))} tokens, ttft "
            f"{_show(outcome.get('ttft_ms'))} ms, tpot "
            f"{'-' if tpot is None else f'{_show(tpot)} ms'}, graphs "
            f"{_show(graphs.get('backend'))} sizes {_show(graphs.get('captured_sizes'))}"
        )
    return "\n".join(lines)


def _show(value: Any) -> str:
    """A value from a record as text of one line, control characters escaped."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, list):
        text = ",".join(map(_show, value))
    else:
        text = str(value)
    return one_line(escape(text))
