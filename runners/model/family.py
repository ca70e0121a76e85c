"""What a model family declares: its config defaults, how its keys switch the shared
layers, and its checkpoint names.

Torch-free. A family is data plus two small rules (sliding windows, routed
experts) picked from the ones below or written in its own module; the
families themselves live one per module in ``interlock.runners.model.families``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from interlock.runners.model.config import (
    MAX_SCALE,
    SCORING_FUNCS,
    TOPK_METHODS,
    Bad,
    DSAConfig,
    LinearAttentionConfig,
    MLAConfig,
    MoEConfig,
    RawConfig,
    RopeConfig,
    Routing,
    finite,
)

#: ``(config, window) -> per-layer windows``; window: the config's sliding_window, else
#: the family's default.
WindowRule = Callable[[RawConfig, int | None, Bad], tuple[int | None, ...]]
#: ``(config, family) -> MoEConfig`` for a family with routed experts.
MoERule = Callable[[RawConfig, "Family", Bad], MoEConfig]
#: ``(config, rope) -> MLAConfig`` for a family with multi-head latent attention.
MLARule = Callable[[RawConfig, RopeConfig, Bad], MLAConfig]
#: ``(config, its MLA) -> DSAConfig`` for a family with DeepSeek sparse attention
#: (``interlock.runners.model.family_dsa``).
DSARule = Callable[[RawConfig, MLAConfig | None, Bad], DSAConfig]
#: ``config -> LinearAttentionConfig`` for a hybrid family with linear-attention layers
#: (``interlock.runners.model.families.kimi_linear``).
LinearRule = Callable[[RawConfig, Bad], LinearAttentionConfig]


@dataclass(frozen=True)
class Defaults:
    """What transformers assumes for keys a config of this family may omit."""

    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    num_key_value_heads: int | None = None  # None: as many as attention heads
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    sliding_window: int | None = None
    qkv_bias: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 0


@dataclass(frozen=True)
class CheckpointNames:
    """Where a family's checkpoint puts what the shared layers hold (under ``model.layers.N``)."""

    moe_block: str = "mlp"  # the routed MLP's prefix
    dense_block: str = "mlp"  # the dense MLP's prefix
    experts: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")  # gate, up, down


@dataclass(frozen=True)
class GGUFFacts:
    """How llama.cpp's GGUF files write a family: the ``general.architecture`` name, and what
    its conversion to config.json and Hugging Face weights needs beyond the shared keys."""

    name: str  # general.architecture, e.g. "llama"
    #: llama.cpp permuted the q/k rows (rotary on interleaved pairs, where Hugging Face
    #: rotates the two halves of each head): the conversion undoes it.
    permuted_qk: bool = False
    #: config.json key -> the metadata key (after ``{name}.``) whose value it takes
    metadata_keys: Mapping[str, str] = field(default_factory=dict)
    #: config.json keys every conversion of this family writes as they are
    fixed_keys: Mapping[str, Any] = field(default_factory=dict)
    #: Whether the family's ``bias_key`` is written from the file (true when the file has
    #: query biases).
    bias_from_tensors: bool = False


def no_windows(cfg: RawConfig, window: int | None, bad: Bad) -> tuple[int | None, ...]:
    """Full attention in every layer (the config's window is ignored, as transformers does)."""
    return (None,) * cfg.num_hidden_layers


def window_everywhere(cfg: RawConfig, window: int | None, bad: Bad) -> tuple[int | None, ...]:
    """The window (if any) in every layer."""
    return (window or None,) * cfg.num_hidden_layers


