"""``policy vllm verify FILE``: what really ran, checked after the fact.

FILE is either a saved engine log or a decision log.

- **An engine log** (vLLM's output, as saved by a service manager or ``tee``): the decision
  to check against is the one the interlock plugin logged inside the engine (its
  ``interlock: governing ...`` and ``interlock: decided FIELD=VALUE (...)`` lines), or the
  one of a decision record (``--record LOG`` with ``--id``, else its last record that
  carries an engine target). The log's own lines are read by the same check as a live
  ``policy vllm serve`` (:class:`interlock.vllm.engine.EngineCheck`): the config line's
  ``mode`` and ``cudagraph_mode``, the V2 runner line, the breakable lines, the ready line.
- **A decision log**: every record that says what an engine did (``policy vllm serve``,
  ``policy measure --engine vllm``) is checked again: its expected values must be what its
  decision makes on its platform, and what the engine's log showed must agree with them.

Bounded reads: a line longer than :data:`MAX_LINE` is cut, a file larger than
:data:`MAX_BYTES` is refused. Exit 0 when what ran is the decision, 4 when it is not (or the
log cannot tell), 1 on unreadable input.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from interlock.core.errors import InputError
from interlock.vllm.engine import EngineCheck, Verification, expected_from

#: Exit status when the log or record shows something else than the decision.
MISMATCH_EXIT = 4
MAX_LINE = 1 << 20
MAX_BYTES = 1 << 30
#: The plugin's lines (interlock.vllm.plugin): ``interlock: decided runner=mrv1 (...)``.
_DECIDED = re.compile(r"^interlock: decided (?P<field>[a-z_]+)=(?P<value>\S+) \((?P<why>.*)$")
_GOVERNING = re.compile(r"^interlock: governing (?P<arch>\S+) on (?P<platform>[a-z]+)[ ,]")
_FIELDS = ("runner", "cudagraph", "breakable", "compile")


@dataclass
class LogVerdict:
    """The verdict on one saved engine log."""

    verification: Verification
    #: Where the decision checked against came from.
    decided_by: str
    decision: dict[str, Any]
    platform: str

    def to_dict(self) -> dict[str, Any]:
        return {"decided_by": self.decided_by, "decision": self.decision,
                "platform": self.platform, **self.verification.to_dict()}


def read_lines(path: str) -> list[str]:
    """The lines of a saved log (bounded, undecodable bytes replaced)."""
    from interlock.core.files import FileProblem, check_regular

    try:
        check_regular(path)
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except FileProblem as exc:
        raise InputError(f"{path}: {exc.detail}") from None
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise InputError(f"{path}: larger than {MAX_BYTES} bytes; not an engine log")
    return [line[:MAX_LINE] for line in data.decode("utf-8", "replace").splitlines()]


def is_decision_log(lines: Sequence[str]) -> bool:
    first = next((line for line in lines if line.strip()), "")
    return first.lstrip().startswith("{")


def plugin_decision(lines: Iterable[str]) -> tuple[dict[str, Any], str] | None:
    """The decision the interlock plugin logged in an engine log, and its platform; None
    when the log has no plugin lines. The last governed model wins (a restart in one file)."""
    from interlock.vllm.engine import _ANSI, _LOG_LINE

    decision: dict[str, Any] = {}
    platform = ""
    found = False
    for line in lines:
        match = _LOG_LINE.search(_ANSI.sub("", line).rstrip("\r\n"))
        if match is None:
            continue
        message = match["message"].rstrip()
        governing = _GOVERNING.match(message)
        if governing:
            decision, platform, found = {}, governing["platform"], True
            continue
        decided = _DECIDED.match(message)
        if decided and decided["field"] in _FIELDS:
            value: Any = decided["value"]
            if decided["field"] in ("breakable", "compile"):
                value = value == "true"
            decision[decided["field"]] = value
    if not found:
        return None
    missing = [f for f in _FIELDS if f not in decision]
    if missing:
        raise InputError(
            f"the interlock plugin's lines in the log do not name {', '.join(missing)}: a "
            "truncated log?"
        )
    return decision, platform


def verify_log(lines: Sequence[str], decision: Mapping[str, Any], platform: str,
               decided_by: str, version: str | None = None) -> LogVerdict:
    """Feed the saved lines to the startup-log check, as a live serve would have."""
    config = re.compile(r"Initializing a V1 LLM engine \(v(?P<v>[^)]*)\)")
    seen_version = next((m["v"] for m in map(config.search, lines) if m), None)
    check = EngineCheck(decision, version or seen_version, platform)
    verdict = None
    for line in lines:
        verdict = check.feed(line)
        if verdict is not None:
            break
    if verdict is None:
        verdict = check.finish(
            "exited", "the log ends before the server said it was ready ('Starting vLLM "
            "server on ...'): what ran is not confirmed")
    return LogVerdict(verdict, decided_by, dict(decision), platform)


def record_decision(path: str, record_id: str | None) -> tuple[dict[str, Any], str, str]:
    """The engine target and platform of a decision record (``record_id``, else the last
    record with one), and how to name it."""
    from interlock import decision_log

    found, _ = decision_log.records(path)
    chosen = None
    for number, record in found:
        engine = record.get("engine")
        if not isinstance(engine, dict) or not isinstance(engine.get("target"), dict):
            continue
        if record_id is None or record.get("id") == record_id:
            chosen = (number, record)
    if chosen is None:
        which = f"record {record_id}" if record_id else "record with an engine target"
        raise InputError(f"{path}: no {which}")
    number, record = chosen
    target = record["engine"]["target"]
    missing = [f for f in _FIELDS if f not in target]
    if missing:
        raise InputError(f"{path}:{number}: the engine target lacks {', '.join(missing)}")
    platform = str((record.get("context") or {}).get("platform", ""))
    return dict(target), platform, f"decision record {record.get('id', '?')} ({path}:{number})"


def verify_records(path: str) -> list[tuple[str, list[str]]]:
    """Each record with an engine verdict, checked again: ``(who, problems)``."""
    from interlock import decision_log

    found, _ = decision_log.records(path)
    out = []
    for number, record in found:
        engine = record.get("engine")
        if not isinstance(engine, dict) or "verified" not in engine:
            continue
        who = f"{path}:{number} {record.get('command', '?')} {record.get('id', '?')}"
        problems: list[str] = []
        target = engine.get("target")
        platform = str((record.get("context") or {}).get("platform", ""))
        expected = engine.get("expected")
        shown = engine.get("seen")
        seen: dict[str, Any] = shown if isinstance(shown, dict) else {}
        if not isinstance(target, dict) or not isinstance(expected, dict):
            problems.append("the record has no engine target or expected values")
        else:
            try:
                wanted = expected_from(target, platform)
            except (KeyError, TypeError):
                wanted = {}
                problems.append("the engine target lacks a decision field")
            for key, value in wanted.items():
                if expected.get(key) != value:
                    problems.append(f"{key}: the decision makes {value}, but the check "
                                    f"expected {expected.get(key)}")
                if key in seen and seen[key] != value:
                    problems.append(f"{key}: decided {value}, but the engine showed {seen[key]}")
        if engine.get("verified") is not True:
            problems += [str(p) for p in engine.get("problems") or ["not verified"]]
        out.append((who, problems))
    return out
