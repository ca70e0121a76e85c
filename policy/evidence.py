"""Evidence a rule cites: measurement records (``policy measure --record``) listed under a rule's
``evidence:`` key, relative to the policy file.

``policy check`` validates each cited record (it exists, parses, has the record
layout, and its context is one the rule's ``when`` matches) and warns when the
record shows the rule's value significantly slower than an alternative it
measured (``evidence-contradicts``) or when the rule changed after the record
(``evidence-stale``, from git history; without it a note says it was not
checked). ``policy explain`` prints a one-line summary per record
(:func:`summaries`), reading the JSON with the standard library only.
"""

from __future__ import annotations

import datetime
import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from interlock.core.errors import PolicyError
from interlock.core.fields import show_scalar
from interlock.core.git import run_git
from interlock.policy.conditions import Facts
from interlock.policy.loader import MAX_FILE_BYTES
from interlock.policy.model import Rule

#: The metric a record's effects are judged on, and the unit it is shown in.
METRIC = "tpot_ms"
UNIT = "ms/token"


def record_path(cited: str, policy_file: Path) -> Path:
    """Where a cited record is: relative paths are relative to the policy file's folder."""
    path = Path(cited)
    return path if path.is_absolute() else Path(os.path.normpath(policy_file.parent / path))


def policy_file_path(name: str) -> Path:
    """The file behind a policy's display name (the shipped one is named ``policies.yaml``)."""
    from interlock.policy.loader import SHIPPED_NAME, shipped_policy_path

    path = Path(name)
    if name == SHIPPED_NAME and not path.exists():
        return shipped_policy_path()
    return path


def read_record(path: Path, name: str) -> dict[str, Any]:
    """Read and validate a record; a problem is a ``PolicyError`` at ``name:line:col``."""
    from interlock.core.files import FileProblem, load_json, read_regular
    from interlock.policy.evidence_schema import EvidenceRecordModel
    from interlock.policy.schema import validate_doc
    from interlock.policy.source import SourceDoc, parse_yaml

    try:
        content = read_regular(path, MAX_FILE_BYTES, name)
        data = load_json(content, name)
    except FileProblem as exc:
        raise PolicyError(exc.detail, file=name, line=exc.line, col=exc.col) from None
    try:
        # JSON is YAML: the YAML parser gives every value its line:col for the messages.
        marks = parse_yaml(content, name)
        doc = SourceDoc(name, data, marks.marks, marks.key_marks)
    except PolicyError:
        doc = SourceDoc(name, data)
    validate_doc(EvidenceRecordModel, doc)
    return data


def context_failure(rule: Rule, record: dict[str, Any]) -> str | None:
    """Why the record's context is not one the rule's ``when`` matches (None if it is)."""
    ctx = record["context"]
    facts = Facts(
        ctx["architecture"], ctx["platform"], ctx["device_arch"], ctx["traits"], ctx["features"]
    )
    failure = rule.when.first_failure(facts)
    return None if failure is None else failure.describe(limit=4)


@dataclass(frozen=True)
class Comparison:
    """The rule's value of one field against the other level the record measured."""

    field: str
    value: Any
    other: Any
    batch_size: str
    #: TPOT with the rule's value minus TPOT with the other level, and its interval.
    delta: float
    low: float
    high: float
    #: The record measured enough trials to call a difference significant.
    claimable: bool = True

    @property
    def slower(self) -> bool:
        """The rule's value is significantly slower than the other level."""
        return self.claimable and self.low > 0

    def text(self) -> str:
        return (
            f"{self.field} {show_scalar(self.value)} {self.delta:+.2f} {UNIT} "
            f"[{self.low:+.2f}, {self.high:+.2f}] vs {show_scalar(self.other)} "
            f"(batch {self.batch_size})"
        )


