"""What a plugin declares: runner specs and kernel specs.

Plain frozen dataclasses, validated on construction with messages naming the
offending value and the allowed ones. Cheap to import (no torch, no pydantic):
the cached registry is rebuilt from its JSON form (``to_dict``/``from_dict``)
on every `policy explain`. The objects that
do the work are named by import path (``module:attr``) and loaded only when a
run needs them.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from interlock.core.decision import (
    DTYPES,
    FIELDS,
    IMPLICATIONS,
    RUNNER_NAME,
    CudagraphMode,
    Decision,
    FieldSpec,
)
from interlock.core.platform import PLATFORM_NAMES, TRITON_FACT, platform_problem
from interlock.plugins.api import check_api_range

if TYPE_CHECKING:
    from interlock.policy.conditions import When

# Boolean facts of the context a runner may require on a platform, with what
# each one means in a message ("mrv2 requires Triton on cuda").
REQUIRABLE_FACTS: dict[str, str] = {TRITON_FACT: "Triton"}

_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_PLATFORM = re.compile(r"^[a-z][a-z0-9_]*$")
_BACKEND = re.compile(r"^[a-z][a-z0-9_-]*$")


class SpecError(ValueError):
    """A declaration is invalid; the message names the field, the value and what is allowed."""


def load_import_path(path: str) -> Any:
    """The object named by ``package.module:attr``; raises ImportError/AttributeError."""
    module, _, attrs = path.partition(":")
    obj: Any = importlib.import_module(module)
    for attr in attrs.split("."):
        obj = getattr(obj, attr)
    return obj


def _fail(where: str, message: str) -> SpecError:
    return SpecError(f"{where}: {message}")


def _text(where: str, value: object, pattern: re.Pattern[str] | None = None) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _fail(where, f"{value!r} must be a non-empty string")
    if pattern is not None and not pattern.match(value):
        raise _fail(where, f"{value!r} does not match {pattern.pattern}")
    return value


def _import_path(where: str, value: object) -> str:
    if not isinstance(value, str) or not _IMPORT_PATH.match(value):
        raise _fail(where, f"{value!r} is not an import path of the form 'package.module:attr'")
    return value


def _api_range(where: str, value: object) -> str:
    try:
        return check_api_range(_text(where, value))
    except ValueError as exc:
        raise _fail(where, str(exc)) from None


def _choices(
    where: str, values: object, allowed: Iterable[str] | re.Pattern[str]
) -> tuple[str, ...]:
    """A set declared in any iterable form, stored distinct and in a stable order."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise _fail(where, f"{values!r} must be a set or list")
    items = set(values)
    if isinstance(allowed, re.Pattern):
        for item in items:
            _text(where, item, allowed)
        return tuple(sorted(items))
    order = list(allowed)
    unknown = sorted(str(i) for i in items if i not in order)
    if unknown:
        raise _fail(where, f"unknown {', '.join(map(repr, unknown))}; allowed: {', '.join(order)}")
    return tuple(v for v in order if v in items)


#: What an ``Unserved`` is about: the run's context (the platform, a required fact, the
#: tensor-parallel size), a decision field's value, or two fields' values that exclude
#: each other (``IMPLICATIONS``: breakable capture runs without torch.compile).
CONTEXT, FIELD, IMPLICATION = "context", "field", "implication"


@dataclass(frozen=True)
class Unserved:
    """One thing of a decision a runner does not serve on a platform."""

    field: str  # the decision field; for the context: platform, requires, tensor_parallel_size
    value: Any  # the platform, the required fact's name, the size, the field's value
    what: str  # as a message names it: "cudagraph=full", "breakable capture"
    offered: str  # what the runner serves instead, "" for a switch ("none, piecewise")
    kind: str = FIELD  # CONTEXT, FIELD or IMPLICATION

    def __str__(self) -> str:
        return self.what


