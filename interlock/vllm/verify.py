"""``policy vllm verify FILE``: what really ran, checked after the fact.

FILE is either a saved engine log or a decision log.

- **An engine log** (vLLM's output, as saved by a service manager or ``tee``), which may hold
  several engine starts (a restart appends to the same file). Each start is checked on its
  own, against its own decision: the one the interlock plugin logged in that start (its
  ``interlock: governing ...`` and ``interlock: decided FIELD=VALUE (...)`` lines), or the one
  of a decision record (``--record LOG`` with ``--id``, else its last record that carries an
  engine target). A start begins at the plugin's ``governing`` line, or at the engine's config
  line when the start before already logged one (or came up). The log's own lines are read by
  the same check as a live ``policy vllm serve`` (:class:`interlock.vllm.startup_log.EngineCheck`):
  the config line's ``mode`` and ``cudagraph_mode``, the V2 runner line, the breakable lines,
  the ready line.
- **A decision log**: every record that says what an engine did (``policy vllm serve``,
  ``policy measure --engine vllm``) is checked again: its expected values must be what its
  decision makes on its platform, and what the engine's log showed must agree with them.

Both are streamed, a chunk (1 MiB) at a time: memory does not grow with the file. A line longer than
:data:`MAX_LINE` is cut, a file larger than :data:`MAX_BYTES` is refused, and a log with more
than :data:`MAX_STARTS` engine starts is refused. Exit 0 when what ran is the decision in
every start, 4 when it is not in one (or the log cannot tell: no plugin lines and no record,
no ready line), 1 on unreadable input.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from interlock.core.errors import InputError
from interlock.vllm.startup_log import (
    _LOG_LINE,
    ANSI,
    CONFIG_MESSAGE,
    READY_MESSAGE,
    EngineCheck,
    Verification,
    expected_from,
)

#: Exit status when the log or record shows something else than the decision.
MISMATCH_EXIT = 4
MAX_LINE = 1 << 20
MAX_BYTES = 1 << 30
#: The most engine starts one log may hold (each keeps a verdict until the end).
MAX_STARTS = 10_000
#: The plugin's lines (interlock.vllm.plugin): ``interlock: decided runner=mrv1 (...)``.
_DECIDED = re.compile(r"^interlock: decided (?P<field>[a-z_]+)=(?P<value>\S+) \((?P<why>.*)$")
_GOVERNING = re.compile(r"^interlock: governing (?P<arch>\S+) on (?P<platform>[a-z]+)[ ,]")
_FIELDS = ("runner", "cudagraph", "breakable", "compile")


@dataclass
class Start:
    """One engine start in a saved log: where it begins and what its lines say."""

    number: int
    #: The log's line number the start begins at (1 for the first).
    line: int
    governed: bool = False
    #: The fields the plugin logged it decided, and on which platform.
    decision: dict[str, Any] = field(default_factory=dict)
    platform: str = ""
    #: The vLLM version of its config line, when it logged one.
    version: str | None = None
    config: bool = False
    ready: bool = False


@dataclass
class LogVerdict:
    """The verdict on one engine start of a saved engine log."""

    verification: Verification
    #: Where the decision checked against came from.
    decided_by: str
    decision: dict[str, Any]
    platform: str
    start: int = 1
    line: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start, "line": self.line, "decided_by": self.decided_by,
                "decision": self.decision, "platform": self.platform,
                **self.verification.to_dict()}


def read_lines(path: str, marker: bytes | None = None) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` for each line of a saved log that is not blank (and holds
    ``marker``, when given), streamed a chunk at a time: a line is cut at :data:`MAX_LINE`
    bytes (the rest skipped), undecodable bytes are replaced, a file over :data:`MAX_BYTES`
    is refused before a line is read (and reading stops there should it grow)."""
    import os

    from interlock.core.files import FileProblem, open_regular

    try:
        handle = open_regular(path)
    except FileProblem as exc:
        raise InputError(f"{path}: {exc.detail}") from None
    with handle:
        try:
            if os.fstat(handle.fileno()).st_size > MAX_BYTES:
                raise InputError(f"{path}: larger than {MAX_BYTES} bytes; not an engine log")
            yield from _lines(handle, marker)
        except OSError as exc:
            raise InputError(f"{path}: {exc.strerror or exc}") from None


