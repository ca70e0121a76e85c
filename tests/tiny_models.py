"""The tests' tiny models, all of one size (the plugin test kit's TINY_LLAMA):

- :func:`write_tiny_model`: that Llama as a checkpoint of seeded dummy weights, written
  without transformers (the ``tiny_model`` fixtures);
- :class:`TinyModels`: random checkpoints of every supported architecture, built with
  transformers, and their greedy generations as the oracle (lazily, once per session: the
  ``tiny_models`` fixture).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from interlock.runners.graphs.buffers import ForwardInputs
from interlock.runners.mrv1.runner import MRV1Runner
from interlock.testing.checks import TINY_LLAMA

# The MLA and MoE sizes of every DeepSeek config below.
MLA: dict[str, Any] = {
    "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
    "v_head_dim": 12, "n_routed_experts": 8, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "n_shared_experts": 1,
    # transformers repeats the expanded per-head K/V by heads / num_key_value_heads.
    "num_key_value_heads": 4,
}

# The indexer of every DSA config below, on DeepSeek's MLA sizes.
# No padding_idx: transformers zeroes the pad token's embedding row, and a zero hidden state
# gives the indexer a zero query, so every position of that step scores exactly 0; which of
# equal scores torch.topk keeps depends on the row's length, and the batched oracle's rows
# are padded where the runner's are not.
DSA: dict[str, Any] = {**MLA, "index_topk": 4, "index_n_heads": 8, "index_head_dim": 16,
                       "pad_token_id": None}

# A different rope scaling, window and head layout per family, so together they cover
# what these configs can vary.
TINY_CONFIGS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("llama", "LlamaForCausalLM", {
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
    }),
    "llama-tied-bias": ("llama", "LlamaForCausalLM", {
        "tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "num_key_value_heads": 4,
    }),
    "mistral": ("mistral", "MistralForCausalLM", {
        "sliding_window": 8, "head_dim": 24, "num_key_value_heads": 1,
    }),
    "qwen2": ("qwen2", "Qwen2ForCausalLM", {
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                         "original_max_position_embeddings": 64},
        "use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1,
    }),
    "qwen3": ("qwen3", "Qwen3ForCausalLM", {"head_dim": 32, "tie_word_embeddings": True}),
    "qwen2_moe": ("qwen2_moe", "Qwen2MoeForCausalLM", {
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48, "mlp_only_layers": [1],
    }),
    "qwen3_moe": ("qwen3_moe", "Qwen3MoeForCausalLM", {
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "norm_topk_prob": True, "rope_theta": 500000.0,
    }),
    "mixtral": ("mixtral", "MixtralForCausalLM", {
        "num_local_experts": 4, "num_experts_per_tok": 2,
    }),
    # Multi-head latent attention with DeepSeek's routing: between them, q_lora_rank null and
    # set, every topk_method, yarn with mscale / mscale_all_dim, interleaved and plain rotary
    # layouts, dense first layers (first_k_dense_replace) and none.
    "deepseek_v2": ("deepseek_v2", "DeepseekV2ForCausalLM", {
        **MLA, "q_lora_rank": None, "topk_method": "greedy", "first_k_dense_replace": 1,
        "n_shared_experts": 2, "routed_scaling_factor": 1.5,
    }),
    "deepseek_v2_grouped": ("deepseek_v2", "DeepseekV2ForCausalLM", {
        **MLA, "topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2,
        "first_k_dense_replace": 0, "attention_bias": True,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "mscale": 1.0,
                         "mscale_all_dim": 0.8, "original_max_position_embeddings": 64},
    }),
    "deepseek_v3": ("deepseek_v3", "DeepseekV3ForCausalLM", {
        **MLA, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1,
    }),
    "deepseek_v3_plain_q": ("deepseek_v3", "DeepseekV3ForCausalLM", {
        **MLA, "q_lora_rank": None, "rope_interleave": False, "n_group": 4, "topk_group": 2,
        "first_k_dense_replace": 0, "norm_topk_prob": False, "n_shared_experts": 0,
        "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "mscale": 0.9,
                         "mscale_all_dim": 1.0, "original_max_position_embeddings": 32},
    }),
    # DeepSeek sparse attention: a top-4 of prompts up to 19 tokens, so the selection
    # matters; 8 indexer heads, so scores rarely tie at 0 (where the padded rows of the
    # batched oracle may keep other positions; TIE_CONFIGS below are the tied case).
    # GLM-5's third layer reuses the second's selection.
    "deepseek_v32": ("deepseek_v32", "DeepseekV32ForCausalLM", {
        **DSA, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1,
    }),
    "glm_moe_dsa": ("glm_moe_dsa", "GlmMoeDsaForCausalLM", {
        **DSA, "num_hidden_layers": 3, "index_topk_freq": 2, "first_k_dense_replace": 1,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "mscale": 1.0,
                         "mscale_all_dim": 0.8, "original_max_position_embeddings": 64},
    }),
    # Kimi Linear: 3 KDA layers then MLA without rotary, written as the released
    # checkpoints write it (linear_attn_config, numbered layers, transformers' aliases); the
    # first layer dense (first_k_dense_replace defaults to 1).
    "kimi_linear": ("kimi_linear", "KimiLinearForCausalLM", {
        "num_hidden_layers": 4, "num_key_value_heads": 4, "q_lora_rank": None,
        "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 12,
        "num_experts": 4, "num_experts_per_token": 2, "moe_intermediate_size": 32,
        "num_shared_experts": 1,
        "linear_attn_config": {"head_dim": 16, "num_heads": 2, "short_conv_kernel_size": 4,
                               "kda_layers": [1, 2, 3], "full_attn_layers": [4]},
    }),
}

# DSA as issue 36 found it diverging from transformers: 2 indexer heads of 16, so a score
# of exactly 0 (every head's dot negative, relu) is common and ties at the top-4 cut are
# too; 3 layers, the first dense; GLM-5's third reuses the second's selection. Not in
# TINY_CONFIGS: which of equal scores torch.topk keeps depends on the row's length, so
# their oracle is transformers fed as the runner was (hf_oracle.transformers_replay), not
# the batched, left-padded generate of Oracle.
DSA_TIES: dict[str, Any] = {**DSA, "index_n_heads": 2, "num_hidden_layers": 3,
                            "first_k_dense_replace": 1}
TIE_CONFIGS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "deepseek_v32_ties": ("deepseek_v32", "DeepseekV32ForCausalLM", {
        **DSA_TIES, "n_group": 2, "topk_group": 1,
    }),
    "glm_moe_dsa_ties": ("glm_moe_dsa", "GlmMoeDsaForCausalLM", {
        **DSA_TIES, "index_topk_freq": 2,
    }),
}
ALL_CONFIGS = {**TINY_CONFIGS, **TIE_CONFIGS}

#: TINY_LLAMA's sizes and its initializer_range (larger than the usual 0.02 so logits are
#: peaked: no near-ties for float noise to flip), with room for longer runs.
SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
         "num_attention_heads", "num_key_value_heads", "initializer_range")
BASE_CONFIG: dict[str, Any] = {
    **{key: TINY_LLAMA[key] for key in SIZES},
    "max_position_embeddings": 256,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": 0,
}

# Prompts of different lengths; the longest spans several KV blocks.
PROMPTS: list[list[int]] = [
    [7, 93, 12, 54, 3, 88, 41, 19, 66, 102, 5, 27, 71, 30, 9, 115, 48, 60, 2],
    [17, 85],
    [33, 4, 120, 58, 77, 11, 96, 23, 64],
]
NEW_TOKENS = 40


@dataclass(frozen=True)
class Oracle:
    """transformers' greedy continuation of PROMPTS, with the raw logits of each step."""

    tokens: list[list[int]]
    logits: list[torch.Tensor]  # per step: [len(PROMPTS), V]


