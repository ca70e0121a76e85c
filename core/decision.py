"""The decision vocabulary: the one frozen :class:`Decision` the policy resolves and a runner runs.

Each field's annotation says what it accepts: a ``Literal`` of choices, ``bool``, a runner name
(``str`` with a pattern) or ``tuple[int, ...]`` of distinct positive sizes. A field whose type
admits ``None`` is optional in a policy's ``defaults``. Everything else is derived from this
class: the field list, the checks of overrides and env values (:func:`check_field`,
:func:`parse_field`), the policy file's pydantic model and JSON Schema
(:mod:`interlock.policy.schema`), what a runner declares per platform and ``RunnerSpec.unserved``
(:class:`interlock.plugins.spec.PlatformSupport`) and stage 5's fallback chains. Plain Python,
no pydantic: the resolver's warm path imports it.
"""

# Not ``from __future__ import annotations``: the field kinds are read from the annotations.
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Union, get_args, get_origin

# The cudagraph field's choices and their meaning are interlock.core.cudagraph's table;
# the decision vocabulary names them too.
from interlock.core.cudagraph import CUDAGRAPH_MODES as CUDAGRAPH_MODES
from interlock.core.cudagraph import CudagraphMode, fallbacks

#: The dtypes a model runs in (``auto``, where accepted, means the checkpoint's own).
Dtype = Literal["float32", "bfloat16", "float16"]
DTYPES: tuple[str, ...] = get_args(Dtype)
#: What a caller may ask for: a dtype, or ``auto``.
DTYPE_CHOICES: tuple[str, ...] = ("auto", *DTYPES)
#: How a model's weights are materialised: from the checkpoint (``auto``, ``safetensors``) or
#: random (``dummy``).
LOAD_FORMATS: tuple[str, ...] = ("auto", "safetensors", "dummy")
#: How a GGUF file's block-quantized weights are held: kept quantized (``native``, products
#: that dequantize inside them; ``int8``, the same, but the Q4_1 and Q8_0 products round their
#: activations to 8 bits and take integer dot products), converted to floats at load
#: (``dequantize``), or ``auto``: native where the quantized kernels run natively (CPU,
#: float32, one rank), else dequantize.
WEIGHTS: tuple[str, ...] = ("auto", "native", "int8", "dequantize")
RUNNER_NAME = re.compile(r"^[a-z][a-z0-9_]*$")

FieldValue = str | bool | tuple[int, ...]
#: No batch of one step is larger (a graph per size is captured: 1e20 is a mistake).
MAX_CAPTURE_SIZE = 65536


def _about(doc: str, **meta: Any) -> dict[str, Any]:
    """A field's metadata: ``doc`` (its meaning, in the JSON Schema) and optionally ``label``
    (how a message names a switch), ``fallback`` (value -> what stage 5 tries next when a
    runner does not serve it), ``pattern`` and ``allowed`` (for a name)."""
    return {"doc": doc, **meta}


