"""GGUF files as a model source: read one, dequantize it, and write a plain model directory.

A llama.cpp GGUF file holds the weights (quantized or not), the hyperparameters
and the tokenizer. :func:`convert` turns one into what the runners load
everywhere else: ``config.json`` (the Hugging Face keys ``runners.model.config_json``
reads; :mod:`.config`), ``model.safetensors`` (Hugging Face tensor names and
layouts; :mod:`.tensors`), ``tokenizer.json`` (built with the ``tokenizers`` library
from the GGUF vocabulary and merges) and ``tokenizer_config.json`` (the chat template
and special tokens; :mod:`.tokenizer`), and ``quantized.safetensors``: the block-quantized
weights' own bytes (uint8 [rows, bytes per row], q/k rows un-permuted, each tensor's GGML
type in the metadata), which a runner keeps quantized with ``--weights native``
(``runners.model.quantized``). The file is read by :mod:`.reader`. Which
families convert, and how each differs, is what each declares in its ``GGUFFacts``.
Torch-free: numpy, the ``gguf`` package (reading and dequantizing) and ``tokenizers``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from interlock.runners.model.config_json import parse_config
from interlock.runners.model.gguf.config import family_of, hf_config
from interlock.runners.model.gguf.errors import GGUFError
from interlock.runners.model.gguf.reader import Fields, open_reader
from interlock.runners.model.gguf.tensors import (
    GGUFTensor,
    gguf_tensor,
    quantized_entry,
    safetensors_entry,
)
from interlock.runners.model.gguf.tokenizer import build_tokenizer, tokenizer_fields
from interlock.runners.model.safetensors_format import write_safetensors

__all__ = ["CONVERTER_VERSION", "GGML_TYPES_KEY", "MODEL_FILES",
           "GGUFError", "GGUFModel", "convert", "read_gguf"]

#: Bumped whenever the converter's output changes: a cached conversion made by
#: another version is converted again.
CONVERTER_VERSION = 2  # 2: quantized.safetensors

MODEL_FILES = ("config.json", "model.safetensors", "quantized.safetensors", "tokenizer.json",
               "tokenizer_config.json")
#: The metadata key of quantized.safetensors naming each tensor's GGML type (JSON).
GGML_TYPES_KEY = "ggml_types"


@dataclass(frozen=True)
class GGUFModel:
    """What a GGUF file holds, read and checked but not dequantized."""

    path: Path
    architecture: str  # the GGUF name, e.g. "llama"
    config: dict[str, Any]  # config.json contents
    tensors: tuple[GGUFTensor, ...]
    tokenizer: dict[str, Any]  # the tokenizer.ggml.* and chat template fields, by short name


def read_gguf(path: str | Path, fh: BinaryIO | None = None) -> GGUFModel:
    """Read and check ``path`` (through ``fh`` when given, which it closes): architecture,
    tensor types and names, hyperparameters."""
    path = Path(path)
    reader = open_reader(path, fh)
    fields = Fields(reader, path)
    family, facts = family_of(fields, path)
    tensors = {t.name: t for t in reader.tensors}
    tokenizer = tokenizer_fields(fields)  # type-checked first: the config reads the ids too
    config = hf_config(family, facts, fields, tensors, path)
    # Checked as the runners will read it, before anything is converted or cached: a bad
    # number is named against the GGUF file, not against the cached config.json.
    parse_config(config, source=f"{path} (its {facts.name}.* metadata as config.json)")
    converted = tuple(gguf_tensor(t, facts, config, path) for t in reader.tensors)
    return GGUFModel(path, facts.name, config, converted, tokenizer)


def convert(model: GGUFModel, directory: Path) -> None:
    """Write the converted model into ``directory`` (which must exist and be empty)."""
    tokenizer, tokenizer_config = build_tokenizer(model.tokenizer, model.path)
    write_safetensors(
        directory / "model.safetensors", [safetensors_entry(t) for t in model.tensors],
        {"source": model.path.name, "converter": f"interlock gguf v{CONVERTER_VERSION}"},
    )
    quantized = [t for t in model.tensors if t.quantized]
    write_safetensors(
        directory / "quantized.safetensors", [quantized_entry(t) for t in quantized],
        {"source": model.path.name, "converter": f"interlock gguf v{CONVERTER_VERSION}",
         GGML_TYPES_KEY: json.dumps({t.hf_name: t.ggml_type for t in quantized})},
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    _write_json(directory / "tokenizer_config.json", tokenizer_config)
    _write_json(directory / "config.json", model.config)


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
