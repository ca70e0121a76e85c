"""Running policy test cases: per-case verdicts with the actual decision, and rule coverage.

A case's context is built as `policy explain` builds its own
(:func:`~interlock.policy.context.make_context`) and decided by the ``decide`` the caller
passes: the application passes its one decision (``interlock.app.query.decide_context``,
stage 5 included), so a case decides as every other reader does; the default is the
policy's own pipeline (:func:`~interlock.policy.resolution.resolve`). It passes when every
expected field has the expected value (and, with ``rule``, was set by that
rule), or, with ``error``, when resolution fails with a message containing it.
A rule is covered when it decided at least one field of some case's decision, or refused
some case's context. Coverage is per file of the stack; the counted files are the site's
(:meth:`TestRun.files`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from interlock.core.errors import LocatedError
from interlock.core.suggest import hint
from interlock.policy.context import Context
from interlock.policy.diff import decider, show_value
from interlock.policy.explain import render_trace
from interlock.policy.loader import shipped_sha256
from interlock.policy.model import Policy
from interlock.policy.resolution import PolicyRefused, Resolution, resolve
from interlock.policy.testfile import LoadedCase
from interlock.policy.trace import ENV, RULES, Provenance, Step, rule_deciders

#: How a case's context is decided: ``(policy, context, overrides) -> Resolution``.
Decide = Callable[[Policy, Context, Mapping[str, Any]], Resolution]


@dataclass(frozen=True)
class CaseResult:
    case: LoadedCase
    #: Why the case failed, one problem per entry; empty when it passed.
    problems: tuple[str, ...]
    resolution: Resolution | None = None
    #: The error resolution raised, if it did.
    error: str | None = None
    #: Fields whose trace the report shows.
    failing_fields: tuple[str, ...] = ()
    #: What looks wrong without failing the case (``--strict`` fails it), at file:line.
    warnings: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return not self.problems

    @property
    def covered(self) -> set[str]:
        if self.resolution is None:
            return set()
        refusal = self.resolution.refusal
        refused = {refusal.by} if refusal is not None else set()
        return rule_deciders(self.resolution.provenance.values()) | refused


@dataclass(frozen=True)
class FileCoverage:
    """The rule coverage of one file of the tested stack."""

    file: str
    covered: tuple[str, ...]
    uncovered: tuple[str, ...]
    #: Its content is the shipped policy's (:func:`interlock.policy.loader.shipped_sha256`).
    shipped: bool
    #: Counted: ``--min-coverage`` applies to it (see :meth:`TestRun.files`).
    gated: bool

    @property
    def rules(self) -> int:
        return len(self.covered) + len(self.uncovered)

    @property
    def percent(self) -> float:
        """Percentage of the file's rules covered (100 for a file without rules)."""
        return 100.0 if self.rules == 0 else 100.0 * len(self.covered) / self.rules

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "percent": round(self.percent, 2),
            "covered": list(self.covered),
            "uncovered": list(self.uncovered),
            "rules": self.rules,
            "shipped": self.shipped,
            "gated": self.gated,
        }


@dataclass
class TestRun:
    policy: Policy
    results: list[CaseResult] = field(default_factory=list)

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def failed(self) -> int:
        return len(self.results) - self.passed

    def files(self) -> list[FileCoverage]:
        """Coverage per file of the stack, bottom first. A site's tests are about its own
        layers, so every file but the shipped policy is counted (gated: ``--min-coverage``
        applies to each); the shipped policy is counted only when it is the whole stack (its
        own tests), as the shipped rules a site's cases happen to reach measure nothing of
        the site's."""
        decided = set().union(*(r.covered for r in self.results))
        shipped_sha = shipped_sha256()
        shipped = [f.sha256 == shipped_sha for f in self.policy.files]
        out = []
        for file, is_shipped in zip(self.policy.files, shipped, strict=True):
            ids = [r.id for r in self.policy.rules if r.location.file == file.path]
            out.append(FileCoverage(
                file.path,
                tuple(i for i in ids if i in decided),
                tuple(i for i in ids if i not in decided),
                shipped=is_shipped,
                gated=all(shipped) or not is_shipped,
            ))
        return out

    def covered(self) -> list[str]:
        """Ids of the counted files' rules that decided a field in some case, in policy order."""
        return [rule for f in self.files() if f.gated for rule in f.covered]

    def uncovered(self) -> list[str]:
        return [rule for f in self.files() if f.gated for rule in f.uncovered]

    def coverage(self) -> float:
        """Percentage of the counted files' rules covered (100 when they have none)."""
        total = len(self.covered()) + len(self.uncovered())
        return 100.0 if total == 0 else 100.0 * len(self.covered()) / total

    def below(self, percent: float) -> list[FileCoverage]:
        """The counted files whose coverage is under ``percent`` (``--min-coverage``)."""
        return [f for f in self.files() if f.gated and f.percent < percent]


