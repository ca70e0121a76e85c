"""Qwen3-MoE: Qwen3's attention with routed experts (no shared expert)."""

from interlock.runners.model.family import Defaults, Family, qwen_moe, qwen_window_everywhere

FAMILIES = (
    Family(
        "Qwen3MoeForCausalLM",
        Defaults(max_position_embeddings=32768, num_key_value_heads=4, sliding_window=4096,
                 num_experts=128, num_experts_per_tok=8),
        bias_key="attention_bias", bias_on_output=True, qk_norm=True,
        windows=qwen_window_everywhere,
        # transformers 5 writes num_local_experts and reads num_experts as its alias.
        moe=qwen_moe(("num_local_experts", "num_experts"), shared_expert=False),
    ),
)
