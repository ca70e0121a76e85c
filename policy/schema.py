"""The policy file format (schema_version 1) as pydantic models; errors mapped to file:line:col.

Only the loader (on a cache miss) and tools that validate `when` mappings import
this module; the resolver works on the plain dataclasses of :mod:`interlock.policy.model`.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional, TypeVar, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from interlock.core.decision import (
    DECISION_FIELDS,
    MAX_CAPTURE_SIZE,
    OUTCOME,
    VLLM,
    VOCABULARIES,
    FieldSpec,
    Vocabulary,
)
from interlock.core.errors import PolicyError, dotted
from interlock.core.fields import TRAITS
from interlock.core.suggest import hint
from interlock.core.terminal import shown
from interlock.policy.conditions import (
    ENGINES,
    When,
    build_when,
    check_config_path,
    engine_spec,
)
from interlock.policy.source import Path_, SourceDoc

SCHEMA_VERSION = 1

Name = Annotated[StrictStr, Field(min_length=1)]
Names = Union[Name, Annotated[list[Name], Field(min_length=1)]]  # noqa: UP007
Identifier = Annotated[StrictStr, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$")]
EnvName = Annotated[StrictStr, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
RuleId = Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
Url = Annotated[StrictStr, Field(pattern=r"^https?://\S+$")]
Scalar = Union[StrictBool, StrictInt, StrictFloat, StrictStr]  # noqa: UP007
Number = Union[StrictInt, StrictFloat]  # noqa: UP007


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=False)


def _distinct(sizes: list[int]) -> list[int]:
    if len(set(sizes)) != len(sizes):
        raise ValueError("capture sizes must be distinct")
    return sizes


def _decision_type(spec: FieldSpec) -> Any:
    """The pydantic type of a decision field, from its kind."""
    if spec.kind == "choice":
        return Literal[spec.choices]
    if spec.kind == "switch":
        return StrictBool
    if spec.kind == "name":
        assert spec.pattern is not None
        return Annotated[StrictStr, Field(pattern=spec.pattern.pattern)]
    if spec.kind == "size":
        return Annotated[StrictInt, Field(gt=0, le=MAX_CAPTURE_SIZE)]
    positive = Annotated[StrictInt, Field(gt=0, le=MAX_CAPTURE_SIZE)]
    return Annotated[list[positive], Field(min_length=1), AfterValidator(_distinct)]


def _model(name: str, **fields: Any) -> type[_Model]:
    """A model whose fields are built from a vocabulary (decision fields, traits)."""
    return create_model(name, __base__=_Model, **fields)


def _decision_fields(vocabulary: Vocabulary, name: str) -> type[_Model]:
    """The model of a vocabulary's decision fields (a ``set``, ``decided`` or ``defaults``)."""
    # Fields default to None but do not accept an explicit `null`: pydantic does not
    # validate defaults, so `runner: null` in a file fails like any other bad value.
    return _model(
        name,
        **{
            field: (_decision_type(spec), Field(None, description=spec.doc))
            for field, spec in vocabulary.fields.items()
        },
    )


_DecisionFields = _decision_fields(VLLM, "DecisionFields")
#: Every engine's decision fields (their names are distinct): what a tests file may name
#: before the policy it tests, and with it the vocabulary, is known.
_AnyDecisionFields = _model(
    "AnyDecisionFields",
    **{
        name: (_decision_type(spec), Field(None, description=spec.doc))
        for vocabulary in VOCABULARIES.values()
        for name, spec in vocabulary.fields.items()
    },
)


class FeatureOps(_Model):
    gt: Number = None  # type: ignore[assignment]
    ge: Number = None  # type: ignore[assignment]
    lt: Number = None  # type: ignore[assignment]
    le: Number = None  # type: ignore[assignment]
    eq: Scalar = None  # type: ignore[assignment]
    ne: Scalar = None  # type: ignore[assignment]
    in_: Annotated[list[Scalar], Field(min_length=1, alias="in")] = None  # type: ignore[assignment]

    @model_validator(mode="after")
    def _not_empty(self) -> FeatureOps:
        if not self.model_fields_set:
            raise ValueError("a comparison needs at least one of gt, ge, lt, le, eq, ne, in")
        return self


FeatureCondition = Union[Scalar, Annotated[list[Scalar], Field(min_length=1)], FeatureOps]  # noqa: UP007


def _spec_text(text: str) -> str:
    engine_spec(text)
    return text


