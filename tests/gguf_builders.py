"""Tiny GGUF files written with the ``gguf`` package's writer, as llama.cpp lays them out.

Each model has Hugging Face-layout weights (``weights``); the file holds them as
llama.cpp's converter would: q/k rows permuted for llama-style families, 2-D
weights in the requested GGML type, norms (and biases) in F32.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's 2024, and we'll see 12345 more!",
    "def add(a, b):\n    return a + b  # adds two numbers\n",
    "Paris is the capital of France. Berlin is the capital of Germany.",
    "Once upon a time, there was a little robot who loved to read stories.",
    "Héllo wörld, naïve café: ünïcödé text with émojis 😀🚀 and tabs\tand\nnewlines.",
] * 4

# K-quants pack 256 values per block, so every row here is 256 long.
HIDDEN, HEADS, KV_HEADS, FFN, LAYERS = 256, 4, 2, 256, 2


def head_dim(arch: str) -> int:
    """Qwen3 GGUFs give head_dim (attention.key_length) apart from hidden / heads; 128 as
    in every Qwen3 model (transformers' GGUF loader assumes it)."""
    return 128 if arch == "qwen3" else 64


def llama_cpp_permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k permutation (Hugging Face half-split -> interleaved pairs), as its
    converter writes it; the test's reference, independent of the code under test."""
    return (
        rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:])
        .swapaxes(1, 2)
        .reshape(rows.shape)
    )


def train_vocab() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A small byte-level BPE vocabulary and its merges, trained on CORPUS."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=420, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    merges = [tuple(m) for m in json.loads(tok.to_str())["model"]["merges"]]
    return tok.get_vocab(), merges


@dataclass
class TinyGGUF:
    path: Path
    arch: str
    ggml_type: str
    weights: dict[str, np.ndarray] = field(default_factory=dict)  # HF names and layouts
    vocab: dict[str, int] = field(default_factory=dict)
    merges: list[tuple[str, str]] = field(default_factory=list)


