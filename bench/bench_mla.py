"""MLA benchmark: a random DeepseekV3-shaped model, interlock vs transformers on the same
weights, in one process with the runs interleaved (medians of --reps), float32.

Measures, against the issue's goals:

* KV-cache bytes per token (every layer) against the per-head layout, 2 x heads x head_dim
  per layer (goal: at most (kv_lora_rank + qk_rope_head_dim) / (2 x heads x head_dim) of
  it). The model's K and V heads are equally wide (qk_nope + qk_rope = v_head_dim), so
  head_dim is unambiguous;
* batch-1 decode time per output token, (t(N tokens) - t(1 token)) / (N - 1) for both
  (goal: <= 0.6x transformers');
* output tokens/s of --concurrency requests (prompts of 8-64 tokens, each asking for
  --new-tokens), against one batched transformers ``generate`` over the same prompts,
  left-padded (goal: >= 2x transformers').

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_mla.py [--reps 3] [--new-tokens 32]
        [--threads 1] [--json]

The model (about 150 M parameters: 8 layers, hidden 768, 12 heads, q_lora_rank 384,
kv_lora_rank 256, 12 routed experts + 1 shared, top 4 of 2 groups of 4, the first layer
dense) is built by transformers from a seeded random initialisation and saved once into a
temporary directory; interlock loads the saved checkpoint and runs the decision the shipped
policy resolves for DeepseekV3ForCausalLM on the CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_model import (  # noqa: E402
    compare,
    greedy_generators,
    interleaved_medians,
    machine,
    policy_decision,
    read_bandwidth,
    warm_up,
)

from interlock.llm import LLM  # noqa: E402

#: DeepSeek-V3's layout at about 150 M parameters; K and V heads both 96 wide.
CONFIG = {
    "vocab_size": 32000, "hidden_size": 768, "intermediate_size": 2048,
    "moe_intermediate_size": 512, "num_hidden_layers": 8, "num_attention_heads": 12,
    "num_key_value_heads": 12, "q_lora_rank": 384, "kv_lora_rank": 256,
    "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 96,
    "n_routed_experts": 12, "n_shared_experts": 1, "num_experts_per_tok": 4, "n_group": 2,
    "topk_group": 1, "first_k_dense_replace": 1, "routed_scaling_factor": 2.5,
    "max_position_embeddings": 1024, "bos_token_id": None, "eos_token_id": None,
    "pad_token_id": 0,
}


def build_checkpoint(directory: Path) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("deepseek_v3", **CONFIG)
    config.architectures = ["DeepseekV3ForCausalLM"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    for name, buffer in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buffer.uniform_(-0.05, 0.05)  # zero-initialised: some, so that it matters
    model.save_pretrained(directory)
    return model


def decode_bytes_per_token(hf: torch.nn.Module) -> int:
    """Weight bytes a batch-1 decode step reads, in either engine: every parameter but the
    embedding table (one row of it) and the routed experts a token does not pick (it picks
    num_experts_per_tok of n_routed_experts per MoE layer)."""
    total = sum(p.numel() * p.element_size() for p in hf.parameters())
    embedding = hf.get_input_embeddings().weight
    routed = sum(p.numel() * p.element_size() for name, p in hf.named_parameters()
                 if ".mlp.experts." in name)
    unpicked = 1 - CONFIG["num_experts_per_tok"] / CONFIG["n_routed_experts"]
    return int(total - embedding.numel() * embedding.element_size() - routed * unpicked)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=32, help="batch-1 prompt length")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    new_tokens, reps, concurrency = args.new_tokens, args.reps, args.concurrency
    generator = torch.Generator().manual_seed(0)

    def draw(low: int, high: int, count: int) -> list[int]:
        return torch.randint(low, high + 1, (count,), generator=generator).tolist()

    top = CONFIG["vocab_size"] - 1
    prompt = draw(3, top, args.prompt_len)
    prompts = [draw(3, top, n) for n in draw(8, 64, concurrency)]
    with tempfile.TemporaryDirectory() as directory:
        hf = build_checkpoint(Path(directory))
        decision = policy_decision("cpu", directory)
        llm = LLM(directory, dtype="float32", device="cpu", max_num_seqs=concurrency,
                  max_model_len=256, decision=decision)
    parameters = sum(p.numel() for p in hf.parameters())
    ours, theirs = greedy_generators(llm, hf)

    same_tokens = warm_up(ours, theirs, prompt, prompts)
    runs = {
        "batch1_one": ([prompt], [1]),
        "batch1_many": ([prompt], [new_tokens]),
        "concurrent": (prompts, [new_tokens] * concurrency),
    }
    median = interleaved_medians(ours, theirs, runs, reps)

    tpot = compare(lambda e: (median[e, "batch1_many"] - median[e, "batch1_one"])
                   / (new_tokens - 1) * 1e3)
    throughput = compare(lambda e: concurrency * new_tokens / median[e, "concurrent"])
    report = llm.report()
    kv = report.kv_cache
    bandwidth = max(read_bandwidth().values())
    weight_bytes = decode_bytes_per_token(hf)
    layers, heads = CONFIG["num_hidden_layers"], CONFIG["num_attention_heads"]
    head_dim = CONFIG["v_head_dim"]
    per_head = layers * 2 * heads * head_dim * 4
    latent = CONFIG["kv_lora_rank"] + CONFIG["qk_rope_head_dim"]
    figures = {
        "machine": {**machine(), "transformers": transformers.__version__},
        "model": {"config": CONFIG, "parameters": parameters},
        "decision": {"runner": decision.runner, "cudagraph": decision.cudagraph,
                     "breakable": decision.breakable},
        "graphs": report.graphs.to_dict() if report.graphs else None,
        "settings": {"reps": reps, "new_tokens": new_tokens, "prompt_len": args.prompt_len,
                     "concurrency": concurrency, "prompt_lens": [len(p) for p in prompts]},
        "greedy_tokens_identical": same_tokens,
        "kv_bytes_per_token": {
            "interlock": kv.bytes_per_token, "per_head_layout": per_head,
            "ratio": kv.bytes_per_token / per_head, "goal": latent / (2 * heads * head_dim),
        },
        "batch1_tpot_ms": tpot,
        "concurrent_tokens_per_s": throughput,
        "roofline": {"weight_bytes_per_token": weight_bytes, "read_gb_per_s": bandwidth / 1e9,
                     "roofline_ms": weight_bytes / bandwidth * 1e3},
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    m = figures["machine"]
    print(f"machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} "
          f"({m['torch_threads']} threads), transformers {m['transformers']}")
    print(f"model: random DeepseekV3ForCausalLM, {parameters / 1e6:.0f} M parameters, float32")
    print(f"interlock: runner {decision.runner}, cudagraph={decision.cudagraph}, breakable="
          f"{decision.breakable}; graphs: {figures['graphs'] and figures['graphs']['backend']}")
    print(f"greedy tokens identical to transformers: {same_tokens}")
    kv_row = figures["kv_bytes_per_token"]
    print(f"KV bytes per token: {kv_row['interlock']} (MLA latent) vs {per_head} per-head "
          f"K/V = {kv_row['ratio']:.4f} (goal <= {kv_row['goal']:.4f})")
    print("| metric | interlock | transformers | ratio | goal |")
    print("|---|---|---|---|---|")
    print(f"| batch-1 decode, ms per output token | {tpot['interlock']:.2f} | "
          f"{tpot['transformers']:.2f} | {tpot['ratio']:.2f}x | <= 0.6x |")
    print(f"| {concurrency} concurrent requests, output tokens/s | "
          f"{throughput['interlock']:.1f} | {throughput['transformers']:.1f} | "
          f"{throughput['ratio']:.2f}x | >= 2x |")
    roof = figures["roofline"]
    print(f"roofline: {weight_bytes / 1e6:.0f} MB of weights per decoded token / "
          f"{roof['read_gb_per_s']:.1f} GB/s read = {roof['roofline_ms']:.1f} ms")


if __name__ == "__main__":
    main()
