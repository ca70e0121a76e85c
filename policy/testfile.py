"""The policy tests file (``policies.tests.yaml``): declarative regression cases for a policy.

Each case gives a context and expects any subset of the decision, optionally
the rule that set those fields, or an error::

    schema_version: 1
    cases:
      - name: GLM-5.2 on MI355X stays on MRV1 (vLLM #53155)
        given: {architecture: GlmMoeDsaForCausalLM, platform: rocm, device_arch: gfx950}
        expect: {runner: mrv1, breakable: false, rule: rocm-dsa-stays-on-mrv1}

A case's context may carry the model's config.json (``config:``, a mapping as
in the file), its identity (``model: zai-org/GLM-5.3``) and engine versions
(``engine: {vllm: 0.29.0}``), for rules with ``config``, ``model`` and
``engine`` conditions.

*Invariants* state what must hold on the policy's whole finite domain
(:class:`interlock.policy.domain.Domain`), and are checked by enumeration::

    invariants:
      - name: DSA models on ROCm stay on MRV1
        forall: {platform: rocm, attention: dsa}
        expect: {runner: mrv1}
      - name: breakable graphs never compile
        never: {breakable: true, compile: true}
      - name: MRV1 on ROCm keeps compiled graphs
        forall: {platform: rocm}
        implies: {if: {runner: mrv1}, then: {compile: true}}

``forall`` (a `when` mapping, default every context) selects the contexts, and
``env`` (``{VLLM_USE_V2_MODEL_RUNNER: null}``: unset) narrows them to an
environment; otherwise every env state of the domain is checked, so an
operator's override that breaks the claim is a counterexample too.
``expect`` (decision fields) must hold in each, ``never`` must not hold all
together in any, and ``implies`` says that wherever the decision has the ``if``
fields it also has the ``then`` fields. A violation is reported as a
counterexample: the context, its decision and the rule (file:line) that
decided the fields concerned.

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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictStr, model_validator

from interlock.core.errors import PolicyError
from interlock.policy.conditions import ENGINES, check_version
from interlock.policy.context import Context, make_context
from interlock.policy.loader import read_source
from interlock.policy.model import Location
from interlock.policy.schema import (
    AnyDecisionFields,
    EnvName,
    Name,
    RuleId,
    Scalar,
    WhenModel,
    validate_doc,
)
from interlock.policy.source import SourceDoc, parse_yaml

TESTS_SCHEMA_VERSION = 1
#: ``X.tests.yaml`` holds the cases of the policy ``X.yaml`` beside it.
TESTS_SUFFIX = ".tests.yaml"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


Version = Annotated[StrictStr, AfterValidator(check_version)]


class Given(_Model):
    """The context of a case: what `policy explain` takes as flags."""

    architecture: Name
    platform: Name
    device_arch: StrictStr = ""
    features: dict[Name, Scalar] = {}
    env: dict[EnvName, StrictStr] = {}
    #: Explicit overrides (stage 4), like ``--set``.
    set: AnyDecisionFields = AnyDecisionFields()
    #: The architecture is meant to be outside the policy's catalog (no typo warning).
    outside_catalog: bool = False
    #: The model's config.json, as a mapping (``config`` conditions see it flattened).
    config: dict[StrictStr, Any] | None = Field(
        default=None, description="the model's config.json (a mapping)"
    )
    #: The model's identity, like ``--model-id``.
    model: Name = Field(default=None, description="the model's id")  # type: ignore[assignment]
    #: Engine versions, like ``--engine-version vllm=0.29.0``.
    engine: dict[Literal[ENGINES], Version] = {}  # type: ignore[valid-type]


class Expect(AnyDecisionFields):
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
            for name in AnyDecisionFields.model_fields
            if name in self.model_fields_set
        }


class Case(_Model):
    name: Name
    given: Given
    expect: Expect


class Implication(_Model):
    if_: AnyDecisionFields = Field(alias="if")
    then: AnyDecisionFields


class Invariant(_Model):
    """What must hold over the whole domain: exactly one of expect, never, implies."""

    name: Name
    forall: WhenModel = Field(
        default=WhenModel(), description="the contexts it is about (a `when`; default: all)"
    )
    env: dict[EnvName, StrictStr | None] = Field(
        default={},
        description="environment the contexts must carry: a value, or null for unset "
        "(default: every env state of the domain)",
    )
    expect: AnyDecisionFields = Field(
        default=None, description="decision fields every context must have"
    )  # type: ignore[assignment]
    never: AnyDecisionFields = Field(
        default=None, description="decision fields no context may have all together"
    )  # type: ignore[assignment]
    implies: Implication = Field(
        default=None, description="where the decision has the `if` fields, it has `then`'s"
    )  # type: ignore[assignment]

    @model_validator(mode="after")
    def _one_claim(self) -> Invariant:
        claims = [c for c in ("expect", "never", "implies") if getattr(self, c) is not None]
        if len(claims) != 1:
            raise ValueError("an invariant has exactly one of expect, never, implies")
        fields = [self.expect, self.never] + (
            [self.implies.if_, self.implies.then] if self.implies is not None else []
        )
        if any(f is not None and not f.model_fields_set for f in fields):
            raise ValueError("an invariant's decision fields cannot be empty")
        return self


class TestsFileModel(_Model):
    schema_version: Literal[TESTS_SCHEMA_VERSION]  # type: ignore[valid-type]
    policy: Annotated[list[StrictStr], Field(min_length=1)] | None = Field(
        default=None,
        description="the policy the cases test, bottom first (paths relative to this file, "
        "'@shipped' the shipped policy); default: X.yaml beside X.tests.yaml",
    )
    cases: list[Case] = []
    invariants: list[Invariant] = []

    @model_validator(mode="after")
    def _something(self) -> TestsFileModel:
        if not self.cases and not self.invariants:
            raise ValueError("a tests file has at least one case or invariant")
        return self


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

    # A method of the case, not of the runner of cases: `policy lint` needs the same context
    # for its reachability check, and neither should import the other for it.
    def context(self) -> Context:
        """The context the case gives, its config flattened as a model's config.json is."""
        given = self.case.given
        where = f"{self.doc.name}:{self.at('given').line}"
        sources: dict[str, str] = {}
        if given.model:
            sources["model_id"] = f"given by the case ({where})"
        if given.config is not None:
            sources["config"] = f"the case's config ({where})"
        # Built as `policy explain` builds its context (the same normalisation); the case's
        # config is read as a model's config.json is, its traits too.
        return make_context(
            given.architecture,
            platform=given.platform,
            device_arch=given.device_arch or None,
            features=given.features,
            env=given.env,
            model_config=given.config,
            model_id=given.model,
            engine=given.engine,
            sources=sources,
        )


