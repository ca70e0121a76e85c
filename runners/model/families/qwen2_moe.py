"""Qwen2-MoE: routed experts plus a gated shared expert; windows on alternate layers."""

from interlock.runners.model.family import Defaults, Family, qwen_moe, qwen_windows

FAMILIES = (
    Family(
        "Qwen2MoeForCausalLM",
        Defaults(max_position_embeddings=32768, num_key_value_heads=16, sliding_window=4096,
                 qkv_bias=True, num_experts=60, num_experts_per_tok=4),
        bias_key="qkv_bias",  # q/k/v only
        windows=qwen_windows(
            lambda layer, max_window_layers: layer % 2 == 0 and layer < max_window_layers
        ),
        # Only num_experts: transformers' Qwen2-MoE has no num_local_experts alias.
        moe=qwen_moe(("num_experts",), shared_expert=True),
    ),
)
