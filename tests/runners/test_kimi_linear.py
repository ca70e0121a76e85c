"""Kimi Linear (KDA + MLA hybrid): token parity with transformers through both runners, the
config keys it reads and refuses, and the recurrent-state pool beside the paged cache."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tiny_models import PROMPTS

from interlock.kernels.native import unavailable as native_unavailable
from interlock.llm import LLM
from interlock.runners.batching.kv_cache import plan_kv_cache
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.batching.step_loop import StepLoop
from interlock.runners.contract import Decision, KVCacheSpec, ModelSpec, RunnerOutput
from interlock.runners.model import kda
from interlock.runners.model.cache_spec import layer_caches, state_pool_bytes, state_spec
from interlock.runners.model.config import ConfigError
from interlock.runners.model.config_json import load_config, parse_config

NAME = "kimi_linear"
MAX_TOKENS = [12, 7, 10]


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """4-token chunks of the delta rule: the 19- and 9-token prompts span several."""
    monkeypatch.setattr(kda, "CHUNK_SIZE", 4)


def generate(path: Path, decision: Decision, prompts=PROMPTS, max_tokens=MAX_TOKENS,
             **engine) -> tuple[list[list[int]], LLM]:
    options = {"block_size": 4, "num_blocks": 96, "max_model_len": 64, "max_num_seqs": 4,
               "max_num_batched_tokens": 10, **engine}
    llm = LLM(str(path), dtype="float32", decision=decision, **options)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in max_tokens]
    return [list(o.token_ids) for o in llm.generate(prompts, params)], llm


def expected(tiny_models) -> list[list[int]]:
    oracle = tiny_models.oracle(NAME).tokens
    return [tokens[:n] for tokens, n in zip(oracle, MAX_TOKENS, strict=True)]


@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_batched_greedy_tokens_match_transformers(runner, tiny_models):
    # A 10-token budget: the 19-token prompt is prefilled in chunks that continue the state,
    # beside the other requests' decodes.
    tokens, _ = generate(tiny_models.path(NAME), Decision(runner, "none", False))
    assert tokens == expected(tiny_models)


@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_each_prompt_alone_matches_transformers(runner, tiny_models):
    want = expected(tiny_models)
    for prompt, n, tokens in zip(PROMPTS, MAX_TOKENS, want, strict=True):
        got, _ = generate(tiny_models.path(NAME), Decision(runner, "none", False), [prompt],
                          [n], max_num_batched_tokens=32)
        assert got == [tokens]


@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_a_preempted_request_recomputes_to_the_same_tokens(runner, tiny_models):
    # 9 blocks of 4 cannot hold the three requests at once: the youngest is preempted and
    # recomputed from its prompt into whichever state slot it gets next.
    _, llm = generate(tiny_models.path(NAME), Decision(runner, "none", False), [], [],
                      num_blocks=9)
    engine = llm.step_loop
    requests = [engine.make_request(p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
                for p, n in zip(PROMPTS, MAX_TOKENS, strict=True)]
    for request in requests:
        engine.add_request(request)
    while engine.has_unfinished():
        engine.step()
    assert sum(r.num_preemptions for r in requests) > 0, "the cache never ran short"
    assert [r.output_token_ids for r in requests] == expected(tiny_models)
    assert sorted(engine.scheduler.free_state_slots) == list(range(4))


def test_the_config_is_read_as_transformers_reads_it(tiny_models):
    config = load_config(tiny_models.path(NAME))
    assert config.linear is not None
    assert config.linear.layers == (True, True, True, False)
    assert (config.linear.num_heads, config.linear.head_dim, config.linear.conv_kernel) == (
        2, 16, 4)
    assert config.mla is not None and not config.mla.rotary
    assert config.moe is not None and config.moe.sparse_layers == (1, 2, 3)
    assert (config.moe.num_experts, config.moe.top_k) == (4, 2)
    assert config.max_position_embeddings == 256  # written as model_max_length
    # The KDA layers cache nothing per token; their state is one pool slot per request.
    assert [len(c.tensors) for c in layer_caches(config)] == [0, 0, 0, 1]
    spec = state_spec(config)
    assert spec is not None and spec.conv == (96, 3) and spec.recurrent == (2, 16, 16)
    assert spec.bytes_per_slot(4) == 3 * (96 * 3 * 4 + 2 * 16 * 16 * 4)


def _edited(tiny_models, tmp_path: Path, **changes) -> Path:
    model = tmp_path / NAME
    shutil.copytree(tiny_models.path(NAME), model)
    raw = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**raw, **changes}))
    return model


@pytest.mark.parametrize(("changes", "message"), [
    ({"layer_types": ["linear_attention", "mamba", "linear_attention", "full_attention"]},
     r"layer_types entry='mamba' is not supported; allowed: linear_attention, full_attention"),
    ({"layer_types": None, "linear_attn_config": {"kda_layers": [1, 2], "full_attn_layers": [4]}},
     r"linear_attn_config='<layer 3 in neither list>'"),
    ({"layer_types": None, "linear_attn_config": {"kda_layers": [0], "full_attn_layers": [4]}},
     r"linear_attn_config.kda_layers entry=0 is not supported; allowed: a layer number in 1..4"),
    ({"mlp_layer_types": ["dense", "sparse", "moe", "sparse"]},
     r"mlp_layer_types entry='moe' is not supported"),
    ({"linear_attn_config": {"head_dim": 0}}, r"linear_attn_config.head_dim=0 is not supported"),
])
def test_unknown_layer_types_and_bad_sizes_are_refused(changes, message, tiny_models, tmp_path):
    with pytest.raises(ConfigError, match=message):
        load_config(_edited(tiny_models, tmp_path, **changes))


def test_without_layer_types_every_fourth_layer_but_the_first_is_mla():
    raw = {"architectures": ["KimiLinearForCausalLM"], "vocab_size": 64, "hidden_size": 32,
           "intermediate_size": 32, "num_hidden_layers": 9, "num_attention_heads": 2,
           "kv_lora_rank": 8, "num_experts": 8}
    config = parse_config(raw)
    assert config.linear is not None
    assert config.linear.linear_layers == (0, 1, 2, 3, 5, 6, 7)
    assert config.linear.num_heads == 32 and config.linear.head_dim == 128


class StateCheckingRunner:
    """Stands in for a KDA model: each state slot remembers whose tokens it folded in. A
    sequence starting at position 0 must find its slot reset; a later chunk or decode must
    find its own request's state, as long as it has computed so far."""

    def load(self, model, kv_cache, decision) -> None:
        self.states: dict[int, tuple[str, int, int]] = {}
        self.slots_seen: set[int] = set()

    def execute(self, batch):
        tokens = []
        for seq in batch.sequences:
            slot = seq.state_slot
            assert slot >= 0
            self.slots_seen.add(slot)
            if seq.start_position == 0:
                owner, length, folded = seq.request_id, 0, 0
            else:
                owner, length, folded = self.states[slot]
                assert (owner, length) == (seq.request_id, seq.start_position), \
                    "state slot holds another request's state"
            for token in seq.token_ids:
                folded = (folded * 31 + token) % 1000
            self.states[slot] = (owner, length + seq.num_tokens, folded)
            tokens.append(folded if seq.sample else None)
        return RunnerOutput(tuple(tokens))

    def report(self):
        raise NotImplementedError


