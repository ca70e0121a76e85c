"""DeepSeek-V2: multi-head latent attention (rotary dims always interleaved pairs) and
softmax routing, greedy or limited to the best groups, with ungated shared experts."""

from interlock.runners.model.family import (
    DEEPSEEK_SHAPE_KEYS,
    DeepseekMoEDefaults,
    Defaults,
    Family,
    MLADefaults,
    deepseek_moe,
    mla_attention,
)

FAMILIES = (
    Family(
        "DeepseekV2ForCausalLM",
        Defaults(max_position_embeddings=2048),
        bias_key="attention_bias", bias_on_output=True,  # q_a, kv_a and o_proj
        mla=mla_attention(MLADefaults(), interleave_key=False),
        moe=deepseek_moe(
            DeepseekMoEDefaults(
                n_routed_experts=64, n_shared_experts=2, moe_intermediate_size=1407,
                first_k_dense_replace=0, routed_scaling_factor=1.0, n_group=None,
                topk_group=None, num_experts_per_tok=None, norm_topk_prob=False,
            ),
            scoring="softmax", methods=("greedy", "group_limited_greedy"),
            reads_norm_topk_prob=False, correction_bias=False,
        ),
        shape_keys=DEEPSEEK_SHAPE_KEYS,
        mtp_layers=True,
    ),
)