def comparisons(rule: Rule, record: dict[str, Any]) -> tuple[list[Comparison], list[str]]:
    """``(comparisons, unmeasured)``: for each field the rule sets that the record varied
    over two levels, the main effect seen from the rule's value, per batch size; and the
    fields the rule sets that the record cannot speak to, with why."""
    found: list[Comparison] = []
    unmeasured: list[str] = []
    factors = record["factors"]
    for name, setting in rule.set.items():
        value = setting.value
        levels = [_typed(v) for v in factors.get(name, ())]
        if value not in levels:
            measured = ", ".join(map(show_scalar, levels)) if levels else "not varied"
            unmeasured.append(f"{name}={show_scalar(value)} (the record's {name}: {measured})")
            continue
        before = len(found)
        for batch, analysis in record["analysis"]["batch_sizes"].items():
            for effect in (analysis.get("effects") or {}).get(METRIC, ()):
                if effect["factors"] != [name]:
                    continue
                first, second = (_typed(v) for v in effect["levels"][0])
                sign = 1 if value == second else -1
                low, high = sorted((sign * effect["low"], sign * effect["high"]))
                other = first if value == second else second
                claims = record["analysis"].get("claims")
                found.append(
                    Comparison(name, value, other, batch, sign * effect["value"], low, high,
                               claims is not False)
                )
        if len(found) == before:
            unmeasured.append(
                f"{name}={show_scalar(value)} (no main effect of {name} in the record: "
                f"{record['analysis'].get('effects_note') or 'not a 2^k design'})"
            )
    return found, unmeasured


def summaries(rule: Rule, policy_file: Path) -> Iterator[str]:
    """One line per cited record for ``policy explain``; an unreadable record says so (run
    ``policy check`` for the details) instead of failing the explanation."""
    from interlock.core.files import load_json, read_regular

    for cited in rule.evidence:
        path = record_path(cited, policy_file)
        try:
            record = load_json(read_regular(path, MAX_FILE_BYTES), cited)
            found, _ = comparisons(rule, record)
            ctx = record["context"]
            where = ctx["platform"] + (f" {ctx['device_arch']}" if ctx["device_arch"] else "")
            day = str(record["created"])[:10]
        except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            yield f"{cited}: unreadable ({type(exc).__name__}); run `policy check`"
            continue
        shown = "; ".join(c.text() for c in found) or "measures none of the fields it sets"
        yield f"{shown} on {where}, {day} ({cited})"


def _typed(level: Any) -> Any:
    return tuple(level) if isinstance(level, list) else level


# -- staleness --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Staleness:
    #: None when it could not be checked.
    stale: bool | None
    #: Which check ran, for the message.
    method: str
    detail: str


def staleness(rule_file: Path, rule_lines: Sequence[int], record_file: Path) -> Staleness:
    """Did the rule change after the record? By git history: the last commit touching the
    rule's lines (uncommitted edits count as now) against the record's last commit (now
    when it is uncommitted); both in one commit, or both uncommitted, is not stale.
    Without git history for both files it is not checked: a file's modification time moves
    with any edit of the file, so it cannot tell."""
    rule_time = _git_rule_time(rule_file, rule_lines)
    record_time = _git_file_time(record_file) if rule_time is not None else None
    if rule_time is None or record_time is None:
        return Staleness(
            None,
            "no git history for the policy and the record",
            "file times cannot tell a change of the rule from any other edit",
        )
    return Staleness(
        rule_time > record_time,
        "git",
        f"the rule last changed {_when(rule_time)}, the record {_when(record_time)}",
    )


#: A time that sorts after every commit: the working tree's uncommitted state.
UNCOMMITTED = float("inf")


def _when(stamp: float) -> str:
    if stamp == UNCOMMITTED:
        return "in uncommitted edits"
    day = datetime.datetime.fromtimestamp(stamp, datetime.timezone.utc)
    return f"in a commit of {day:%Y-%m-%d %H:%M} UTC"


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        done = run_git(args, cwd)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.decode(errors="replace") if done.returncode == 0 else None


def _git_rule_time(path: Path, lines: Sequence[int]) -> float | None:
    """The latest commit time of ``lines`` of ``path`` (UNCOMMITTED for edited lines); None
    when git cannot tell (not installed, not in a repository, file not tracked)."""
    if not lines:
        return None
    ranges = [arg for line in sorted(set(lines)) for arg in ("-L", f"{line},{line}")]
    out = _git(
        ["blame", "--porcelain", "--no-textconv", *ranges, "--", path.name], path.parent
    )
    if out is None:
        # An untracked file inside a work tree is all uncommitted edits.
        inside = _git(["rev-parse", "--is-inside-work-tree"], path.parent)
        return UNCOMMITTED if inside is not None and inside.strip() == "true" else None
    latest = 0.0
    commit = ""
    for row in out.splitlines():
        head = row.split(" ", 1)[0]
        if len(head) == 40 and all(c in "0123456789abcdef" for c in head):
            commit = head
            if set(commit) == {"0"}:
                return UNCOMMITTED
        elif row.startswith("committer-time "):
            latest = max(latest, float(row.split()[1]))
    return latest if commit else None