#: ``"quantization_config.quant_method"``: a dotted path into config.json, bounded.
ConfigPath = Annotated[
    StrictStr, Field(min_length=1), AfterValidator(check_config_path)
]
EngineSpec = Annotated[StrictStr, Field(min_length=1), AfterValidator(_spec_text)]
EngineConditions = Annotated[
    dict[Literal[ENGINES], EngineSpec], Field(min_length=1)  # type: ignore[valid-type]
]


def _trait_type(spec: tuple[str, ...] | type, *, many: bool) -> Any:
    one: Any = StrictBool if spec is bool else Name if spec is str else Literal[spec]
    return Union[one, Annotated[list[one], Field(min_length=1)]] if many else one  # noqa: UP007


_TraitsModel = _model(
    "Traits", **{key: (_trait_type(spec, many=False), None) for key, spec in TRAITS.items()}
)

_WhenModel = _model(
    "When",
    architecture=(Names, None),
    platform=(Names, None),
    device_arch=(Names, None),
    features=(dict[Name, FeatureCondition], None),
    **{key: (_trait_type(spec, many=True), None) for key, spec in TRAITS.items()},
    engine=(EngineConditions, None),
    model=(Names, None),
    config=(Annotated[dict[ConfigPath, FeatureCondition], Field(min_length=1)], None),
)

if TYPE_CHECKING:
    # The checker sees their common base: their fields come from the vocabularies.
    DecisionFields = _Model
    AnyDecisionFields = _Model
    TraitsModel = _Model
    WhenModel = _Model
else:
    DecisionFields, TraitsModel, WhenModel = _DecisionFields, _TraitsModel, _WhenModel
    AnyDecisionFields = _AnyDecisionFields


class RuleModel(_Model):
    id: RuleId
    when: WhenModel = WhenModel()
    set: DecisionFields = Field(  # type: ignore[assignment]
        None, description="decision fields this rule sets (a rule sets or refuses)"
    )
    #: The context is refused, with this message (instead of ``set``).
    refuse: Name = Field(  # type: ignore[assignment]
        None,
        description="refuse the context with this message, naming what the engine would "
        "reject (a rule sets or refuses)",
    )
    #: Apply only where the decision has these values (``set``: after env bindings and
    #: overrides; ``refuse``: the final decision).
    decided: DecisionFields = Field(  # type: ignore[assignment]
        None,
        description="apply only where the decision has these values: with set, the decision "
        "after env bindings and overrides (fields they forced stay); with refuse, the final "
        "decision",
    )
    reason: Name
    ref: Url = None  # type: ignore[assignment]
    #: Measurement records (``policy measure --record``) behind the rule, relative to this file.
    evidence: Annotated[list[Name], Field(min_length=1)] = None  # type: ignore[assignment]

    @field_validator("set", "decided")
    @classmethod
    def _sets_something(cls, fields: BaseModel) -> BaseModel:
        if not fields.model_fields_set:
            raise ValueError(f"name at least one of {', '.join(type(fields).model_fields)}")
        return fields

    @model_validator(mode="after")
    def _sets_or_refuses(self) -> RuleModel:
        if (self.set is None) == (self.refuse is None):
            raise ValueError(
                "a rule has exactly one of `set` (the fields it decides) and `refuse` "
                "(the message it refuses the context with)"
            )
        if self.decided is not None and self.set is not None:
            both = set(self.decided.model_fields_set) & set(self.set.model_fields_set)
            if both:
                raise ValueError(
                    f"`decided` and `set` both name {', '.join(sorted(both))}: a rule on the "
                    "decision sets other fields than those it tests"
                )
        return self


class EnvBindingModel(_Model):
    field: Literal[DECISION_FIELDS]  # type: ignore[valid-type]
    values: Annotated[dict[StrictStr, Any], Field(min_length=1)]
    #: Later files may neither replace nor drop the binding (a site keeps a switch honoured).
    locked: StrictBool = False


#: What a deviation names: a decision field, or the outcome (the engine refuses the context).
_DEVIATION_FIELDS = (*DECISION_FIELDS, OUTCOME)


class DeviationModel(_Model):
    """A context where the policy differs from the engine it mirrors, on purpose."""

    id: RuleId
    when: WhenModel = WhenModel()
    #: Environment values the context must carry, exactly (``"0"``, ``"1"``).
    env: dict[EnvName, StrictStr] = {}
    field: Literal[_DEVIATION_FIELDS]  # type: ignore[valid-type]
    reason: Name
    ref: Url = None  # type: ignore[assignment]


