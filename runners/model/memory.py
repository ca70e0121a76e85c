"""Whether a model fits before it is allocated: the bytes its weights take, counted on the
meta device, against the memory the device (or the host) has available."""

from __future__ import annotations

import os

import torch

from interlock.runners.contract import ModelSpec
from interlock.runners.model.weights import CheckpointError


def model_bytes(meta_model: torch.nn.Module) -> int:
    """Bytes of a model's parameters and buffers (weights, rotary tables), from the model
    built on the meta device: nothing is allocated."""
    tensors = [*meta_model.parameters(), *meta_model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def available_bytes(device: str | torch.device) -> int | None:
    """Memory a model may take on ``device``: free device memory, or the host's available
    memory; None when unknown."""
    kind = torch.device(device).type
    if kind == "cuda":
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    if hasattr(os, "sysconf"):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None


def check_fits_in_memory(spec: ModelSpec, meta_model: torch.nn.Module,
                         device: str | torch.device) -> None:
    """Refuse, before allocating, a model whose weights (``meta_model``: this rank's shard,
    built on the meta device) cannot fit (a config.json with absurd sizes would otherwise
    reach the allocator with no file or field named)."""
    need = model_bytes(meta_model)
    have = available_bytes(device)
    if have is not None and need > have:
        c = spec.config
        raise CheckpointError(
            f"{spec.name}: the model needs about {need / 2**30:.1f} GiB for its weights in "
            f"{spec.dtype} (config.json: vocab_size={c.vocab_size}, hidden_size="
            f"{c.hidden_size}, intermediate_size={c.intermediate_size}, num_hidden_layers="
            f"{c.num_layers}, max_model_len={spec.max_model_len}), more than the "
            f"{have / 2**30:.1f} GiB available on {torch.device(device).type}"
        )