@dataclass(frozen=True)
class PlatformSupport:
    """What a runner serves on one platform: for each decision field it declares (an attribute
    named like the field), the values it serves: a set of choices, or True for a switch.

    A set of choices is declared in any collection (a set, a list, a tuple) and stored as a
    tuple, distinct and in the vocabulary's order."""

    cudagraph: Collection[CudagraphMode]
    breakable: bool = False
    compile: bool = False  # torch.compile
    # Facts that must be true for the runner to serve this platform at all.
    requires: Collection[str] = ()
    # The largest tensor_parallel_size served: 1 (the default) is no tensor parallelism,
    # None no limit of the runner's own (the model's head counts still limit it).
    max_tensor_parallel_size: int | None = 1

    def __post_init__(self) -> None:
        for name in SERVED_FIELDS:
            spec, value = FIELDS[name], getattr(self, name)
            if spec.kind == "switch":
                if not isinstance(value, bool):
                    raise _fail(name, f"{value!r} must be True or False")
                continue
            value = _choices(name, value, spec.choices)
            object.__setattr__(self, name, value)
            floor = _floor(spec)
            if floor not in value:
                # Every fallback chain ends there: a runner must be able to serve it.
                raise _fail(name, f"must include {floor!r} (every runner can run with it)")
        limit = self.max_tensor_parallel_size
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or limit < 1):
            raise _fail(
                "max_tensor_parallel_size", f"{limit!r} must be an integer >= 1 or None (no limit)"
            )
        set_ = object.__setattr__
        set_(self, "requires", _choices("requires", self.requires, tuple(REQUIRABLE_FACTS)))
        if self.breakable and self.cudagraph == ("none",):
            raise _fail("breakable", "breakable capture needs a graph mode besides 'none'")

    def _offers(self, name: str, value: Any) -> bool:
        """Whether decision field ``name`` may take ``value`` on this platform."""
        declared = getattr(self, name)
        if isinstance(declared, bool):
            return value is False or declared
        return value in declared

    def _unserved_fields(self, decision: Decision) -> list[Unserved]:
        """The decision fields' values this platform does not serve (``RunnerSpec.unserved``
        is the judge; this is its part per field). Unset fields are served."""
        unserved = []
        for name in SERVED_FIELDS:
            value = getattr(decision, name)
            if value is None or self._offers(name, value):
                continue
            declared = getattr(self, name)
            offered = "" if isinstance(declared, bool) else ", ".join(declared)
            unserved.append(Unserved(name, value, FIELDS[name].what(value), offered))
        return unserved

    def describe(self, name: str) -> str:
        """What this platform serves of decision field ``name``, as messages say it:
        ``cudagraph none, full``, ``breakable capture``, ``no torch.compile``."""
        declared = getattr(self, name)
        if isinstance(declared, bool):
            return FIELDS[name].label if declared else f"no {FIELDS[name].label}"
        return f"{name} {', '.join(declared)}"

    def to_dict(self) -> dict[str, Any]:
        declared = {n: getattr(self, n) for n in SERVED_FIELDS}
        listed = {n: v if isinstance(v, bool) else list(v) for n, v in declared.items()}
        return {
            **listed,
            "requires": list(self.requires),
            "max_tensor_parallel_size": self.max_tensor_parallel_size,
        }


def _floor(spec: FieldSpec) -> Any:
    """The value every fallback chain of a choice field ends at."""
    value = spec.choices[0]
    while value in spec.fallback:
        value = spec.fallback[value]
    return value


#: The decision fields a runner declares per platform (PlatformSupport's attributes among them).
SERVED_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(PlatformSupport) if f.name in FIELDS)


