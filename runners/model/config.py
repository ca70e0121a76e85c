"""The model configuration the runners execute, parsed from a Hugging Face ``config.json``.

Torch-free. Keys a family may leave out take the defaults transformers gives
them, so a config means the same model here as there.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, PositiveInt, ValidationError


class ConfigError(ValueError):
    """A config.json this project cannot run, with the file and the offending key."""


@dataclass(frozen=True)
class ArchitectureDefaults:
    """What transformers assumes for keys a config of this family may omit."""

    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    num_key_value_heads: int | None = None  # None: as many as attention heads
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    sliding_window: int | None = None
    qkv_bias: bool = False
    qk_norm: bool = False
    moe: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 0
    shared_expert: bool = False


SUPPORTED_ARCHITECTURES: Mapping[str, ArchitectureDefaults] = {
    "LlamaForCausalLM": ArchitectureDefaults(),
    "MistralForCausalLM": ArchitectureDefaults(
        max_position_embeddings=4096 * 32, num_key_value_heads=8, sliding_window=4096
    ),
    "Qwen2ForCausalLM": ArchitectureDefaults(
        max_position_embeddings=32768, num_key_value_heads=32, sliding_window=4096, qkv_bias=True
    ),
    "Qwen3ForCausalLM": ArchitectureDefaults(
        max_position_embeddings=32768, num_key_value_heads=32, head_dim=128, sliding_window=4096,
        qk_norm=True,
    ),
    "Qwen2MoeForCausalLM": ArchitectureDefaults(
        max_position_embeddings=32768, num_key_value_heads=16, sliding_window=4096,
        qkv_bias=True, moe=True, num_experts=60, num_experts_per_tok=4, shared_expert=True,
    ),
    "Qwen3MoeForCausalLM": ArchitectureDefaults(
        max_position_embeddings=32768, num_key_value_heads=4, sliding_window=4096, qk_norm=True,
        moe=True, num_experts=128, num_experts_per_tok=8,
    ),
    "MixtralForCausalLM": ArchitectureDefaults(
        rms_norm_eps=1e-5, rope_theta=1e6, max_position_embeddings=4096 * 32,
        num_key_value_heads=8, moe=True, num_experts=8, num_experts_per_tok=2,
    ),
}

ROPE_TYPES = ("default", "linear", "llama3", "yarn")
CHECKPOINT_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding: base and the scaling a checkpoint declares (``type`` in ROPE_TYPES)."""

    theta: float
    type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float | None = None  # yarn; None: derived from factor / mscale
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    truncate: bool = True  # yarn


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int
    top_k: int
    intermediate_size: int
    norm_topk_prob: bool
    shared_expert_intermediate_size: int  # 0: no shared expert
    sparse_layers: tuple[int, ...]  # layers whose MLP is the routed block


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    sliding_windows: tuple[int | None, ...]  # per layer; None: full attention
    moe: MoEConfig | None
    dtype: str  # the checkpoint's own dtype (what dtype="auto" picks)
    initializer_range: float
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]


_Bad = Callable[[str, object, str], ConfigError]


class _RawConfig(BaseModel):
    """The config.json keys read here, type-checked; every other key is ignored."""

    model_config = ConfigDict(extra="ignore")

    architectures: list[str]
    vocab_size: PositiveInt
    hidden_size: PositiveInt
    intermediate_size: PositiveInt
    num_hidden_layers: PositiveInt
    num_attention_heads: PositiveInt
    num_key_value_heads: PositiveInt | None = None
    head_dim: PositiveInt | None = None
    hidden_act: str = "silu"
    rms_norm_eps: float | None = None
    max_position_embeddings: int | None = None
    rope_theta: float | None = None
    rope_scaling: dict[str, Any] | None = None
    rope_parameters: dict[str, Any] | None = None
    partial_rotary_factor: float | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool | None = None
    qkv_bias: bool | None = None
    mlp_bias: bool = False
    sliding_window: int | None = None
    use_sliding_window: bool | None = None
    max_window_layers: int | None = None
    layer_types: list[str] | None = None
    num_experts: int | None = None
    num_local_experts: int | None = None
    num_experts_per_tok: int | None = None
    moe_intermediate_size: int | None = None
    shared_expert_intermediate_size: int | None = None
    norm_topk_prob: bool | None = None
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] | None = None
    torch_dtype: str | None = None
    dtype: str | None = None
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None


