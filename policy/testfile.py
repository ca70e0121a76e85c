"""The policy tests file (``policies.tests.yaml``): declarative regression cases for a policy.

Each case gives a context and expects any subset of the decision, optionally
the rule that set those fields, or an error::

    schema_version: 1
    cases:
      - name: GLM-5.2 on MI355X stays on MRV1 (vLLM #53155)
        given: {architecture: GlmMoeDsaForCausalLM, platform: rocm, device_arch: gfx950}
        expect: {runner: mrv1, breakable: false, rule: rocm-dsa-stays-on-mrv1}

The file is validated like a policy (unknown keys, bad values: errors at
file:line:col); names that must exist in the policy (env bindings, rule ids)
are checked against it when the cases run.

A tests file may name the policy it tests, as a stack bottom first: a site's
tests say ``policy: ["@shipped", site.yaml]`` (``@shipped`` is quoted: YAML
reserves a leading ``@``). Relative paths are relative to the tests file's
folder. Without the key, the file tests the policy beside it (``X.yaml``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, model_validator

from interlock.core.errors import PolicyError
from interlock.policy.loader import read_source
from interlock.policy.model import Location
from interlock.policy.schema import DecisionFields, EnvName, Name, RuleId, Scalar, validate_doc
from interlock.policy.source import SourceDoc, parse_yaml

TESTS_SCHEMA_VERSION = 1
#: ``X.tests.yaml`` holds the cases of the policy ``X.yaml`` beside it.
TESTS_SUFFIX = ".tests.yaml"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Given(_Model):
    """The context of a case: what `policy explain` takes as flags."""

    architecture: Name
    platform: Name
    device_arch: StrictStr = ""
    features: dict[Name, Scalar] = {}
    env: dict[EnvName, StrictStr] = {}
    #: Explicit overrides (stage 4), like ``--set``.
    set: DecisionFields = DecisionFields()
    #: The architecture is meant to be outside the policy's catalog (no typo warning).
    outside_catalog: bool = False


class Expect(DecisionFields):
    """Decision fields the case checks, and optionally who set them, or an expected error."""

    rule: RuleId = Field(
        default=None,
        description="id of the rule that must have set every decision field listed here",
    )  # type: ignore[assignment]
    error: Name = Field(
        default=None, description="a substring of the error the case must fail with"
    )  # type: ignore[assignment]

    @model_validator(mode="after")
    def _consistent(self) -> Expect:
        fields = self.fields()
        if self.error is not None and (fields or self.rule is not None):
            raise ValueError("`error` cannot be combined with decision fields or `rule`")
        if self.rule is not None and not fields:
            raise ValueError("`rule` needs at least one decision field whose setter it names")
        if self.error is None and not fields:
            raise ValueError("expect at least one decision field, or an `error`")
        return self

    def fields(self) -> dict[str, Any]:
        """The expected decision fields, by name."""
        return {
            name: getattr(self, name)
            for name in DecisionFields.model_fields
            if name in self.model_fields_set
        }


class Case(_Model):
    name: Name
    given: Given
    expect: Expect


class TestsFileModel(_Model):
    schema_version: Literal[TESTS_SCHEMA_VERSION]  # type: ignore[valid-type]
    policy: Annotated[list[StrictStr], Field(min_length=1)] | None = Field(
        default=None,
        description="the policy the cases test, bottom first (paths relative to this file, "
        "'@shipped' the shipped policy); default: X.yaml beside X.tests.yaml",
    )
    cases: Annotated[list[Case], Field(min_length=1)]


@dataclass(frozen=True)
class LoadedCase:
    """A validated case with where it is written."""

    case: Case
    index: int
    doc: SourceDoc

    @property
    def name(self) -> str:
        return self.case.name

    def at(self, *path: str | int) -> Location:
        mark = self.doc.mark(("cases", self.index, *path))
        return Location(self.doc.name, mark.line, mark.col)

    def error(self, message: str, *path: str | int) -> PolicyError:
        return self.doc.error(("cases", self.index, *path), message)


@dataclass(frozen=True)
class TestsFile:
    name: str
    cases: tuple[LoadedCase, ...]
    #: ``(display name, path)`` of the files of the policy the file names, or None.
    policy: tuple[tuple[str, Path], ...] | None = None


def load_tests(path: str | os.PathLike[str], name: str | None = None) -> TestsFile:
    """Read and validate a tests file; raises :class:`PolicyError` at file:line:col."""
    display = name or os.fspath(path)
    return parse_tests(read_source(Path(path), display), display, Path(path).parent)


def parse_tests(content: bytes, name: str, folder: Path | None = None) -> TestsFile:
    """Validate a tests file's ``content``; ``folder`` is where its relative policy paths
    start (default: the folder of ``name``)."""
    doc = parse_yaml(content, name)
    model = validate_doc(TestsFileModel, doc)
    policy = None
    if model.policy is not None:
        policy = _policy_files(model.policy, doc, Path(name).parent if folder is None else folder)
    seen: dict[str, int] = {}
    for i, case in enumerate(model.cases):
        if case.name in seen:
            first = doc.mark(("cases", seen[case.name], "name")).line
            raise doc.error(
                ("cases", i, "name"),
                f"duplicate case name {case.name!r} (first at line {first}); names identify "
                "cases in reports and pytest",
            )
        seen[case.name] = i
    cases = tuple(LoadedCase(case, i, doc) for i, case in enumerate(model.cases))
    return TestsFile(name, cases, policy)


def _policy_files(
    items: list[str], doc: SourceDoc, folder: Path
) -> tuple[tuple[str, Path], ...]:
    from interlock.policy.loader import parse_stack, shipped_policy_path

    files = []
    for i, item in enumerate(items):
        try:
            stack = parse_stack(item, "policy")
        except PolicyError as exc:
            raise doc.error(("policy", i), exc.message) from None
        for display, path in stack:
            if path != shipped_policy_path() and not path.is_absolute():
                path = Path(os.path.normpath(folder / path))
                display = _shown(path)
            files.append((display, path))
    return tuple(files)


def _shown(path: Path) -> str:
    """``path`` relative to the current directory when below it (shorter locations)."""
    try:
        return str(path.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def tests_path_for(policy_path: Path) -> Path:
    """Where the tests of ``policy_path`` live: ``X.tests.yaml`` beside ``X.yaml`` (links
    followed, so the shipped policy finds the repository's tests file)."""
    real = policy_path.resolve()
    return real.with_name(real.name.removesuffix(".yaml").removesuffix(".yml") + TESTS_SUFFIX)


def policy_path_for(tests_path: Path) -> Path:
    """The policy a tests file belongs to: ``X.yaml`` beside ``X.tests.yaml``."""
    return tests_path.with_name(tests_path.name.removesuffix(TESTS_SUFFIX) + ".yaml")
