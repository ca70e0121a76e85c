"""config.json parsing: family defaults, rope scaling, windows, MoE layout, errors."""

from __future__ import annotations

import json

import pytest

from interlock.runners.model.config import ConfigError, RopeConfig
from interlock.runners.model.config_json import load_config, parse_config

BASE = {
    "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 2,
}


def parse(architecture: str, **keys):
    return parse_config({"architectures": [architecture], **BASE, **keys})


def test_heads_and_head_dim_follow_the_family_defaults():
    llama = parse("LlamaForCausalLM", num_key_value_heads=None)
    assert (llama.num_kv_heads, llama.head_dim) == (8, 8)  # Llama: as many as query heads
    assert parse("Qwen3ForCausalLM").head_dim == 128  # Qwen3's own default
    assert parse("MistralForCausalLM", head_dim=32, num_key_value_heads=2).head_dim == 32
    with pytest.raises(ConfigError, match="num_key_value_heads=3 is not supported; allowed: a "
                       "divisor of num_attention_heads=8"):
        parse("LlamaForCausalLM", num_key_value_heads=3)


def test_rope_from_legacy_rope_scaling_and_from_rope_parameters():
    legacy = parse("LlamaForCausalLM", rope_theta=5e5, rope_scaling={
        "type": "linear", "factor": 4.0})
    assert legacy.rope == RopeConfig(theta=5e5, type="linear", factor=4.0)
    v5 = parse("LlamaForCausalLM", max_position_embeddings=4096, rope_parameters={
        "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0})
    assert (v5.rope.type, v5.rope.theta, v5.rope.original_max_position_embeddings) == (
        "llama3", 5e5, 4096)
    assert parse("MixtralForCausalLM").rope.theta == 1e6  # Mixtral's own default


def test_unsupported_rope_and_activation_are_errors():
    with pytest.raises(ConfigError, match="rope type='dynamic' is not supported; allowed: "
                       "default, linear, llama3, yarn"):
        parse("LlamaForCausalLM", rope_scaling={"type": "dynamic", "factor": 2.0})
    with pytest.raises(ConfigError, match="hidden_act='gelu' is not supported; allowed: silu"):
        parse("LlamaForCausalLM", hidden_act="gelu")
    with pytest.raises(ConfigError, match="partial_rotary_factor=0.5"):
        parse("LlamaForCausalLM", partial_rotary_factor=0.5)


def test_sliding_windows_per_family():
    assert parse("MistralForCausalLM").sliding_windows == (4096,) * 4  # Mistral's default
    assert parse("MistralForCausalLM", sliding_window=None).sliding_windows == (None,) * 4
    assert parse("Qwen2ForCausalLM", sliding_window=16).sliding_windows == (None,) * 4
    qwen2 = parse("Qwen2ForCausalLM", use_sliding_window=True, sliding_window=16,
                  max_window_layers=2)
    assert qwen2.sliding_windows == (None, None, 16, 16)
    explicit = parse("Qwen3ForCausalLM", use_sliding_window=True, sliding_window=16,
                     layer_types=["sliding_attention", "full_attention"] * 2)
    assert explicit.sliding_windows == (16, None, 16, None)
    assert parse("LlamaForCausalLM", sliding_window=16).sliding_windows == (None,) * 4


def test_biases_per_family():
    assert parse("Qwen2ForCausalLM").qkv_bias and not parse("Qwen2ForCausalLM").o_bias
    llama = parse("LlamaForCausalLM", attention_bias=True, mlp_bias=True)
    assert (llama.qkv_bias, llama.o_bias, llama.mlp_bias) == (True, True, True)
    assert not parse("MistralForCausalLM", attention_bias=True).qkv_bias  # Mistral has none


def test_moe_layout():
    qwen2 = parse("Qwen2MoeForCausalLM", num_experts=8, num_experts_per_tok=2,
                  moe_intermediate_size=32, shared_expert_intermediate_size=64,
                  decoder_sparse_step=2, mlp_only_layers=[3])
    assert qwen2.moe.sparse_layers == (1,)
    assert (qwen2.moe.num_experts, qwen2.moe.shared_expert_intermediate_size) == (8, 64)
    # transformers 5 writes num_local_experts for Qwen3-MoE and Mixtral.
    qwen3 = parse("Qwen3MoeForCausalLM", num_local_experts=6, num_experts_per_tok=2,
                  moe_intermediate_size=32, norm_topk_prob=True)
    assert (qwen3.moe.num_experts, qwen3.moe.norm_topk_prob, qwen3.moe.sparse_layers) == (
        6, True, (0, 1, 2, 3))
    mixtral = parse("MixtralForCausalLM", num_local_experts=4)
    assert (mixtral.moe.intermediate_size, mixtral.moe.norm_topk_prob) == (128, True)
    assert parse("LlamaForCausalLM").moe is None
    with pytest.raises(ConfigError, match="num_experts_per_tok=9"):
        parse("Qwen3MoeForCausalLM", num_experts=8, num_experts_per_tok=9,
              moe_intermediate_size=32)


def test_file_errors_name_the_file_and_key(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"],\n  oops}')
    with pytest.raises(ConfigError, match=r"config.json:2:3: invalid JSON"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], **BASE, "hidden_size": "wide"}))
    with pytest.raises(ConfigError, match=r"config.json: hidden_size: Input should be a valid "
                       "integer"):
        load_config(tmp_path)
    without_vocab = {k: v for k, v in BASE.items() if k != "vocab_size"}
    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], **without_vocab}))
    with pytest.raises(ConfigError, match="vocab_size: Field required"):
        load_config(tmp_path)
    with pytest.raises(ConfigError, match="num_attention_heads: Input should be greater than 0"):
        parse("LlamaForCausalLM", num_attention_heads=0)


def test_eos_ids_and_dtype(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], **BASE, "eos_token_id": 2,
         "torch_dtype": "bfloat16"}))
    assert load_config(tmp_path).eos_token_ids == (2,)
    assert load_config(tmp_path).dtype == "bfloat16"
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    assert load_config(tmp_path).eos_token_ids == (2, 7)
    with pytest.raises(ConfigError, match="dtype='float64' is not supported"):
        parse("LlamaForCausalLM", dtype="float64")
