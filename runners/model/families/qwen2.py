"""Qwen2: biased q/k/v, optional sliding windows on the layers past max_window_layers."""

from interlock.runners.model.family import Defaults, Family, GGUFFacts, qwen_windows

FAMILIES = (
    Family(
        "Qwen2ForCausalLM",
        Defaults(max_position_embeddings=32768, num_key_value_heads=32, sliding_window=4096,
                 qkv_bias=True),
        windows=qwen_windows(lambda layer, max_window_layers: layer >= max_window_layers),
        gguf=GGUFFacts("qwen2", fixed_keys={"use_sliding_window": False}),
    ),
)
