"""Mixtral: Mistral's attention with eight routed experts per layer, named w1/w3/w2."""

from interlock.runners.model.family import (
    CheckpointNames,
    Defaults,
    Family,
    every_layer_moe,
    window_everywhere,
)

FAMILIES = (
    Family(
        "MixtralForCausalLM",
        Defaults(rms_norm_eps=1e-5, rope_theta=1e6, max_position_embeddings=4096 * 32,
                 num_key_value_heads=8, num_experts=8, num_experts_per_tok=2),
        windows=window_everywhere,
        moe=every_layer_moe(("num_local_experts", "num_experts")),
        names=CheckpointNames(moe_block="block_sparse_moe", experts=("w1", "w3", "w2")),
    ),
)
