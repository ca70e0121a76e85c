"""The checks of ``LLM(...)``'s arguments: one place, with the command line's messages.

Every value is checked for its type and range before anything is resolved, allocated or
started, and refused as an :class:`~interlock.core.errors.InputError` (exit 1) saying
``name=value is invalid; allowed: ...``: a float block size, a NaN budget, a seed the
command line refuses, or a cache of 10^12 blocks would otherwise fail deep inside torch
(TypeError, SystemError) or run for a minute first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from interlock.core.decision import DTYPES, LOAD_FORMATS, WEIGHTS
from interlock.core.errors import InputError
from interlock.core.platform import PLATFORMS

#: Seeds live in int64 tensors on the device (as SamplingParams.seed).
SEED_LIMIT = 2**63
MAX_BLOCK_SIZE = 4096
#: Sequences one engine step schedules at most: its per-sequence buffers are sized by it.
MAX_NUM_SEQS = 4096
MAX_BATCHED_TOKENS = 1 << 20
MAX_TENSOR_PARALLEL = 1024
#: KV cache blocks at most (each holds block_size slots of every layer): past this the
#: block tables alone outgrow any machine.
MAX_NUM_BLOCKS = 1 << 24
#: Device types a model runs on, as torch names them.
DEVICE_TYPES = tuple(dict.fromkeys(p.device_type for p in PLATFORMS.values()))


def _whole(name: str, value: object, low: int, high: int | None, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    allowed = (f"an integer >= {low}" if high is None else f"an integer in {low}..{high}") + (
        " or None" if optional else ""
    )
    if type(value) is not int or value < low or (high is not None and value > high):
        raise InputError(f"{name}={value!r} is invalid; allowed: {allowed}")


def check_llm_arguments(arguments: Mapping[str, Any]) -> None:
    """Check ``LLM(...)``'s keyword arguments (``model`` and the objects excepted)."""
    get = arguments.get
    dtype = get("dtype", "auto")
    if dtype != "auto" and dtype not in DTYPES:
        raise InputError(f"dtype={dtype!r} is invalid; allowed: auto, {', '.join(DTYPES)}")
    load_format = get("load_format", "auto")
    if load_format not in LOAD_FORMATS:
        raise InputError(
            f"load_format={load_format!r} is invalid; allowed: {', '.join(LOAD_FORMATS)}"
        )
    weights = get("weights", "auto")
    if weights not in WEIGHTS:
        raise InputError(f"weights={weights!r} is invalid; allowed: {', '.join(WEIGHTS)}")
    check_device(get("device"))
    _whole("seed", get("seed", 0), 0, SEED_LIMIT - 1)
    _whole("block_size", get("block_size", 16), 1, MAX_BLOCK_SIZE)
    _whole("num_blocks", get("num_blocks"), 1, MAX_NUM_BLOCKS, optional=True)
    _whole("kv_cache_memory", get("kv_cache_memory"), 1, None, optional=True)
    _whole("max_num_seqs", get("max_num_seqs", 64), 1, MAX_NUM_SEQS)
    _whole("max_num_batched_tokens", get("max_num_batched_tokens", 2048), 1, MAX_BATCHED_TOKENS)
    _whole("max_model_len", get("max_model_len"), 1, None, optional=True)
    _whole("tensor_parallel_size", get("tensor_parallel_size", 1), 1, MAX_TENSOR_PARALLEL)


def check_device(device: object) -> None:
    """``device``: None (detected), or a torch device string of a known type with an
    optional index that this torch can use."""
    if device is None:
        return
    allowed = f"None (detected) or one of {', '.join(DEVICE_TYPES)}, optionally with ':N'"
    if not isinstance(device, str):
        raise InputError(f"device={device!r} is invalid; allowed: {allowed}")
    kind, _, index = device.partition(":")
    if kind not in DEVICE_TYPES or (index and not (index.isascii() and index.isdigit())):
        raise InputError(f"device={device!r} is invalid; allowed: {allowed}")
    if kind == "cpu":
        return
    import torch

    backend = getattr(torch, kind, None)
    count = backend.device_count() if backend is not None and backend.is_available() else 0
    if count == 0:
        raise InputError(f"device={device!r}: this torch sees no {kind} device "
                         f"(torch {torch.__version__})")
    if index and int(index) >= count:
        raise InputError(f"device={device!r}: this torch sees {count} {kind} device(s), "
                         f"0..{count - 1}")


def check_text(name: str, text: str) -> None:
    """Text given to the tokenizer must be encodable as UTF-8 (a lone surrogate such as
    ``"\\ud800"``, or the escape of an undecodable byte in a command line, is not)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(
            f"{name}: not valid UTF-8 text (code point U+{ord(text[exc.start]):04X} at "
            f"position {exc.start})"
        ) from None



def check_kv_cache_fits(spec: Any, num_blocks: int, block_size: int) -> None:
    """Refuse, before allocating, a KV cache and recurrent-state pool larger than the memory
    of their device (an explicit ``num_blocks`` is not capped by the model's length the way
    a budget is, and the pool grows with ``max_num_seqs`` whatever the blocks)."""
    from interlock.runners.batching.kv_cache import DTYPE_BYTES, bytes_per_block
    from interlock.runners.model.cache_spec import state_pool_bytes
    from interlock.runners.model.memory import available_bytes

    kv = num_blocks * bytes_per_block(spec.config, spec.dtype, block_size,
                                      spec.tensor_parallel_size)
    pool = state_pool_bytes(spec.config, DTYPE_BYTES[spec.dtype], spec.max_num_seqs,
                            spec.tensor_parallel_size)
    have = available_bytes(spec.device)
    if have is None or kv + pool <= have:
        return
    if pool > have or (pool and pool >= kv):
        raise InputError(
            f"max_num_seqs={spec.max_num_seqs} is invalid; allowed: a recurrent-state pool "
            f"that fits in memory with the KV cache: {spec.max_num_seqs + 1} slots of "
            f"{spec.config.architecture}'s linear-attention state take {pool / 2**30:.1f} GiB "
            f"(and the KV cache {kv / 2**30:.1f} GiB), more than the {have / 2**30:.1f} GiB "
            f"available on {spec.device}"
        )
    raise InputError(
        f"num_blocks={num_blocks} is invalid; allowed: a KV cache that fits in memory: "
        f"{num_blocks} blocks of {block_size} tokens take {kv / 2**30:.1f} GiB"
        + (f" (and the recurrent-state pool {pool / 2**30:.1f} GiB)" if pool else "")
        + f", more than the {have / 2**30:.1f} GiB available on {spec.device}"
    )
