"""Llama and Mistral (Llama with a sliding window in every layer)."""

from interlock.runners.model.family import Defaults, Family, GGUFFacts, window_everywhere

FAMILIES = (
    Family(
        "LlamaForCausalLM",
        bias_key="attention_bias", bias_on_output=True, reads_mlp_bias=True,
        gguf=GGUFFacts("llama", permuted_qk=True, bias_from_tensors=True),
    ),
    Family(
        "MistralForCausalLM",
        Defaults(max_position_embeddings=4096 * 32, num_key_value_heads=8, sliding_window=4096),
        windows=window_everywhere,
        gguf=GGUFFacts(
            "mistral", permuted_qk=True,
            metadata_keys={"sliding_window": "attention.sliding_window"},
        ),
    ),
)
