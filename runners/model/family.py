"""What a model family declares: its config defaults, how its keys switch the shared
layers, and its checkpoint names.

Torch-free. A family is data plus two small rules (sliding windows, routed
experts) picked from the ones below or written in its own module; the
families themselves live one per module in ``interlock.runners.model.families``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from interlock.runners.model.config import Bad, MoEConfig, RawConfig

#: ``(config, window) -> per-layer windows``; window: the config's sliding_window, else
#: the family's default.
WindowRule = Callable[[RawConfig, int | None, Bad], tuple[int | None, ...]]
#: ``(config, family) -> MoEConfig`` for a family with routed experts.
MoERule = Callable[[RawConfig, "Family", Bad], MoEConfig]


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
    names: CheckpointNames = field(default_factory=CheckpointNames)
    gguf: GGUFFacts | None = None  # None: no GGUF conversion for this family
