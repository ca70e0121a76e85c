"""The context a decision is made for, and where each of its facts came from.

Facts are *given* (flags, Python API), *detected* (platform via torch, imported
only when the platform is not given), *assumed* (defaults when neither),
*from model config* (traits derived from an HF ``config.json``) or *from the
catalog* (merged in at resolution, since the catalog belongs to the policy).

When the catalog and a model's config.json disagree on a trait, the catalog
wins: it is reviewed policy data, while config derivation is a heuristic over
keys that differ between model families. The disagreement is kept in the trace.
Traits given explicitly win over both.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from interlock.core.errors import PolicyError
from interlock.core.fields import TRAITS
from interlock.core.platform import TRITON_FACT, detect_platform
from interlock.core.terminal import shown
from interlock.policy.conditions import ENGINES, check_version, flatten_config

GIVEN = "given"
DETECTED = "detected"
ASSUMED = "assumed"
MODEL_CONFIG = "model config"
CATALOG = "catalog"
PROCESS_ENV = "process environment"

ARCHITECTURE_NAME = "architecture name"

_EXPERT_KEYS = ("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts")

#: vLLM's architecture-name suffixes and the runner type each implies, first match wins
#: (``_SUFFIX_TO_DEFAULTS`` in vllm/config/model.py); a name that matches none is a
#: generation model. vLLM consults it for a class its registry cannot call a pooling or a
#: text-generation model, which is why the catalog names the task where the class decides.
TASK_SUFFIXES = (
    ("ForCausalLM", "generate"),
    ("ForConditionalGeneration", "generate"),
    ("ChatModel", "generate"),
    ("LMHeadModel", "generate"),
    ("ForTextEncoding", "pooling"),
    ("EmbeddingModel", "pooling"),
    ("ForSequenceClassification", "pooling"),
    ("ForTokenClassification", "pooling"),
    ("ForAudioClassification", "pooling"),
    ("ForImageClassification", "pooling"),
    ("ForVideoClassification", "pooling"),
    ("ClassificationModel", "pooling"),
    ("ForRewardModeling", "pooling"),
    ("RewardModel", "pooling"),
    ("Model", "pooling"),
)


def task_from_name(architecture: str) -> tuple[str, str]:
    """The task vLLM gives ``architecture`` by its name, and why (:data:`TASK_SUFFIXES`)."""
    for suffix, task in TASK_SUFFIXES:
        if architecture.endswith(suffix):
            return task, f"vLLM's name suffix *{suffix} -> {task}"
    return "generate", "no suffix of vLLM's table: generate"


@dataclass(frozen=True, eq=False)
class Context:
    """Inputs of one resolution. Hashable and compared by value (the memo key).

    ``traits`` are given explicitly and win over the catalog; ``model_traits`` come
    from a model's config.json and lose to the catalog. ``sources`` maps a fact
    (``platform``, ``device_arch``, ``traits.moe``, ``env.NAME``, ``features.K``…)
    to where it came from, e.g. ``"detected (torch.cuda, sm_90)"``; a fact not
    listed there was given.

    ``config`` is the model's config.json flattened to dotted paths
    (:func:`interlock.policy.conditions.flatten_config`; None: no model config),
    ``identity`` the names the model goes by with where each came from, and
    ``engine`` the version of each engine the decision is for (``{"vllm": "0.29.0"}``).
    """

    architecture: str
    platform: str = "cpu"
    device_arch: str = ""
    features: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    traits: Mapping[str, Any] = field(default_factory=dict)
    model_traits: Mapping[str, Any] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)
    config: Mapping[str, Any] | None = None
    #: ``((name, origin), ...)``: ``("GLM-5.3-FP8", "directory name")``.
    identity: tuple[tuple[str, str], ...] = ()
    engine: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.architecture:
            raise PolicyError("an architecture is required (e.g. LlamaForCausalLM)")
        if not self.platform:
            raise PolicyError("platform must not be empty (e.g. cuda, rocm, xpu, cpu)")
        for name, value in self.features.items():
            if not isinstance(value, (bool, int, float, str)):
                raise PolicyError(f"feature {name}: {value!r} is not a bool, number or string")
        for name, value in self.env.items():
            if not isinstance(value, str):
                raise PolicyError(f"env {name}: {value!r} is not a string")
        for traits in (self.traits, self.model_traits):
            for name, value in traits.items():
                check_trait(name, value)
        for name, version in self.engine.items():
            if name not in ENGINES:
                raise PolicyError(f"unknown engine {name!r}; known engines: {', '.join(ENGINES)}")
            try:
                check_version(version)
            except (ValueError, TypeError):
                raise PolicyError(
                    f"engine version {name}={shown(str(version), 60)} "
                    f"({self.source(f'engine.{name}')}) is not a PEP 440 version (e.g. 0.29.0)"
                ) from None
        key = (
            self.architecture,
            self.platform,
            self.device_arch,
            *(tuple(sorted(m.items())) for m in self._maps()),
            None if self.config is None else tuple(sorted(self.config.items())),
            self.identity,
            tuple(sorted(self.engine.items())),
        )
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_hash", hash(key))

    def _maps(self) -> tuple[Mapping[str, Any], ...]:
        return (self.features, self.env, self.traits, self.model_traits, self.sources)

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Context):
            return NotImplemented
        return self._key == other._key  # type: ignore[attr-defined]

    def source(self, fact: str) -> str:
        return self.sources.get(fact, GIVEN)

    @property
    def model_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.identity)

    def config_fact(self, path: str) -> tuple[Any, str]:
        """``(value, origin)`` of one config path; the value is None when it is unknown."""
        if self.config is None:
            return None, "unknown (no model config)"
        if path not in self.config:
            return None, f"unknown (absent from {self.source('config')})"
        return self.config[path], self.source("config")

    def to_dict(self) -> dict[str, Any]:
        return {
            "architecture": self.architecture,
            "platform": self.platform,
            "device_arch": self.device_arch,
            "features": dict(self.features),
            "env": dict(self.env),
            "engine": dict(self.engine),
            "model": [{"name": name, "source": origin} for name, origin in self.identity],
            "config": self.config is not None,
            "sources": dict(self.sources),
        }


def check_trait(name: str, value: Any) -> None:
    spec = TRAITS.get(name)
    if spec is None:
        raise PolicyError(f"unknown trait {name!r}; known traits: {', '.join(TRAITS)}")
    ok = value in spec if isinstance(spec, tuple) else type(value) is spec
    if not ok:
        allowed = ", ".join(spec) if isinstance(spec, tuple) else spec.__name__
        raise PolicyError(f"trait {name}: bad value {value!r}; allowed: {allowed}")


def make_context(
    architecture: str | None = None,
    *,
    platform: str | None = None,
    device_arch: str | None = None,
    model: str | os.PathLike[str] | None = None,
    features: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    traits: Mapping[str, Any] | None = None,
    sources: Mapping[str, str] | None = None,
    model_id: str | None = None,
    engine: Mapping[str, str] | None = None,
    model_config: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
    model_traits: Mapping[str, Any] | None = None,
    identity: tuple[tuple[str, str], ...] = (),
) -> Context:
    """Build a context, reading ``model`` (a directory or config.json) and detecting the
    platform when it is not given. ``model_id`` names the model (``zai-org/GLM-5.3``) for
    ``model:`` conditions besides its directory name and ``_name_or_path``; ``engine`` gives
    engine versions (``{"vllm": "0.29.0"}``). Raises :class:`PolicyError` on bad input.

    Every reader builds its context here, so each gets the same normalisation (the
    ``has_triton`` fact, the device arch's origin): a model's config may also come as its
    content (``model_config``: a policy test case's, flattened and its traits read as a
    file's are), or as values already flattened (``config``, with ``model_traits`` and
    ``identity``: a decision record's, a table row's config state)."""
    facts: dict[str, str] = dict(sources or {})
    traits_of_model: dict[str, Any] = dict(model_traits or {})
    flat: dict[str, Any] | None = None if config is None else dict(config)
    names: list[tuple[str, str]] = list(identity)
    if model_id is not None:
        names.append((_model_name(model_id, "--model-id"), facts.get("model_id", GIVEN)))
    if model_config is not None:
        flat = flatten_config(model_config)
        for name, (value, note) in traits_from_config(model_config).items():
            traits_of_model[name] = value
            facts[f"traits.{name}"] = f"{MODEL_CONFIG} ({note})"
    if model is not None:
        config_path, read = read_model_config(model)
        flat = flatten_config(read)
        facts["config"] = f"{MODEL_CONFIG} ({config_path})"
        names += model_identity(config_path, read)
        model_arch = _architecture_of(read, config_path)
        if architecture is not None and architecture != model_arch:
            raise PolicyError(
                f"architecture {architecture!r} disagrees with the model's "
                f"architectures[0] {model_arch!r}",
                file=str(config_path),
            )
        if architecture is None:
            architecture = model_arch
            facts["architecture"] = f"{MODEL_CONFIG} ({config_path})"
        for name, (value, note) in traits_from_config(read).items():
            traits_of_model[name] = value
            facts[f"traits.{name}"] = f"{MODEL_CONFIG} ({note})"
    if architecture is None:
        raise PolicyError("an architecture is required: give ARCH or --model PATH")
    if len(architecture) > MAX_NAME:
        where = facts.get("architecture", "given")
        raise PolicyError(
            f"architecture name {shown(architecture, 60)} ({where}) is "
            f"{len(architecture)} characters long; an architecture name has at most {MAX_NAME}"
        )
    detected = platform is None
    if platform is None:
        platform, detected_arch, how = detect_platform()
        facts["platform"] = f"{DETECTED} ({how})"
        if device_arch is None:
            device_arch = detected_arch
            facts["device_arch"] = f"{DETECTED} ({how})"
    if device_arch is None:
        device_arch = ""
        facts["device_arch"] = f"{ASSUMED} (not given; detected only with the platform)"
    features = dict(features or {})
    if TRITON_FACT not in features:
        features[TRITON_FACT], facts[f"features.{TRITON_FACT}"] = has_triton_fact(detected)
    return Context(
        architecture=architecture,
        platform=platform,
        device_arch=device_arch,
        features=features,
        env=dict(env or {}),
        traits=dict(traits or {}),
        model_traits=traits_of_model,
        sources=facts,
        config=flat,
        identity=tuple(dict.fromkeys(names)),
        engine=dict(engine or {}),
    )


#: A model name longer than this is refused (HF ids are under 100 characters).
MAX_MODEL_NAME = 256


def _model_name(name: str, where: str) -> str:
    if not name or len(name) > MAX_MODEL_NAME:
        raise PolicyError(
            f"model name {shown(name, 60)} ({where}) must have 1 to {MAX_MODEL_NAME} characters"
        )
    return name


def model_identity(config_path: Path, config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The names a model goes by: its directory's name and its config's ``_name_or_path``
    (written by ``save_pretrained``: the hub id or the path it was loaded from)."""
    names = [(config_path.resolve().parent.name, f"directory name ({config_path.parent})")]
    name_or_path = config.get("_name_or_path")
    if isinstance(name_or_path, str) and name_or_path and len(name_or_path) <= MAX_MODEL_NAME:
        names.append((name_or_path, f"{MODEL_CONFIG} _name_or_path ({config_path})"))
    return [(name, origin) for name, origin in names if name]


def has_triton_fact(detected: bool) -> tuple[bool, str]:
    """``(has_triton, origin)``: probed only when the platform was detected (this machine);
    a named platform may be another machine, where Triton is assumed (runners may require it)."""
    if not detected:
        return True, f"{ASSUMED} (--platform may name another machine; give has_triton=false)"
    import importlib.util

    found = importlib.util.find_spec("triton") is not None
    return found, f"{DETECTED} (triton {'is' if found else 'is not'} installed)"


#: Longest architecture name accepted (real ones are under 60 characters).
MAX_NAME = 256
#: A config.json larger than this is refused unread (real ones are a few KB).
MAX_CONFIG_BYTES = 16 * 1024 * 1024


def read_model_config(model: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    """Read ``model`` (a directory holding config.json, or the file itself)."""
    from interlock.core.files import FileProblem, read_json

    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    try:
        config = read_json(path, MAX_CONFIG_BYTES)
    except FileProblem as exc:
        raise PolicyError(
            f"cannot read model config: {exc.detail}",
            file=exc.file or str(path),
            line=exc.line,
            col=exc.col,
        ) from None
    if not isinstance(config, dict):
        raise PolicyError("a model config is a JSON object", file=str(path))
    return path, config


def _architecture_of(config: dict[str, Any], path: Path) -> str:
    archs = config.get("architectures")
    if not (isinstance(archs, list) and archs and isinstance(archs[0], str) and archs[0]):
        raise PolicyError(
            "config.json has no architectures[0]", file=str(path), path="architectures"
        )
    return archs[0]


def traits_from_config(config: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """Traits derivable from an HF config as ``{trait: (value, why)}``; others are left out."""
    text = config.get("text_config")
    nested = text if isinstance(text, dict) else {}

    def get(key: str) -> Any:
        return config.get(key, nested.get(key))

    traits: dict[str, tuple[Any, str]] = {}
    experts = next(((k, get(k)) for k in _EXPERT_KEYS if isinstance(get(k), int)), None)
    if experts is not None:
        traits["moe"] = (experts[1] > 0, f"{experts[0]}={experts[1]}")
    else:
        traits["moe"] = (False, "no expert count")
    attention = _attention_of(get)
    if attention is not None:
        traits["attention"] = attention
    layers = get("num_nextn_predict_layers")
    if isinstance(layers, int):
        traits["mtp"] = (layers > 0, f"num_nextn_predict_layers={layers}")
    else:
        traits["mtp"] = (False, "no num_nextn_predict_layers")
    quant = get("quantization_config")
    if isinstance(quant, dict):
        traits["quantized"] = (
            True,
            f"quantization_config.quant_method={quant.get('quant_method')}",
        )
    else:
        traits["quantized"] = (False, "no quantization_config")
    # A wrapper's text model, by the name vLLM matches from 0.34.0 on (hf_text_config).
    names = nested.get("architectures")
    if isinstance(names, list) and names and isinstance(names[0], str) and names[0]:
        traits["text_architecture"] = (names[0], "text_config.architectures[0]")
    # vLLM's is_encoder_decoder(): the config's flag or its text config's.
    for where, part in (("is_encoder_decoder", config), ("text_config.is_encoder_decoder", nested)):
        if part.get("is_encoder_decoder") is True:
            traits["task"] = ("encoder-decoder", f"{where}=true")
            break
    return traits


def _attention_of(get: Any) -> tuple[str, str] | None:
    if get("index_topk") is not None:
        return "dsa", f"index_topk={get('index_topk')}"
    # Before MLA: a hybrid's full-attention layers may be MLA (Kimi Linear's are); its
    # linear layers are what set it apart.
    linear = _linear_attention_of(get)
    if linear is not None:
        return linear
    if get("kv_lora_rank") is not None:
        return "mla", f"kv_lora_rank={get('kv_lora_rank')}"
    heads = get("num_attention_heads")
    if not isinstance(heads, int):
        return None
    kv = get("num_key_value_heads")
    if isinstance(kv, int) and kv < heads:
        return "gqa", f"num_key_value_heads={kv} < num_attention_heads={heads}"
    return "mha", f"num_key_value_heads={kv if kv is not None else heads} = num_attention_heads"


def _linear_attention_of(get: Any) -> tuple[str, str] | None:
    """``linear`` or ``hybrid`` from ``layer_types`` (what transformers writes), else from
    ``linear_attn_config`` (what the released Kimi checkpoints write); None without."""
    layer_types = get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        linear = [t for t in layer_types if isinstance(t, str) and "linear" in t]
        if linear:
            kind = "linear" if len(linear) == len(layer_types) else "hybrid"
            return kind, f"layer_types: {len(linear)} of {len(layer_types)} linear"
    linear_cfg = get("linear_attn_config")
    if isinstance(linear_cfg, dict):
        full = linear_cfg.get("full_attn_layers")
        return ("hybrid" if full else "linear"), "linear_attn_config"
    return None