def qwen_windows(sliding_by_default: Callable[[int, int], bool]) -> WindowRule:
    """Qwen's rule: a window only when ``use_sliding_window``, on the layers ``layer_types``
    names, else on those where ``sliding_by_default(layer, max_window_layers)`` holds."""

    def rule(cfg: RawConfig, window: int | None, bad: Bad) -> tuple[int | None, ...]:
        n = cfg.num_hidden_layers
        if not cfg.use_sliding_window or not window:
            return (None,) * n
        layer_types = cfg.layer_types
        if layer_types is None:
            max_window_layers = cfg.max_window_layers if cfg.max_window_layers is not None else 28
            layer_types = [
                "sliding_attention" if sliding_by_default(i, max_window_layers)
                else "full_attention"
                for i in range(n)
            ]
        if len(layer_types) != n:
            raise bad("layer_types", layer_types, f"a list of {n} entries (num_hidden_layers)")
        allowed = ("full_attention", "sliding_attention")
        for kind in layer_types:
            if kind not in allowed:
                raise bad("layer_types entry", kind, ", ".join(allowed))
        return tuple(window if kind == "sliding_attention" else None for kind in layer_types)

    return rule


def qwen_window_everywhere(cfg: RawConfig, window: int | None, bad: Bad) -> tuple[int | None, ...]:
    """The window in every layer, only when ``use_sliding_window``."""
    if not cfg.use_sliding_window or not window:
        return (None,) * cfg.num_hidden_layers
    return (window,) * cfg.num_hidden_layers


def _num_experts(cfg: RawConfig, family: Family, keys: tuple[str, ...]) -> int:
    values = (getattr(cfg, key) for key in keys)
    return next((v for v in values if v is not None), family.defaults.num_experts)


def every_layer_moe(expert_keys: tuple[str, ...]) -> MoERule:
    """Mixtral's layout: every layer routed, experts as wide as ``intermediate_size``,
    top-k weights renormalised, no shared expert."""

    def rule(cfg: RawConfig, family: Family, bad: Bad) -> MoEConfig:
        top_k = cfg.num_experts_per_tok or family.defaults.num_experts_per_tok
        return MoEConfig(_num_experts(cfg, family, expert_keys), top_k, cfg.intermediate_size,
                         True, 0, tuple(range(cfg.num_hidden_layers)))

    return rule


def qwen_moe(expert_keys: tuple[str, ...], shared_expert: bool) -> MoERule:
    """Qwen's layout: ``moe_intermediate_size`` experts on every ``decoder_sparse_step``-th
    layer outside ``mlp_only_layers``, optionally a gated shared expert."""

    def rule(cfg: RawConfig, family: Family, bad: Bad) -> MoEConfig:
        num_experts = _num_experts(cfg, family, expert_keys)
        top_k = cfg.num_experts_per_tok or family.defaults.num_experts_per_tok
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
        if shared_expert:
            if cfg.shared_expert_intermediate_size is None:
                raise bad("shared_expert_intermediate_size", None, "a positive integer")
            shared = cfg.shared_expert_intermediate_size
        return MoEConfig(num_experts, top_k, cfg.moe_intermediate_size, bool(cfg.norm_topk_prob),
                         shared, sparse)

    return rule


@dataclass(frozen=True)
class MLADefaults:
    """What transformers assumes for the MLA keys a config may omit (DeepSeek V2 and V3
    agree on these)."""

    q_lora_rank: int | None = 1536
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128


def given(cfg: RawConfig, key: str, default: object) -> object:
    """The config's value of ``key``, or ``default`` when the key is absent (an explicit
    null stays None: ``q_lora_rank: null`` means a plain q_proj)."""
    return getattr(cfg, key) if key in cfg.model_fields_set else default


def positive(cfg: RawConfig, key: str, default: int | None, bad: Bad) -> int:
    value = given(cfg, key, default)
    if not isinstance(value, int) or value < 1:
        raise bad(key, value, "a positive integer")
    return value


