"""Quantized weights kept quantized (``--weights native``), third hostile pass (issue 38):
a NaN or infinite block scale or offset in the file is refused, as it is when the weights
are dequantized at load."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from gguf_builders import train_vocab, write_tiny_gguf

#: float16 bits, little-endian.
F16 = {"nan": b"\x00\x7e", "inf": b"\x00\x7c"}


@pytest.fixture(scope="module")
def conversions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from interlock.runners.model.sources import model_directory

    vocab = train_vocab()
    out = {}
    for kind in ("Q8_0", "Q4_1"):
        path = write_tiny_gguf(tmp_path_factory.mktemp(kind) / "model.gguf", "llama", kind,
                               vocab=vocab).path
        out[kind] = model_directory(path)
    return out


@pytest.mark.parametrize(("kind", "where"), [
    ("Q8_0", "scale"), ("Q4_1", "scale"), ("Q4_1", "offset"),
])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_non_finite_block_scale_is_refused_when_kept_quantized(
    conversions: dict[str, Path], tmp_path: Path, kind: str, where: str, value: str
) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    from interlock.runners.dispatch import build_kernel_table
    from interlock.runners.model.checkpoint import build_model
    from interlock.runners.model.config_json import load_config
    from interlock.runners.model.quantized import QUANTIZED, keep_quantized
    from interlock.runners.model.weights import CheckpointError

    damaged = tmp_path / "conversion"
    shutil.copytree(conversions[kind], damaged)
    with safe_open(damaged / QUANTIZED, "pt") as handle:
        metadata = handle.metadata()
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    name = "model.layers.0.self_attn.q_proj.weight"
    raw = tensors[name].clone()
    at = 0 if where == "scale" else 2  # Q4_1 blocks: d (2 bytes), then m (2 bytes)
    raw[3, at:at + 2] = torch.frombuffer(bytearray(F16[value]), dtype=torch.uint8)
    tensors[name] = raw
    save_file(tensors, str(damaged / QUANTIZED), metadata=metadata)
    model = build_model(load_config(damaged), build_kernel_table("cpu", "float32"), "float32",
                        "cpu", 64)
    with pytest.raises(CheckpointError, match=f"tensor {name}: {kind}: 1 NaN or infinite "
                       f"block {where}"):
        keep_quantized(model, damaged)


def test_quantized_bytes_of_another_dtype_or_cut_short_are_refused_by_name(
    conversions: dict[str, Path], tmp_path: Path
) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    from interlock.runners.dispatch import build_kernel_table
    from interlock.runners.model.checkpoint import build_model
    from interlock.runners.model.config_json import load_config
    from interlock.runners.model.quantized import QUANTIZED, keep_quantized
    from interlock.runners.model.weights import CheckpointError

    damaged = tmp_path / "conversion"
    shutil.copytree(conversions["Q4_1"], damaged)
    with safe_open(damaged / QUANTIZED, "pt") as handle:
        metadata = handle.metadata()
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    name = "model.layers.0.self_attn.q_proj.weight"
    model = build_model(load_config(damaged), build_kernel_table("cpu", "float32"), "float32",
                        "cpu", 64)
    # the bytes as int16 pairs: the same size, but not rows of bytes
    save_file({**tensors, name: tensors[name].view(torch.int16)}, str(damaged / QUANTIZED),
              metadata=metadata)
    with pytest.raises(CheckpointError, match=f"tensor {name}: holds I16 .*not rows of bytes"):
        keep_quantized(model, damaged)
    # a file whose last tensor's bytes are cut off after its header was written
    save_file(tensors, str(damaged / QUANTIZED), metadata=metadata)
    whole = (damaged / QUANTIZED).read_bytes()
    (damaged / QUANTIZED).write_bytes(whole[:-100])
    with pytest.raises(CheckpointError, match=f"{QUANTIZED}"):
        keep_quantized(model, damaged)
