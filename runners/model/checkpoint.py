"""Load a model: resolve ``demo`` or a Hugging Face directory, pick the dtype, build the
model, check that it fits (``runners.model.memory``) and fill its weights.

Weights come from ``model.safetensors``, a sharded ``model.safetensors.index.json``
(``runners.model.weights``), or seeded dummy values.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from interlock.core.decision import DTYPE_CHOICES
from interlock.core.decision import DTYPES as DTYPE_NAMES
from interlock.runners.contract import ModelSpec
from interlock.runners.dispatch import KernelTable, build_kernel_table
from interlock.runners.model import demo
from interlock.runners.model.config import ModelConfig
from interlock.runners.model.config_json import load_config
from interlock.runners.model.decoder import CausalLM
from interlock.runners.model.dummy import DummyTensors
from interlock.runners.model.heap import placeholders_mapped
from interlock.runners.model.memory import check_fits_in_memory
from interlock.runners.model.quantized import keep_quantized, weights_mode
from interlock.runners.model.safetensors_format import TensorEntry, write_safetensors
from interlock.runners.model.sources import DEMO, model_directory
from interlock.runners.model.weights import (
    SAFETENSORS,
    CheckpointError,
    SafetensorsFiles,
    TensorSource,
    checkpoint_shapes,
    load_weights,
)
from interlock.runners.parallel.group import SINGLE, TensorParallel

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}

__all__ = ["CheckpointError", "ModelSource", "build_model", "load_model", "resolve_dtype",
           "resolve_model", "source_in", "write_demo_checkpoint"]


@dataclass(frozen=True)
class ModelSource:
    """What ``model=`` names: the built-in demo, or a directory with config.json."""

    name: str  # "demo" or the directory to load (a GGUF file's conversion)
    directory: Path | None  # None for the demo
    config: ModelConfig


def resolve_model(model: str | Path) -> ModelSource:
    """``demo``, a named model or a GGUF file (its cached conversion, made on first use: see
    ``runners.model.sources``), or a model directory."""
    return source_in(model_directory(model))


def source_in(directory: Path | None) -> ModelSource:
    """The model a resolution found (``model_directory``'s answer: None for the demo), its
    config read: what was resolved once is not resolved again."""
    if directory is None:
        return ModelSource(DEMO, None, demo.demo_config())
    return ModelSource(str(directory), directory, load_config(directory))


def resolve_dtype(dtype: str, config: ModelConfig) -> str:
    """'auto' means the checkpoint's own dtype."""
    if dtype not in DTYPE_CHOICES:
        raise CheckpointError(
            f"dtype {dtype!r} is not supported; allowed: {', '.join(DTYPE_CHOICES)}"
        )
    return config.dtype if dtype == "auto" else dtype


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_model(
    config: ModelConfig,
    ops: KernelTable,
    dtype: str,
    device: str | torch.device,
    max_positions: int,
    tp: TensorParallel = SINGLE,
) -> CausalLM:
    """An uninitialised model (this rank's shard of it) with parameters in ``dtype`` on
    ``device``."""
    with default_dtype(DTYPES[dtype]), torch.device(device):
        return CausalLM(config, ops, max_positions, tp)


def load_model(
    spec: ModelSpec, ops: KernelTable, device: str | torch.device, tp: TensorParallel = SINGLE
) -> CausalLM:
    """Build the model a runner is asked for (this rank's shard under tensor parallelism)
    and fill its weights.

    The demo's weights are its own seeded ones unless ``load_format="dummy"``
    asks for ``spec.seed``'s.
    """
    directory = None if spec.name == DEMO else Path(spec.name)
    if directory is None and spec.load_format == "safetensors":
        raise CheckpointError(
            f"the {DEMO!r} model has no checkpoint files; use load_format 'auto' or 'dummy'"
        )
    meta = build_model(spec.config, ops, spec.dtype, "meta", spec.max_model_len, tp)
    check_fits_in_memory(spec, meta, device)
    native, why = weights_mode(spec.weights, directory, ops, spec.dtype)
    if not native or directory is None:
        model = _build_and_fill(spec, ops, device, tp, directory, None)
        model.weight_decisions = {"dequantized": why}
        return model
    # the float placeholders the quantized records replace are mapped, so freeing returns them
    with placeholders_mapped() as heap:
        model = _build_and_fill(spec, ops, device, tp, directory, directory)
    model.weight_decisions["memory"] = heap.line()
    return model


def _build_and_fill(spec: ModelSpec, ops: KernelTable, device: str | torch.device,
                    tp: TensorParallel, directory: Path | None, quantized: Path | None
                    ) -> CausalLM:
    """The model built and its weights filled, those of ``quantized``'s file kept quantized
    (their decisions in ``weight_decisions``)."""
    model = build_model(spec.config, ops, spec.dtype, device, spec.max_model_len, tp)
    if directory is None or spec.load_format == "dummy":
        seed = spec.seed if spec.load_format == "dummy" else demo.DEMO_SEED
        shapes = checkpoint_shapes(model)
        tensors: TensorSource = DummyTensors(shapes, seed, spec.config.initializer_range)
    else:
        tensors = SafetensorsFiles(directory)
    kept = (keep_quantized(model, quantized, int8=spec.weights == "int8")
            if quantized is not None else None)
    load_weights(model, tensors, kept.names if kept else frozenset())
    if kept is not None:
        model.weight_decisions = dict(kept.decisions)
    model.finish_loading()
    return model.eval()


def write_demo_checkpoint(directory: str | Path) -> Path:
    """Write the demo model as config.json + model.safetensors (for transformers, benchmarks)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = demo.demo_config()
    # Built on the meta device: names and shapes without allocating weights.
    shapes = checkpoint_shapes(
        build_model(config, build_kernel_table("cpu", "float32"), "float32", "meta", 1)
    )
    tensors = DummyTensors(shapes, demo.DEMO_SEED, config.initializer_range)
    write_safetensors(directory / SAFETENSORS, [
        TensorEntry(name, "F32", shape, functools.partial(_float32_bytes, tensors, name))
        for name, shape in shapes.items()
    ])
    (directory / "config.json").write_text(json.dumps(demo.DEMO_CONFIG, indent=2))
    return directory


def _float32_bytes(tensors: TensorSource, name: str) -> memoryview:
    """Tensor ``name``'s bytes as float32 (made when the writer reaches it)."""
    return memoryview(tensors.get(name).to(torch.float32).contiguous().numpy()).cast("B")
