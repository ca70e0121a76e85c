"""GGUF files as a model source: read one, dequantize it, and write a plain model directory.

A llama.cpp GGUF file holds the weights (quantized or not), the hyperparameters
and the tokenizer. :func:`convert` turns one into what the runners load
everywhere else: ``config.json`` (the Hugging Face keys ``runners.model.config``
reads), ``model.safetensors`` (Hugging Face tensor names and layouts),
``tokenizer.json`` (built with the ``tokenizers`` library from the GGUF
vocabulary and merges) and ``tokenizer_config.json`` (the chat template and
special tokens). Torch-free: numpy, the ``gguf`` package (reading and
dequantizing) and ``tokenizers``.

llama.cpp's converter permutes the rows of the query and key projections of
``llama``-style models (it runs rotary embeddings on interleaved pairs where
Hugging Face rotates the two halves of each head); :func:`unpermute_rotary`
undoes it, or attention would be wrong.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from interlock.runners.model.sources import ModelSourceError

#: Bumped whenever the converter's output changes: a cached conversion made by
#: another version is converted again.
CONVERTER_VERSION = 1

#: GGUF ``general.architecture`` -> the Hugging Face architecture it converts to.
ARCHITECTURES: Mapping[str, str] = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
#: Families whose q/k rows llama.cpp permuted (the others use NeoX-style rotary as is).
_PERMUTED = ("llama", "mistral")

#: The GGML tensor types read here, by their GGML names.
TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K")
_NATIVE = {"F32": "F32", "F16": "F16", "BF16": "BF16"}  # stored as they are; the rest -> F32
_ITEM_SIZE = {"F32": 4, "F16": 2, "BF16": 2}

#: Pre-tokenizer regexes by ``tokenizer.ggml.pre``, applied in order (each splits the
#: pieces the previous one left), as the model families' own tokenizers split text.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
PRE_TOKENIZERS: Mapping[str, tuple[str, ...]] = {
    "default": (_GPT2_SPLIT,),
    "gpt-2": (_GPT2_SPLIT,),
    "smollm": (r"\p{N}", _GPT2_SPLIT),
    "qwen2": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "llama-bpe": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
}
#: GGUF token types (llama.cpp's ``llama_token_type``) that become added tokens.
_CONTROL, _USER_DEFINED = 3, 4

# GGUF tensor name (after ``blk.N.``) -> Hugging Face name (after ``model.layers.N.``).
_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_MODEL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_WHY_UNSUPPORTED = {
    "rope_freqs.weight": "per-dimension rotary frequency factors (llama3 rope scaling)",
}

MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


class GGUFError(ModelSourceError):
    """A GGUF file this project cannot convert, naming the file and what is unsupported."""


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of the file, with its Hugging Face name and how it converts."""

    gguf_name: str
    hf_name: str
    ggml_type: str  # one of TENSOR_TYPES
    shape: tuple[int, ...]  # numpy order (rows first), as Hugging Face stores it
    rotary_heads: int | None  # heads to un-permute the rows over; None: stored as is
    raw: np.ndarray  # the file's bytes (memory-mapped): typed for F32/F16, uint8 otherwise

    @property
    def stored_dtype(self) -> str:
        """The safetensors dtype it is written as: its own when unquantized, else F32."""
        return _NATIVE.get(self.ggml_type, "F32")


@dataclass(frozen=True)
class GGUFModel:
    """What a GGUF file holds, read and checked but not dequantized."""

    path: Path
    architecture: str  # the GGUF name, e.g. "llama"
    config: dict[str, Any]  # config.json contents
    tensors: tuple[GGUFTensor, ...]
    tokenizer: dict[str, Any]  # the tokenizer.ggml.* and chat template fields, by short name


def read_gguf(path: str | Path) -> GGUFModel:
    """Read and check ``path``: architecture, tensor types and names, hyperparameters."""
    path = Path(path)
    reader = _open_reader(path)
    fields = _Fields(reader, path)
    arch = fields.string("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFError(
            f"{path}: architecture {arch!r} (general.architecture) is not supported; "
            f"supported: {', '.join(ARCHITECTURES)}"
        )
    tensors = {t.name: t for t in reader.tensors}
    config = _hf_config(arch, fields, tensors, path)
    converted = tuple(_tensor(t, arch, config, path) for t in reader.tensors)
    return GGUFModel(path, arch, config, converted, _tokenizer_fields(fields))