class PolicyFileModel(_Model):
    schema_version: StrictInt
    version: Name
    catalog: dict[Identifier, TraitsModel] = {}
    defaults: DecisionFields = DecisionFields()
    #: ``null`` drops an earlier file's binding: the variable is no longer honoured.
    env: dict[EnvName, Optional[EnvBindingModel]] = {}  # noqa: UP045
    rules: list[RuleModel] = []
    deviations: list[DeviationModel] = []


def file_model(vocabulary: Vocabulary) -> type[PolicyFileModel]:
    """The policy file model of ``vocabulary``: vLLM's above, another engine's the same with
    its decision fields."""
    if vocabulary is VLLM:
        return PolicyFileModel
    model = _FILE_MODELS.get(vocabulary.engine)
    if model is None:
        title = vocabulary.title
        fields = _decision_fields(vocabulary, f"{title}DecisionFields")
        fields_named = vocabulary.names
        deviation_fields = (*fields_named, OUTCOME)
        names: Any = Literal[fields_named]
        deviations: Any = Literal[deviation_fields]
        rule = create_model(
            f"{title}Rule", __base__=RuleModel,
            set=(fields, RuleModel.model_fields["set"]),
            decided=(fields, RuleModel.model_fields["decided"]),
        )
        binding = create_model(f"{title}EnvBinding", __base__=EnvBindingModel, field=(names, ...))
        deviation = create_model(
            f"{title}Deviation", __base__=DeviationModel,
            field=(deviations, ...),
        )
        model = create_model(
            f"{title}PolicyFile", __base__=PolicyFileModel,
            defaults=(fields, fields()),
            env=(dict[EnvName, Optional[binding]], {}),  # type: ignore[valid-type]  # noqa: UP045
            rules=(list[rule], []),  # type: ignore[valid-type]
            deviations=(list[deviation], []),  # type: ignore[valid-type]
        )
        _FILE_MODELS[vocabulary.engine] = model
    return model


_FILE_MODELS: dict[str, type[PolicyFileModel]] = {}


def validate_file(doc: SourceDoc, vocabulary: Vocabulary = VLLM) -> PolicyFileModel:
    """Validate a parsed policy file, its decision fields ``vocabulary``'s; every error
    points at its file:line:col."""
    data = doc.data
    if not isinstance(data, dict):
        raise doc.error((), "a policy file is a mapping with the keys " + _keys(PolicyFileModel))
    if "schema_version" not in data:
        raise doc.error((), f"schema_version is missing (this interlock reads {SCHEMA_VERSION})")
    version = data["schema_version"]
    if type(version) is int and version > SCHEMA_VERSION:
        raise doc.error(
            ("schema_version",),
            f"schema_version {version} is newer than this interlock understands "
            f"(it reads {SCHEMA_VERSION}); upgrade interlock to use this policy",
        )
    if version != SCHEMA_VERSION or type(version) is not int:
        raise doc.error(
            ("schema_version",),
            f"unsupported schema_version {version!r}; supported: {SCHEMA_VERSION}",
        )
    model = file_model(vocabulary)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _located(exc, doc, model) from None


def validate_when(data: Any, name: str = "<when>") -> dict[str, Any]:
    """Validate a `when` mapping given as Python data; returns it normalised."""
    doc = SourceDoc(name, data)
    try:
        model = WhenModel.model_validate(data)
    except ValidationError as exc:
        raise _located(exc, doc, WhenModel, with_position=False) from None
    return model.model_dump(by_alias=True, exclude_none=True)


# Here rather than beside build_when: validating needs this module's models, and
# interlock.policy.conditions stays below the schema (the schema imports its checks).
def parse_when(data: Mapping[str, Any]) -> When:
    """Validate a `when` mapping (the policy-file syntax) and build it; for plugins and tools.

    Raises :class:`interlock.core.errors.PolicyError` naming the offending key and value.
    """
    return build_when(validate_when(data))


M = TypeVar("M", bound=BaseModel)


def validate_doc(model: type[M], doc: SourceDoc) -> M:
    """Validate a parsed YAML document against another file format's model (e.g. policy
    tests), with errors located like the policy's."""
    try:
        return model.model_validate(doc.data)
    except ValidationError as exc:
        raise _located(exc, doc, model) from None