@dataclass
class TinyModels:
    root: Path
    _models: dict[str, Any] = field(default_factory=dict)
    _oracles: dict[str, Oracle] = field(default_factory=dict)

    def path(self, name: str) -> Path:
        self.hf(name)
        return self.root / name

    def hf(self, name: str) -> Any:
        if name not in self._models:
            self._models[name] = make_checkpoint(self.root / name, *ALL_CONFIGS[name])
        return self._models[name]

    def oracle(self, name: str) -> Oracle:
        if name not in self._oracles:
            width = max(len(p) for p in PROMPTS)
            ids = torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])
            with torch.no_grad():
                out = self.hf(name).generate(
                    input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS,
                    min_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                    return_dict_in_generate=True, pad_token_id=0,
                )
            self._oracles[name] = Oracle(out.sequences[:, width:].tolist(), list(out.logits))
        return self._oracles[name]


def make_checkpoint(directory: Path, model_type: str, architecture: str,
                    extra: dict[str, Any], seed: int = 0) -> Any:
    """A random transformers model of BASE_CONFIG with ``extra``, seeded, saved to
    ``directory``; returns the model (eval mode)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **{**BASE_CONFIG, **extra})
    config.architectures = [architecture]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    for buffer_name, buffer in model.named_buffers():
        # Initialised to zero: random, so that choosing with it differs from without.
        if buffer_name.endswith("e_score_correction_bias"):
            buffer.uniform_(-0.2, 0.2)
    model.save_pretrained(directory)
    return model


class RecordingRunner(MRV1Runner):
    """mrv1 that keeps the logits of every (eager) step, for comparing against the oracle."""

    def __init__(self) -> None:
        super().__init__()
        self.logits: list[torch.Tensor] = []

    def compute_logits(self, inputs: ForwardInputs) -> torch.Tensor:
        logits = super().compute_logits(inputs)
        self.logits.append(logits.clone())
        return logits


def write_tiny_model(directory: Path) -> Path:
    """TINY_LLAMA as a checkpoint in ``directory`` (created): config.json and a
    model.safetensors of seeded dummy weights. Returns ``directory``."""
    from safetensors.torch import save_file

    from interlock.runners.dispatch import build_kernel_table
    from interlock.runners.model.checkpoint import build_model
    from interlock.runners.model.config_json import parse_config
    from interlock.runners.model.dummy import DummyTensors
    from interlock.runners.model.weights import checkpoint_shapes

    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(TINY_LLAMA))
    model = build_model(
        parse_config(TINY_LLAMA), build_kernel_table("cpu", "float32"), "float32", "meta",
        TINY_LLAMA["max_position_embeddings"],
    )
    shapes = checkpoint_shapes(model)
    tensors = DummyTensors(shapes, 0, 0.1)
    save_file({n: tensors.get(n) for n in shapes}, directory / "model.safetensors")
    return directory