def run_cases(
    policy: Policy, cases: Sequence[LoadedCase], *, decide: Decide = resolve
) -> TestRun:
    run = TestRun(policy)
    for case in cases:
        run.results.append(run_case(policy, case, decide=decide))
    return run


def run_case(policy: Policy, loaded: LoadedCase, *, decide: Decide = resolve) -> CaseResult:
    """Decide one case and compare. Names the case cannot use (an env variable the policy
    does not bind, a rule id it does not have) fail it at their file:line, next to any value
    that differs."""
    result = _run_case(policy, loaded, decide)
    warnings = _warnings(policy, loaded)
    return dataclasses.replace(result, warnings=warnings) if warnings else result


def _warnings(policy: Policy, loaded: LoadedCase) -> tuple[str, ...]:
    """An architecture outside the catalog is usually a typo of one in it (the case then
    tests the defaults, and passes for the wrong reason), unless the case says it means it."""
    given = loaded.case.given
    if given.outside_catalog or given.architecture in policy.catalog:
        return ()
    message = (
        f"warning: architecture {given.architecture!r} is not in the policy's catalog, so the "
        f"case tests an unknown model{hint(given.architecture, policy.catalog)} (set "
        f"`outside_catalog: true` in `given` if that is what it means)"
    )
    where = loaded.at("given", "architecture")
    return (f"{where.file}:{where.line}:{where.col}: {message}",)


def _run_case(policy: Policy, loaded: LoadedCase, decide: Decide) -> CaseResult:
    case = loaded.case
    problems = _unknown_names(policy, loaded)
    given = case.given
    overrides = given.set.model_dump(exclude_unset=True)
    expect = case.expect
    try:
        resolution = decide(policy, loaded.context(), overrides)
    except LocatedError as exc:  # a policy's or a plugin's (stage 5) error
        message = str(exc)
        if expect.error is None:
            problems.append(f"resolution failed: {message}")
        elif expect.error not in message:
            problems.append(f"expected an error containing {expect.error!r}, got: {message}")
        # A refusal keeps its resolution: the refusing rule is covered by the case.
        refused = exc.resolution if isinstance(exc, PolicyRefused) else None
        return CaseResult(loaded, tuple(problems), refused, error=message)
    if expect.error is not None:
        problems.append(f"expected an error containing {expect.error!r}, but the case resolves")
        return CaseResult(loaded, tuple(problems), resolution)
    check_rule = expect.rule in {r.id for r in policy.rules}
    failing: list[str] = []
    vocabulary = policy.vocabulary
    for name, wanted in expect.fields().items():
        if name not in vocabulary.fields:  # another engine's field: this policy has none
            problems.append(
                f"{name}: not a decision field of a {vocabulary.title} policy; its fields: "
                f"{', '.join(vocabulary.names)}"
            )
            failing.append(name)
            continue
        got = getattr(resolution.decision, name)
        wanted_value = tuple(wanted) if isinstance(wanted, list) else wanted
        prov = resolution.provenance.get(name)
        if got != wanted_value:
            problems.append(
                f"{name}: expected {show_value(wanted_value)}, got {show_value(got)} "
                f"(set by {_setter(prov)})"
            )
            failing.append(name)
        elif check_rule and not (
            prov is not None and prov.stage == RULES and prov.source == expect.rule
        ):
            problems.append(
                f"{name}: expected it set by rule {expect.rule}, but it was set by {_setter(prov)}"
            )
            failing.append(name)
    return CaseResult(loaded, tuple(problems), resolution, failing_fields=tuple(failing))


def _setter(prov: Provenance | None) -> str:
    if prov is None:
        return "nothing"
    return decider(prov) + (f" at {prov.location}" if prov.location else "")