@dataclass(frozen=True)
class Unsupported:
    """A feature a runner cannot serve: ``when`` is a condition in the rule `when` language."""

    feature: str  # what it is, for messages: "pipeline parallelism"
    when: Mapping[str, Any]
    #: ``when`` compiled by the engine, kept with the spec (and in the registry cache).
    condition: When = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # The engine's own parser (one condition language for rules and plugins);
        # it is the one place that imports pydantic, and runs only at declaration.
        from interlock.core.errors import PolicyError
        from interlock.policy.conditions import build_when
        from interlock.policy.schema import validate_when

        _text("feature", self.feature)
        if not isinstance(self.when, Mapping) or not self.when:
            raise _fail("when", f"{self.when!r} must be a non-empty mapping of conditions")
        try:
            when = validate_when(dict(self.when))
        except PolicyError as exc:
            raise _fail("when", str(exc)) from None
        object.__setattr__(self, "when", when)
        object.__setattr__(self, "condition", build_when(when))

    def to_dict(self) -> dict[str, Any]:
        return {"feature": self.feature, "when": dict(self.when)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Unsupported:
        """Rebuild what :meth:`to_dict` wrote for a validated declaration (the registry cache)
        without the pydantic validation, which only declaring needs."""
        from interlock.policy.conditions import build_when

        if not isinstance(data["when"], dict):
            raise _fail("when", "must be a mapping")
        obj = object.__new__(cls)
        object.__setattr__(obj, "feature", _text("feature", data["feature"]))
        object.__setattr__(obj, "when", data["when"])
        object.__setattr__(obj, "condition", build_when(data["when"]))
        return obj


@dataclass(frozen=True)
class RunnerSpec:
    """A runner as the policy sees it: capabilities, fallback, and where its object lives."""

    name: str
    description: str
    plugin_api: str  # the plugin API versions supported, e.g. ">=1.0,<2"
    platforms: Mapping[str, PlatformSupport]
    # The runner object (runners.contract), imported only when a run starts.
    factory: str
    unsupported: tuple[Unsupported, ...] = ()
    # The runner an automatic choice moves to when this one cannot serve the context.
    fallback: str | None = None
    # Platforms this runner brings that are not built in (interlock.core.platform): named
    # here on purpose, so that a misspelt one ("cdua") is an error, not a platform no
    # context ever has while the real one silently falls back to another runner.
    new_platforms: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        where = f"runner {self.name!r}"
        try:
            self._validate()
        except SpecError as exc:
            raise SpecError(f"{where}: {exc}") from None

    def _validate(self) -> None:
        _text("name", self.name, RUNNER_NAME)
        _text("description", self.description)
        _api_range("plugin_api", self.plugin_api)
        _import_path("factory", self.factory)
        if not isinstance(self.platforms, Mapping) or not self.platforms:
            raise _fail("platforms", "declare at least one, e.g. {'cpu': PlatformSupport(...)}")
        object.__setattr__(self, "new_platforms", tuple(self.new_platforms))
        for platform in self.new_platforms:
            _text("new_platforms", platform, _PLATFORM)
            if platform in PLATFORM_NAMES:
                raise _fail("new_platforms", f"{platform!r} is built in; list it in platforms only")
        for platform, support in self.platforms.items():
            _text("platforms", platform, _PLATFORM)
            problem = platform_problem(platform, self.new_platforms)
            if problem is not None:
                raise _fail(
                    "platforms", f"{problem}; a new platform is also listed in new_platforms"
                )
            if not isinstance(support, PlatformSupport):
                raise _fail(f"platforms.{platform}", f"{support!r} is not a PlatformSupport")
        object.__setattr__(self, "platforms", dict(sorted(self.platforms.items())))
        object.__setattr__(self, "unsupported", tuple(self.unsupported))
        for i, item in enumerate(self.unsupported):
            if not isinstance(item, Unsupported):
                raise _fail(f"unsupported[{i}]", f"{item!r} is not an Unsupported")
        if self.fallback is not None:
            _text("fallback", self.fallback, RUNNER_NAME)
            if self.fallback == self.name:
                raise _fail("fallback", "a runner cannot fall back to itself")

    def unserved(
        self,
        decision: Decision,
        platform: str,
        *,
        tensor_parallel_size: int = 1,
        facts: Mapping[str, Any] | None = None,
    ) -> list[Unserved]:
        """Everything of running ``decision`` on ``platform`` that this runner does not serve;
        empty: it serves it. The one judge of "can this runner serve this": stage 5, the
        built-in runners' load, `policy check`'s lint and the plugin test kit all ask it.

        In order: the platform (nothing else is judged without it), each fact the platform
        requires (``facts``, by name; a fact not given counts as true, as for a platform
        named for another machine, which cannot be probed here), the tensor-parallel size,
        each decision field the runner declares, and pairs of values that exclude each
        other (``interlock.core.decision.IMPLICATIONS``)."""
        support = self.platforms.get(platform)
        if support is None:
            return [Unserved("platform", platform, f"platform {platform}",
                             ", ".join(self.platforms), CONTEXT)]
        given = facts or {}
        items = [
            Unserved("requires", name, REQUIRABLE_FACTS[name], "", CONTEXT)
            for name in support.requires
            if given.get(name, True) is not True
        ]
        limit = support.max_tensor_parallel_size
        if tensor_parallel_size > 1 and limit is not None and tensor_parallel_size > limit:
            served = "no tensor parallelism" if limit == 1 else f"at most {limit}"
            items.append(Unserved("tensor_parallel_size", tensor_parallel_size,
                                  f"tensor_parallel_size={tensor_parallel_size}", served, CONTEXT))
        items += support._unserved_fields(decision)
        for implication in IMPLICATIONS:
            if implication.violated_by(decision):
                items.append(Unserved(implication.then, getattr(decision, implication.then),
                                      implication.what(), "", IMPLICATION))
        return items

    def claims_beyond(self, base: RunnerSpec) -> list[str]:
        """What this spec serves that ``base`` does not, one phrase per claim (empty: it claims
        no more): platforms, each field's values per platform, a fact ``base`` requires that
        this does not, a larger tensor-parallel size, and features ``base`` declares
        unsupported that this does not. For a runner class subclassing ``base``'s, whose
        code is ``base``'s unless it overrides it."""
        claims = [f"platform {p}" for p in self.platforms if p not in base.platforms]
        for platform, support in self.platforms.items():
            below = base.platforms.get(platform)
            if below is None:
                continue
            for name in SERVED_FIELDS:
                declared = getattr(support, name)
                # A switch offers its one value (False is served by every runner).
                offered = (declared,) if isinstance(declared, bool) else declared
                claims += [f"{FIELDS[name].what(v)} on {platform}" for v in offered
                           if not below._offers(name, v)]
            claims += [f"{platform} without {REQUIRABLE_FACTS[fact]}" for fact in below.requires
                       if fact not in support.requires]
            limit, base_limit = support.max_tensor_parallel_size, below.max_tensor_parallel_size
            if base_limit is not None and (limit is None or limit > base_limit):
                size = "any" if limit is None else str(limit)
                claims.append(f"tensor_parallel_size {size} on {platform} ({base.name}: at "
                              f"most {base_limit})")
        declared = [u.to_dict() for u in self.unsupported]
        claims += [u.feature for u in base.unsupported if u.to_dict() not in declared]
        return claims

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "plugin_api": self.plugin_api,
            "platforms": {p: s.to_dict() for p, s in self.platforms.items()},
            "unsupported": [u.to_dict() for u in self.unsupported],
            "fallback": self.fallback,
            "factory": self.factory,
            "new_platforms": list(self.new_platforms),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunnerSpec:
        """The spec :meth:`to_dict` describes (validated again)."""
        return cls(
            name=data["name"],
            description=data["description"],
            plugin_api=data["plugin_api"],
            platforms={p: PlatformSupport(**s) for p, s in data["platforms"].items()},
            factory=data["factory"],
            unsupported=tuple(Unsupported.from_dict(u) for u in data["unsupported"]),
            fallback=data["fallback"],
            new_platforms=tuple(data.get("new_platforms", ())),
        )


@dataclass(frozen=True)
class KernelSpec:
    """An extra implementation of a kernel op, installed into ``interlock.kernels.REGISTRY``
    when kernels load."""

    op: str
    backend: str
    target: str  # the function, as "package.module:attr"
    platforms: tuple[str, ...]
    dtypes: tuple[str, ...]
    plugin_api: str
    # ``fn(platform) -> str | None``: why the implementation cannot run now, or None.
    unavailable: str | None = None

    def __post_init__(self) -> None:
        where = f"kernel {self.op!r}/{self.backend!r}"
        try:
            _text("op", self.op)
            _text("backend", self.backend, _BACKEND)
            _import_path("target", self.target)
            object.__setattr__(self, "platforms", _choices("platforms", self.platforms, _PLATFORM))
            object.__setattr__(self, "dtypes", _choices("dtypes", self.dtypes, DTYPES))
            if not self.platforms or not self.dtypes:
                raise _fail("platforms/dtypes", "declare at least one of each")
            _api_range("plugin_api", self.plugin_api)
            if self.unavailable is not None:
                _import_path("unavailable", self.unavailable)
        except SpecError as exc:
            raise SpecError(f"{where}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "backend": self.backend,
            "target": self.target,
            "platforms": list(self.platforms),
            "dtypes": list(self.dtypes),
            "plugin_api": self.plugin_api,
            "unavailable": self.unavailable,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KernelSpec:
        """The spec :meth:`to_dict` describes (validated again)."""
        return cls(**data)
