"""`policy check`: validation (what the loader refuses) and lints over a policy's finite domain.

A check is a function ``(subject) -> Iterable[Finding]`` listed in :data:`CHECKS`;
a new one is one function and one line there. The :class:`Subject` gives checks
the layered policy, each file's source positions and, computed once on demand,
which rules match and decide where in :class:`interlock.policy.domain.Domain`.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from interlock.core.decision import VOCABULARIES
from interlock.core.errors import PolicyError
from interlock.core.fields import TRAITS, show_scalar
from interlock.core.suggest import hint
from interlock.policy.conditions import ConfigMatch, Facts, NameMatch, TraitMatch, When, is_glob
from interlock.policy.diff import show_value
from interlock.policy.domain import Domain, predicate_text
from interlock.policy.model import Location, Policy, Rule
from interlock.policy.resolution import context_facts, resolve
from interlock.policy.source import Path_, SourceDoc
from interlock.policy.trace import rule_deciders

if TYPE_CHECKING:
    from interlock.policy.testfile import TestsFile

ERROR = "error"
WARNING = "warning"
#: What a check did, for the record (never fails a check, not counted as a warning).
NOTE = "note"

#: A shared trait value held by more than this share of the catalog explains nothing about
#: why names were listed, so it never makes a near-miss (``moe: true`` in a MoE-heavy catalog).
NEAR_MISS_MAX_SHARE = 0.5
#: A trait value this share of the catalog holds is never a near-miss's reason.
NEAR_MISS_NEARLY_ALL = 0.8
#: Reasons that say nothing (compared lower-cased, without surrounding punctuation).
PLACEHOLDER_REASONS = frozenset(
    {"todo", "tbd", "fixme", "xxx", "wip", "n/a", "na", "none", "reason", "fix", "hack",
     "temp", "temporary", "workaround", "see above", "see pr", "perf", "performance", "bug",
     "needed", "required", "because"}
)  # fmt: skip
#: Fewer words than this cannot say what a rule does and why.
MIN_REASON_WORDS = 3


@dataclass(frozen=True)
class Finding:
    file: str
    line: int
    col: int
    severity: str
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: {self.severity}: {self.code}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "col": self.col,
            "severity": self.severity,
            "code": self.code,
            "message": self.message,
        }


@dataclass(frozen=True)
class RuleUsage:
    """Where, in the domain (env unset), a rule matched and where it decided a field."""

    matched: int
    decided: int
    #: Field -> the deciders that overwrote this rule's value where it matched.
    overwritten_by: dict[str, set[str]]
    #: Where it matched and some field it sets had another value before it (the defaults'
    #: and the earlier matched rules'): 0 makes it a pin (:func:`pinned_rules`).
    changed: int = 0
    #: Field -> the deciders whose value it found there, where it changed nothing.
    pinned_from: dict[str, set[str]] = field(default_factory=dict)


class Subject:
    """What checks look at: the layered policy and where each of its parts is written."""

    def __init__(
        self,
        policy: Policy,
        docs: dict[str, SourceDoc],
        runners: RunnerCheck,
        files: dict[str, Path] | None = None,
    ) -> None:
        self.policy = policy
        self.docs = docs
        #: Display name -> the file, where it differs from the name (the shipped policy).
        self.files = files or {}
        #: Why a runner name cannot be used (not registered, disabled, ...), None if it can.
        self.runner_problem = runners
        self._rule_paths: dict[str, tuple[SourceDoc, Path_]] = {}
        for doc in docs.values():
            for i, data in enumerate(doc.data.get("rules") or ()):
                self._rule_paths[data["id"]] = (doc, ("rules", i))

    def at(self, rule: Rule, *path: str | int, key: bool = False) -> Location:
        """The location of ``path`` inside ``rule`` (e.g. ``"when", "architecture", 2``)."""
        doc, base = self._rule_paths[rule.id]
        mark = doc.mark((*base, *path), key=key)
        return Location(doc.name, mark.line, mark.col)

    def file_of(self, rule: Rule) -> tuple[SourceDoc, Path, int]:
        """``(doc, file, index in that file)`` of the rule."""
        from interlock.policy.evidence import policy_file_path

        doc, base = self._rule_paths[rule.id]
        return doc, self.files.get(doc.name) or policy_file_path(doc.name), int(base[1])

    def finding(self, where: Location, severity: str, code: str, message: str) -> Finding:
        return Finding(where.file, where.line, where.col, severity, code, message)

    @cached_property
    def domain(self) -> Domain:
        return Domain.of(self.policy)

    @cached_property
    def tests(self) -> TestsFile | None:
        """The tests file beside the last policy file (``X.tests.yaml``), if it loads;
        `policy test` reports one that does not."""
        from interlock.policy.evidence import policy_file_path
        from interlock.policy.testfile import load_tests, tests_path_for

        name = self.policy.files[-1].path
        path = tests_path_for(self.files.get(name) or policy_file_path(name))
        if not path.is_file():
            return None
        try:
            return load_tests(path)
        except PolicyError:
            return None

    @cached_property
    def usage(self) -> dict[str, RuleUsage]:
        """Per rule id: how often it matched and decided over the domain (env unset)."""
        matched = dict.fromkeys((r.id for r in self.policy.rules), 0)
        decided = dict(matched)
        overwritten: dict[str, dict[str, set[str]]] = {r.id: {} for r in self.policy.rules}
        changed = dict(matched)
        pinned_from: dict[str, dict[str, set[str]]] = {r.id: {} for r in self.policy.rules}
        rules = self.policy.rules
        defaults = {name: (s.value, "defaults") for name, s in self.policy.defaults.items()}
        for context in self.domain.contexts(with_env=False):
            resolution = resolve(self.policy, context, refused=True)
            deciders = rule_deciders(resolution.provenance.values())
            # Each field's value and decider so far in the rules stage, to tell a rule that
            # changes a value from one that restates it.
            before = dict(defaults)
            # The matched rules alone: the whole trace would explain every rule that failed.
            for index in sorted(resolution.matched_rules):
                rule = rules[index]
                matched[rule.id] += 1
                if rule.id in deciders:
                    decided[rule.id] += 1
                for name in rule.set:
                    final = resolution.provenance[name]
                    if final.source != rule.id:
                        overwritten[rule.id].setdefault(name, set()).add(final.source)
                if rule.decided:  # applied after env bindings and overrides: not judged here
                    changed[rule.id] += 1
                    continue
                found = {name: before.get(name, (None, "")) for name in rule.set}
                if any(found[n][0] != s.value for n, s in rule.set.items()):
                    changed[rule.id] += 1
                else:
                    for name, (_, source) in found.items():
                        pinned_from[rule.id].setdefault(name, set()).add(source)
                before.update({n: (s.value, rule.id) for n, s in rule.set.items()})
        return {
            rid: RuleUsage(matched[rid], decided[rid], overwritten[rid], changed[rid],
                           pinned_from[rid])
            for rid in matched
        }


Check = Callable[[Subject], Iterable[Finding]]
RunnerCheck = Callable[[str], "str | None"]


# -- checks ---------------------------------------------------------------------------------


def unknown_runners(subject: Subject) -> Iterator[Finding]:
    """Errors: a runner value that names no registered runner."""
    policy = subject.policy

    def check(value: Any, where: Location, what: str) -> Iterator[Finding]:
        problem = subject.runner_problem(value)
        if problem is not None:
            yield subject.finding(where, ERROR, "unknown-runner", f"{what}: {problem}")

    setting = policy.defaults.get("runner")
    if setting is not None:
        yield from check(setting.value, setting.location, "defaults")
    for rule in policy.rules:
        for setting in (rule.set.get("runner"), rule.decided.get("runner")):
            if setting is not None:
                yield from check(setting.value, setting.location, f"rule {rule.id}")
    for name, binding in policy.env.items():
        if binding.field != "runner":
            continue
        doc = subject.docs[binding.location.file]
        for text, value in binding.values.items():
            mark = doc.mark(("env", name, "values", text))
            where = Location(doc.name, mark.line, mark.col)
            yield from check(value, where, f"env {name}={text}")


def unknown_architectures(subject: Subject) -> Iterator[Finding]:
    """Warnings: a rule names an architecture (or a glob matches none) absent from the catalog."""
    catalog = subject.policy.catalog
    for rule in subject.policy.rules:
        condition = rule.when.name_match("architecture")
        if condition is None:
            continue
        for i, pattern in enumerate(condition.patterns):
            path: tuple[str | int, ...] = ("when", "architecture")
            if len(condition.patterns) > 1:
                path = (*path, i)
            if is_glob(pattern):
                glob = NameMatch.of("architecture", (pattern,))
                if any(glob.matches(arch) for arch in catalog):
                    continue
                message = f"rule {rule.id}: pattern {pattern!r} matches no catalog architecture"
            elif pattern in catalog:
                continue
            else:
                message = (
                    f"rule {rule.id}: architecture {pattern!r} is not in the catalog, so its "
                    f"traits are unknown{hint(pattern, catalog)}"
                )
            yield subject.finding(subject.at(rule, *path), WARNING, "unknown-architecture", message)


def bounded_domain(subject: Subject) -> Iterator[Finding]:
    """Notes: where the domain stops short of every combination the rules distinguish
    (:attr:`interlock.policy.domain.Domain.bounded`), so that the lints over it are read as
    covering what was enumerated."""
    policy_file = subject.policy.files[-1].path if subject.policy.files else "<policy>"
    for note in subject.domain.bounded:
        yield subject.finding(
            Location(policy_file, 1), NOTE, "bounded-domain",
            f"the domain is bounded ({note}); dead and shadowed rules are judged on the "
            "contexts enumerated",
        )


def dead_and_shadowed_rules(subject: Subject) -> Iterator[Finding]:
    """Warnings: a rule that matches no context, or never decides a field where it matches."""
    domain = subject.domain
    # A trait only a model's config.json gives (a wrapper's text model; no catalog entry has
    # it) is not in the domain: a rule on one is judged on real models and policy test cases
    # that carry a config, not called dead here.
    catalogued = {key for entry in subject.policy.catalog.values() for key in entry.traits}
    for rule in subject.policy.rules:
        usage = subject.usage[rule.id]
        from_config = any(isinstance(c, TraitMatch) and c.key not in catalogued
                          and c.key == "text_architecture" for c in rule.when.conditions)
        if usage.matched == 0 and from_config:
            continue
        if usage.matched == 0:
            yield subject.finding(
                subject.at(rule, "when", key=True) if rule.when.conditions else subject.at(rule),
                WARNING,
                "dead-rule",
                f"rule {rule.id} matches no context of the domain "
                f"({len(domain.architectures)} architectures x {len(domain.platforms)} platforms "
                "with their device archs and features), so it never applies",
            )
        elif usage.decided == 0 and rule.refuse is None:  # a refusing rule sets nothing
            by = "; ".join(
                f"{name} by {', '.join(sorted(who))}"
                for name, who in sorted(usage.overwritten_by.items())
            )
            yield subject.finding(
                subject.at(rule, "set", key=True),
                WARNING,
                "shadowed-rule",
                f"rule {rule.id} matches {usage.matched} contexts but never decides anything: "
                f"everywhere it matches, later steps overwrite what it sets ({by})",
            )


def pinned_rules(subject: Subject) -> Iterator[Finding]:
    """Notes: a rule that changes nothing, a pin: wherever it matches in the domain, every
    field it sets already has that value from the defaults and the earlier rules that match
    there. Removing it changes no decision (the domain stands for every context), so it is
    either left over or meant to hold the values against a change below it (a site pinning
    the shipped default); a note says which, not a warning. Judged on the rules stage, env
    unset; rules on the decided values (``decided:``), refusing, dead and shadowed rules
    are not pins (the last two have their warnings)."""
    for rule in subject.policy.rules:
        usage = subject.usage[rule.id]
        if rule.refuse is not None or usage.decided == 0 or usage.changed:
            continue
        found = "; ".join(
            f"{name}={show_value(rule.set[name].value)} from {', '.join(sorted(who))}"
            for name, who in sorted(usage.pinned_from.items())
        )
        yield subject.finding(
            subject.at(rule, "set", key=True), NOTE, "pin-rule",
            f"rule {rule.id} changes nothing: in the {usage.matched} contexts it matches, "
            f"every field it sets already has that value ({found}); it pins them against a "
            "change of the files or rules before it, or it can go",
        )


def near_miss_lists(subject: Subject) -> Iterator[Finding]:
    """Warnings: a list of names that all share a trait value, missing catalog members with it."""
    catalog = subject.policy.catalog
    for rule in subject.policy.rules:
        condition = rule.when.name_match("architecture")
        if condition is None or len(condition.patterns) < 2 or condition.regex is not None:
            continue
        listed = [a for a in condition.patterns if a in catalog]
        if len(listed) < 2:
            continue
        # The rule's own trait conditions rule out some architectures whatever the list says.
        trait_when = When(tuple(c for c in rule.when.conditions if isinstance(c, TraitMatch)))
        eligible = [
            arch
            for arch, entry in catalog.items()
            if trait_when.matches(Facts(arch, "", "", entry.traits, {}))
        ]
        best: tuple[int, int, str, Any, list[str]] | None = None
        for key in TRAITS:
            values = [catalog[a].traits.get(key) for a in listed]
            if values[0] is None or any(
                v != values[0] or type(v) is not type(values[0]) for v in values
            ):
                continue
            value = values[0]
            holders = [a for a, e in catalog.items() if _same(e.traits.get(key), value)]
            share = len(holders) / len(catalog)
            covered = sum(1 for a in holders if a in condition.literals)
            # A value nearly every architecture has (`moe: false`) says nothing about why
            # names were listed; a common one does only if the list covers most of it.
            if share >= NEAR_MISS_NEARLY_ALL or (
                share > NEAR_MISS_MAX_SHARE and 2 * covered <= len(holders)
            ):
                continue
            missing = [a for a in holders if a in eligible and a not in condition.literals]
            if not missing:  # the list is exactly this value's members: nothing is missed
                best = None
                break
            candidate = (len(missing), len(holders), key, value, missing)
            if best is None or candidate[:3] < best[:3]:
                best = candidate
        if best is None:
            continue
        _, _, key, value, missing = best
        shown = show_scalar(value)
        yield subject.finding(
            subject.at(rule, "when", "architecture", key=True),
            WARNING,
            "near-miss-list",
            f"rule {rule.id} lists {len(listed)} architectures that all have {key}: {shown}, "
            f"but misses {len(missing)} more catalog architecture(s) with {key}: {shown}: "
            f"{', '.join(missing)}; the condition `{key}: {shown}` instead of the list "
            "would cover them all",
        )


def reasons(subject: Subject) -> Iterator[Finding]:
    """Warnings: a rule without a ref (or evidence), or whose reason cannot explain a
    decision."""
    for rule in subject.policy.rules:
        if rule.ref is None and not rule.evidence:
            yield subject.finding(
                subject.at(rule, "id", key=True),
                WARNING,
                "missing-ref",
                f"rule {rule.id} has no ref: link the pull request, issue or measurement "
                "that motivates it (`ref: https://...`), or cite a measurement record "
                "(`evidence: [file.json]`)",
            )
        vague = _vague(rule.reason)
        if vague:
            yield subject.finding(
                subject.at(rule, "reason"),
                WARNING,
                "vague-reason",
                f"rule {rule.id}: reason {rule.reason!r} {vague}; say what the rule does "
                "and why (the regression, the constraint, the measurement)",
            )


def evidence(subject: Subject) -> Iterator[Finding]:
    """Errors, warnings and a note per measurement record a rule cites (see
    :mod:`interlock.policy.evidence`): invalid records, contradicting or stale evidence."""
    from interlock.policy.evidence import check_record, rule_lines

    # A policy that mirrors a vLLM release says so in its version (``vllm-0.33.0``).
    version = subject.policy.version
    engine_version = version[len("vllm-"):] if version.startswith("vllm-") else None
    for rule in subject.policy.rules:
        if not rule.evidence:
            continue
        doc, file, index = subject.file_of(rule)
        lines = rule_lines(doc.marks, index)
        for i, cited in enumerate(rule.evidence):
            where = subject.at(rule, "evidence", i)
            for severity, code, message in check_record(
                rule, cited, file, lines, ERROR, WARNING, NOTE, engine_version
            ):
                yield subject.finding(where, severity, code, message)


def unreachable_config(subject: Subject) -> Iterator[Finding]:
    """Warnings: a rule's config condition that no catalog architecture and no test case
    reaches: no catalog architecture matches the rule's other conditions together with
    any config the domain enumerates, and no test case's context matches the rule."""
    catalog = subject.policy.catalog
    tests = subject.tests
    cases = [case.context() for case in tests.cases] if tests is not None else []
    policy = subject.policy
    pending = [r for r in policy.rules
               if any(isinstance(c, ConfigMatch) for c in r.when.conditions)]
    # One pass over the domain for every such rule, each context's facts made once.
    contexts = itertools.chain(
        (c for c in subject.domain.contexts(with_env=False) if c.architecture in catalog),
        cases,
    )
    for context in contexts:
        if not pending:
            break
        facts = context_facts(policy, context)
        pending = [r for r in pending if not r.when.matches(facts)]
    for rule in pending:
        configs = [c for c in rule.when.conditions if isinstance(c, ConfigMatch)]
        shown = ", ".join(f"`{predicate_text(c)}`" for c in configs)
        where = "no test case gives a config that does" if tests else "there is no tests file"
        yield subject.finding(
            subject.at(rule, "when", "config", key=True),
            WARNING,
            "unreachable-config",
            f"rule {rule.id}: config condition {shown} is reached by no catalog architecture "
            f"(none matches the rule's other conditions with a config satisfying it) and {where}"
            ", so the rule never applies; add the architecture to the catalog or a case "
            "with `given: {config: ...}`",
        )


