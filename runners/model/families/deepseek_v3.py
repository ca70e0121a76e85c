"""DeepSeek-V3: DeepSeek-V2's latent attention (``rope_interleave`` chooses the rotary
layout) with sigmoid routing over the best groups, chosen with a score correction bias
(``noaux_tc``), renormalised and scaled."""

from interlock.runners.model.family import (
    DEEPSEEK_SHAPE_KEYS,
    DeepseekMoEDefaults,
    Defaults,
    Family,
    MLADefaults,
    deepseek_v3_moe,
    mla_attention,
)

FAMILIES = (
    Family(
        "DeepseekV3ForCausalLM",
        Defaults(max_position_embeddings=4096),
        bias_key="attention_bias", bias_on_output=True,  # q_a, kv_a and o_proj
        mla=mla_attention(MLADefaults(), interleave_key=True),
        moe=deepseek_v3_moe(
            DeepseekMoEDefaults(
                n_routed_experts=256, n_shared_experts=1, moe_intermediate_size=2048,
                first_k_dense_replace=3, routed_scaling_factor=2.5, n_group=8, topk_group=4,
                num_experts_per_tok=8, norm_topk_prob=True,
            )
        ),
        shape_keys=DEEPSEEK_SHAPE_KEYS,
        mtp_layers=True,
    ),
)
