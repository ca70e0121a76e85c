"""The GGUF converter on tiny files written with the gguf package: every tensor type and
family against the package's reference dequantization, the q/k row permutation, the
config, the tokenizer, and files it must refuse."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf_builders import (
    CORPUS,
    HEADS,
    HIDDEN,
    KV_HEADS,
    LAYERS,
    head_dim,
    llama_cpp_permute,
    rewrite_gguf,
    train_vocab,
    write_foreign_gguf,
    write_tiny_gguf,
)
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import load_file
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from interlock.runners.model import gguf as converter
from interlock.runners.model.config_json import parse_config
from interlock.runners.model.families import gguf_registry
from interlock.runners.model.gguf.tensors import TENSOR_TYPES, unpermute_rotary
from interlock.runners.model.gguf.tokenizer import build_tokenizer

ARCHS = ("llama", "qwen2", "qwen3", "mistral")
VOCAB = train_vocab()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """``converted(arch, kind)``: (the tiny model written, its converted directory), once."""
    done: dict[tuple[str, str], tuple] = {}

    def make(arch: str, kind: str, **options):
        key = (arch, kind, json.dumps(options, sort_keys=True))
        if key not in done:
            root = tmp_path_factory.mktemp(f"{arch}-{kind}")
            model = write_tiny_gguf(root / "model.gguf", arch, kind, vocab=VOCAB, **options)
            out = root / "converted"
            out.mkdir()
            converter.convert(converter.read_gguf(model.path), out)
            done[key] = (model, out)
        return done[key]

    return make


def reference_tensors(path: Path) -> dict[str, np.ndarray]:
    """Each tensor of the file, dequantized by the gguf package (numpy order, as stored)."""
    reader = gguf.GGUFReader(path)
    return {
        t.name: gguf.quants.dequantize(t.data, t.tensor_type).reshape(
            tuple(reversed(t.shape.tolist()))
        )
        for t in reader.tensors
    }


GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(hf_name: str) -> str:
    if hf_name in GGUF_NAMES:
        return GGUF_NAMES[hf_name]
    _, _, index, rest = hf_name.split(".", 3)
    return f"blk.{index}.{LAYER_NAMES[rest]}"


@pytest.mark.parametrize("kind", TENSOR_TYPES)
@pytest.mark.parametrize("arch", ARCHS)
def test_every_tensor_is_the_reference_dequantization_in_hf_layout(converted, arch, kind):
    model, out = converted(arch, kind)
    ours = load_file(out / "model.safetensors")
    reference = reference_tensors(model.path)
    assert set(ours) == set(model.weights)
    for name, tensor in ours.items():
        expected = reference[gguf_name(name)]
        if arch in ("llama", "mistral") and (".q_proj." in name or ".k_proj." in name):
            heads = HEADS if ".q_proj." in name else KV_HEADS
            # Permuted back as llama.cpp permuted it, ours is exactly what the file holds.
            values = llama_cpp_permute(tensor.float().numpy(), heads)
        else:
            values = tensor.float().numpy()
        np.testing.assert_array_equal(values, expected, err_msg=name)
        if kind in ("F32", "F16", "BF16"):  # stored as they are, in their own dtype
            assert tensor.dtype == {"F32": torch.float32, "F16": torch.float16,
                                    "BF16": torch.bfloat16}[kind if tensor.dim() > 1 else "F32"]
        else:
            assert tensor.dtype == torch.float32


@pytest.mark.parametrize("arch", ARCHS)
def test_unquantized_weights_come_back_exactly_in_hf_layout(converted, arch):
    model, out = converted(arch, "F32")
    ours = load_file(out / "model.safetensors")
    for name, expected in model.weights.items():
        np.testing.assert_array_equal(ours[name].numpy(), expected, err_msg=name)


@given(
    heads=st.integers(1, 6), half=st.integers(1, 8), cols=st.integers(1, 5),
    seed=st.integers(0, 2**32 - 1),
)
def test_rotary_unpermutation_inverts_llama_cpps_permutation(heads, half, cols, seed):
    rows = np.random.default_rng(seed).normal(size=(heads * 2 * half, cols))
    np.testing.assert_array_equal(unpermute_rotary(llama_cpp_permute(rows, heads),
                                                             heads), rows)
    np.testing.assert_array_equal(llama_cpp_permute(unpermute_rotary(rows, heads),
                                                    heads), rows)
    bias = rows[:, 0]  # a 1-D bias permutes like the rows
    np.testing.assert_array_equal(unpermute_rotary(llama_cpp_permute(bias, heads),
                                                             heads), bias)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_config_describes_the_model(converted, arch):
    model, out = converted(arch, "Q8_0")
    raw = json.loads((out / "config.json").read_text())
    config = parse_config(raw)
    assert config.architecture == gguf_registry()[arch].architecture
    assert (config.hidden_size, config.num_layers, config.num_heads, config.num_kv_heads,
            config.head_dim, config.intermediate_size) == (HIDDEN, LAYERS, HEADS, KV_HEADS,
                                                           head_dim(arch), 256)
    assert config.vocab_size == len(VOCAB[0])
    assert config.rope.theta == 100000.0
    assert config.rms_norm_eps == pytest.approx(1e-5)
    assert config.qkv_bias == (arch == "qwen2")
    assert config.qk_norm == (arch == "qwen3")
    assert config.sliding_windows == (None,) * LAYERS
    assert config.tie_word_embeddings is False
    assert config.eos_token_ids == (VOCAB[0]["<|im_end|>"],)
    assert config.dtype == "float32"


def test_a_missing_output_tensor_means_tied_embeddings(converted):
    _, out = converted("llama", "F16", tied=True)
    config = parse_config(json.loads((out / "config.json").read_text()))
    assert config.tie_word_embeddings and config.dtype == "float16"
    assert "lm_head.weight" not in load_file(out / "model.safetensors")


# llama.cpp writes Mistral models as "llama" (transformers' loader tells them apart by
# general.name); gguf-py, and so transformers, has no "mistral" architecture to load.
@pytest.mark.parametrize(("arch", "name"), [
    ("llama", "tiny"), ("llama", "Mistral tiny"), ("qwen2", "tiny"), ("qwen3", "tiny"),
])
def test_tensors_equal_transformers_own_gguf_loader(converted, arch, name):
    transformers = pytest.importorskip("transformers")
    model, out = converted(arch, "Q4_K", metadata={"general.name": name})
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        model.path.parent, gguf_file=model.path.name, dtype=torch.float32
    )
    theirs = hf.state_dict()
    ours = load_file(out / "model.safetensors")
    assert set(ours) <= set(theirs)
    for tensor_name, tensor in ours.items():
        torch.testing.assert_close(tensor, theirs[tensor_name], rtol=0, atol=0, msg=tensor_name)
    config = parse_config(json.loads((out / "config.json").read_text()))
    assert (hf.config.num_key_value_heads, hf.config.rms_norm_eps,
            hf.config.tie_word_embeddings) == (config.num_kv_heads, config.rms_norm_eps,
                                               config.tie_word_embeddings)


# The pre-tokenization each family's own tokenizer.json declares, written with the
# tokenizers library's components (the reference the converted tokenizer must match).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
REFERENCE_PRE = {
    "gpt-2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False),
    "smollm": lambda: pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ]),
    "qwen2": lambda: pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]),
    "llama-bpe": lambda: pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]),
}
TEXTS = [
    *CORPUS[:5],
    "",
    " leading space and trailing   ",
    "Numbers: 3.14159, 1,000,000 and 20240901!",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "I'M SHOUTING, YOU'RE NOT. We'VE seen it.",
    "ÀÉÎÕÜ ñ ß 中文 日本語 한국어 עברית العربية",
]


def reference_tokenizer(pre: str, add_bos: bool) -> Tokenizer:
    vocab, merges = VOCAB
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = REFERENCE_PRE[pre]()
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<|im_start|> $A", special_tokens=[("<|im_start|>", vocab["<|im_start|>"])]
        )
    return tok


def converted_tokenizer(converted, pre: str, add_bos: bool) -> Tokenizer:
    _, out = converted("qwen2", "F16", pre=pre, add_bos=add_bos)
    return Tokenizer.from_file(str(out / "tokenizer.json"))


@pytest.mark.parametrize(("pre", "add_bos"), [
    ("gpt-2", False), ("smollm", False), ("qwen2", False), ("llama-bpe", True),
])
def test_the_tokenizer_encodes_and_decodes_like_one_built_from_the_same_vocabulary(
    converted, pre, add_bos
):
    ours = converted_tokenizer(converted, pre, add_bos)
    reference = reference_tokenizer(pre, add_bos)
    for text in TEXTS:
        ids = ours.encode(text).ids
        assert ids == reference.encode(text).ids, text
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == reference.decode(
                ids, skip_special_tokens=skip
            )
        body = ids[1:] if add_bos else ids
        assert ours.decode(body, skip_special_tokens=False) == text


@pytest.mark.parametrize("pre", ["smollm", "qwen2"])
@given(text=st.text(max_size=40))
def test_any_text_round_trips_like_the_reference(converted, pre, text):
    ours = converted_tokenizer(converted, pre, False)
    ids = ours.encode(text).ids
    assert ids == reference_tokenizer(pre, False).encode(text).ids
    assert ours.decode(ids, skip_special_tokens=False) == text


def test_special_tokens_and_the_chat_template_are_kept(converted):
    _, out = converted("llama", "Q8_0")
    vocab = VOCAB[0]
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>").ids
    assert ids[0] == vocab["<|im_start|>"] and ids[-1] == vocab["<|im_end|>"]
    assert tok.decode(ids, skip_special_tokens=True) == "user\nhi"
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>" and config["add_bos_token"] is False
    assert "{% for message in messages %}" in config["chat_template"]


def refused(path: Path) -> str:
    with pytest.raises(converter.GGUFError) as info:
        model = converter.read_gguf(path)
        build_tokenizer(model.tokenizer, model.path)
    return str(info.value)


def test_an_unsupported_architecture_is_refused_by_name(tmp_path):
    message = refused(write_foreign_gguf(tmp_path / "gemma.gguf", "gemma2"))
    assert "'gemma2'" in message and "llama, mistral, qwen2, qwen3" in message


def test_an_unsupported_tensor_type_is_refused_naming_tensor_and_type(tmp_path):
    model = write_tiny_gguf(tmp_path / "m.gguf", "llama", "Q8_0", vocab=VOCAB)
    q5 = gguf.GGMLQuantizationType.Q5_0
    values = model.weights["model.layers.1.mlp.up_proj.weight"]
    path = rewrite_gguf(model.path, tmp_path / "q5.gguf", tensors={
        "blk.1.ffn_up.weight": (gguf.quants.quantize(values, q5), q5),
    })
    message = refused(path)
    assert "blk.1.ffn_up.weight" in message and "Q5_0" in message and "Q4_K" in message


def test_an_unknown_tensor_is_refused_by_name(tmp_path):
    model = write_tiny_gguf(tmp_path / "m.gguf", "llama", "F32", vocab=VOCAB,
                            extra_tensors={"rope_freqs.weight": np.ones(32, np.float32)})
    assert "rope_freqs.weight" in refused(model.path)
    assert "llama3 rope scaling" in refused(model.path)


@pytest.mark.parametrize("content", [b"", b"GGUF", b"GGUF\x03\x00\x00\x00garbage", b"PK\x03\x04"])
def test_a_file_that_is_not_gguf_is_refused(tmp_path, content):
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    assert str(path) in refused(path)


def test_a_truncated_file_is_refused(tmp_path):
    model = write_tiny_gguf(tmp_path / "m.gguf", "llama", "Q8_0", vocab=VOCAB)
    data = model.path.read_bytes()
    model.path.write_bytes(data[: len(data) // 2])
    assert str(model.path) in refused(model.path)


@pytest.mark.parametrize(("key", "value", "named"), [
    ("tokenizer.ggml.pre", "falcon", "'falcon'"),
    ("tokenizer.ggml.model", "llama", "'llama'"),
])
def test_an_unsupported_tokenizer_is_refused_by_name(tmp_path, key, value, named):
    model = write_tiny_gguf(tmp_path / "m.gguf", "llama", "F32", vocab=VOCAB)
    path = rewrite_gguf(model.path, tmp_path / "t.gguf", metadata={key: value})
    assert named in refused(path)