def invariants(subject: Subject) -> Iterator[Finding]:
    """Errors: an invariant of the tests file beside the policy that a context of the domain
    violates (policy stages only; `policy test` adds the runners' capabilities)."""
    from interlock.policy.invariants import ALL_FLAG, check_invariants

    if subject.tests is None:
        return
    for result in check_invariants(subject.policy, subject.tests.invariants):
        if result.passed:
            continue
        examples = result.counterexamples
        text = "; ".join(f"counterexample: {c.describe()}" for c in examples[:3])
        more = (f"; … and {len(examples) - 3} more (policy test {ALL_FLAG})"
                if len(examples) > 3 else "")
        yield subject.finding(
            result.invariant.at(),
            ERROR,
            "invariant-violated",
            f"invariant {result.invariant.name!r} ({result.claim()}) fails in "
            f"{len(examples)} of {result.checked} contexts: {text}{more}",
        )


def _vague(reason: str) -> str:
    text = reason.strip().lower().strip(".!?:;,-_*() \"'`")
    if not text:
        return "is empty"
    if text in PLACEHOLDER_REASONS or re.match(r"^(todo|tbd|fixme|xxx)\b", text):
        return "is a placeholder"
    if len(text.split()) < MIN_REASON_WORDS:
        return f"has fewer than {MIN_REASON_WORDS} words"
    return ""


