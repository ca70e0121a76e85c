"""A GGUF file's hyperparameters as the Hugging Face config.json keys the runners read.

What differs between families (the ``general.architecture`` name, keys only one family
writes) is what each family declares in its ``GGUFFacts``
(``interlock.runners.model.families``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from interlock.runners.model.families import gguf_registry
from interlock.runners.model.family import Family, GGUFFacts
from interlock.runners.model.gguf.errors import GGUFError
from interlock.runners.model.gguf.reader import Fields


def family_of(fields: Fields, path: Path) -> tuple[Family, GGUFFacts]:
    """The family of the file's ``general.architecture``, and its GGUF facts."""
    arch = fields.string("general.architecture")
    found = gguf_registry().get(arch)
    if found is None:
        raise GGUFError(
            f"{path}: architecture {arch!r} (general.architecture) is not supported; "
            f"supported: {', '.join(gguf_registry())}"
        )
    assert found.gguf is not None  # gguf_registry holds only families with GGUF facts
    return found, found.gguf


def hf_config(
    family: Family, facts: GGUFFacts, fields: Fields, tensors: Mapping[str, Any], path: Path
) -> dict[str, Any]:
    """config.json contents from the ``{arch}.*`` hyperparameters (and the tensors present)."""
    p = f"{facts.name}."
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
        "architectures": [family.architecture],
        "model_type": facts.name,
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
    if facts.bias_from_tensors and family.bias_key is not None:
        config[family.bias_key] = "blk.0.attn_q.bias" in tensors
    for key, metadata_key in facts.metadata_keys.items():
        config[key] = fields.get(p + metadata_key)
    config.update(facts.fixed_keys)
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


def _rope_scaling(fields: Fields, p: str, path: Path) -> dict[str, Any] | None:
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
