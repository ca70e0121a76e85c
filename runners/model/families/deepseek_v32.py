"""DeepSeek-V3.2: DeepSeek-V3's latent attention (rotary dims always interleaved pairs) and
routing, with DeepSeek sparse attention: every layer's lightning indexer (64 heads of 128,
its rotary dims two halves) picks the 2048 positions attention reads."""

from interlock.runners.model.family import (
    DeepseekMoEDefaults,
    Defaults,
    Family,
    MLADefaults,
    deepseek_v3_moe,
    mla_attention,
)
from interlock.runners.model.family_dsa import (
    DSA_SHAPE_KEYS,
    DSADefaults,
    dsa_indexer,
    with_mlp_layer_types,
)

FAMILIES = (
    Family(
        "DeepseekV32ForCausalLM",
        Defaults(max_position_embeddings=163840),
        bias_key="attention_bias", bias_on_output=True,  # q_a, kv_a and o_proj
        mla=mla_attention(MLADefaults(), interleave_key=False),
        dsa=dsa_indexer(DSADefaults(index_n_heads=64), reads_indexer_types=False,
                        rope_interleave=False),
        moe=with_mlp_layer_types(deepseek_v3_moe(
            DeepseekMoEDefaults(
                n_routed_experts=256, n_shared_experts=1, moe_intermediate_size=2048,
                first_k_dense_replace=3, routed_scaling_factor=2.5, n_group=8, topk_group=4,
                num_experts_per_tok=8, norm_topk_prob=True,
            )
        )),
        shape_keys=DSA_SHAPE_KEYS,
        mtp_layers=True,
    ),
)