#: The checks that need only the policy, in order; the plugin layer adds its own
#: (:mod:`interlock.plugins.checks`).
def stale_deviations(subject: Subject) -> Iterator[Finding]:
    """Warnings: a deviation that covers nothing any more: it applies to no context of the
    domain (every env state), or it says the engine refuses where a rule of the policy
    refuses every context it applies to (the policy and the engine agree there)."""
    from interlock.core.decision import OUTCOME

    policy = subject.policy
    for dev in policy.deviations:
        where = Location(dev.location.file, dev.location.line, dev.location.col)
        contexts = [
            c for c in subject.domain.contexts(with_env=True)
            if dev.applies(context_facts(policy, c), c.env)
        ]
        if not contexts:
            yield subject.finding(
                where, WARNING, "stale-deviation",
                f"deviation {dev.id} applies to no context of the domain, so it covers nothing",
            )
            continue
        if dev.field != OUTCOME:
            continue
        refusals = set()
        for context in contexts:
            try:
                refusal = resolve(policy, context, refused=True).refusal
            except PolicyError:
                refusal = None
            if refusal is None:
                break
            refusals.add(refusal.by)
        else:
            yield subject.finding(
                where, WARNING, "stale-deviation",
                f"deviation {dev.id} declares that the engine refuses where rule(s) "
                f"{', '.join(sorted(refusals))} refuse every context it applies to: the "
                "policy says so itself, so the deviation covers nothing; remove it",
            )