@dataclass(frozen=True)
class Decision:
    """How to run a model: what the policy decides and what a runner is handed (checked on
    construction; a ``ValueError`` names the field, the value and what is allowed)."""

    runner: str = field(default="mrv1", metadata=_about(
        "the registered runner that executes the model",
        pattern=RUNNER_NAME,
        allowed="a runner name such as mrv1, mrv2 (lowercase letters, digits, _)",
    ))
    cudagraph: CudagraphMode = field(default="none", metadata=_about(
        "the CUDA-graph strategy: piecewise graphs between attention ops, full graphs, "
        "full for decode-only batches, or both",
        fallback=fallbacks(),  # interlock.core.cudagraph's table
    ))
    breakable: bool = field(default=False, metadata=_about(
        "piecewise graphs whose breaks are found during capture (implies compile: false)",
        label="breakable capture",
    ))
    compile: bool = field(default=False, metadata=_about(
        "torch.compile of the graph segments", label="torch.compile"
    ))
    capture_sizes: tuple[int, ...] | None = field(default=None, metadata=_about(
        "the batch sizes to capture graphs for; unset: the runner's automatic sizes"
    ))

    def __post_init__(self) -> None:
        _check_all(self, FIELDS)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (tuples as lists)."""
        return _as_dict(self, FIELDS)


def _check_all(decision: object, specs: "Mapping[str, FieldSpec]") -> None:
    for spec in specs.values():
        value = getattr(decision, spec.name)
        if value is not None or not spec.optional:
            object.__setattr__(decision, spec.name, spec.check(value))


def _as_dict(decision: object, specs: "Mapping[str, FieldSpec]") -> dict[str, Any]:
    values = {name: getattr(decision, name) for name in specs}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}


class FieldSpec:
    """One decision field as read from :class:`Decision` (read-only by convention: a plain
    class, because a dataclass costs `policy explain` its generated methods at every start)."""

    __slots__ = ("name", "kind", "optional", "doc", "choices", "pattern", "label", "fallback",
                 "allowed")

    def __init__(
        self,
        name: str,
        kind: str,  # choice | switch | name | sizes | size
        optional: bool,  # may be left unset by the policy (its type admits None)
        doc: str,
        choices: tuple[str, ...] = (),
        pattern: re.Pattern[str] | None = None,
        label: str = "",
        fallback: Mapping[Any, Any] | None = None,
        allowed: str = "",
    ) -> None:
        self.name, self.kind, self.optional, self.doc = name, kind, optional, doc
        self.choices, self.pattern, self.label = choices, pattern, label
        self.fallback: Mapping[Any, Any] = fallback or {}
        self.allowed = allowed

    def __repr__(self) -> str:
        return f"FieldSpec({self.name!r}, {self.kind!r})"

    def check(self, value: object) -> FieldValue:
        """``value`` validated and normalised (a list of sizes becomes a tuple)."""
        ok = False
        if self.kind == "choice":
            ok = isinstance(value, str) and value in self.choices
        elif self.kind == "switch":
            ok = isinstance(value, bool)
        elif self.kind == "name":
            ok = isinstance(value, str) and bool(self.pattern and self.pattern.match(value))
        elif self.kind == "size":
            ok = type(value) is int and 0 < value <= MAX_CAPTURE_SIZE
        elif isinstance(value, (list, tuple)) and value:
            ok = all(type(v) is int and 0 < v <= MAX_CAPTURE_SIZE for v in value)
            ok = ok and len(set(value)) == len(value)
            value = tuple(value)
        if not ok:
            raise ValueError(f"{self.name}: bad value {value!r}; allowed: {self.allowed}")
        return value  # type: ignore[return-value]

    def parse(self, text: str) -> FieldValue:
        """``text`` (as ``--set name=text`` gives it) typed, then checked."""
        value: object = text
        lowered = text.strip().lower()
        if self.kind == "switch":
            value = True if lowered in _TRUE else False if lowered in _FALSE else text
        elif self.kind == "sizes":
            try:
                value = [int(part) for part in text.split(",")]
            except ValueError:
                value = text
        elif self.kind == "size":
            value = int(text) if text.strip().isdigit() else text
        try:
            return self.check(value)
        except ValueError:  # echo what the user typed, not the parsed form
            raise ValueError(f"{self.name}: bad value {text!r}; allowed: {self.allowed}") from None

    def what(self, value: object) -> str:
        """How a message names asking for ``value``: ``breakable capture``, ``cudagraph=full``."""
        return self.label if self.kind == "switch" else f"{self.name}={value}"

    def next(self, value: object) -> Any:
        """What stage 5 tries after ``value``, which a runner does not serve."""
        return False if self.kind == "switch" else self.fallback[value]


_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")
_SIZES = tuple[int, ...]


def _field_spec(f: Any) -> FieldSpec:
    tp, optional = f.type, False
    if get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp):
        optional = True
        (tp,) = (arg for arg in get_args(tp) if arg is not type(None))
    meta = dict(f.metadata)
    common = {"name": f.name, "optional": optional, "doc": meta.pop("doc")}
    if get_origin(tp) is Literal:
        choices = get_args(tp)
        return FieldSpec(
            kind="choice", choices=choices, allowed=", ".join(choices), **common, **meta
        )
    if tp is bool:
        return FieldSpec(kind="switch", allowed="true, false", **common, **meta)
    if tp is str and "pattern" in meta:
        return FieldSpec(kind="name", **common, **meta)
    if tp == _SIZES:
        allowed = f"a list of distinct integers from 1 to {MAX_CAPTURE_SIZE}, e.g. 1,2,4,8"
        return FieldSpec(kind="sizes", allowed=allowed, **common, **meta)
    if tp is int:
        allowed = f"an integer from 1 to {MAX_CAPTURE_SIZE}"
        return FieldSpec(kind="size", allowed=allowed, **common, **meta)
    raise TypeError(
        f"Decision.{f.name}: {f.type} is not a decision field type; use a Literal of choices, "
        "bool, str with a pattern, int or tuple[int, ...] (each optionally | None)"
    )


#: Name -> spec, in output order.
FIELDS: dict[str, FieldSpec] = {f.name: _field_spec(f) for f in fields(Decision)}
DECISION_FIELDS: tuple[str, ...] = tuple(FIELDS)
#: The fields a policy's defaults must set.
REQUIRED_FIELDS: tuple[str, ...] = tuple(n for n, s in FIELDS.items() if not s.optional)
#: Not a field: whether a decision is made at all (an engine may refuse a context).
OUTCOME = "outcome"


@dataclass(frozen=True)
class Implication:
    """One switch on turns another off: the policy's implied stage sets ``then`` false when
    ``when`` is true (an error when ``then`` was forced true), and no runner serves both."""

    when: str
    then: str
    why: str  # how a message says it: "runs without torch.compile"

    def violated_by(self, decision: "Decision") -> bool:
        return getattr(decision, self.when) is True and getattr(decision, self.then) is True

    def what(self) -> str:
        """``torch.compile with breakable capture``."""
        return f"{FIELDS[self.then].label} with {FIELDS[self.when].label}"


#: Breakable capture finds its graph breaks while capturing, which torch.compile's
#: tracing cannot follow: the one statement of "breakable means no compile".
IMPLICATIONS: tuple[Implication, ...] = (
    Implication("breakable", "compile", "runs without torch.compile"),
)


def check_field(name: str, value: object) -> FieldValue:
    """Validate a typed decision-field value; returns it normalised (lists -> tuples).

    Raises ``ValueError`` naming the field, the value and the allowed values.
    """
    return _spec(name).check(value)


def parse_field(name: str, text: str) -> FieldValue:
    """Parse ``--set name=text`` into a typed, validated value."""
    return _spec(name).parse(text)


def allowed_values(name: str) -> str:
    """Human text of what ``name`` accepts, for error messages."""
    return _spec(name).allowed


def _spec(name: str) -> FieldSpec:
    return VLLM.spec(name)


#: An attention backend as SGLang names them (``fa3``, ``trtllm_mla``, ``torch_native``).
BACKEND_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
#: SGLang's CUDA-graph backend of one phase (``model_executor/cuda_graph_config.py``).
GraphBackend = Literal["full", "breakable", "disabled"]


@dataclass(frozen=True)
class SglangDecision:
    """How SGLang is to run a model: the fields of its resolution the policy decides (SGLang
    has one model runner, so no runner axis; CUDA graphs are chosen per phase). The names
    are those of SGLang's snapshot rows (``tools/sglang_probe``)."""

    decode_cuda_graph: GraphBackend = field(default="full", metadata=_about(
        "the CUDA-graph backend of decode batches (cuda_graph_config.decode.backend)"
    ))
    prefill_cuda_graph: GraphBackend = field(default="disabled", metadata=_about(
        "the CUDA-graph backend of prefill batches (cuda_graph_config.prefill.backend)"
    ))
    torch_compile: bool = field(default=False, metadata=_about(
        "torch.compile of the model (enable_torch_compile)", label="torch.compile"
    ))
    attention_backend: str = field(default="triton", metadata=_about(
        "the attention backend (attention_backend)",
        pattern=BACKEND_NAME,
        allowed="an SGLang attention backend name such as fa3, triton, aiter, torch_native",
    ))
    decode_cuda_graph_max_bs: int | None = field(default=None, metadata=_about(
        "the largest decode batch (requests) captured; unset: SGLang's own size"
    ))
    prefill_cuda_graph_max_bs: int | None = field(default=None, metadata=_about(
        "the largest prefill batch (tokens) captured; unset: SGLang's own size"
    ))

    def __post_init__(self) -> None:  # checked as Decision is, on its own fields
        _check_all(self, SGLANG_FIELDS)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return _as_dict(self, SGLANG_FIELDS)