def load_config(model_dir: str | Path) -> ModelConfig:
    """Parse ``<model_dir>/config.json`` (eos ids from generation_config.json when present)."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ConfigError(f"{path}: no config.json in model directory {model_dir}")
    raw = _read_json(path)
    generation = Path(model_dir) / "generation_config.json"
    if generation.is_file():
        eos = _read_json(generation).get("eos_token_id")
        if eos is not None:
            raw = {**raw, "eos_token_id": eos}
    return parse_config(raw, source=str(path))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def parse_config(raw: Mapping[str, Any], source: str = "config.json") -> ModelConfig:
    """Build a ModelConfig from config.json contents; ``source`` names it in errors."""
    architectures = raw.get("architectures")
    if not architectures or not isinstance(architectures, list):
        raise ConfigError(f"{source}: 'architectures' must be a non-empty list")
    architecture = architectures[0]
    defaults = SUPPORTED_ARCHITECTURES.get(architecture)
    if defaults is None:
        raise ConfigError(
            f"{source}: architecture {architecture!r} is not supported; supported: "
            + ", ".join(SUPPORTED_ARCHITECTURES)
        )
    try:
        cfg = _RawConfig.model_validate(dict(raw))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"{source}: {problems}") from exc

    def bad(key: str, value: object, allowed: str) -> ConfigError:
        return ConfigError(f"{source}: {key}={value!r} is not supported; allowed: {allowed}")

    if cfg.hidden_act != "silu":
        raise bad("hidden_act", cfg.hidden_act, "silu")
    num_heads = cfg.num_attention_heads
    num_kv_heads = cfg.num_key_value_heads or defaults.num_key_value_heads or num_heads
    if num_heads % num_kv_heads:
        raise bad("num_key_value_heads", num_kv_heads,
                  f"a divisor of num_attention_heads={num_heads}")
    head_dim = cfg.head_dim or defaults.head_dim or cfg.hidden_size // num_heads
    max_positions = cfg.max_position_embeddings or defaults.max_position_embeddings
    qkv_bias = _qkv_bias(architecture, cfg, defaults)
    return ModelConfig(
        architecture=architecture,
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_layers=cfg.num_hidden_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rms_norm_eps=cfg.rms_norm_eps if cfg.rms_norm_eps is not None else defaults.rms_norm_eps,
        max_position_embeddings=max_positions,
        rope=_rope(cfg, defaults, max_positions, bad),
        tie_word_embeddings=cfg.tie_word_embeddings,
        qkv_bias=qkv_bias,
        o_bias=qkv_bias and architecture in _ATTENTION_BIAS_KEY,  # Qwen2: q/k/v only
        mlp_bias=cfg.mlp_bias and architecture == "LlamaForCausalLM",
        qk_norm=defaults.qk_norm,
        sliding_windows=_sliding_windows(architecture, cfg, defaults, bad),
        moe=_moe(architecture, cfg, defaults, bad),
        dtype=_checkpoint_dtype(cfg, bad),
        initializer_range=cfg.initializer_range,
        bos_token_id=cfg.bos_token_id,
        eos_token_ids=_eos_ids(cfg.eos_token_id),
    )


# Families whose attention_bias key adds a bias to all four attention projections.
_ATTENTION_BIAS_KEY = ("LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM")


def _qkv_bias(architecture: str, cfg: _RawConfig, defaults: ArchitectureDefaults) -> bool:
    if architecture == "Qwen2MoeForCausalLM" and cfg.qkv_bias is not None:
        return cfg.qkv_bias
    if architecture in _ATTENTION_BIAS_KEY and cfg.attention_bias is not None:
        return cfg.attention_bias
    return defaults.qkv_bias


def _rope(
    cfg: _RawConfig, defaults: ArchitectureDefaults, max_positions: int, bad: _Bad
) -> RopeConfig:
    # transformers 5 writes rope_parameters; older checkpoints write rope_theta + rope_scaling.
    params = dict(cfg.rope_parameters or cfg.rope_scaling or {})
    theta = params.get("rope_theta", cfg.rope_theta)
    theta = float(theta if theta is not None else defaults.rope_theta)
    partial = params.get("partial_rotary_factor", cfg.partial_rotary_factor)
    if partial not in (None, 1, 1.0):
        raise bad("partial_rotary_factor", partial, "1.0 (full rotary)")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise bad("rope type", kind, ", ".join(ROPE_TYPES))
    if kind == "default":
        return RopeConfig(theta=theta)

    def number(key: str, default: float | None = None) -> float | None:
        value = params.get(key, default)
        return None if value is None else float(value)

    factor = number("factor")
    if factor is None:
        raise bad(f"rope {kind} factor", None, "a number")
    original = params.get("original_max_position_embeddings")
    if kind in ("llama3", "yarn") and original is None:
        original = max_positions
    return RopeConfig(
        theta=theta,
        type=kind,
        factor=factor,
        original_max_position_embeddings=None if original is None else int(original),
        low_freq_factor=number("low_freq_factor", 1.0),
        high_freq_factor=number("high_freq_factor", 4.0),
        beta_fast=number("beta_fast") or 32.0,
        beta_slow=number("beta_slow") or 1.0,
        attention_factor=number("attention_factor"),
        mscale=number("mscale"),
        mscale_all_dim=number("mscale_all_dim"),
        truncate=bool(params.get("truncate", True)),
    )


def _sliding_windows(
    architecture: str, cfg: _RawConfig, defaults: ArchitectureDefaults, bad: _Bad
) -> tuple[int | None, ...]:
    n = cfg.num_hidden_layers
    given = "sliding_window" in cfg.model_fields_set
    window = cfg.sliding_window if given else defaults.sliding_window
    if architecture in ("MistralForCausalLM", "MixtralForCausalLM"):
        return (window or None,) * n
    if architecture == "LlamaForCausalLM":
        return (None,) * n
    # Qwen families: a window only when use_sliding_window, on the layers layer_types names.
    if not cfg.use_sliding_window or not window:
        return (None,) * n
    if architecture == "Qwen3MoeForCausalLM":
        return (window,) * n
    layer_types = cfg.layer_types
    if layer_types is None:
        max_window_layers = cfg.max_window_layers if cfg.max_window_layers is not None else 28
        if architecture == "Qwen2MoeForCausalLM":
            sliding = [(i + 1) % 2 == 1 and i < max_window_layers for i in range(n)]
        else:
            sliding = [i >= max_window_layers for i in range(n)]
        layer_types = ["sliding_attention" if s else "full_attention" for s in sliding]
    if len(layer_types) != n:
        raise bad("layer_types", layer_types, f"a list of {n} entries (num_hidden_layers)")
    allowed = ("full_attention", "sliding_attention")
    for kind in layer_types:
        if kind not in allowed:
            raise bad("layer_types entry", kind, ", ".join(allowed))
    return tuple(window if kind == "sliding_attention" else None for kind in layer_types)


def _moe(
    architecture: str, cfg: _RawConfig, defaults: ArchitectureDefaults, bad: _Bad
) -> MoEConfig | None:
    if not defaults.moe:
        return None
    # Mixtral and Qwen3-MoE read num_experts as an alias of num_local_experts; Qwen2-MoE
    # has only num_experts.
    keys = (cfg.num_experts,)
    if architecture != "Qwen2MoeForCausalLM":
        keys = (cfg.num_local_experts, cfg.num_experts)
    num_experts = next((k for k in keys if k is not None), defaults.num_experts)
    top_k = cfg.num_experts_per_tok or defaults.num_experts_per_tok
    if architecture == "MixtralForCausalLM":
        return MoEConfig(num_experts, top_k, cfg.intermediate_size, True, 0,
                         tuple(range(cfg.num_hidden_layers)))
    if cfg.moe_intermediate_size is None:
        raise bad("moe_intermediate_size", None, "a positive integer")
    if cfg.decoder_sparse_step < 1:
        raise bad("decoder_sparse_step", cfg.decoder_sparse_step, "a positive integer")
    if num_experts and top_k > num_experts:
        raise bad("num_experts_per_tok", top_k, f"at most num_experts={num_experts}")
    mlp_only = set(cfg.mlp_only_layers or ())
    sparse = tuple(
        i for i in range(cfg.num_hidden_layers)
        if i not in mlp_only and num_experts > 0 and (i + 1) % cfg.decoder_sparse_step == 0
    )
    shared = 0
    if defaults.shared_expert:
        shared = cfg.shared_expert_intermediate_size
        if shared is None:
            raise bad("shared_expert_intermediate_size", None, "a positive integer")
    return MoEConfig(num_experts, top_k, cfg.moe_intermediate_size, bool(cfg.norm_topk_prob),
                     shared, sparse)


def _checkpoint_dtype(cfg: _RawConfig, bad: _Bad) -> str:
    dtype = cfg.dtype or cfg.torch_dtype or "float32"
    dtype = dtype.removeprefix("torch.")
    if dtype not in CHECKPOINT_DTYPES:
        raise bad("dtype", dtype, ", ".join(CHECKPOINT_DTYPES))
    return dtype


def _eos_ids(eos: int | list[int] | None) -> tuple[int, ...]:
    if eos is None:
        return ()
    return (eos,) if isinstance(eos, int) else tuple(eos)
