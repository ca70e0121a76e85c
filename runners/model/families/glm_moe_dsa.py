"""GLM-5 (GlmMoeDsa): DeepSeek-V3.2's sparse attention and routing at other sizes (MLA heads
of 192 + 64 with values of 256, one expert group), the indexer's rotary dims interleaved,
and layers that reuse an earlier layer's selection instead of running an indexer
(``indexer_types``)."""

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
        "GlmMoeDsaForCausalLM",
        Defaults(max_position_embeddings=202752, rms_norm_eps=1e-5),
        bias_key="attention_bias", bias_on_output=True,  # q_a, kv_a and o_proj
        mla=mla_attention(
            MLADefaults(q_lora_rank=2048, qk_nope_head_dim=192, v_head_dim=256),
            interleave_key=False,
        ),
        dsa=dsa_indexer(DSADefaults(index_n_heads=32), reads_indexer_types=True,
                        rope_interleave=True),
        moe=with_mlp_layer_types(deepseek_v3_moe(
            DeepseekMoEDefaults(
                n_routed_experts=256, n_shared_experts=1, moe_intermediate_size=2048,
                first_k_dense_replace=3, routed_scaling_factor=2.5, n_group=1, topk_group=1,
                num_experts_per_tok=8, norm_topk_prob=True,
            )
        )),
        shape_keys=DSA_SHAPE_KEYS,
        mtp_layers=True,
    ),
)
