"""KV block accounting and continuous batching, driven by a fake runner that checks the cache."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from interlock.kernels.reference import mla as reference
from interlock.runners.batching.kv_cache import (
    BlockAllocator,
    KVCacheError,
    bytes_per_block,
    plan_kv_cache,
)
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.batching.scheduler import RequestRejected
from interlock.runners.batching.step_loop import StepLoop
from interlock.runners.contract import (
    Decision,
    KVCacheSpec,
    ModelSpec,
    RunnerOutput,
    RunnerReport,
    ScheduledBatch,
)
from interlock.runners.model.config_json import parse_config
from interlock.runners.model.demo import demo_config
from interlock.runners.model.kv_cache import allocate_kv_cache

CONFIG = demo_config()
#: A DeepSeek-V3 config (multi-head latent attention): its cache holds one latent of
#: kv_lora_rank + qk_rope_head_dim = 24 values per token and layer.
MLA_CONFIG = parse_config({
    "architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 1000, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
    "q_lora_rank": None, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
    "v_head_dim": 12, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 2,
    "topk_group": 1, "moe_intermediate_size": 32,
})

#: A GLM-5 config (DSA over MLA): the first layer also caches an indexer key of 16 values per
#: token; the second reuses its selection and caches the latent only.
DSA_CONFIG = parse_config({
    "architectures": ["GlmMoeDsaForCausalLM"], "vocab_size": 1000, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
    "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
    "v_head_dim": 12, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "index_topk": 4, "index_n_heads": 2, "index_head_dim": 16,
    "indexer_types": ["full", "shared"],
})


class CacheCheckingRunner:
    """Stands in for a model: remembers which (request, position, token) each slot holds,
    checks every sequence finds its own history in its block table, and returns a token
    that depends on that history — so any scheduling mistake changes the output."""

    def load(self, model, kv_cache, decision) -> None:
        self.block_size = kv_cache.block_size
        self.slots: dict[int, tuple[str, int, int]] = {}
        self.batches: list[ScheduledBatch] = []

    def execute(self, batch: ScheduledBatch) -> RunnerOutput:
        self.batches.append(batch)
        tokens = []
        for seq in batch.sequences:
            history = 0
            for pos in range(seq.seq_len):
                slot = self.slot(seq.block_table, pos)
                if pos >= seq.start_position:
                    fed = seq.token_ids[pos - seq.start_position]
                    self.slots[slot] = (seq.request_id, pos, fed)
                request_id, stored_pos, token = self.slots[slot]
                assert (request_id, stored_pos) == (seq.request_id, pos), "slot holds another token"
                history = (history * 31 + token) % 1000
            tokens.append(history if seq.sample else None)
        return RunnerOutput(tuple(tokens))

    def slot(self, block_table: tuple[int, ...], pos: int) -> int:
        return block_table[pos // self.block_size] * self.block_size + pos % self.block_size

    def report(self) -> RunnerReport:
        return RunnerReport("fake", "cpu", "float32", ())


class LatentCacheRunner(CacheCheckingRunner):
    """The fake runner over a real MLA latent cache (and a DSA layer's index cache beside
    it), allocated from the config's cache spec: each fed token's entry in every cache tensor
    (values naming its request, position and token) goes in with ``store_latent_cache``;
    every step reads each sequence's whole history back through its block table, so a block
    reused or a preemption mishandled shows as a wrong entry."""

    def load(self, model, kv_cache, decision) -> None:
        super().load(model, kv_cache, decision)
        self.caches = allocate_kv_cache(model.config, kv_cache, "float32", "cpu")
        self.ids: dict[str, int] = {}

    def entry(self, request_id: str, pos: int, token: int, width: int) -> torch.Tensor:
        number = self.ids.setdefault(request_id, len(self.ids) + 1)
        return torch.tensor([number, pos, token], dtype=torch.float32).repeat(width // 3 + 1)[
            :width]

    def execute(self, batch: ScheduledBatch) -> RunnerOutput:
        tensors = [cache for layer in self.caches for cache in layer]
        for seq in batch.sequences:
            slots = [self.slot(seq.block_table, p) for p in range(seq.start_position, seq.seq_len)]
            for cache in tensors:
                width = cache.shape[-1]
                entries = torch.stack([self.entry(seq.request_id, seq.start_position + i, t, width)
                                       for i, t in enumerate(seq.token_ids)])
                reference.store_latent_cache(entries[:, : width // 2], entries[:, width // 2:],
                                             cache, torch.tensor(slots))
        output = super().execute(batch)  # records what each slot should hold
        for seq in batch.sequences:
            for cache in tensors:
                flat = cache.view(-1, cache.shape[-1])
                for pos in range(seq.seq_len):
                    slot = self.slot(seq.block_table, pos)
                    request_id, stored_pos, token = self.slots[slot]
                    expected = self.entry(request_id, stored_pos, token, cache.shape[-1])
                    assert flat[slot].tolist() == expected.tolist()
        return output


def make_engine(num_blocks: int, block_size: int = 4, max_model_len: int = 64,
                model_config=CONFIG, runner=None, **limits) -> StepLoop:
    spec = ModelSpec("demo", model_config, "float32", "cpu", max_model_len=max_model_len,
                     **limits)
    return StepLoop(spec, KVCacheSpec(num_blocks, block_size), runner or CacheCheckingRunner(),
                  Decision())


def spec_of(dtype: str = "float32", max_model_len: int = 2048, max_num_seqs: int = 64,
            config=CONFIG) -> ModelSpec:
    return ModelSpec("demo", config, dtype, "cpu", max_model_len=max_model_len,
                     max_num_seqs=max_num_seqs)


def run(engine: StepLoop, prompts, max_tokens: int):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    requests = [engine.make_request(p, params) for p in prompts]
    for request in requests:
        engine.add_request(request)
    while engine.has_unfinished():
        engine.step()
    return requests


def test_block_allocator_free_list():
    allocator = BlockAllocator(4)
    first = allocator.allocate(3)
    assert allocator.num_free == 1
    with pytest.raises(KVCacheError, match="asked for 2 KV blocks, 1 free"):
        allocator.allocate(2)
    allocator.free(first)
    assert allocator.num_free == 4
    assert sorted(allocator.allocate(4)) == [0, 1, 2, 3]


def test_kv_cache_budget_from_bytes_or_blocks():
    per_block = bytes_per_block(CONFIG, "float32", 16)
    assert per_block == 2 * 8 * 4 * 64 * 4 * 16
    assert plan_kv_cache(spec_of(), 16, kv_cache_memory=10 * per_block + 1).num_blocks == 10
    assert plan_kv_cache(spec_of(max_model_len=64, max_num_seqs=2), 16,
                         kv_cache_memory=10**12).num_blocks == 8
    assert plan_kv_cache(spec_of("bfloat16"), 16, num_blocks=7).num_blocks == 7
    with pytest.raises(KVCacheError, match="holds no KV block"):
        plan_kv_cache(spec_of(), 16, kv_cache_memory=per_block - 1)
    with pytest.raises(KVCacheError, match="not both"):
        plan_kv_cache(spec_of(), 16, num_blocks=1, kv_cache_memory=1)


def test_requests_that_cannot_fit_alone_are_rejected_with_the_reason():
    engine = make_engine(num_blocks=4, block_size=4, max_model_len=32)
    with pytest.raises(RequestRejected, match=r"needs 5 KV blocks \(prompt 10 \+ max_tokens 10 "
                       r"tokens, block size 4\) but the cache has only 4"):
        engine.make_request(list(range(10)), SamplingParams(temperature=0, max_tokens=10))
    with pytest.raises(RequestRejected, match="exceeds max_model_len 32"):
        engine.make_request(list(range(30)), SamplingParams(temperature=0, max_tokens=3))
    with pytest.raises(RequestRejected, match="the prompt is empty"):
        engine.make_request([], SamplingParams(temperature=0))
    with pytest.raises(RequestRejected, match=r"outside the vocabulary \[0, 32000\)"):
        engine.make_request([1, 32000], SamplingParams(temperature=0))


def test_a_request_waits_for_blocks_then_runs():
    # Each request needs 3 blocks at its longest and 2 to start; 3 blocks fit one at a time.
    engine = make_engine(num_blocks=3)
    first, second = run(engine, [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15, 16]], 4)
    assert len(first.output_token_ids) == len(second.output_token_ids) == 4
    assert first.num_preemptions == second.num_preemptions == 0
    ids = [[s.request_id for s in b.sequences] for b in engine.runner.batches]
    assert ids == [[first.request_id]] * 4 + [[second.request_id]] * 4
    assert engine.scheduler.allocator.num_free == 3


def test_prefill_and_decode_share_a_step_and_long_prompts_are_chunked():
    engine = make_engine(num_blocks=64, max_num_batched_tokens=6)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    first = engine.make_request([1, 2, 3], params)
    engine.add_request(first)
    engine.step()  # prefill of the first request
    second = engine.make_request(list(range(10, 24)), params)  # 14 tokens: 3 chunks
    engine.add_request(second)
    while engine.has_unfinished():
        engine.step()
    batches = engine.runner.batches
    mixed = batches[1].sequences
    assert [(s.request_id, s.num_tokens, s.sample) for s in mixed] == [
        (first.request_id, 1, True), (second.request_id, 5, False)]
    chunks = [s for b in batches for s in b.sequences if s.request_id == second.request_id]
    assert [(s.start_position, s.num_tokens, s.sample) for s in chunks[:3]] == [
        (0, 5, False), (5, 5, False), (10, 4, True)]
    assert len(second.output_token_ids) == 5


def test_preempted_requests_are_recomputed_and_finish_with_the_same_tokens():
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14, 15]]
    roomy = run(make_engine(num_blocks=64), prompts, 10)
    tight_engine = make_engine(num_blocks=5)
    tight = run(tight_engine, prompts, 10)
    assert sum(r.num_preemptions for r in tight) > 0
    assert [r.output_token_ids for r in tight] == [r.output_token_ids for r in roomy]
    released = {rid for b in tight_engine.runner.batches for rid in b.finished_request_ids}
    assert released == {r.request_id for r in tight}


@pytest.mark.parametrize("config", [MLA_CONFIG, DSA_CONFIG], ids=["mla", "dsa"])
def test_the_latent_cache_survives_preemption_and_block_reuse(config):
    """And, for DSA, the index cache beside it (on the layers that run an indexer)."""
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14, 15]]
    roomy = run(make_engine(64, model_config=config, runner=LatentCacheRunner()),
                prompts, 10)
    tight_engine = make_engine(5, model_config=config, runner=LatentCacheRunner(),
                               max_num_batched_tokens=6)
    tight = run(tight_engine, prompts, 10)
    assert sum(r.num_preemptions for r in tight) > 0
    assert [r.output_token_ids for r in tight] == [r.output_token_ids for r in roomy]
    # Every block held entries of more than one request over the run.
    owners: dict[int, set[str]] = {}
    for batch in tight_engine.runner.batches:
        for seq in batch.sequences:
            for block in seq.block_table:
                owners.setdefault(block, set()).add(seq.request_id)
    assert all(len(ids) > 1 for ids in owners.values())


def test_blocks_are_counted_in_latent_bytes():
    # Per token: 2 layers x (16 + 8) latent values in float32, against per-head K and V.
    assert bytes_per_block(MLA_CONFIG, "float32", 16) == 2 * 24 * 4 * 16
    budget = 64 * bytes_per_block(MLA_CONFIG, "float32", 16)
    latent = plan_kv_cache(spec_of(max_model_len=4096, config=MLA_CONFIG), 16,
                           kv_cache_memory=budget)
    assert latent.num_blocks == 64
    per_head = 2 * 2 * 4 * (16 + 12) * 4 * 16  # what per-head K/V blocks would take
    assert latent.num_blocks * 16 > 4 * (budget // per_head) * 16
    # The same holds per rank: the latent is replicated, not split, across ranks.
    assert bytes_per_block(MLA_CONFIG, "float32", 16, tensor_parallel_size=2) == 2 * 24 * 4 * 16
    # DSA adds its indexer key where an indexer runs, replicated too.
    for ranks in (1, 2):
        assert bytes_per_block(DSA_CONFIG, "float32", 16, ranks) == (2 * 24 + 16) * 4 * 16


@given(
    prompt_lens=st.lists(st.integers(1, 20), min_size=1, max_size=6),
    max_tokens=st.integers(1, 12),
    block_size=st.sampled_from([1, 2, 4, 16]),
    spare_blocks=st.integers(0, 12),
    max_num_seqs=st.integers(1, 4),
    token_budget=st.integers(1, 24),
)
def test_every_request_finishes_whatever_the_limits(
    prompt_lens, max_tokens, block_size, spare_blocks, max_num_seqs, token_budget
):
    longest = max(prompt_lens) + max_tokens - 1
    num_blocks = -(-longest // block_size) + spare_blocks
    engine = make_engine(num_blocks, block_size, max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=token_budget)
    prompts = [list(range(i, i + n)) for i, n in enumerate(prompt_lens)]
    requests = run(engine, prompts, max_tokens)
    assert all(len(r.output_token_ids) == max_tokens for r in requests)
    assert engine.scheduler.allocator.num_free == num_blocks
    for batch in engine.runner.batches:
        assert 0 < batch.num_tokens <= token_budget
        assert len(batch.sequences) <= max_num_seqs