def _run(num_blocks: int, prompts, max_tokens) -> tuple[StepLoop, list]:
    config = load_config_for_pool()
    spec = ModelSpec("demo", config, "float32", "cpu", max_model_len=64, max_num_seqs=6,
                     max_num_batched_tokens=16)
    engine = StepLoop(spec, KVCacheSpec(num_blocks, 4), StateCheckingRunner(), Decision())
    requests = [engine.make_request(p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
                for p, n in zip(prompts, max_tokens, strict=True)]
    for request in requests:
        engine.add_request(request)
    while engine.has_unfinished():
        engine.step()
    return engine, requests


def load_config_for_pool():
    return parse_config({
        "architectures": ["KimiLinearForCausalLM"], "vocab_size": 1000, "hidden_size": 64,
        "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
        "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 12,
        "num_experts": 4, "num_experts_per_token": 2, "moe_intermediate_size": 32,
        "linear_num_heads": 2, "linear_head_dim": 16,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    })


def test_no_state_slot_leaks_after_200_mixed_requests_with_preemption():
    prompts = [[(7 * i + j) % 1000 for j in range(1 + (i * 5) % 23)] for i in range(200)]
    max_tokens = [1 + (i * 3) % 17 for i in range(200)]
    tight, requests = _run(24, prompts, max_tokens)
    assert sum(r.num_preemptions for r in requests) > 0, "the cache never ran short"
    scheduler = tight.scheduler
    assert sorted(scheduler.free_state_slots) == list(range(6))
    assert all(r.state_slot == -1 for r in requests)
    assert tight.runner.slots_seen == set(range(6))
    _, roomy = _run(4096, prompts, max_tokens)
    assert [r.output_token_ids for r in requests] == [r.output_token_ids for r in roomy]
    assert sum(r.num_preemptions for r in roomy) == 0


def test_the_state_pool_comes_out_of_the_kv_budget():
    config = load_config_for_pool()
    spec = ModelSpec("demo", config, "float32", "cpu", max_model_len=64, max_num_seqs=6)
    pool = state_pool_bytes(config, 4, 6)
    assert pool == 7 * state_spec(config).bytes_per_slot(4)
    per_block = 4 * 4 * (16 + 8)  # block 4, float32, the one MLA layer's latent
    budget = pool + 10 * per_block
    assert plan_kv_cache(spec, 4, kv_cache_memory=budget).num_blocks == 10


CPU_GRAPHS = "debug" if native_unavailable("cpu") else "native"
MODES = [("piecewise", False), ("full_and_piecewise", False), ("full_and_piecewise", True),
         ("full_decode_only", False)]


@pytest.mark.parametrize(("mode", "breakable"), MODES,
                         ids=[f"{m}{'-breakable' if b else ''}" for m, b in MODES])
@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_every_graph_mode_gives_transformers_tokens(runner, mode, breakable, tiny_models):
    decision = Decision(runner, mode, breakable, capture_sizes=(1, 2, 4, 8))
    tokens, llm = generate(tiny_models.path(NAME), decision)
    assert tokens == expected(tiny_models)
    report = llm.report()
    graphs = report.graphs
    assert graphs.backend == CPU_GRAPHS and graphs.captured
    assert not graphs.failed and not report.fallbacks
    # Decode steps replay graphs that update the pool's slots in place.
    assert sum(graphs.replays.values()) > 0
    # The KDA layers are split points like the MLA layer (piecewise and breakable cut there).
    splits = ("layer 0: linear attention (KDA)", "layer 1: linear attention (KDA)",
              "layer 2: linear attention (KDA)", "layer 3: latent attention")
    assert graphs.break_points == (() if mode == "full_decode_only" else splits)
    assert report.kv_cache is not None and report.kv_cache.linear_layers == (0, 1, 2)
    assert report.kv_cache.state_slots == 5  # max_num_seqs 4, and the scratch slot


@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_piecewise_and_breakable_programs_break_at_every_kda_layer(runner, tiny_models):
    shapes = {}
    for mode, breakable in (("full", False), ("piecewise", False), ("full", True)):
        _, llm = generate(tiny_models.path(NAME), Decision(runner, mode, breakable,
                                                           capture_sizes=(2,)))
        shapes[mode, breakable] = {(g.segments, g.breaks) for g in llm.report().graphs.captured}
    assert shapes["full", False] == {(1, 0)}
    assert shapes["piecewise", False] == shapes["full", True] == {(5, 4)}


@pytest.mark.slow  # two spawned ranks, each loading and capturing
def test_two_ranks_split_the_kda_heads_and_give_transformers_tokens(tiny_models):
    # Each rank holds one of the two KDA heads (its projections, convolution channels,
    # gates and pool state) and two of the four MLA heads; the step's state slots travel to
    # the other rank with the batch. (Chunk size 64 there: the ranks are fresh processes.)
    decision = Decision("mrv2", "full_and_piecewise", False, capture_sizes=(1, 2, 4))
    tokens, llm = generate(tiny_models.path(NAME), decision, tensor_parallel_size=2)
    assert tokens == expected(tiny_models)
    kv = llm.report().kv_cache
    assert kv is not None and kv.state_bytes_per_request == 3 * (48 * 3 * 4 + 16 * 16 * 4)


def test_a_size_that_does_not_divide_the_kda_heads_is_refused(tiny_models):
    from interlock.runners.model.sharding import ShardingError, plan_shards

    config = load_config(tiny_models.path(NAME))  # 2 KDA heads, 4 MLA heads
    assert plan_shards(config, 2).linear_heads == 1
    with pytest.raises(ShardingError, match="its linear-attention head count 2 does not "
                                            "divide into 4 ranks"):
        plan_shards(config, 4)