#: A line that is not empty: runs of line breaks are counted in C, not walked in Python.
_TEXT = re.compile(rb"[^\n]+")


def _spans(chunk: bytes, at: int, last: int, marker: bytes | None) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each line of ``chunk[at:last]`` (whole lines) that is not empty
    and holds ``marker``; the lines without it are passed over by ``bytes.find``."""
    if marker is None:
        for match in _TEXT.finditer(chunk, at, last):
            yield match.start(), match.end()
        return
    while True:
        found = chunk.find(marker, at, last)
        if found < 0:
            return
        start = chunk.rfind(b"\n", at, found) + 1 or at
        end = chunk.find(b"\n", found, last + 1)
        yield start, end
        at = end + 1


def _lines(handle: Any, marker: bytes | None) -> Iterator[tuple[int, str]]:
    number = 0  # the lines ended so far
    head = bytearray()  # the first MAX_LINE bytes of the line the last chunk left unended
    left = MAX_BYTES
    while left > 0:
        chunk = handle.read(min(MAX_LINE, left))
        if not chunk:
            break
        left -= len(chunk)
        first = chunk.find(b"\n")
        if first < 0:
            head += chunk[:max(0, MAX_LINE - len(head))]
            continue
        head += chunk[:max(0, min(first, MAX_LINE - len(head)))]
        number += 1
        if marker is None or marker in head:
            yield from _texts(number, bytes(head))
        head.clear()
        last, at = chunk.rfind(b"\n"), first + 1
        for start, end in _spans(chunk, at, last, marker):
            number += chunk.count(b"\n", at, start) + 1
            yield from _texts(number, chunk[start:end])
            at = end + 1
        number += chunk.count(b"\n", at, last + 1)
        head += chunk[last + 1:]
    if head and (marker is None or marker in head):
        yield from _texts(number + 1, bytes(head))


def _texts(number: int, raw: bytes) -> Iterator[tuple[int, str]]:
    # str.splitlines(), as the whole log was split before it was streamed: a break inside
    # vLLM's progress output (\r, \x0b...) ends a line here too.
    for text in raw.decode("utf-8", "replace").splitlines():
        yield number, text


def is_decision_log(path: str) -> bool:
    """Whether the file's first line that is not blank is a JSON object (a decision log)."""
    first = next((text for _, text in read_lines(path) if text.strip()), "")
    return first.lstrip().startswith("{")


def _message(text: str) -> str | None:
    """The message of a line of vLLM's logger, None for any other line (as
    :class:`EngineCheck` reads it)."""
    if "]" not in text:  # no `[file:line]`: not the logger's (the quick answer for most lines)
        return None
    match = _LOG_LINE.search(ANSI.sub("", text).rstrip("\r\n"))
    return None if match is None else match["message"].rstrip()


def starts(path: str) -> Iterator[tuple[Start, str]]:
    """``(start, text)`` for each line of vLLM's logger in an engine log (the only lines the
    check reads), with the engine start it belongs to. A start begins at the plugin's
    ``governing`` line (unless the start it would end has logged nothing yet), or at the
    engine's config line when the current start logged one or came up already. The
    :class:`Start` is filled in as its lines pass."""
    current = Start(1, 1)
    for number, text in read_lines(path, b"]"):
        message = _message(text)
        if message is not None:
            governing = _GOVERNING.match(message)
            config = CONFIG_MESSAGE.match(message)
            if (governing and (current.governed or current.config or current.ready)) or (
                config and (current.config or current.ready)
            ):
                if current.number >= MAX_STARTS:
                    raise InputError(
                        f"{path}:{number}: more than {MAX_STARTS} engine starts in one log; "
                        "cut the log to the starts to check"
                    )
                current = Start(current.number + 1, number)
            if governing:
                current.governed, current.platform = True, governing["platform"]
            elif config:
                current.config = True
                current.version = current.version or config["version"]
            elif message.startswith(READY_MESSAGE):
                current.ready = True
            else:
                decided = _DECIDED.match(message)
                if decided and decided["field"] in _FIELDS:
                    value: Any = decided["value"]
                    if decided["field"] in ("breakable", "compile"):
                        value = value == "true"
                    current.decision[decided["field"]] = value
            yield current, text