def _quantized(values: np.ndarray, kind: str, rng: np.random.Generator) -> np.ndarray:
    """``values`` in GGML type ``kind`` as the bytes (or typed array) the writer takes."""
    qtype = Q[kind]
    if kind in ("Q4_K", "Q6_K"):  # the gguf package only dequantizes these: random blocks
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        blocks = rng.integers(0, 256, (values.size // block, size), dtype=np.uint8)
        scale = rng.uniform(1e-3, 2e-3, (len(blocks), 2)).astype(np.float16).view(np.uint8)
        if kind == "Q4_K":  # d and dmin lead the block
            blocks[:, :4] = scale
        else:  # d ends the block; the int8 scales before it are any byte
            blocks[:, -2:] = scale[:, :2]
        return blocks.reshape(values.shape[0], -1)
    return gguf.quants.quantize(values, qtype)


def write_tiny_gguf(
    path: Path,
    arch: str,
    kind: str,
    *,
    pre: str = "smollm",
    add_bos: bool = False,
    tied: bool = False,
    vocab: tuple[dict[str, int], list[tuple[str, str]]] | None = None,
    extra_tensors: dict[str, np.ndarray] | None = None,
    metadata: dict[str, Any] | None = None,
    seed: int = 0,
) -> TinyGGUF:
    rng = np.random.default_rng(seed)
    token_ids, merges = vocab or train_vocab()
    tokens = sorted(token_ids, key=token_ids.__getitem__)
    model = TinyGGUF(path, arch, kind, vocab=token_ids, merges=merges)
    permuted = arch in ("llama", "mistral")

    def weight(shape: tuple[int, ...]) -> np.ndarray:
        return rng.normal(0, 0.05, shape).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), arch)
    p = f"{arch}."
    writer.add_uint32(p + "block_count", LAYERS)
    writer.add_uint32(p + "context_length", 512)
    writer.add_uint32(p + "embedding_length", HIDDEN)
    writer.add_uint32(p + "feed_forward_length", FFN)
    writer.add_uint32(p + "attention.head_count", HEADS)
    writer.add_uint32(p + "attention.head_count_kv", KV_HEADS)
    writer.add_float32(p + "rope.freq_base", 100000.0)
    writer.add_float32(p + "attention.layer_norm_rms_epsilon", 1e-5)
    dim = head_dim(arch)
    if arch == "qwen3":
        writer.add_uint32(p + "attention.key_length", dim)
        writer.add_uint32(p + "attention.value_length", dim)
    else:
        writer.add_uint32(p + "rope.dimension_count", dim)
    for key, value in (metadata or {}).items():
        if isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_uint32(key, value)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_merges([f"{a} {b}" for a, b in merges])
    writer.add_token_types([3 if t in SPECIAL_TOKENS else 1 for t in tokens])
    writer.add_bos_token_id(token_ids["<|im_start|>"])
    writer.add_eos_token_id(token_ids["<|im_end|>"])
    writer.add_add_bos_token(add_bos)
    writer.add_chat_template(CHAT_TEMPLATE)

    def add(gguf_name: str, hf_name: str, values: np.ndarray, heads: int | None = None) -> None:
        model.weights[hf_name] = values
        stored = llama_cpp_permute(values, heads) if permuted and heads else values
        if values.ndim == 1:
            writer.add_tensor(gguf_name, stored)
            return
        data = _quantized(stored, kind, rng)
        if kind in ("F32", "F16"):
            writer.add_tensor(gguf_name, data)
        else:
            writer.add_tensor(gguf_name, data, raw_dtype=Q[kind])

    vocab_size = len(tokens)
    add("token_embd.weight", "model.embed_tokens.weight", weight((vocab_size, HIDDEN)))
    q_rows, kv_rows = HEADS * dim, KV_HEADS * dim
    for i in range(LAYERS):
        b, h = f"blk.{i}.", f"model.layers.{i}."
        add(b + "attn_norm.weight", h + "input_layernorm.weight", 1 + weight((HIDDEN,)))
        add(b + "attn_q.weight", h + "self_attn.q_proj.weight", weight((q_rows, HIDDEN)), HEADS)
        add(b + "attn_k.weight", h + "self_attn.k_proj.weight", weight((kv_rows, HIDDEN)),
            KV_HEADS)
        add(b + "attn_v.weight", h + "self_attn.v_proj.weight", weight((kv_rows, HIDDEN)))
        add(b + "attn_output.weight", h + "self_attn.o_proj.weight", weight((HIDDEN, q_rows)))
        if arch == "qwen2":
            add(b + "attn_q.bias", h + "self_attn.q_proj.bias", weight((q_rows,)))
            add(b + "attn_k.bias", h + "self_attn.k_proj.bias", weight((kv_rows,)))
            add(b + "attn_v.bias", h + "self_attn.v_proj.bias", weight((kv_rows,)))
        if arch == "qwen3":
            add(b + "attn_q_norm.weight", h + "self_attn.q_norm.weight", 1 + weight((dim,)))
            add(b + "attn_k_norm.weight", h + "self_attn.k_norm.weight", 1 + weight((dim,)))
        add(b + "ffn_norm.weight", h + "post_attention_layernorm.weight", 1 + weight((HIDDEN,)))
        add(b + "ffn_gate.weight", h + "mlp.gate_proj.weight", weight((FFN, HIDDEN)))
        add(b + "ffn_up.weight", h + "mlp.up_proj.weight", weight((FFN, HIDDEN)))
        add(b + "ffn_down.weight", h + "mlp.down_proj.weight", weight((HIDDEN, FFN)))
    add("output_norm.weight", "model.norm.weight", 1 + weight((HIDDEN,)))
    if not tied:
        add("output.weight", "lm_head.weight", weight((vocab_size, HIDDEN)))
    for name, values in (extra_tensors or {}).items():
        writer.add_tensor(name, values)
    finish(writer)
    return model


def rewrite_gguf(
    source: Path,
    target: Path,
    *,
    metadata: dict[str, Any] | None = None,
    tensors: dict[str, tuple[np.ndarray, Q]] | None = None,
) -> Path:
    """A copy of ``source`` with some metadata values and tensors (raw data, type) replaced."""
    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(target), arch)
    for f in reader.fields.values():
        if f.name.startswith(("GGUF.", "general.architecture", "general.alignment")):
            continue  # the writer writes these itself
        value = (metadata or {}).get(f.name, f.contents())
        sub_type = f.types[-1] if len(f.types) > 1 else None
        writer.add_key_value(f.name, value, f.types[0], sub_type)
    for t in reader.tensors:
        data, kind = (tensors or {}).get(t.name, (t.data, t.tensor_type))
        writer.add_tensor(t.name, data, raw_dtype=kind)
    finish(writer)
    return target


def finish(writer: gguf.GGUFWriter) -> None:
    """Write what was added (header, metadata, tensors) and close the file."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_foreign_gguf(path: Path, arch: str) -> Path:
    """A GGUF of an architecture the converter does not know: one embedding tensor."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    finish(writer)
    return path