CHECKS: tuple[Check, ...] = (
    unknown_runners,
    unknown_architectures,
    bounded_domain,
    dead_and_shadowed_rules,
    pinned_rules,
    stale_deviations,
    near_miss_lists,
    reasons,
    evidence,
    unreachable_config,
    invariants,
)


# -- running --------------------------------------------------------------------------------


def runners_named(names: Sequence[str]) -> RunnerCheck:
    """A fixed set of runner names (tests, tools without plugins)."""
    known = tuple(names)

    def problem(name: str) -> str | None:
        if name in known:
            return None
        return f"runner {name!r} is not registered{hint(name, known)}; registered runners: " + (
            ", ".join(known) or "(none)"
        )

    return problem


def lint_paths(
    paths: Sequence[str | os.PathLike[str]] | None = None,
    *,
    runners: RunnerCheck | Sequence[str],
    checks: Sequence[Check] = (),
) -> list[Finding]:
    """Check the policy files that :func:`interlock.policy.loader.policy_paths` picks for ``paths``
    (see :func:`lint_sources`)."""
    from interlock.policy.loader import policy_paths, read_source

    sources: list[tuple[str, bytes]] = []
    findings: list[Finding] = []
    files = dict(policy_paths(paths))
    for name, path in files.items():
        try:
            sources.append((name, read_source(path, name)))
        except PolicyError as exc:
            findings.extend(_from_error(exc))
    if findings:
        return findings
    return lint_sources(sources, runners=runners, checks=checks, files=files)


