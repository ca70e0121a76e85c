"""Paged KV cache bookkeeping: how many blocks fit a budget, and who owns which block.

The cache is ``num_blocks`` fixed-size blocks of ``block_size`` token slots
per layer. A request owns an ordered block table; token position p lives in
slot ``block_table[p // block_size] * block_size + p % block_size``.
Torch-free: the tensors themselves are allocated by the runner.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from interlock.core.errors import InputError
from interlock.runners.contract import KVCacheSpec, ModelSpec
from interlock.runners.model.cache_spec import elements_per_token, state_pool_bytes
from interlock.runners.model.config import ModelConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
DEFAULT_KV_CACHE_MEMORY = 512 * 2**20


class KVCacheError(InputError):
    """A KV cache budget that cannot hold what was asked."""


def bytes_per_block(
    config: ModelConfig, dtype: str, block_size: int, tensor_parallel_size: int = 1
) -> int:
    """What every layer caches for one block, on one rank (``cache_spec``: its KV heads'
    K and V, or an MLA layer's latent)."""
    return elements_per_token(config, tensor_parallel_size) * DTYPE_BYTES[dtype] * block_size


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def plan_kv_cache(
    model: ModelSpec,
    block_size: int,
    num_blocks: int | None = None,
    kv_cache_memory: int | None = None,
) -> KVCacheSpec:
    """Size the cache of running ``model`` from ``num_blocks`` or a byte budget (default
    512 MiB) per rank.

    The recurrent-state pool of a model with linear attention (``cache_spec.state_spec``,
    a slot per ``max_num_seqs``) comes out of the byte budget first: both kinds of cache
    share it. Without ``num_blocks`` the budget is capped at what ``model.max_num_seqs``
    sequences of ``model.max_model_len`` tokens can use. Every rank of a tensor-parallel
    run holds the same blocks (its KV heads of them), so one block table serves all.
    """
    config, dtype = model.config, model.dtype
    max_model_len, max_num_seqs = model.max_model_len, model.max_num_seqs
    if block_size < 1:
        raise KVCacheError(f"block_size={block_size} is invalid; allowed: an integer >= 1")
    if num_blocks is not None and kv_cache_memory is not None:
        raise KVCacheError("give num_blocks or kv_cache_memory, not both")
    if num_blocks is None:
        budget = DEFAULT_KV_CACHE_MEMORY if kv_cache_memory is None else kv_cache_memory
        pool = state_pool_bytes(config, DTYPE_BYTES[dtype], max_num_seqs,
                                model.tensor_parallel_size)
        if pool >= budget:
            raise KVCacheError(
                f"kv_cache_memory={budget} bytes holds no KV block: the recurrent-state pool of "
                f"{max_num_seqs} sequences (max_num_seqs) takes {pool} bytes of it"
            )
        budget -= pool
        per_block = bytes_per_block(config, dtype, block_size, model.tensor_parallel_size)
        num_blocks = min(budget // per_block, max_num_seqs * blocks_for(max_model_len, block_size))
        if num_blocks < 1:
            raise KVCacheError(
                f"kv_cache_memory={budget} bytes holds no KV block; one block of {block_size} "
                f"tokens needs {per_block} bytes for {config.architecture} in {dtype}"
            )
    if num_blocks < 1:
        raise KVCacheError(f"num_blocks={num_blocks} is invalid; allowed: an integer >= 1")
    return KVCacheSpec(num_blocks=num_blocks, block_size=block_size)


class BlockAllocator:
    """Free list of cache blocks: allocate from the front, freed blocks go back to it."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise KVCacheError(f"asked for {count} KV blocks, {len(self._free)} free")
        return [self._free.popleft() for _ in range(count)]

    def free(self, blocks: Iterable[int]) -> None:
        # Most recently freed first: their memory is the likeliest to be cache-warm.
        self._free.extendleft(reversed(list(blocks)))
