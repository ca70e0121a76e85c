"""The runner contract: what the engine hands a runner, and what it gets back.

A runner executes a model for the engine. Its lifecycle is two calls:

1. ``load(model, kv_cache, decision)`` — once. Build the kernel dispatch
   (``interlock.runners.dispatch.build_kernel_table``), load the model
   (``interlock.runners.model.checkpoint.load_model``), allocate the paged KV cache
   described by ``kv_cache`` and bind it to the model, and prepare whatever
   the ``decision`` (``interlock.core.decision.Decision``, the policy's own) asks
   for: capture the graphs of its cudagraph mode (for batches up to
   ``model.max_num_seqs`` sequences and ``model.max_num_batched_tokens``
   tokens), breakable or not. A decision the runner's plugin spec does not
   declare (``PlatformSupport.serves`` says what) is an error, never a silent
   change.
2. ``execute(batch)`` — once per engine step. ``batch`` holds every sequence
   scheduled this step, prefill chunks and decodes mixed, each with the
   tokens to feed, where they start, its KV block table and how to sample
   (``Sampling``: temperature, top-k/top-p/min-p, penalties, logprobs; a sequence whose
   sampling is penalised also carries its prompt and output tokens so far). Return one
   sampled token per sequence that asks for one, and its logprobs where asked for.

``report()`` says what the runner actually did: kernel choices, graphs,
fallbacks (e.g. a size whose capture failed and which runs eagerly). It may
be called any time after ``load``.

The engine owns scheduling and the block allocator: a runner never decides
which blocks a sequence uses, it only writes K/V into the slots the block
table implies (slot = block_table[pos // block_size] * block_size + pos % block_size).

Everything here is plain, frozen and torch-free, so a third-party runner can
depend on it without importing this project's model code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from interlock.core.decision import DTYPES, LOAD_FORMATS, WEIGHTS, Decision
from interlock.runners.graphs.report import GraphReport
from interlock.runners.model.config import ModelConfig


@dataclass(frozen=True)
class ModelSpec:
    """Which model to run and how to materialise it."""

    name: str  # "demo" or a Hugging Face model directory
    config: ModelConfig
    dtype: str  # resolved: one of interlock.core.decision.DTYPES
    device: str  # torch device string: "cpu", "cuda", "cuda:1", ...
    load_format: str = "auto"  # one of LOAD_FORMATS
    weights: str = "auto"  # one of WEIGHTS: a GGUF file's quantized weights kept or not
    seed: int = 0  # the run's seed: of dummy weights, and of requests that bring none
    max_model_len: int = 2048  # longest sequence (prompt + output) the engine schedules
    # The engine's limits: the scheduler keeps to them and the runner sizes by them.
    max_num_seqs: int = 64  # most sequences in one step (sizes graphs and request state)
    max_num_batched_tokens: int = 2048  # most tokens in one step
    # Ranks the model is split across. Above 1 the runner is one rank of a group its host
    # started (``interlock.runners.parallel``); a runner whose plugin declares no tensor
    # parallelism is never handed one (stage 5 of the policy).
    tensor_parallel_size: int = 1
    # Replay captured graphs eagerly (the debug graph backend) wherever the runner's backend
    # is automatic: tells a graph bug from a model bug, on any device.
    debug_graphs: bool = False
    # Read from the environment where the run started (interlock.core.env.Settings) and
    # handed to the runner and every rank with the model: the kernel backend that must serve
    # every op it implements (INTERLOCK_KERNELS), the graph captures made to fail
    # (INTERLOCK_GRAPHS_FAIL_CAPTURE: all, or sizes like 4,8; for tests of the fallback).
    kernels: str | None = None
    fail_capture: str | None = None

    def __post_init__(self) -> None:
        for key, value, allowed in (("dtype", self.dtype, DTYPES),
                                    ("load_format", self.load_format, LOAD_FORMATS),
                                    ("weights", self.weights, WEIGHTS)):
            if value not in allowed:
                raise ValueError(
                    f"{key} {value!r} is not supported; allowed: {', '.join(allowed)}"
                )
        for key in ("max_model_len", "max_num_seqs", "max_num_batched_tokens",
                    "tensor_parallel_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)} is invalid; allowed: >= 1")


@dataclass(frozen=True)
class KVCacheSpec:
    """The paged KV cache the engine schedules against: per layer, K and V of
    shape [num_blocks, block_size, num_kv_heads, head_dim] in the model dtype."""

    num_blocks: int
    block_size: int

    def __post_init__(self) -> None:
        for key in ("num_blocks", "block_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)} is invalid; allowed: >= 1")


@dataclass(frozen=True)
class Sampling:
    """How to pick a sequence's next token, with ``SamplingParams``' meaning
    (``interlock.runners.batching.sampling``). temperature 0 is greedy; top_k 0, top_p 1.0
    and min_p 0.0 are off, as are the penalties at 0, 0 and 1. The penalties change the
    logits before the draw (greedy too). logprobs -1: none; N >= 0: the N most likely
    tokens' log-probabilities and the sampled one's, of the raw logits. The draw depends
    only on (seed, step), never on the batch."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int = -1

    @property
    def penalised(self) -> bool:
        return (self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1)