def verify_log(path: str, decision: Mapping[str, Any] | None, platform: str, decided_by: str,
               version: str | None = None) -> list[LogVerdict]:
    """Each engine start of the log fed to the startup-log check, as a live serve would have
    read it, against ``decision`` (a record's, on ``platform``) or, when None, the decision
    the plugin logged in that start. The log is streamed twice (the first pass finds each
    start's decision and vLLM version), never held."""
    scanned: list[Start] = []
    for start, _ in starts(path):
        if not scanned or scanned[-1] is not start:
            scanned.append(start)
    scanned = scanned or [Start(1, 1)]  # an empty log: one start that shows nothing
    checks = [_check_for(start, decision, platform, version) for start in scanned]
    for start, text in starts(path):
        if start.number > len(checks):
            break  # the log grew since the first pass: its new starts were not scanned
        check = checks[start.number - 1]
        if isinstance(check, EngineCheck):
            check.feed(text)
    verdicts = []
    for start, check in zip(scanned, checks, strict=True):
        if not isinstance(check, EngineCheck):
            verdicts.append(LogVerdict(check, "nothing: no decision to check against",
                                       dict(start.decision), start.platform, start.number,
                                       start.line))
            continue
        verdict = check.finish(
            "exited", "the log ends before the server said it was ready ('Starting vLLM "
            "server on ...'): what ran is not confirmed")
        if decision is not None:
            verdicts.append(LogVerdict(verdict, decided_by, dict(decision), platform,
                                       start.number, start.line))
        else:
            verdicts.append(LogVerdict(
                verdict, f"the interlock plugin's lines in {path}", dict(start.decision),
                start.platform, start.number, start.line))
    return verdicts


#: ``Verification.ended_by`` of a start there was no decision to check against.
NO_DECISION = "no-decision"


def _check_for(start: Start, decision: Mapping[str, Any] | None, platform: str,
               version: str | None) -> EngineCheck | Verification:
    """The check for one start, or (when it has no decision to be checked against) its
    verdict: not confirmed."""
    if decision is not None:
        return EngineCheck(decision, version or start.version, platform)
    if not start.governed:
        problem = (
            "the log has no interlock plugin lines ('interlock: governing ...'): the plugin "
            "did not govern this engine start (not installed, or it failed to load); give "
            "the decision with --record DECISION_LOG"
        )
    elif missing := [f for f in _FIELDS if f not in start.decision]:
        problem = (f"the interlock plugin's lines from line {start.line} do not name "
                   f"{', '.join(missing)}: a truncated log?")
    else:
        return EngineCheck(start.decision, version or start.version, start.platform)
    return Verification(verified=False, expected={}, seen={}, problems=[problem],
                        ended_by=NO_DECISION, vllm_version=version or start.version or "")


def record_decision(path: str, record_id: str | None) -> tuple[dict[str, Any], str, str]:
    """The engine target and platform of a decision record (``record_id``, else the last
    record with one), and how to name it."""
    from interlock import decision_log

    chosen = None
    for number, record in decision_log.read_records(path):
        if isinstance(record, decision_log.Problem):
            continue
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


def verify_records(path: str) -> Iterator[tuple[str, list[str]]]:
    """Each record with an engine verdict, checked again: ``(who, problems)``, streamed."""
    from interlock import decision_log

    for number, record in decision_log.read_records(path):
        if isinstance(record, decision_log.Problem):
            continue
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
        yield who, problems
