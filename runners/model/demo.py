"""The built-in ``demo`` model: a fixed Llama-style config with seeded random weights.

About 52M parameters in float32, so ``model="demo"`` runs offline on any
machine and always produces the same tokens (for a given torch version).
"""

from __future__ import annotations

from typing import Any

from interlock.runners.model.config import ModelConfig
from interlock.runners.model.config_json import parse_config

DEMO_SEED = 20260901

DEMO_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 512,
    "intermediate_size": 1024,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}


def demo_config() -> ModelConfig:
    return parse_config(DEMO_CONFIG, source="demo model config (runners/model/demo.py)")
