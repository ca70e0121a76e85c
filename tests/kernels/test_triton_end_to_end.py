"""A tiny model end to end with every op forced to Triton: greedy tokens equal the torch path.

Dummy (seeded random) weights from a config.json, run by the default runner through
``interlock.llm.LLM``; ``INTERLOCK_KERNELS`` forces the backend for every op.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kernel_checks import DEVICE

from interlock.kernels import REGISTRY
from interlock.llm import LLM
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.contract import KernelReport

COMMON: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 128,
    "intermediate_size": 192,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 128,
    # Peaked logits, so the two paths' float differences cannot flip a near-tie.
    "initializer_range": 0.1,
    "torch_dtype": "float32",
    "eos_token_id": None,
}
MODELS: dict[str, dict[str, Any]] = {
    "llama": {"architectures": ["LlamaForCausalLM"]},
    # Routed experts, q/k norms, and a sliding window smaller than the prompts.
    "qwen3_moe": {
        "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 64, "norm_topk_prob": True,
    },
    "mistral": {"architectures": ["MistralForCausalLM"], "sliding_window": 8},
    # MLA over the latent cache (absorbed decode) with noaux_tc routing over groups.
    "deepseek_v3": {
        "architectures": ["DeepseekV3ForCausalLM"], "q_lora_rank": 32, "kv_lora_rank": 32,
        "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 16,
        "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
        "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1,
    },
    # DSA over MLA with DeepSeek routing: the indexer's top-4 of prompts up to 37 tokens,
    # and a layer that reuses the first one's selection. 16 indexer heads, so hardly a
    # score is exactly 0: equal scores at the cut go by CUDA's rule in the Triton kernel
    # and by the CPU's torch.topk in the reference under the interpreter.
    "glm_moe_dsa": {
        "architectures": ["GlmMoeDsaForCausalLM"], "q_lora_rank": 32, "kv_lora_rank": 32,
        "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 16,
        "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
        "first_k_dense_replace": 1, "index_topk": 4, "index_n_heads": 16,
        "index_head_dim": 32, "indexer_types": ["full", "shared"],
    },
}
# Several KV blocks, a single token, and one in between; batched together.
PROMPTS = [[(7 * i + 3) % 256 for i in range(37)], [5], [11, 40, 99, 3, 250, 17, 64, 8, 31]]
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def _generate(
    model_dir: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[tuple[int, ...]], dict[str, KernelReport]]:
    """Greedy tokens of PROMPTS, and the kernel chosen for each op."""
    monkeypatch.setenv("INTERLOCK_KERNELS", backend)
    llm = LLM(str(model_dir), load_format="dummy", device=DEVICE, num_blocks=24,
              max_model_len=64, max_num_seqs=4)
    tokens = [out.token_ids for out in llm.generate(PROMPTS, GREEDY)]
    return tokens, {k.op: k for k in llm.report().kernels}


# slow: 10-25 s a model in the interpreter on a 2-core machine (the MLA models the most).
@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_every_op_forced_to_triton_generates_the_torch_tokens(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**COMMON, **MODELS[name]}))
    torch_tokens, torch_choices = _generate(tmp_path, "torch", monkeypatch)
    triton_tokens, triton_choices = _generate(tmp_path, "triton", monkeypatch)
    for op in REGISTRY.ops():
        assert torch_choices[op].implementation == "torch (interlock)"
        # an op with no Triton kernel (the products, the gathers, some MLA ops) is chosen
        # as usual, and says so
        if not any(i.backend == "triton" for i in REGISTRY.implementations(op)):
            assert f"forced triton has no {op}" in triton_choices[op].reason
        else:
            assert triton_choices[op].implementation == "triton (interlock)", op
    assert triton_tokens == torch_tokens
    assert all(len(tokens) == GREEDY.max_tokens for tokens in torch_tokens)
