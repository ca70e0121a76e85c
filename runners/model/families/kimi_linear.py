"""Kimi Linear: a hybrid of Kimi Delta Attention (KDA, linear attention with a per-request
recurrent state) and MLA without positional encoding, with DeepSeek-V3's sigmoid routing
(``noaux_tc``, one group unless ``num_expert_group`` says more).

Read as transformers 5.24's ``KimiLinearConfig`` reads it: ``layer_types`` (per layer
``linear_attention`` or ``full_attention``; without it ``linear_attn_config``'s
``kda_layers`` / ``full_attn_layers``, numbered from 1, else every fourth layer but the
first is MLA), ``mlp_layer_types`` (``dense`` / ``sparse``; without it the first
``first_k_dense_replace``, default 1, are dense), ``linear_num_heads``, ``linear_head_dim``
and ``linear_conv_kernel_dim`` (``linear_attn_config``'s ``num_heads``, ``head_dim``,
``short_conv_kernel_size`` take precedence, as there). The config.json transformers writes
spells several DeepSeek keys its own way (``num_experts_per_token``, ``moe_renormalize``,
...): ``Family.aliases`` maps them back."""

from __future__ import annotations

from interlock.runners.model.config import Bad, LinearAttentionConfig, RawConfig
from interlock.runners.model.family import (
    DEEPSEEK_SHAPE_KEYS,
    CheckpointNames,
    DeepseekMoEDefaults,
    Defaults,
    Family,
    MLADefaults,
    deepseek_v3_moe,
    mla_attention,
    positive,
)
from interlock.runners.model.family_dsa import with_mlp_layer_types

LINEAR, FULL = "linear_attention", "full_attention"
LAYER_TYPES = (LINEAR, FULL)


def _layer_types(cfg: RawConfig, bad: Bad) -> list[str]:
    layers = cfg.num_hidden_layers
    if cfg.layer_types is not None:
        kinds = cfg.layer_types
    else:
        linear = cfg.linear_attn_config or {}
        if "full_attn_layers" in linear and "kda_layers" in linear:
            numbered: list[str | None] = [None] * layers
            for key, kind in (("full_attn_layers", FULL), ("kda_layers", LINEAR)):
                entries = linear[key]
                if not isinstance(entries, list):
                    raise bad(f"linear_attn_config.{key}", entries, "a list of layer numbers")
                for number in entries:
                    if not isinstance(number, int) or not 1 <= number <= layers:
                        raise bad(f"linear_attn_config.{key} entry", number,
                                  f"a layer number in 1..{layers} (num_hidden_layers)")
                    numbered[number - 1] = kind
            if None in numbered:
                missing = numbered.index(None) + 1
                raise bad("linear_attn_config", f"<layer {missing} in neither list>",
                          "every layer in kda_layers or full_attn_layers")
            kinds = [kind for kind in numbered if kind is not None]
        else:
            kinds = [FULL if i and i % 4 == 0 else LINEAR for i in range(layers)]
    if len(kinds) != layers:
        raise bad("layer_types", f"<{len(kinds)} entries>",
                  f"one entry per layer ({layers}, num_hidden_layers)")
    for kind in kinds:
        if kind not in LAYER_TYPES:
            raise bad("layer_types entry", kind, ", ".join(LAYER_TYPES))
    return kinds


def kda_layers(cfg: RawConfig, bad: Bad) -> LinearAttentionConfig:
    linear = cfg.linear_attn_config or {}

    def size(key: str, inner: str, default: int) -> int:
        if inner in linear:
            value = linear[inner]
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise bad(f"linear_attn_config.{inner}", value, "a positive integer")
            return value
        return positive(cfg, key, default, bad)

    return LinearAttentionConfig(
        num_heads=size("linear_num_heads", "num_heads", 32),
        head_dim=size("linear_head_dim", "head_dim", 128),
        conv_kernel=size("linear_conv_kernel_dim", "short_conv_kernel_size", 4),
        layers=tuple(kind == LINEAR for kind in _layer_types(cfg, bad)),
    )


_KDA = ("linear_num_heads", "linear_head_dim", "layer_types")

FAMILIES = (
    Family(
        "KimiLinearForCausalLM",
        Defaults(rms_norm_eps=1e-5, max_position_embeddings=1048576),
        bias_key="attention_bias", bias_on_output=True,
        mla=mla_attention(MLADefaults(q_lora_rank=None), interleave_key=False, rotary=False),
        # DeepSeek-V3's routing on the layers ``mlp_layer_types`` marks ``sparse``
        moe=with_mlp_layer_types(deepseek_v3_moe(
            DeepseekMoEDefaults(
                n_routed_experts=256, n_shared_experts=1, moe_intermediate_size=1024,
                first_k_dense_replace=1, routed_scaling_factor=2.446, n_group=1,
                topk_group=1, num_experts_per_tok=8, norm_topk_prob=True,
            )
        )),
        linear=kda_layers,
        aliases={
            "model_max_length": "max_position_embeddings",
            "moe_renormalize": "norm_topk_prob",
            "num_expert_group": "n_group",
            "num_experts_per_token": "num_experts_per_tok",
            "num_shared_experts": "n_shared_experts",
        },
        shape_keys={
            **{kind: keys + ("mlp_layer_types",) if kind.startswith("mlp.") else keys
               for kind, keys in DEEPSEEK_SHAPE_KEYS.items()},
            "self_attn.q_proj": DEEPSEEK_SHAPE_KEYS["self_attn.q_proj"] + _KDA,
            "self_attn.k_proj": _KDA,
            "self_attn.v_proj": _KDA,
            "self_attn.o_proj": DEEPSEEK_SHAPE_KEYS["self_attn.o_proj"] + _KDA,
            "self_attn.q_conv1d": _KDA + ("linear_conv_kernel_dim",),
            "self_attn.k_conv1d": _KDA + ("linear_conv_kernel_dim",),
            "self_attn.v_conv1d": _KDA + ("linear_conv_kernel_dim",),
            "self_attn.f_a_proj": _KDA,
            "self_attn.f_b_proj": _KDA,
            "self_attn.g_a_proj": _KDA,
            "self_attn.g_b_proj": _KDA,
            "self_attn.b_proj": _KDA,
            "self_attn.dt_bias": _KDA,
            "self_attn.A_log": _KDA,
            "self_attn.o_norm": _KDA,
        },
        names=CheckpointNames(moe_block="block_sparse_moe", dense_block="block_sparse_moe",
                              experts=("w1", "w3", "w2")),
    ),
)