def _unknown_names(policy: Policy, loaded: LoadedCase) -> list[str]:
    problems = []
    for name in loaded.case.given.env:
        if name not in policy.env:
            declared = ", ".join(policy.env) or "none"
            message = f"the policy binds no variable {name!r}; declared: {declared}"
            error = loaded.error(message + hint(name, policy.env), "given", "env", name)
            problems.append(str(error))
    rule = loaded.case.expect.rule
    ids = [r.id for r in policy.rules]
    if rule is not None and rule not in ids:
        error = loaded.error(f"the policy has no rule {rule!r}{hint(rule, ids)}", "expect", "rule")
        problems.append(str(error))
    return problems


# -- reporting ------------------------------------------------------------------------------


def field_steps(resolution: Resolution, name: str) -> tuple[Step, ...]:
    """The steps of the trace that could have set ``name``: defaults, rules setting it (matched
    or not, with the first failing condition), its env bindings, overrides, later stages."""
    env_bound = {n for n, b in resolution.policy.env.items() if b.field == name}
    out = []
    for step in resolution.trace:
        if name in step.sets or (step.stage == ENV and step.name in env_bound):
            out.append(step)
    return tuple(out)


def render_result(result: CaseResult, *, color: bool = False) -> list[str]:
    where = result.case.at()
    head = f"{'PASS' if result.passed else 'FAIL'}  {result.case.name}"
    warnings = [f"      {w}" for w in result.warnings]
    if result.passed:
        return [head, *warnings]
    lines = [f"{head}  ({where.file}:{where.line})", *warnings]
    lines += [f"      {problem}" for problem in result.problems]
    res = result.resolution
    if res is not None:
        decision = " ".join(f"{k}={show_value(v)}" for k, v in _decision_items(res))
        lines.append(f"      decision: {decision}")
        for name in result.failing_fields:
            lines.append(f"      trace of {name}:")
            lines += [f"    {line}" for line in render_trace(field_steps(res, name), color=color)]
    return lines


def result_to_dict(result: CaseResult) -> dict[str, Any]:
    """One case's outcome as ``policy test --json`` prints it."""
    where = result.case.at()
    res = result.resolution
    return {
        "name": result.case.name,
        "location": where.to_dict(),
        "passed": result.passed,
        "problems": list(result.problems),
        "warnings": list(result.warnings),
        "decision": None if res is None else res.decision.to_dict(),
        "error": result.error,
    }


def coverage_to_dict(run: TestRun) -> dict[str, Any]:
    """The counted files' coverage together, and each file's (``files``)."""
    files = run.files()
    return {
        "percent": round(run.coverage(), 2),
        "covered": run.covered(),
        "uncovered": run.uncovered(),
        "rules": sum(f.rules for f in files if f.gated),
        "files": [f.to_dict() for f in files],
    }


def _decision_items(res: Resolution) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in res.decision.to_dict().items() if v is not None]


def render_summary(run: TestRun, invariants: Sequence[Any] = ()) -> list[str]:
    """``N passed, M failed`` over the cases and the invariants (their ``passed``), and the
    rule coverage of the cases."""
    passed = run.passed + sum(r.passed for r in invariants)
    failed = run.failed + sum(not r.passed for r in invariants)
    return [f"{passed} passed, {failed} failed", *render_coverage(run)]


def render_coverage(run: TestRun) -> list[str]:
    """One file: its coverage and uncovered rules. A stack: a line per file, the uncovered
    rules of the counted ones (a shipped layer's would bury the site's)."""
    files = run.files()
    if len(files) == 1:
        (only,) = files
        return [f"rule coverage: {_fraction(only)}", *_uncovered(only, "not covered")]
    lines = []
    for f in files:
        tag = "" if f.gated else " (shipped, not counted)"
        lines.append(f"rule coverage of {f.file}{tag}: {_fraction(f)}")
        if f.gated:
            lines += _uncovered(f, f"not covered in {f.file}")
    return lines


def _fraction(f: FileCoverage) -> str:
    return f"{len(f.covered)}/{f.rules} rules ({f.percent:.1f} %)"


def _uncovered(f: FileCoverage, head: str) -> list[str]:
    return [f"{head}: {', '.join(f.uncovered)}"] if f.uncovered else []
