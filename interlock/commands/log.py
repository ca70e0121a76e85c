"""``policy log FILE``: list the decision records of a log, newest last, filtered.

Lines that are not records (damaged, unfinished, too long) are named on stderr by line
number and skipped. Exit 1 when the log cannot be read or a filter is malformed.
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import datetime, timedelta, timezone
from typing import Any

from interlock.commands.common import write_json

_AGO = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "log",
        help="list and filter decision records",
        description="List the decision records of FILE (written with --decision-log or "
        "$INTERLOCK_DECISION_LOG): time, host, command, context, decision and, for vllm "
        "serve, whether the engine confirmed it.",
    )
    parser.add_argument("file", metavar="FILE", help="a decision log (JSON lines)")
    parser.add_argument(
        "--since", metavar="WHEN",
        help="only records at or after WHEN: an ISO time (2026-12-01, 2026-12-01T20:00Z; "
        "UTC unless it says) or an age (30m, 2h, 7d)",
    )
    parser.add_argument("--architecture", metavar="ARCH", help="only records for ARCH")
    parser.add_argument("--json", action="store_true", help="print the records as JSON")
    parser.set_defaults(run=run)


def since_of(text: str, now: datetime | None = None) -> datetime:
    """``--since``'s moment (aware, UTC when the text names no zone)."""
    from interlock.core.errors import InputError
    from interlock.decision_log import parse_time

    ago = _AGO.match(text.strip())
    if ago:
        now = now or datetime.now(timezone.utc)
        return now - timedelta(**{_UNITS[ago[2]]: int(ago[1])})
    try:
        return parse_time(text.strip())
    except ValueError:
        raise InputError(
            f"--since {text!r}: not an ISO time (2026-12-01T20:00Z) or an age (30m, 2h, 7d)"
        ) from None


def run(args: argparse.Namespace) -> int:
    from interlock.decision_log import parse_time, records

    since = since_of(args.since) if args.since else None
    found, problems = records(args.file)
    for problem in problems:
        print(f"policy log: {args.file}:{problem.line}: {problem.detail} (skipped)",
              file=sys.stderr)
    kept = []
    for number, record in found:
        if args.architecture and record["context"].get("architecture") != args.architecture:
            continue
        if since is not None:
            try:
                when = parse_time(str(record["time"]))
            except ValueError:
                print(f"policy log: {args.file}:{number}: time {record['time']!r} is not ISO "
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
    return 0


def render(record: dict[str, Any]) -> str:
    """One record as a line (and a second for an engine check or a run's outcome)."""
    ctx, decision = record["context"], record["decision"]
    where = f"{ctx.get('platform')}/{ctx.get('device_arch')}" if ctx.get("device_arch") else (
        str(ctx.get("platform"))
    )
    fields = " ".join(f"{k}={_show(v)}" for k, v in decision.items() if v is not None)
    revision = record.get("policy", {}).get("revision", "?")
    lines = [f"{record['time']}  {record['host']}  {record['command']}  "
             f"{ctx.get('architecture')} on {where}  {fields}  (policy {revision})"]
    engine, outcome = record.get("engine"), record.get("outcome")
    if engine and "verified" in engine:
        if engine["verified"]:
            lines.append(f"    engine: verified ({engine.get('vllm_version')})")
        else:
            lines.append("    engine: NOT VERIFIED: " + "; ".join(engine.get("problems", [])))
    if outcome and "error" in outcome:
        lines.append(f"    outcome: failed: {outcome['error']}: {outcome.get('message', '')}")
    elif outcome:
        tpot = outcome.get("tpot_ms")
        graphs = outcome.get("graphs") or {}
        lines.append(
            f"    outcome: {outcome.get('output_tokens')} tokens, ttft "
            f"{outcome.get('ttft_ms')} ms, tpot {'-' if tpot is None else f'{tpot} ms'}, graphs "
            f"{graphs.get('backend')} sizes {graphs.get('captured_sizes')}"
        )
    return "\n".join(lines)


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)
