"""How a model splits across tensor-parallel ranks: per-rank sizes, and which checkpoint rows
each rank reads. Torch-free, so a size that cannot work is refused before anything loads.

Attention heads split evenly across ranks. KV heads split too when there are at least as
many as ranks; when there are fewer, each rank keeps the one KV head its query heads read
(replicated across ``kv_replicas`` ranks), as production engines do. MLP intermediate
sizes (dense, each expert, the shared expert) split evenly. The vocabulary splits into
``ceil(V / ranks)`` rows per rank; the last rank's rows past V are zero padding, so no
rank count is refused for the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

from interlock.core.errors import InputError
from interlock.runners.model.config import ModelConfig


class ShardingError(InputError):
    """A tensor-parallel size the model cannot be split into, with the numbers."""


@dataclass(frozen=True)
class Shard:
    """Rows ``start:stop`` along ``dim`` of a checkpoint tensor whose size there is ``full``;
    rows at or past ``full`` are padding (zero)."""

    dim: int
    start: int
    stop: int
    full: int


@dataclass(frozen=True)
class ShardPlan:
    """Per-rank sizes of one model split across ``size`` ranks (``size == 1``: unsplit)."""

    size: int
    num_heads: int
    num_kv_heads: int
    kv_replicas: int  # ranks holding each KV head (1: KV heads are split, not replicated)
    intermediate_size: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    vocab_rows: int  # embedding / LM-head rows per rank
    linear_heads: int = 0  # linear-attention (KDA) heads per rank

    def kv_head_start(self, rank: int) -> int:
        """Index of the first KV head rank ``rank`` holds."""
        return (rank // self.kv_replicas) * self.num_kv_heads

    def rows(self, rank: int, per_rank: int, full: int, dim: int = 0) -> Shard:
        """Rank ``rank``'s part of ``full`` rows split ``per_rank`` each."""
        return Shard(dim, rank * per_rank, (rank + 1) * per_rank, full)

    def notes(self, config: ModelConfig) -> tuple[str, ...]:
        """What a report should say about the split beyond the sizes."""
        notes = []
        if config.mla is not None:
            notes.append(
                "the MLA latent cache is replicated on every rank: each head reads the whole "
                "latent, so splitting heads cannot split it"
            )
        elif self.kv_replicas > 1:
            notes.append(
                f"{config.num_kv_heads} KV head(s) for {self.size} ranks: each KV head is "
                f"replicated on {self.kv_replicas} ranks"
            )
        padding = self.vocab_rows * self.size - config.vocab_size
        if padding:
            notes.append(f"vocabulary {config.vocab_size} padded by {padding} rows to "
                         f"{self.vocab_rows} per rank")
        return tuple(notes)


def plan_shards(config: ModelConfig, size: int) -> ShardPlan:
    """The split of ``config`` across ``size`` ranks; ``ShardingError`` naming the numbers
    when a size does not divide what must be split evenly."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ShardingError(f"tensor_parallel_size={size!r} is invalid; allowed: an integer >= 1")
    problems = _problems(config, size)
    if problems:
        fits = [s for s in range(1, config.num_heads + 1) if not _problems(config, s)]
        raise ShardingError(
            f"tensor_parallel_size={size} cannot split {config.architecture}: "
            + "; ".join(problems)
            + f". Sizes that split it: {', '.join(map(str, fits))}"
        )
    heads, kv = config.num_heads, config.num_kv_heads
    moe = config.moe
    return ShardPlan(
        size=size,
        num_heads=heads // size,
        num_kv_heads=max(kv // size, 1),
        kv_replicas=max(size // kv, 1),
        intermediate_size=config.intermediate_size // size if _has_dense(config) else 0,
        moe_intermediate_size=moe.intermediate_size // size if moe else 0,
        shared_expert_intermediate_size=(
            moe.shared_expert_intermediate_size // size if moe else 0
        ),
        vocab_rows=-(-config.vocab_size // size),
        linear_heads=config.linear.num_heads // size if config.linear is not None else 0,
    )


def _has_dense(config: ModelConfig) -> bool:
    moe = config.moe
    return moe is None or len(moe.sparse_layers) < config.num_layers


def _problems(config: ModelConfig, size: int) -> list[str]:
    heads, kv = config.num_heads, config.num_kv_heads
    problems = []
    if heads % size:
        problems.append(f"its {heads} attention heads do not divide into {size} ranks")
    if kv % size and size % kv:
        problems.append(
            f"its {kv} KV heads neither divide into {size} ranks nor divide {size} "
            "(fewer KV heads than ranks are replicated, which needs ranks a multiple of them)"
        )
    sizes = [("MLP intermediate size", config.intermediate_size if _has_dense(config) else 0)]
    if config.moe is not None:
        sizes += [
            ("expert intermediate size", config.moe.intermediate_size),
            ("shared expert intermediate size", config.moe.shared_expert_intermediate_size),
        ]
    if config.linear is not None:
        sizes.append(("linear-attention head count", config.linear.num_heads))
    for what, value in sizes:
        if value % size:
            problems.append(f"its {what} {value} does not divide into {size} ranks")
    return problems