def _git_file_time(path: Path) -> float | None:
    """The record's last commit time; UNCOMMITTED when it is new or edited; None when git
    cannot tell."""
    folder = path.parent
    status = _git(["status", "--porcelain", "--", path.name], folder)
    if status is None:
        return None
    if status.strip():
        return UNCOMMITTED
    out = _git(
        ["log", "-1", "--no-ext-diff", "--no-textconv", "--format=%ct", "--", path.name], folder
    )
    return float(out.strip()) if out and out.strip() else None


def rule_lines(marks: Mapping[tuple[str | int, ...], Any], index: int) -> list[int]:
    """The lines a rule's values are on, except its ``evidence`` list (citing a new record
    is not a change of the rule)."""
    return sorted(
        {
            mark.line
            for path, mark in marks.items()
            if path[:2] == ("rules", index) and path[2:3] != ("evidence",)
        }
    )


# -- the check ----------------------------------------------------------------------------------


def check_record(
    rule: Rule,
    cited: str,
    policy_file: Path,
    lines: Sequence[int],
    error: str,
    warning: str,
    note: str,
    engine_version: str | None = None,
) -> Iterator[tuple[str, str, str]]:
    """``(severity, code, message)`` findings about one record ``rule`` cites;
    ``engine_version`` is the vLLM release the policy describes: a record measured on
    another one (``policy measure --engine vllm``) is stale."""
    path = record_path(cited, policy_file)
    relative = os.path.relpath(path)
    shown = str(path) if relative.startswith("..") else relative
    head = f"rule {rule.id}: evidence {shown}"
    if not path.is_file():
        yield (
            error,
            "evidence-invalid",
            f"{head}: no such file (a relative path is relative to {policy_file})",
        )
        return
    try:
        record = read_record(path, shown)
    except PolicyError as exc:
        yield error, "evidence-invalid", f"{head} is not a valid measurement record: {exc}"
        return
    failure = context_failure(rule, record)
    if failure is not None:
        yield (
            error,
            "evidence-invalid",
            f"{head} was measured in a context the rule does not match ({failure})",
        )
        return
    found, unmeasured = comparisons(rule, record)
    if not found:
        yield (
            error,
            "evidence-invalid",
            f"{head} measures none of the fields the rule sets: {'; '.join(unmeasured)}",
        )
        return
    for comparison in found:
        if comparison.slower:
            yield (
                warning,
                "evidence-contradicts",
                f"{head}: the rule's {comparison.field}={show_scalar(comparison.value)} is "
                f"significantly slower than {show_scalar(comparison.other)}: "
                f"{comparison.text()}",
            )
    engine = record.get("engine")
    measured_on = engine.get("version") if isinstance(engine, dict) else None
    if engine_version and measured_on and measured_on != engine_version:
        yield (
            warning,
            "evidence-stale",
            f"{head}: measured on vLLM {measured_on}, but the policy describes vLLM "
            f"{engine_version}; re-measure with `policy measure --engine vllm`",
        )
    code = code_note(record)
    if code.stale:
        yield (
            warning,
            "evidence-stale",
            f"{head}: the runner and kernel code it measured changed since ({code.detail}); "
            "re-measure",
        )
    stale = staleness(policy_file, lines, path)
    if stale.stale:
        yield (
            warning,
            "evidence-stale",
            f"{head}: the rule changed after the record ({stale.detail}; checked with "
            f"{stale.method}); re-measure, or re-record to confirm",
        )
    yield (
        note,
        "evidence",
        f"{head}: {'; '.join(c.text() for c in found)}; context matches; "
        + (
            f"staleness not checked ({stale.method})"
            if stale.stale is None
            else f"{'stale' if stale.stale else 'not stale'} (checked with {stale.method})"
        )
        + f"; code: {code.detail}",
    )


def code_note(record: dict[str, Any]) -> Staleness:
    """Has the runner and kernel code the record measured (``software.code``: a digest per
    file) changed since? None when the record does not say what code it measured."""
    from interlock.core.code_digest import changed_code

    software = record.get("software")
    recorded = software.get("code") if isinstance(software, dict) else None
    if not isinstance(recorded, dict) or not recorded:
        return Staleness(None, "not recorded", "the record names no code digests (re-measure "
                         "to track the code it ran)")
    changed = changed_code({str(k): str(v) for k, v in recorded.items()})
    if not changed:
        return Staleness(False, "digests", f"the {len(recorded)} runner and kernel files it "
                         "measured are unchanged")
    shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
    return Staleness(True, "digests", f"{len(changed)} file(s) differ: {shown}")