def _open_reader(path: Path) -> Any:
    import gguf

    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise GGUFError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if magic != b"GGUF":
        raise GGUFError(f"{path}: not a GGUF file (it does not start with the GGUF magic)")
    try:
        return gguf.GGUFReader(path)
    except Exception as exc:  # the reader parses untrusted bytes; any failure means a bad file
        raise GGUFError(
            f"{path}: not a readable GGUF file: {type(exc).__name__}: {exc}"
        ) from None


class _Fields:
    """Typed access to the key-value metadata, with errors naming the key."""

    def __init__(self, reader: Any, path: Path) -> None:
        self.fields = reader.fields
        self.path = path

    def get(self, key: str) -> Any:
        field = self.fields.get(key)
        if field is None:
            return None
        try:
            return field.contents()
        except Exception as exc:  # a malformed value in untrusted bytes
            raise GGUFError(f"{self.path}: metadata {key}: unreadable value: {exc}") from None

    def required(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise GGUFError(f"{self.path}: metadata {key} is missing")
        return value

    def string(self, key: str) -> str:
        value = self.required(key)
        if not isinstance(value, str):
            raise GGUFError(f"{self.path}: metadata {key}={value!r} is not a string")
        return value

    def integer(self, key: str, default: int | None = None) -> int:
        value = self.get(key) if default is not None else self.required(key)
        if value is None:
            return default  # type: ignore[return-value]
        if isinstance(value, list):  # per-layer values: only a uniform list is a model here
            if not value or len(set(value)) != 1:
                raise GGUFError(
                    f"{self.path}: metadata {key} differs between layers ({value[:8]}...); "
                    "only uniform layers are supported"
                )
            value = value[0]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise GGUFError(f"{self.path}: metadata {key}={value!r} is not a positive integer")
        return int(value)

    def number(self, key: str, default: float | None = None) -> float:
        value = self.get(key)
        if value is None:
            if default is None:
                raise GGUFError(f"{self.path}: metadata {key} is missing")
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise GGUFError(f"{self.path}: metadata {key}={value!r} is not a number")
        return float(value)


def _hf_config(
    arch: str, fields: _Fields, tensors: Mapping[str, Any], path: Path
) -> dict[str, Any]:
    """config.json contents from the ``{arch}.*`` hyperparameters (and the tensors present)."""
    p = f"{arch}."
    hidden = fields.integer(p + "embedding_length")
    heads = fields.integer(p + "attention.head_count")
    kv_heads = fields.integer(p + "attention.head_count_kv", heads)
    head_dim = fields.integer(
        p + "attention.key_length", fields.integer(p + "rope.dimension_count", hidden // heads)
    )
    embedding = tensors.get("token_embd.weight")
    if embedding is None:
        raise GGUFError(f"{path}: tensor token_embd.weight (the token embedding) is missing")
    vocab = fields.integer(p + "vocab_size", int(embedding.shape[-1]))
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": fields.integer(p + "feed_forward_length"),
        "num_hidden_layers": fields.integer(p + "block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": fields.integer(p + "context_length", 2048),
        # float32 in the file; read as the Python float of that float32, as transformers does
        "rms_norm_eps": fields.number(p + "attention.layer_norm_rms_epsilon"),
        "rope_theta": fields.number(p + "rope.freq_base", 10000.0),
        "tie_word_embeddings": "output.weight" not in tensors,
        "torch_dtype": _checkpoint_dtype(tensors.values()),
    }
    if arch == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in tensors
    if arch == "mistral":
        config["sliding_window"] = fields.get(p + "attention.sliding_window")
    if arch in ("qwen2", "qwen3"):
        config["use_sliding_window"] = False
    scaling = _rope_scaling(fields, p, path)
    if scaling is not None:
        config["rope_scaling"] = scaling
    bos = fields.get("tokenizer.ggml.bos_token_id")
    if bos is not None:
        config["bos_token_id"] = int(bos)
    eos = [
        int(v) for v in (fields.get("tokenizer.ggml.eos_token_id"),
                         fields.get("tokenizer.ggml.eot_token_id"))
        if v is not None
    ]
    if eos:
        config["eos_token_id"] = eos[0] if len(set(eos)) == 1 else sorted(set(eos))
    return config


def _rope_scaling(fields: _Fields, p: str, path: Path) -> dict[str, Any] | None:
    kind = fields.get(p + "rope.scaling.type")
    if kind in (None, "none"):
        return None
    factor = fields.number(p + "rope.scaling.factor")
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        original = fields.integer(p + "rope.scaling.original_context_length")
        return {"rope_type": "yarn", "factor": factor,
                "original_max_position_embeddings": original}
    raise GGUFError(
        f"{path}: metadata {p}rope.scaling.type={kind!r} is not supported; allowed: "
        "none, linear, yarn"
    )


def _checkpoint_dtype(tensors: Any) -> str:
    """The dtype ``dtype="auto"`` runs in: the weights' own when all are F16 (or all BF16)."""
    kinds = {t.tensor_type.name for t in tensors if len(t.shape) > 1}
    if kinds == {"F16"}:
        return "float16"
    if kinds == {"BF16"}:
        return "bfloat16"
    return "float32"


def _tensor(t: Any, arch: str, config: Mapping[str, Any], path: Path) -> GGUFTensor:
    name = t.name
    kind = t.tensor_type.name
    hf_name = _hf_name(name)
    if hf_name is None:
        why = _WHY_UNSUPPORTED.get(name, f"not part of a {arch} model this converter knows")
        raise GGUFError(f"{path}: tensor {name} is not supported ({why})")
    if kind not in TENSOR_TYPES:
        raise GGUFError(
            f"{path}: tensor {name} has type {kind}, which is not supported; supported: "
            + ", ".join(TENSOR_TYPES)
        )
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    heads = None
    if arch in _PERMUTED and name.endswith(("attn_q.weight", "attn_q.bias")):
        heads = config["num_attention_heads"]
    elif arch in _PERMUTED and name.endswith(("attn_k.weight", "attn_k.bias")):
        heads = config["num_key_value_heads"]
    if heads is not None and shape[0] % (2 * heads):
        raise GGUFError(
            f"{path}: tensor {name} has {shape[0]} rows, not a multiple of 2 x {heads} heads"
        )
    return GGUFTensor(name, hf_name, kind, shape, heads, t.data)


def _hf_name(name: str) -> str | None:
    if name in _MODEL_TENSORS:
        return _MODEL_TENSORS[name]
    block, _, rest = name.partition(".")
    index, _, suffix = rest.partition(".")
    if block == "blk" and index.isdigit() and suffix in _LAYER_TENSORS:
        return f"model.layers.{int(index)}.{_LAYER_TENSORS[suffix]}"
    return None


def unpermute_rotary(rows: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation over ``heads`` heads.

    Within each head llama.cpp stores the rows as interleaved pairs (row ``2i``
    and ``2i+1`` rotate together); Hugging Face stores the first half of the
    head then the second half (row ``i`` rotates with row ``i + d/2``).
    """
    half = rows.shape[0] // heads // 2
    return (
        rows.reshape(heads, half, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)
    )


def tensor_values(tensor: GGUFTensor) -> np.ndarray:
    """The tensor as stored in the converted checkpoint: dequantized (float32) unless
    F32/F16/BF16 (kept, BF16 as its raw uint16 bits), rows un-permuted where needed."""
    import gguf

    kind = tensor.ggml_type
    if kind == "BF16":
        values = tensor.raw.view(np.uint16).reshape(tensor.shape)
    elif kind in ("F32", "F16"):
        values = tensor.raw.reshape(tensor.shape)
    else:
        values = gguf.quants.dequantize(tensor.raw, gguf.GGMLQuantizationType[kind])
        values = values.reshape(tensor.shape)
    if tensor.rotary_heads is not None:
        values = unpermute_rotary(values, tensor.rotary_heads)
    return values


def _tokenizer_fields(fields: _Fields) -> dict[str, Any]:
    keys = ("model", "pre", "tokens", "merges", "token_type", "bos_token_id", "eos_token_id",
            "eot_token_id", "unknown_token_id", "padding_token_id", "add_bos_token",
            "add_eos_token")
    found = {key: fields.get(f"tokenizer.ggml.{key}") for key in keys}
    found["chat_template"] = fields.get("tokenizer.chat_template")
    return {key: value for key, value in found.items() if value is not None}


def build_tokenizer(model: GGUFModel) -> tuple[Any, dict[str, Any]]:
    """``(tokenizer, tokenizer_config)``: a byte-level BPE ``tokenizers.Tokenizer`` from the
    GGUF vocabulary and merges, and the tokenizer_config.json contents (special tokens,
    whether to add BOS, the chat template)."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
    )

    fields, path = model.tokenizer, model.path
    kind = fields.get("model")
    if kind != "gpt2":
        raise GGUFError(
            f"{path}: tokenizer model {kind!r} (tokenizer.ggml.model) is not supported; "
            "supported: gpt2 (byte-level BPE)"
        )
    pre = fields.get("pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise GGUFError(
            f"{path}: pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not supported; supported: "
            + ", ".join(PRE_TOKENIZERS)
        )
    tokens = fields.get("tokens")
    if not tokens:
        raise GGUFError(f"{path}: metadata tokenizer.ggml.tokens is missing")
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise GGUFError(f"{path}: tokenizer.ggml.tokens lists a token twice")
    merges = []
    for i, merge in enumerate(fields.get("merges", [])):
        pair = merge.split(" ")
        if len(pair) != 2:
            raise GGUFError(f"{path}: tokenizer.ggml.merges[{i}]={merge!r} is not 'left right'")
        merges.append((pair[0], pair[1]))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(regex), behavior="isolated") for regex in PRE_TOKENIZERS[pre]]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    types = fields.get("token_type", [])
    tokenizer.add_tokens(
        [AddedToken(tokens[i], normalized=False) for i, t in enumerate(types) if t == _USER_DEFINED]
    )
    tokenizer.add_special_tokens(
        [AddedToken(tokens[i], special=True, normalized=False)
         for i, t in enumerate(types) if t == _CONTROL]
    )

    def token(key: str) -> str | None:
        index = fields.get(key)
        if index is None:
            return None
        if not 0 <= int(index) < len(tokens):
            raise GGUFError(f"{path}: tokenizer.ggml.{key}={index} is outside the vocabulary")
        return tokens[int(index)]

    bos = token("bos_token_id")
    add_bos = bool(fields.get("add_bos_token", False)) and bos is not None
    if add_bos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, int(fields["bos_token_id"]))],
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    config: dict[str, Any] = {
        "add_bos_token": add_bos,
        "bos_token": bos,
        "eos_token": token("eos_token_id"),
        "unk_token": token("unknown_token_id"),
        "pad_token": token("padding_token_id"),
    }
    if "chat_template" in fields:
        config["chat_template"] = fields["chat_template"]
    return tokenizer, config