def _keys(model: type[BaseModel]) -> str:
    return ", ".join(f.alias or name for name, f in model.model_fields.items())


def _located(
    exc: ValidationError, doc: SourceDoc, root: type[BaseModel], *, with_position: bool = True
) -> PolicyError:
    errors = exc.errors(include_url=False)
    paths = [_data_path(doc.data, err["loc"]) for err in errors]
    grouped: dict[tuple[Path_, bool], tuple[list[str], list[Any]]] = {}
    for err, path in zip(errors, paths, strict=True):
        # A union member that failed on type is noise when another member got further.
        if err["type"].endswith("_type") and any(
            len(p) > len(path) and p[: len(path)] == path for p in paths
        ):
            continue
        is_key = err["type"] == "extra_forbidden"
        inputs: list[Any] = []
        if is_key:
            allowed = _allowed_keys(root, err["loc"][:-1]) or []
            message = f"unknown field {path[-1]!r}" + (
                f"; allowed: {', '.join(allowed)}" if allowed else ""
            )
            message += hint(str(path[-1]), allowed)
        elif err["type"] == "missing":
            message = f"missing required field {err['loc'][-1]!r}"
        elif err["loc"] and err["loc"][-1] == "[key]":
            if isinstance(err["input"], str):  # a string, but not of the allowed form
                message = f"key {shown(err['input'])}: {_message(err)}"
            else:
                message = f"key {err['input']!r} must be a string (quote it)"
        else:
            message = _message(err)
            if not isinstance(err["input"], (dict, list)):
                inputs.append(err["input"])
        messages, seen_inputs = grouped.setdefault((path, is_key), ([], []))
        if message not in messages:
            messages.append(message)
        seen_inputs.extend(i for i in inputs if i not in seen_inputs)
    located = []
    for (path, is_key), (messages, inputs) in grouped.items():
        text = messages[0] + "".join(" or " + _drop_prefix(m, messages[0]) for m in messages[1:])
        if inputs:
            text += f" (got {inputs[0]!r})"
        if with_position:
            located.append(doc.error(path, text, key=is_key))
        else:
            located.append(PolicyError(text, file=doc.name, path=dotted(path) or None))
    first, *rest = located
    first.more = tuple(rest)
    return first


def _message(err: Any) -> str:
    text = err["msg"]
    if text.startswith("Value error, "):
        text = text[len("Value error, ") :]
    return text[0].lower() + text[1:]


def _drop_prefix(message: str, first: str) -> str:
    """Shorten the second of ``input should be a valid string or input should be a valid list``."""
    common = "input should be "
    return (
        message[len(common) :]
        if message.startswith(common) and first.startswith(common)
        else message
    )


def _data_path(data: Any, loc: tuple[Any, ...]) -> Path_:
    """The part of a pydantic error location that exists in the data (drops union tags)."""
    path: list[str | int] = []
    for part in loc:
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            data = data[part]
        else:
            continue
        path.append(part)
    return tuple(path)


def _allowed_keys(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str] | None:
    """Field names (aliases) of the model found at ``loc``, walking the type annotations."""
    current: Any = root
    for part in loc:
        current = _unwrap(current, part)
        if isinstance(current, type) and issubclass(current, BaseModel):
            # Union members appear in locations as tags: "function-after[..., FeatureOps]".
            if isinstance(part, str) and (
                part == current.__name__ or part.endswith(f" {current.__name__}]")
            ):
                continue
            by_key = {f.alias or name: f for name, f in current.model_fields.items()}
            if part not in by_key:
                return None
            current = by_key[part].annotation
        elif typing.get_origin(current) is list:
            current = typing.get_args(current)[0]
        elif typing.get_origin(current) is dict:
            current = typing.get_args(current)[1]
        else:
            return None
    current = _unwrap(current, None)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return [f.alias or name for name, f in current.model_fields.items()]
    return None


def _unwrap(tp: Any, part: Any) -> Any:
    """Strip Annotated; from a union pick the model member (the container one for an index)."""
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (Union, types.UnionType):
            members = typing.get_args(tp)
            models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
            containers = [m for m in members if typing.get_origin(_strip(m)) in (list, dict)]
            if isinstance(part, int) and containers:
                tp = containers[0]
            elif models:
                tp = models[0]
            else:
                return tp
        else:
            return tp


def _strip(tp: Any) -> Any:
    return typing.get_args(tp)[0] if typing.get_origin(tp) is Annotated else tp
