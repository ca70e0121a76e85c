"""What the DSA families (DeepSeek V3.2, GLM-5) read beyond DeepSeek V3's keys: the lightning
indexer, which layers run it, and which layers route. Torch-free.

Both read the keys transformers 5.24's ``DeepseekV32Config`` / ``GlmMoeDsaConfig`` read, with
their defaults: ``index_n_heads``, ``index_head_dim``, ``index_topk``; GLM-5 also
``indexer_types`` (per layer ``full`` or ``shared``), or when a config leaves it out, the
pattern its ``index_topk_pattern`` (``"FSS..."`` or a list) or ``index_topk_freq`` /
``index_skip_topk_offset`` give; and ``mlp_layer_types`` (per layer ``dense`` or
``sparse``), which transformers writes and prefers to ``first_k_dense_replace``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from interlock.runners.model.config import Bad, DSAConfig, MLAConfig, MoEConfig, RawConfig
from interlock.runners.model.family import (
    DEEPSEEK_SHAPE_KEYS,
    DSARule,
    Family,
    MoERule,
    positive,
)

INDEXER_TYPES = ("full", "shared")
MLP_LAYER_TYPES = ("dense", "sparse")
#: The one attention ``layer_types`` entry of these configs (transformers' cache dispatch).
LAYER_TYPE = "indexed_attention"


@dataclass(frozen=True)
class DSADefaults:
    """What transformers assumes for the indexer keys a config may omit."""

    index_n_heads: int
    index_head_dim: int = 128
    index_topk: int = 2048


def dsa_indexer(defaults: DSADefaults, reads_indexer_types: bool, rope_interleave: bool
                ) -> DSARule:
    """The lightning indexer's keys. ``reads_indexer_types``: layers may share an earlier
    layer's selection (GLM-5); without it every layer runs its indexer (DeepSeek V3.2).
    ``rope_interleave``: the indexer's rotary dims are interleaved pairs (GLM-5) rather than
    two halves (DeepSeek V3.2), whatever the main attention does."""

    def rule(cfg: RawConfig, mla: MLAConfig | None, bad: Bad) -> DSAConfig:
        if mla is None:
            raise bad("kv_lora_rank", None, "a positive integer (DSA runs over MLA)")
        if mla.q_lora_rank is None:
            raise bad("q_lora_rank", None, "a positive integer (the indexer's queries come "
                      "from the q_lora_rank latent, as transformers builds them)")
        head_dim = positive(cfg, "index_head_dim", defaults.index_head_dim, bad)
        if head_dim % 2 or head_dim < mla.qk_rope_head_dim:
            raise bad("index_head_dim", head_dim, "an even number of at least "
                      f"qk_rope_head_dim={mla.qk_rope_head_dim} (its rotary part)")
        layers = cfg.num_hidden_layers
        for kind in cfg.layer_types or ():
            if kind != LAYER_TYPE:
                raise bad("layer_types entry", kind, LAYER_TYPE)
        indexer_layers = (True,) * layers
        if reads_indexer_types:
            kinds = _indexer_types(cfg, bad)
            if len(kinds) != layers:
                raise bad("indexer_types", f"<{len(kinds)} entries>",
                          f"one entry per layer ({layers}, num_hidden_layers)")
            for kind in kinds:
                if kind not in INDEXER_TYPES:
                    raise bad("indexer_types entry", kind, ", ".join(INDEXER_TYPES))
            if kinds[0] != "full":
                raise bad("indexer_types[0]", kinds[0],
                          "full (a shared layer reuses an earlier layer's selection)")
            indexer_layers = tuple(kind == "full" for kind in kinds)
        return DSAConfig(
            n_heads=positive(cfg, "index_n_heads", defaults.index_n_heads, bad),
            head_dim=head_dim,
            top_k=positive(cfg, "index_topk", defaults.index_topk, bad),
            indexer_layers=indexer_layers,
            rope_interleave=rope_interleave,
        )

    return rule


def _indexer_types(cfg: RawConfig, bad: Bad) -> list[str]:
    """GLM-5's ``indexer_types``, or the schedule transformers derives without it."""
    if cfg.indexer_types is not None:
        return cfg.indexer_types
    pattern = cfg.index_topk_pattern
    if isinstance(pattern, str):
        letters = {"F": "full", "S": "shared"}
        for letter in pattern:
            if letter not in letters:
                raise bad("index_topk_pattern letter", letter, "F (full), S (shared)")
        return [letters[letter] for letter in pattern]
    if pattern is not None:
        return list(pattern)
    freq = max(cfg.index_topk_freq if cfg.index_topk_freq is not None else 1, 1)
    offset = cfg.index_skip_topk_offset if cfg.index_skip_topk_offset is not None else 2
    return ["full" if max(i - offset + 1, 0) % freq == 0 else "shared"
            for i in range(cfg.num_hidden_layers)]


def with_mlp_layer_types(rule: MoERule) -> MoERule:
    """``rule``, with the routed layers those ``mlp_layer_types`` marks ``sparse`` when the
    config lists them (transformers then ignores ``first_k_dense_replace``)."""

    def wrapped(cfg: RawConfig, family: Family, bad: Bad) -> MoEConfig:
        moe = rule(cfg, family, bad)
        kinds = cfg.mlp_layer_types
        if kinds is None:
            return moe
        if len(kinds) != cfg.num_hidden_layers:
            raise bad("mlp_layer_types", f"<{len(kinds)} entries>",
                      f"one entry per layer ({cfg.num_hidden_layers}, num_hidden_layers)")
        for kind in kinds:
            if kind not in MLP_LAYER_TYPES:
                raise bad("mlp_layer_types entry", kind, ", ".join(MLP_LAYER_TYPES))
        sparse = tuple(i for i, kind in enumerate(kinds) if kind == "sparse")
        return dataclasses.replace(moe, sparse_layers=sparse)

    return wrapped


_INDEXER_Q = ("q_lora_rank", "index_n_heads", "index_head_dim", "indexer_types")
#: DEEPSEEK_SHAPE_KEYS, with the indexer's tensors (present on the layers that run one) and
#: the routed layers named by ``mlp_layer_types`` too.
DSA_SHAPE_KEYS: Mapping[str, tuple[str, ...]] = {
    **{kind: keys + ("mlp_layer_types",) if kind.startswith("mlp.") else keys
       for kind, keys in DEEPSEEK_SHAPE_KEYS.items()},
    "self_attn.indexer.wq_b": _INDEXER_Q,
    "self_attn.indexer.wk": ("index_head_dim", "indexer_types"),
    "self_attn.indexer.k_norm": ("index_head_dim", "indexer_types"),
    "self_attn.indexer.weights_proj": ("index_n_heads", "indexer_types"),
}
