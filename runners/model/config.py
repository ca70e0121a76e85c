"""The model configuration the runners execute: its dataclasses, and the config.json keys read.

Torch-free. :mod:`interlock.runners.model.config_json` builds a :class:`ModelConfig` from a
Hugging Face ``config.json`` through its family (``interlock.runners.model.families``); the
families declare their rules on these types, so this module imports neither.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, PositiveInt

from interlock.core.errors import ModelError


class ConfigError(ModelError):
    """A config.json this project cannot run, with the file and the offending key."""


ROPE_TYPES = ("default", "linear", "llama3", "yarn")
#: Config numbers are computed with in float32: a value past its range (1e300) would turn
#: into an infinity, a positive one below its smallest normal (1e-300) into 0.
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38
#: The most a multiplying config number (``routed_scaling_factor``, yarn's ``mscale`` and
#: ``attention_factor``) may be: released models use 0.7-2.9; one of 1e30 turns every
#: activation it scales into an infinity in float16.
MAX_SCALE = 100.0


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
