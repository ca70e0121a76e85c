"""The model configuration the runners execute, parsed from a Hugging Face ``config.json``.

Torch-free. What differs between families (defaults of omitted keys, which
keys switch biases, windows and routed experts) is declared by each family's
module in ``interlock.runners.model.families``; keys a family may leave out
take the defaults transformers gives them, so a config means the same model
here as there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, PositiveInt, ValidationError

from interlock.core.decision import DTYPES
from interlock.core.errors import ModelError
from interlock.core.files import FileProblem, read_json
from interlock.core.terminal import shown
from interlock.policy.context import MAX_CONFIG_BYTES
from interlock.runners.model import families


class ConfigError(ModelError):
    """A config.json this project cannot run, with the file and the offending key."""


ROPE_TYPES = ("default", "linear", "llama3", "yarn")
#: Bounds of the sizes a config.json may declare, far above any released model (126 layers,
#: 10 M positions), so that a hostile value is refused by name before it reaches an
#: allocation or a native call.
MAX_LAYERS = 4096
MAX_POSITIONS = 1 << 26
#: A window is an int32 in the native kernels.
MAX_WINDOW = (1 << 31) - 1
#: Config numbers are computed with in float32: a value past its range (1e300) would turn
#: into an infinity, a positive one below its smallest normal (1e-300) into 0.
FLOAT32_MAX = 3.4028234663852886e38
#: The most a multiplying config number (``routed_scaling_factor``, yarn's ``mscale`` and
#: ``attention_factor``) may be: released models use 0.7-2.9; one of 1e30 turns every
#: activation it scales into an infinity in float16.
MAX_SCALE = 100.0
#: The largest ``rms_norm_eps`` (released models: 1e-6..1e-5); past it the norm divides by
#: the epsilon rather than the activations' size.
MAX_EPS = 1.0
FLOAT32_TINY = 1.1754943508222875e-38


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


#: How a DeepSeek-style router scores experts, and how it picks them.
SCORING_FUNCS = ("softmax", "sigmoid")
TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")


@dataclass(frozen=True)
class Routing:
    """DeepSeek-style routing (``moe_grouped_route``): ``scoring`` in SCORING_FUNCS,
    ``method`` in TOPK_METHODS; the experts split into ``n_group`` groups of which the
    ``topk_group`` best are searched (group methods only); the chosen weights are scaled by
    ``scaling``; ``correction_bias``: the router has an ``e_score_correction_bias`` added
    to the scores for choosing only (noaux_tc). ``shared_experts`` ungated shared experts,
    each ``MoEConfig.intermediate_size`` wide, run for every token."""

    scoring: str
    method: str
    n_group: int
    topk_group: int
    scaling: float
    correction_bias: bool
    shared_experts: int


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int
    top_k: int
    intermediate_size: int
    norm_topk_prob: bool
    shared_expert_intermediate_size: int  # 0: no (gated, Qwen2-MoE) shared expert
    sparse_layers: tuple[int, ...]  # layers whose MLP is the routed block
    routing: Routing | None = None  # None: softmax top-k (``moe_route``)


@dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention (DeepSeek V2/V3): queries through an optional low-rank
    ``q_lora_rank`` (None: a plain q_proj), keys and values from one ``kv_lora_rank``
    latent per token plus a ``qk_rope_head_dim`` rotary key shared by all heads."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool  # the checkpoint's rotary dims are pairs (x0, x1), (x2, x3), ...
    softmax_scale: float  # qk_head_dim ** -0.5, times yarn's mscale(mscale_all_dim) squared
    #: Whether the ``qk_rope_head_dim`` part is rotated; False: kept as it is (Kimi Linear's
    #: MLA has no positional encoding, its KDA layers carry position).
    rotary: bool = True

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class DSAConfig:
    """DeepSeek sparse attention (DeepSeek V3.2, GLM-5) on top of MLA: a lightning indexer of
    ``n_heads`` heads of ``head_dim`` scores the cached positions (its queries from the
    ``q_lora_rank`` latent, one key per token through ``wk`` and a LayerNorm, rotary on the
    first ``qk_rope_head_dim`` dims), and attention reads only the ``top_k`` best of them.

    ``indexer_layers``: per layer, whether it runs its own indexer (transformers'
    ``"full"``); a layer that does not (``"shared"``, GLM-5) reuses the selection of the
    nearest indexer layer before it. ``rope_interleave``: the indexer's rotary dims are
    interleaved pairs (GLM-5) rather than two halves (DeepSeek V3.2)."""

    n_heads: int
    head_dim: int
    top_k: int
    indexer_layers: tuple[bool, ...]
    rope_interleave: bool


@dataclass(frozen=True)
class LinearAttentionConfig:
    """Kimi Delta Attention (KDA) layers of a hybrid model (Kimi Linear): ``num_heads`` heads
    of ``head_dim`` (queries, keys and values alike), a depthwise causal convolution of
    ``conv_kernel`` taps over q, k and v, and per request a fixed-size recurrent state
    (``interlock.runners.model.state_pool``) instead of paged KV.

    ``layers``: per layer, whether it is a KDA layer (the others are MLA)."""

    num_heads: int
    head_dim: int
    conv_kernel: int
    layers: tuple[bool, ...]

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, linear in enumerate(self.layers) if linear)


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
    mla: MLAConfig | None  # None: per-head K/V attention (num_kv_heads x head_dim)
    dtype: str  # the checkpoint's own dtype (what dtype="auto" picks)
    initializer_range: float
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    # Multi-token-prediction layers after the decoder layers in the checkpoint (not run).
    mtp_layers: int = 0
    dsa: DSAConfig | None = None  # None: attention over every cached position
    linear: LinearAttentionConfig | None = None  # None: no linear-attention layers

    def is_linear(self, layer: int) -> bool:
        """Whether ``layer`` is a linear-attention (KDA) layer, with recurrent state."""
        return self.linear is not None and self.linear.layers[layer]


#: ``bad(key, value, allowed)``: the error for an unsupported value, naming the file.
Bad = Callable[[str, object, str], ConfigError]


class RawConfig(BaseModel):
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
    # DeepSeek V2/V3: multi-head latent attention and grouped routing (read only by the
    # families whose ``mla`` / ``moe`` rules use them).
    q_lora_rank: PositiveInt | None = None
    kv_lora_rank: PositiveInt | None = None
    qk_nope_head_dim: PositiveInt | None = None
    qk_rope_head_dim: PositiveInt | None = None
    v_head_dim: PositiveInt | None = None
    rope_interleave: bool | None = None
    n_routed_experts: int | None = None
    n_shared_experts: int | None = None
    first_k_dense_replace: int | None = None
    moe_layer_freq: int | list[int] | None = None
    routed_scaling_factor: float | None = None
    n_group: int | None = None
    topk_group: int | None = None
    topk_method: str | None = None
    scoring_func: str | None = None
    num_nextn_predict_layers: int | None = None
    # DeepSeek V3.2 / GLM-5 (DSA): the lightning indexer, and which layers route (read only
    # by the families whose ``dsa`` / ``moe`` rules use them). ``index_topk_pattern``,
    # ``index_topk_freq`` and ``index_skip_topk_offset`` set GLM-5's ``indexer_types`` when
    # a config leaves it out, as transformers does.
    index_n_heads: PositiveInt | None = None
    index_head_dim: PositiveInt | None = None
    index_topk: PositiveInt | None = None
    indexer_types: list[str] | None = None
    index_topk_pattern: str | list[str] | None = None
    index_topk_freq: int | None = None
    index_skip_topk_offset: int | None = None
    mlp_layer_types: list[str] | None = None
    # Kimi Linear: its KDA layers' sizes (transformers 5.24 also takes them from the
    # ``linear_attn_config`` of the released checkpoints, with ``kda_layers`` /
    # ``full_attn_layers`` numbered from 1).
    linear_num_heads: PositiveInt | None = None
    linear_head_dim: PositiveInt | None = None
    linear_conv_kernel_dim: PositiveInt | None = None
    linear_attn_config: dict[str, Any] | None = None
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
        data = read_json(path, MAX_CONFIG_BYTES)
    except FileProblem as exc:
        raise ConfigError(str(exc)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def parse_config(raw: Mapping[str, Any], source: str = "config.json") -> ModelConfig:
    """Build a ModelConfig from config.json contents; ``source`` names it in errors."""
    architectures = raw.get("architectures")
    if not architectures or not isinstance(architectures, list):
        raise ConfigError(f"{source}: 'architectures' must be a non-empty list")
    architecture = architectures[0]
    if not isinstance(architecture, str):
        raise ConfigError(f"{source}: architectures[0] must be a string, got {architecture!r}")
    family = families.family(architecture)
    if family is None:
        raise ConfigError(
            f"{source}: architecture {shown(architecture)} is not supported; supported: "
            + ", ".join(families.architectures())
        )
    raw = {**raw}
    for alias, key in family.aliases.items():
        # transformers' attribute_map: the config.json it writes spells the key ``alias``.
        if alias in raw and key not in raw:
            raw[key] = raw.pop(alias)
    try:
        cfg = RawConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"{source}: {problems}") from exc

    def bad(key: str, value: object, allowed: str) -> ConfigError:
        return ConfigError(f"{source}: {key}={value!r} is not supported; allowed: {allowed}")

    if cfg.hidden_act != "silu":
        raise bad("hidden_act", cfg.hidden_act, "silu")
    defaults = family.defaults
    num_heads = cfg.num_attention_heads
    max_positions = cfg.max_position_embeddings
    if max_positions is None:
        max_positions = defaults.max_position_embeddings
    elif not 1 <= max_positions <= MAX_POSITIONS:  # 0 is not "unset": refuse it, not guess
        raise bad("max_position_embeddings", max_positions, f"an integer in 1..{MAX_POSITIONS}")
    if cfg.num_hidden_layers > MAX_LAYERS:
        raise bad("num_hidden_layers", cfg.num_hidden_layers, f"an integer in 1..{MAX_LAYERS}")
    rope = _rope(cfg, defaults.rope_theta, max_positions, bad)
    mla = None if family.mla is None else family.mla(cfg, rope, bad)
    if mla is not None:
        # Every head reads the one latent: num_key_value_heads means nothing to MLA (the
        # configs transformers writes carry its default, 128, whatever the heads), and the
        # rotary table spans the rope part of a head (transformers sets head_dim to it).
        num_kv_heads, head_dim = num_heads, mla.qk_rope_head_dim
    else:
        num_kv_heads = cfg.num_key_value_heads or defaults.num_key_value_heads or num_heads
        if num_heads % num_kv_heads:
            raise bad("num_key_value_heads", num_kv_heads,
                      f"a divisor of num_attention_heads={num_heads}")
        head_dim = cfg.head_dim or defaults.head_dim or cfg.hidden_size // num_heads
        if head_dim == 0:
            raise bad("hidden_size", cfg.hidden_size,
                      f"at least num_attention_heads={num_heads} (head_dim is hidden_size // "
                      "num_attention_heads), or a head_dim")
    if head_dim % 2:
        # The rotary embedding turns pairs of dimensions; the kernels assume it.
        key = "qk_rope_head_dim" if mla is not None else (
            "head_dim" if cfg.head_dim or defaults.head_dim else
            "head_dim (hidden_size // num_attention_heads)"
        )
        raise bad(key, head_dim, "an even number (rotary embeddings turn pairs of dimensions)")
    eps = defaults.rms_norm_eps if cfg.rms_norm_eps is None else cfg.rms_norm_eps
    eps = finite("rms_norm_eps", eps, bad, positive=True, at_most=MAX_EPS)
    if cfg.layer_types is not None and len(cfg.layer_types) != cfg.num_hidden_layers:
        raise bad(
            "layer_types", f"<{len(cfg.layer_types)} entries>",
            f"one entry per layer ({cfg.num_hidden_layers}, num_hidden_layers)",
        )
    special = [("bos_token_id", cfg.bos_token_id)] if cfg.bos_token_id is not None else []
    special += [("eos_token_id", t) for t in _eos_ids(cfg.eos_token_id)]
    for key, token in special:
        if not 0 <= token < cfg.vocab_size:
            raise bad(key, token, f"a token id in [0, {cfg.vocab_size}) (vocab_size)")
    if cfg.sliding_window is not None and not 0 <= cfg.sliding_window <= MAX_WINDOW:
        raise bad("sliding_window", cfg.sliding_window,
                  f"null, or a window in 1..{MAX_WINDOW} tokens (0: none)")
    qkv_bias = defaults.qkv_bias
    if family.bias_key is not None and getattr(cfg, family.bias_key) is not None:
        qkv_bias = getattr(cfg, family.bias_key)
    return ModelConfig(
        architecture=architecture,
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_layers=cfg.num_hidden_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rms_norm_eps=eps,
        max_position_embeddings=max_positions,
        rope=rope,
        tie_word_embeddings=cfg.tie_word_embeddings,
        qkv_bias=qkv_bias,
        o_bias=qkv_bias and family.bias_on_output,
        mlp_bias=cfg.mlp_bias and family.reads_mlp_bias,
        qk_norm=family.qk_norm,
        sliding_windows=family.windows(
            cfg,
            cfg.sliding_window if "sliding_window" in cfg.model_fields_set
            else defaults.sliding_window,
            bad,
        ),
        moe=None if family.moe is None else family.moe(cfg, family, bad),
        mla=mla,
        dtype=_checkpoint_dtype(cfg, bad),
        initializer_range=finite("initializer_range", cfg.initializer_range, bad, at_least=0),
        bos_token_id=cfg.bos_token_id,
        eos_token_ids=_eos_ids(cfg.eos_token_id),
        mtp_layers=(cfg.num_nextn_predict_layers or 0) if family.mtp_layers else 0,
        dsa=None if family.dsa is None else family.dsa(cfg, mla, bad),
        linear=None if family.linear is None else family.linear(cfg, bad),
    )


def _rope(cfg: RawConfig, default_theta: float, max_positions: int, bad: Bad) -> RopeConfig:
    # transformers 5 writes rope_parameters; older checkpoints write rope_theta + rope_scaling.
    # With both, transformers takes a non-empty rope_scaling (convert_rope_params_to_dict:
    # ``rope_scaling or rope_parameters``); so do we, or the same file would be two models.
    params = dict(cfg.rope_scaling or cfg.rope_parameters or {})
    theta = params.get("rope_theta", cfg.rope_theta)
    theta = finite("rope_theta", theta if theta is not None else default_theta, bad, positive=True)
    partial = params.get("partial_rotary_factor", cfg.partial_rotary_factor)
    if partial not in (None, 1, 1.0):
        raise bad("partial_rotary_factor", partial, "1.0 (full rotary)")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise bad("rope type", kind, ", ".join(ROPE_TYPES))
    if kind == "default":
        return RopeConfig(theta=theta)

    def number(key: str, default: float | None = None, positive: bool = False,
               at_least: float | None = None, at_most: float | None = None) -> float | None:
        value = params.get(key, default)
        return None if value is None else finite(f"rope {kind} {key}", value, bad,
                                                 positive=positive, at_least=at_least,
                                                 at_most=at_most)

    factor = number("factor", positive=True)
    if factor is None:
        raise bad(f"rope {kind} factor", None, "a number > 0")
    original = params.get("original_max_position_embeddings")
    if kind in ("llama3", "yarn") and original is None:
        original = max_positions
    if original is not None and (
        not isinstance(original, int) or isinstance(original, bool)
        or not 1 <= original <= MAX_POSITIONS
    ):
        raise bad(f"rope {kind} original_max_position_embeddings", original,
                  f"an integer in 1..{MAX_POSITIONS}")
    low = number("low_freq_factor", 1.0, positive=True)
    high = number("high_freq_factor", 4.0, positive=True)
    if kind == "llama3" and low is not None and high is not None and not high > low:
        # The smoothing between the two wavelengths divides by their difference.
        raise bad("rope llama3 high_freq_factor", high, f"a number > low_freq_factor={low}")
    return RopeConfig(
        theta=theta,
        type=kind,
        factor=factor,
        original_max_position_embeddings=original,
        low_freq_factor=low if low is not None else 1.0,
        high_freq_factor=high if high is not None else 4.0,
        beta_fast=number("beta_fast", positive=True) or 32.0,
        beta_slow=number("beta_slow", positive=True) or 1.0,
        attention_factor=number("attention_factor", positive=True, at_most=MAX_SCALE),
        mscale=number("mscale", at_least=0, at_most=MAX_SCALE),
        mscale_all_dim=number("mscale_all_dim", at_least=0, at_most=MAX_SCALE),
        truncate=bool(params.get("truncate", True)),
    )


def finite(
    key: str, value: object, bad: Bad, *, positive: bool = False,
    at_least: float | None = None, at_most: float | None = None,
) -> float:
    """A number finite in float32, the compute dtype of the norms and the rotary table (NaN,
    infinities and 1e300 are refused); ``positive``: > 0 in float32 as well (not 1e-300);
    ``at_least``/``at_most``: within the range where the value means what it says (a
    scaling factor of -1e30 is finite, and nonsense)."""
    parts = ["a number finite in float32 (|x| <= 3.4e38)"]
    if positive:
        parts.append(">= 1.2e-38 (> 0)")
    if at_least is not None:
        parts.append(f">= {at_least:g}")
    if at_most is not None:
        parts.append(f"<= {at_most:g}")
    allowed = ", and ".join(parts)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise bad(key, value, allowed)
    try:
        number = float(value)
    except OverflowError:  # an int past float64
        raise bad(key, value, allowed) from None
    if not math.isfinite(number) or abs(number) > FLOAT32_MAX or (
        positive and number < FLOAT32_TINY
    ) or (at_least is not None and number < at_least) or (
        at_most is not None and number > at_most
    ):
        raise bad(key, value, allowed)
    return number


def _checkpoint_dtype(cfg: RawConfig, bad: Bad) -> str:
    dtype = cfg.dtype or cfg.torch_dtype or "float32"
    dtype = dtype.removeprefix("torch.")
    if dtype not in DTYPES:
        raise bad("dtype", dtype, ", ".join(DTYPES))
    return dtype


def _eos_ids(eos: int | list[int] | None) -> tuple[int, ...]:
    if eos is None:
        return ()
    return (eos,) if isinstance(eos, int) else tuple(eos)