@dataclass(frozen=True)
class LoadedInvariant:
    """A validated invariant with where it is written."""

    invariant: Invariant
    index: int
    doc: SourceDoc

    @property
    def name(self) -> str:
        return self.invariant.name

    def at(self, *path: str | int) -> Location:
        mark = self.doc.mark(("invariants", self.index, *path))
        return Location(self.doc.name, mark.line, mark.col)


@dataclass(frozen=True)
class TestsFile:
    name: str
    cases: tuple[LoadedCase, ...]
    #: ``(display name, path)`` of the files of the policy the file names, or None.
    policy: tuple[tuple[str, Path], ...] | None = None
    invariants: tuple[LoadedInvariant, ...] = ()


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
    named: tuple[tuple[str, Sequence[Case | Invariant]], ...] = (
        ("cases", model.cases),
        ("invariants", model.invariants),
    )
    for key, items in named:
        seen: dict[str, int] = {}
        for i, item in enumerate(items):
            if item.name in seen:
                first = doc.mark((key, seen[item.name], "name")).line
                raise doc.error(
                    (key, i, "name"),
                    f"duplicate {key[:-1]} name {item.name!r} (first at line {first}); names "
                    "identify them in reports and pytest",
                )
            seen[item.name] = i
    return TestsFile(
        name,
        tuple(LoadedCase(case, i, doc) for i, case in enumerate(model.cases)),
        policy,
        tuple(LoadedInvariant(inv, i, doc) for i, inv in enumerate(model.invariants)),
    )


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