def lint_sources(
    sources: list[tuple[str, bytes]],
    *,
    runners: RunnerCheck | Sequence[str],
    checks: Sequence[Check] = (),
    files: dict[str, Path] | None = None,
) -> list[Finding]:
    """Check layered ``(display name, content)`` sources: loader errors first; only a policy
    that loads is linted. ``runners`` says which runner names exist (a check, or the names);
    ``checks`` run after :data:`CHECKS` (the plugin layer passes the registry's); ``files``
    maps display names to files where they differ (evidence paths are relative to them)."""
    from interlock.policy.build import engine_of_docs
    from interlock.policy.loader import load_policy_sources
    from interlock.policy.schema import validate_file
    from interlock.policy.source import parse_yaml

    findings: list[Finding] = []
    parsed: list[SourceDoc] = []
    for name, content in sources:
        try:
            parsed.append(parse_yaml(content, name))
        except PolicyError as exc:
            findings.extend(_from_error(exc, by_path=False))
    try:
        # Each file is validated in the vocabulary of the engine the stack decides for.
        vocabulary = VOCABULARIES[engine_of_docs(parsed)]
    except PolicyError as exc:
        return [*findings, *_from_error(exc)]
    docs: dict[str, SourceDoc] = {}
    for doc in parsed:
        name = doc.name
        try:
            validate_file(doc, vocabulary)
        except PolicyError as exc:
            findings.extend(_from_error(exc))
            continue
        docs[name] = doc
    if findings:
        return findings
    findings = list(_duplicate_ids(docs))
    if findings:
        return findings
    try:
        policy = load_policy_sources(sources, use_cache=False)
    except PolicyError as exc:
        return _from_error(exc)
    runner_check = runners_named(runners) if isinstance(runners, Sequence) else runners
    subject = Subject(policy, docs, runner_check, files)
    for check in (*CHECKS, *checks):
        findings.extend(check(subject))
    order = {name: i for i, name in enumerate(docs)}
    return sorted(findings, key=lambda f: (order.get(f.file, len(order)), f.line, f.col))


