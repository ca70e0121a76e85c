"""Reading checkpoint tensors into their slots: straight into contiguous slots of the stored
dtype, a few rows at a time through a small staging buffer otherwise (transposed layouts,
casts), with the same values safetensors itself gives; and the zeroed CPU KV cache."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from interlock.runners.contract import KVCacheSpec
from interlock.runners.model import weights
from interlock.runners.model.demo import demo_config
from interlock.runners.model.kv_cache import allocate_kv_cache
from interlock.runners.model.weights import CheckpointError, SafetensorsFiles

TENSORS = {
    "f32": torch.randn(37, 11),
    "f16": torch.randn(5, 3, 4).to(torch.float16),
    "bf16": torch.randn(64, 8).to(torch.bfloat16),
    "vector": torch.randn(129),
}


@pytest.fixture
def files(tmp_path) -> SafetensorsFiles:
    save_file(TENSORS, tmp_path / "model.safetensors")
    return SafetensorsFiles(tmp_path)


@pytest.mark.parametrize("name", sorted(TENSORS))
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "float32", "bfloat16"])
def test_every_slot_layout_gets_the_stored_values(files, monkeypatch, name, layout) -> None:
    # A 64-byte staging buffer: every staged tensor is read in several chunks.
    monkeypatch.setattr(weights, "STAGING_BYTES", 64)
    stored = TENSORS[name]
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(layout, stored.dtype)
    if layout == "transposed" and stored.dim() == 2:
        out = torch.empty(stored.shape[::-1], dtype=dtype).t()  # an [in, out] weight's view
    else:
        out = torch.empty(stored.shape, dtype=dtype)
    files.copy_into(name, out)
    assert torch.equal(out, files.get(name).to(dtype))


def test_a_file_cut_short_after_opening_names_the_tensor(files, tmp_path) -> None:
    path = tmp_path / "model.safetensors"
    files.shape("vector")  # opened and validated whole
    header = int.from_bytes(path.read_bytes()[:8], "little")
    os.truncate(path, 8 + header + 2)  # every tensor's bytes but the first two are gone
    with pytest.raises(CheckpointError, match=r"model.safetensors: tensor vector: the file ends"):
        files.copy_into("vector", torch.empty(129))


def test_the_cpu_kv_cache_is_zeroed_and_writable() -> None:
    config = demo_config()
    layers = allocate_kv_cache(config, KVCacheSpec(num_blocks=3, block_size=4), "float32", "cpu")
    assert len(layers) == config.num_layers
    for k, v in layers:
        assert k.shape == (3, 4, config.num_kv_heads, config.head_dim) == v.shape
        assert not k.any() and not v.any()
    layers[0][0][1, 2].fill_(7.0)
    assert layers[0][0].sum() == 7.0 * config.num_kv_heads * config.head_dim
    assert not layers[0][1].any() and not layers[1][0].any()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.integers(1, 40),
    cols=st.integers(1, 9),
    stored=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    wanted=st.sampled_from([torch.float32, torch.bfloat16]),
    transposed=st.booleans(),
    staging=st.integers(1, 600),
)
def test_any_tensor_reads_into_any_slot_as_safetensors_gives_it(
    tmp_path_factory, monkeypatch, rows, cols, stored, wanted, transposed, staging
) -> None:
    monkeypatch.setattr(weights, "STAGING_BYTES", staging)
    directory = tmp_path_factory.mktemp("reader")
    tensor = torch.randn(rows, cols).to(stored)
    save_file({"w": tensor, "pad": torch.zeros(3)}, directory / "model.safetensors")
    files = SafetensorsFiles(directory)
    out = torch.empty(cols, rows, dtype=wanted).t() if transposed else torch.empty(
        rows, cols, dtype=wanted
    )
    files.copy_into("w", out)
    assert torch.equal(out, tensor.to(wanted))