def convert(model: GGUFModel, directory: Path) -> None:
    """Write the converted model into ``directory`` (which must exist and be empty)."""
    tokenizer, tokenizer_config = build_tokenizer(model)
    _write_safetensors(
        directory / "model.safetensors", model.tensors,
        {"source": model.path.name, "converter": f"interlock gguf v{CONVERTER_VERSION}"},
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    _write_json(directory / "tokenizer_config.json", tokenizer_config)
    _write_json(directory / "config.json", model.config)


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_safetensors(
    path: Path,
    tensors: tuple[GGUFTensor, ...],
    metadata: dict[str, str],
) -> None:
    """Stream the tensors into one safetensors file, one tensor in memory at a time.

    The header (names, dtypes, shapes, byte ranges) is known before any tensor
    is dequantized, so each is written as soon as it is converted.
    """
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for t in tensors:
        size = _ITEM_SIZE[t.stored_dtype] * int(np.prod(t.shape, dtype=np.int64))
        header[t.hf_name] = {
            "dtype": t.stored_dtype,
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(encoded)))
        fh.write(encoded)
        for t in tensors:
            values = tensor_values(t)
            if t.stored_dtype != "BF16":  # little-endian, as safetensors stores
                values = values.astype("<f4" if t.stored_dtype == "F32" else "<f2", copy=False)
            fh.write(np.ascontiguousarray(values).tobytes())