def mla_attention(defaults: MLADefaults, interleave_key: bool, rotary: bool = True) -> MLARule:
    """DeepSeek's MLA keys. ``interleave_key``: the family reads ``rope_interleave``
    (DeepSeek V3, default true); without it the rotary dims are always interleaved pairs
    (DeepSeek V2 rotates them as complex numbers).

    The softmax scale is ``qk_head_dim ** -0.5``, and for any rope scaling but the default
    with a nonzero ``mscale_all_dim``, times ``(0.1 * mscale_all_dim * ln(factor) + 1) ** 2``
    (1 for a factor <= 1): yarn's temperature, applied to the logits as transformers does.
    ``rotary``: False for an MLA without positional encoding (the rope part is kept as is)."""

    def rule(cfg: RawConfig, rope: RopeConfig, bad: Bad) -> MLAConfig:
        q_lora = given(cfg, "q_lora_rank", defaults.q_lora_rank)
        if q_lora is not None:
            q_lora = positive(cfg, "q_lora_rank", defaults.q_lora_rank, bad)
        nope = positive(cfg, "qk_nope_head_dim", defaults.qk_nope_head_dim, bad)
        rope_dim = positive(cfg, "qk_rope_head_dim", defaults.qk_rope_head_dim, bad)
        if rope_dim % 2:
            raise bad("qk_rope_head_dim", rope_dim, "an even number (rotary pairs)")
        interleave = True
        if interleave_key and cfg.rope_interleave is not None:
            interleave = cfg.rope_interleave
        scale = (nope + rope_dim) ** -0.5
        if rope.type != "default" and rope.mscale_all_dim:
            factor = rope.factor
            mscale = 1.0 if factor <= 1 else 0.1 * rope.mscale_all_dim * math.log(factor) + 1.0
            scale *= mscale * mscale
        return MLAConfig(
            q_lora_rank=q_lora,
            kv_lora_rank=positive(cfg, "kv_lora_rank", defaults.kv_lora_rank, bad),
            qk_nope_head_dim=nope,
            qk_rope_head_dim=rope_dim,
            v_head_dim=positive(cfg, "v_head_dim", defaults.v_head_dim, bad),
            rope_interleave=interleave,
            softmax_scale=scale,
            rotary=rotary,
        )

    return rule


@dataclass(frozen=True)
class DeepseekMoEDefaults:
    """What transformers assumes for a DeepSeek family's MoE keys a config may omit."""

    n_routed_experts: int
    n_shared_experts: int
    moe_intermediate_size: int
    first_k_dense_replace: int
    routed_scaling_factor: float
    n_group: int | None
    topk_group: int | None
    num_experts_per_tok: int | None
    norm_topk_prob: bool


