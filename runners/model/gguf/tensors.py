"""A GGUF file's tensors as Hugging Face checkpoint tensors: their names, their types,
dequantization, and undoing llama.cpp's q/k row permutation.

llama.cpp's converter permutes the rows of the query and key projections of the
families whose ``GGUFFacts.permuted_qk`` says so (it runs rotary embeddings on
interleaved pairs where Hugging Face rotates the two halves of each head);
:func:`unpermute_rotary` undoes it, or attention would be wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from interlock.runners.model.family import GGUFFacts
from interlock.runners.model.gguf.errors import GGUFError
from interlock.runners.model.safetensors_format import TensorEntry

#: The GGML tensor types read here, by their GGML names.
TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K")
_NATIVE = {"F32": "F32", "F16": "F16", "BF16": "BF16"}  # stored as they are; the rest -> F32

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

    @property
    def quantized(self) -> bool:
        """A block-quantized matrix (its bytes also go to quantized.safetensors as they are)."""
        return self.ggml_type not in _NATIVE and len(self.shape) == 2


def gguf_tensor(t: Any, facts: GGUFFacts, config: Mapping[str, Any], path: Path) -> GGUFTensor:
    name = t.name
    kind = t.tensor_type.name
    hf_name = _hf_name(name)
    if hf_name is None:
        why = _WHY_UNSUPPORTED.get(name, f"not part of a {facts.name} model this converter knows")
        raise GGUFError(f"{path}: tensor {name} is not supported ({why})")
    if kind not in TENSOR_TYPES:
        raise GGUFError(
            f"{path}: tensor {name} has type {kind}, which is not supported; supported: "
            + ", ".join(TENSOR_TYPES)
        )
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    heads = None
    if facts.permuted_qk and name.endswith(("attn_q.weight", "attn_q.bias")):
        heads = config["num_attention_heads"]
    elif facts.permuted_qk and name.endswith(("attn_k.weight", "attn_k.bias")):
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


def safetensors_entry(tensor: GGUFTensor) -> TensorEntry:
    """How ``tensor`` is written into the converted checkpoint (converted when written)."""

    def data() -> bytes:
        values = tensor_values(tensor)
        if tensor.stored_dtype != "BF16":  # little-endian, as safetensors stores
            values = values.astype("<f4" if tensor.stored_dtype == "F32" else "<f2", copy=False)
        return np.ascontiguousarray(values).tobytes()

    return TensorEntry(tensor.hf_name, tensor.stored_dtype, tensor.shape, data)


def quantized_entry(tensor: GGUFTensor) -> TensorEntry:
    """A quantized matrix's own bytes, uint8 [rows, bytes per row]: GGUF blocks never cross
    a row, so un-permuting the q/k rows moves whole rows of bytes."""

    def data() -> bytes:
        rows = tensor.raw.reshape(tensor.shape[0], -1)
        if tensor.rotary_heads is not None:
            rows = unpermute_rotary(rows, tensor.rotary_heads)
        return np.ascontiguousarray(rows).tobytes()

    row_bytes = tensor.raw.size // tensor.shape[0]
    return TensorEntry(tensor.hf_name, "U8", (tensor.shape[0], row_bytes), data)