@dataclass(frozen=True)
class ScheduledSequence:
    """One sequence's work in a step.

    ``token_ids`` are fed at positions ``start_position ..`` (a prefill chunk,
    or the single last token when decoding); K/V of positions below
    ``start_position`` are already in the cache. ``block_table`` covers every
    position up to ``start_position + len(token_ids) - 1``.
    """

    request_id: str
    token_ids: tuple[int, ...]
    start_position: int
    block_table: tuple[int, ...]
    sampling: Sampling
    step: int  # number of tokens this request has generated so far
    sample: bool = True  # False for a prefill chunk that does not reach the prompt's end
    #: The request's slot of the recurrent-state pool (models with linear attention), -1
    #: for a model without one.
    state_slot: int = -1
    #: Only where ``sampling.penalised`` (else empty): the request's prompt and the
    #: tokens it has generated so far, which the penalties count.
    prompt_token_ids: tuple[int, ...] = ()
    output_token_ids: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def seq_len(self) -> int:
        """Cached plus new tokens after this step."""
        return self.start_position + len(self.token_ids)


@dataclass(frozen=True)
class ScheduledBatch:
    """Everything a runner executes in one engine step."""

    sequences: tuple[ScheduledSequence, ...]
    finished_request_ids: tuple[str, ...] = ()  # left since the last step: drop their state

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.sequences)

    @property
    def decode_only(self) -> bool:
        return all(s.num_tokens == 1 for s in self.sequences)


@dataclass(frozen=True)
class SampleLogprobs:
    """The log-probabilities of one sampled token's step (``Sampling.logprobs``)."""

    logprob: float  # of the sampled token
    rank: int  # of the sampled token, 1 = the most likely
    top: tuple[tuple[int, float], ...]  # the N most likely (token id, logprob), best first


@dataclass(frozen=True)
class RunnerOutput:
    """One entry per scheduled sequence, in batch order: the sampled token, or
    None where the sequence did not ask for one (``sample=False``). ``logprobs``:
    empty when no sequence asks for them, else one entry per sequence (None where
    it did not ask or sampled nothing)."""

    token_ids: tuple[int | None, ...]
    logprobs: tuple[SampleLogprobs | None, ...] = ()


@dataclass(frozen=True)
class KernelReport:
    op: str
    implementation: str  # e.g. "torch (interlock)"
    reason: str


@dataclass(frozen=True)
class TensorParallelReport:
    """How a run was split across ranks."""

    size: int
    backend: str  # torch.distributed backend of the model's collectives: gloo, nccl
    launcher: str  # torch.multiprocessing (one machine) or torchrun
    heads_per_rank: int
    kv_heads_per_rank: int
    notes: tuple[str, ...] = ()  # e.g. KV heads replicated, vocabulary padding
    collectives: str = ""  # what carries the collectives, and why: shared memory, gloo, nccl


@dataclass(frozen=True)
class KVCacheReport:
    """What the paged cache holds per token (``interlock.runners.model.cache_spec``)."""

    # "per-head K/V", "MLA latent" (kv_lora_rank + qk_rope_head_dim), or "MLA latent + DSA
    # indexer keys" (and index_head_dim on each layer that runs an indexer)
    layout: str
    bytes_per_token: int  # every layer, on one rank
    per_head_bytes_per_token: int  # what per-head K and V of the same model would take
    num_blocks: int
    block_size: int
    #: The linear-attention layers, whose state is per request (the recurrent-state pool:
    #: ``state_slots`` slots of ``state_bytes_per_request``), not in the paged blocks.
    linear_layers: tuple[int, ...] = ()
    state_bytes_per_request: int = 0
    state_slots: int = 0

    @property
    def tokens(self) -> int:
        return self.num_blocks * self.block_size


@dataclass(frozen=True)
class RunnerReport:
    """What a runner did, for ``policy run`` and traces."""

    runner: str
    device: str
    dtype: str
    kernels: tuple[KernelReport, ...]
    cudagraph: str = "none"  # the mode in effect
    breakable: bool = False
    captured_sizes: tuple[int, ...] = ()
    fallbacks: tuple[str, ...] = field(default=())  # each: what fell back, and why
    graphs: GraphReport | None = None  # captured keys, failures, replays, eager steps
    tensor_parallel: TensorParallelReport | None = None  # None: one rank
    kv_cache: KVCacheReport | None = None  # None: the runner does not say


@runtime_checkable
class Runner(Protocol):
    """What every runner implements (built-in mrv1/mrv2 and third-party plugins)."""

    def load(self, model: ModelSpec, kv_cache: KVCacheSpec, decision: Decision) -> None: ...

    def execute(self, batch: ScheduledBatch) -> RunnerOutput: ...

    def report(self) -> RunnerReport: ...