def _duplicate_ids(docs: dict[str, SourceDoc]) -> Iterator[Finding]:
    first: dict[str, str] = {}
    for doc in docs.values():
        for i, rule in enumerate(doc.data.get("rules") or ()):
            mark = doc.mark(("rules", i, "id"))
            where = f"{doc.name}:{mark.line}"
            if rule["id"] in first:
                yield Finding(
                    doc.name,
                    mark.line,
                    mark.col,
                    ERROR,
                    "duplicate-rule-id",
                    f"duplicate rule id {rule['id']!r} (first defined at {first[rule['id']]}); "
                    "ids name rules in traces and tests, so each must be unique",
                )
            else:
                first[rule["id"]] = where


def _from_error(exc: PolicyError, *, by_path: bool = True) -> list[Finding]:
    """Findings of a loader error (and the further errors it carries); ``by_path`` tells a bad
    decision value (``unknown-value``) from other errors by where it is."""
    out = []
    for err in (exc, *exc.more):
        out.append(
            Finding(
                err.file or "<policy>",
                err.line or 1,
                err.col or 1,
                ERROR,
                _error_code(err.path) if by_path else "invalid",
                f"{err.path}: {err.message}" if err.path else err.message,
            )
        )
    return out


def _error_code(path: str | None) -> str:
    """``unknown-value`` for a bad decision value (in defaults, a rule's set or an env binding)."""
    if path:
        last = path.rsplit(".", 1)[-1]
        field = any(last in v.fields for v in VOCABULARIES.values())
        if field or re.match(r"^env\.[^.]+\.values\.", path):
            return "unknown-value"
    return "invalid"


def _same(a: Any, b: Any) -> bool:
    return a == b and type(a) is type(b)


def summary(findings: Sequence[Finding], *, strict: bool = False) -> tuple[int, int, bool]:
    """``(errors, warnings, failed)``; with ``strict`` warnings fail too."""
    errors = sum(f.severity == ERROR for f in findings)
    warnings = sum(f.severity == WARNING for f in findings)
    return errors, warnings, errors > 0 or (strict and warnings > 0)