def deepseek_moe(
    defaults: DeepseekMoEDefaults,
    scoring: str,
    methods: tuple[str, ...],
    reads_norm_topk_prob: bool,
    correction_bias: bool,
) -> MoERule:
    """DeepSeek's layout: dense MLPs in the first ``first_k_dense_replace`` layers, then
    routed experts in every layer (``moe_layer_freq`` 1), ``n_shared_experts`` ungated
    shared experts beside them.

    What the family's transformers class implements is fixed by these arguments: its
    ``scoring`` function, the ``topk_method`` values it routes with (the first is the
    default), whether it renormalises the chosen weights when ``norm_topk_prob`` says so,
    and whether its router has an ``e_score_correction_bias``. A config naming a scoring
    function or a top-k method the family does not implement is refused, naming it:
    running it otherwise would be another model than the one it describes."""

    def rule(cfg: RawConfig, family: Family, bad: Bad) -> MoEConfig:
        method = cfg.topk_method if cfg.topk_method is not None else methods[0]
        if method not in methods:
            known = "" if method in TOPK_METHODS else f" (known: {', '.join(TOPK_METHODS)})"
            raise bad("topk_method", method,
                      f"{', '.join(methods)}, what transformers' {family.architecture} "
                      f"routes with{known}")
        given_scoring = cfg.scoring_func if cfg.scoring_func is not None else scoring
        if given_scoring != scoring:
            known = ("" if given_scoring in SCORING_FUNCS
                     else f" (known: {', '.join(SCORING_FUNCS)})")
            raise bad("scoring_func", given_scoring,
                      f"{scoring}, what transformers' {family.architecture} scores "
                      f"experts with{known}")
        freq = cfg.moe_layer_freq
        if freq is not None and freq != 1:
            raise bad("moe_layer_freq", freq,
                      f"1 (transformers' {family.architecture} routes every layer from "
                      "first_k_dense_replace on)")
        experts = cfg.n_routed_experts
        if experts is None:
            experts = next((v for v in (cfg.num_local_experts, cfg.num_experts)
                            if v is not None), defaults.n_routed_experts)
        if experts < 1:
            raise bad("n_routed_experts", experts, "a positive integer")
        shared = given(cfg, "n_shared_experts", defaults.n_shared_experts)
        if not isinstance(shared, int) or shared < 0:
            raise bad("n_shared_experts", shared, "an integer >= 0")
        top_k = positive(cfg, "num_experts_per_tok", defaults.num_experts_per_tok, bad)
        if top_k > experts:
            raise bad("num_experts_per_tok", top_k, f"at most n_routed_experts={experts}")
        first_dense = given(cfg, "first_k_dense_replace", defaults.first_k_dense_replace)
        if not isinstance(first_dense, int) or first_dense < 0:
            raise bad("first_k_dense_replace", first_dense, "an integer >= 0")
        size = positive(cfg, "moe_intermediate_size", defaults.moe_intermediate_size, bad)
        scaling = finite("routed_scaling_factor",
                         given(cfg, "routed_scaling_factor", defaults.routed_scaling_factor),
                         bad, positive=True, at_most=MAX_SCALE)
        n_group, topk_group = 1, 1
        if method != "greedy":
            n_group = positive(cfg, "n_group", defaults.n_group, bad)
            topk_group = positive(cfg, "topk_group", defaults.topk_group, bad)
            if experts % n_group:
                raise bad("n_group", n_group, f"a divisor of n_routed_experts={experts}")
            if topk_group > n_group:
                raise bad("topk_group", topk_group, f"at most n_group={n_group}")
            # noaux_tc scores a group by its best two experts.
            if method == "noaux_tc" and experts // n_group < 2:
                raise bad("n_group", n_group,
                          f"at most n_routed_experts / 2 = {experts // 2} (noaux_tc scores a "
                          "group by its two best experts)")
            if top_k > topk_group * (experts // n_group):
                raise bad("num_experts_per_tok", top_k,
                          f"at most the {topk_group * (experts // n_group)} experts of "
                          f"topk_group={topk_group} groups")
        norm = defaults.norm_topk_prob
        if reads_norm_topk_prob:
            norm = bool(given(cfg, "norm_topk_prob", norm))
        elif cfg.norm_topk_prob:
            raise bad("norm_topk_prob", cfg.norm_topk_prob,
                      f"false (transformers' {family.architecture} never renormalises)")
        sparse = tuple(range(first_dense, cfg.num_hidden_layers))
        routing = Routing(given_scoring, method, n_group, topk_group, scaling,
                          correction_bias, shared)
        return MoEConfig(experts, top_k, size, norm, 0, sparse, routing)

    return rule


def deepseek_v3_moe(defaults: DeepseekMoEDefaults) -> MoERule:
    """DeepSeek-V3's routing, which DeepSeek-V3.2 and GLM-5 (GlmMoeDsa) share: sigmoid
    scores, ``noaux_tc`` over the best groups with the ``e_score_correction_bias``, the
    chosen weights renormalised as ``norm_topk_prob`` says."""
    return deepseek_moe(defaults, scoring="sigmoid", methods=("noaux_tc",),
                        reads_norm_topk_prob=True, correction_bias=True)


_Q = ("q_lora_rank", "num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim")
_EXPERT = ("moe_intermediate_size", "n_routed_experts")
_SHARED = ("moe_intermediate_size", "n_shared_experts")
#: DeepSeek V2/V3: the config keys that set each checkpoint tensor's shape (names under
#: ``model.layers.N``, expert numbers left out), for the error naming them when a config
#: and its checkpoint disagree.
DEEPSEEK_SHAPE_KEYS: dict[str, tuple[str, ...]] = {
    "self_attn.q_proj": _Q,
    "self_attn.q_a_proj": ("q_lora_rank",),
    "self_attn.q_a_layernorm": ("q_lora_rank",),
    "self_attn.q_b_proj": _Q,
    "self_attn.kv_a_proj_with_mqa": ("kv_lora_rank", "qk_rope_head_dim"),
    "self_attn.kv_a_layernorm": ("kv_lora_rank",),
    "self_attn.kv_b_proj": ("kv_lora_rank", "num_attention_heads", "qk_nope_head_dim",
                            "v_head_dim"),
    "self_attn.o_proj": ("num_attention_heads", "v_head_dim"),
    "mlp.gate": ("n_routed_experts", "first_k_dense_replace"),
    "mlp.experts.gate_proj": _EXPERT,
    "mlp.experts.up_proj": _EXPERT,
    "mlp.experts.down_proj": _EXPERT,
    "mlp.shared_experts.gate_proj": _SHARED,
    "mlp.shared_experts.up_proj": _SHARED,
    "mlp.shared_experts.down_proj": _SHARED,
    "mlp.gate_proj": ("intermediate_size", "first_k_dense_replace"),
    "mlp.up_proj": ("intermediate_size", "first_k_dense_replace"),
    "mlp.down_proj": ("intermediate_size", "first_k_dense_replace"),
}


def layer_tensor_kind(name: str) -> str | None:
    """``model.layers.3.mlp.experts.7.up_proj.weight`` -> ``mlp.experts.up_proj``; None for
    a tensor outside the layers."""
    parts = name.split(".")
    if parts[:2] != ["model", "layers"] or len(parts) < 5:
        return None
    inner = parts[3:]
    if inner[-1] in ("weight", "bias"):
        inner = inner[:-1]
    return ".".join(p for p in inner if not p.isdigit())


@dataclass(frozen=True)
class Family:
    """One ``architectures[0]`` name and how its config.json becomes a ``ModelConfig``.

    The shared layers (``interlock.runners.model.decoder``) are Llama-shaped; a family
    says which of their switches its keys turn on.
    """

    architecture: str
    defaults: Defaults = field(default_factory=Defaults)
    #: The config key that adds biases to the attention projections (None: no key; the
    #: family's ``defaults.qkv_bias`` holds), and whether it biases ``o_proj`` too.
    bias_key: str | None = None
    bias_on_output: bool = False
    reads_mlp_bias: bool = False  # whether ``mlp_bias`` biases the MLP projections
    qk_norm: bool = False  # per-head RMS norm of q and k before rotary
    windows: WindowRule = no_windows
    moe: MoERule | None = None  # None: dense MLP in every layer
    mla: MLARule | None = None  # None: per-head K/V attention
    dsa: DSARule | None = None  # None: attention over every cached position
    linear: LinearRule | None = None  # None: no linear-attention layers
    #: transformers' ``attribute_map`` of the family's config: the key config.json spells
    #: -> the key read here (Kimi Linear writes ``num_experts_per_token``, ...).
    aliases: Mapping[str, str] = field(default_factory=dict)
    #: ``layer_tensor_kind`` -> the config keys its shape follows (named in the error when a
    #: checkpoint's shape disagrees with the config).
    shape_keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Whether ``num_nextn_predict_layers`` multi-token-prediction layers follow the decoder
    #: layers in the checkpoint (DeepSeek-V3's layer 61): not run, so their tensors are
    #: ignored, as transformers ignores them.
    mtp_layers: bool = False
    names: CheckpointNames = field(default_factory=CheckpointNames)
    gguf: GGUFFacts | None = None  # None: no GGUF conversion for this family