SGLANG_FIELDS: dict[str, FieldSpec] = {f.name: _field_spec(f) for f in fields(SglangDecision)}


@dataclass(frozen=True)
class Vocabulary:
    """One engine's decision vocabulary: its fields, the class a decision is made of, what
    implies what, and whether interlock's runners execute it (stage 5 asks them what they
    serve). A policy's ``version:`` prefix chooses it (``interlock.policy.release``)."""

    engine: str
    #: How messages name the engine: ``vLLM``, ``SGLang``.
    title: str
    #: The decision's class; called with every field's value.
    decision: Any
    fields: Mapping[str, FieldSpec]
    implications: tuple[Implication, ...]
    runners: bool

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.fields)

    @property
    def required(self) -> tuple[str, ...]:
        """The fields a policy's defaults must set."""
        return tuple(n for n, s in self.fields.items() if not s.optional)

    @property
    def optional(self) -> tuple[str, ...]:
        """The fields a policy may leave to the engine or runner (compared only where set)."""
        return tuple(n for n, s in self.fields.items() if s.optional)

    def spec(self, name: str) -> FieldSpec:
        spec = self.fields.get(name)
        if spec is None:
            from interlock.core.suggest import hint

            raise ValueError(
                f"unknown decision field {name!r}; allowed: {', '.join(self.names)}"
                f"{hint(name, self.names)}"
            )
        return spec

    def check(self, name: str, value: object) -> FieldValue:
        """:func:`check_field` in this vocabulary."""
        return self.spec(name).check(value)

    def parse(self, name: str, text: str) -> FieldValue:
        """:func:`parse_field` in this vocabulary."""
        return self.spec(name).parse(text)


VLLM = Vocabulary("vllm", "vLLM", Decision, FIELDS, IMPLICATIONS, runners=True)
#: SGLang's breakable backend is its own (no torch.compile switch beside it): nothing implied.
SGLANG = Vocabulary("sglang", "SGLang", SglangDecision, SGLANG_FIELDS, (), runners=False)
#: Engine name -> its vocabulary, the first the default (a policy naming no engine).
VOCABULARIES: dict[str, Vocabulary] = {v.engine: v for v in (VLLM, SGLANG)}
