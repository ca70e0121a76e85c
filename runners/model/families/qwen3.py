"""Qwen3: Qwen2 without the q/k/v bias, with per-head q/k norms."""

from interlock.runners.model.family import Defaults, Family, GGUFFacts, qwen_windows

FAMILIES = (
    Family(
        "Qwen3ForCausalLM",
        Defaults(max_position_embeddings=32768, num_key_value_heads=32, head_dim=128,
                 sliding_window=4096),
        bias_key="attention_bias", bias_on_output=True, qk_norm=True,
        windows=qwen_windows(lambda layer, max_window_layers: layer >= max_window_layers),
        gguf=GGUFFacts("qwen3", fixed_keys={"use_sliding_window": False}),
    ),
)
