"""DeepSeek V2/V3 (multi-head latent attention, DeepSeek routing) beyond eager parity: every
runner and graph mode token for token with transformers, the latent cache's size, and the
configs that are refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tiny_models import PROMPTS

from interlock.core.env import DEBUG_GRAPHS
from interlock.kernels.native import unavailable as native_unavailable
from interlock.llm import LLM
from interlock.runners.batching.kv_cache import bytes_per_block
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.contract import Decision
from interlock.runners.model.cache_spec import (
    elements_per_token,
    layer_caches,
    per_head_elements_per_token,
)
from interlock.runners.model.checkpoint import CheckpointError
from interlock.runners.model.config import ConfigError
from interlock.runners.model.config_json import load_config

CAPTURE_SIZES = (1, 2, 4, 8)
# Staggered lengths: batches shrink as requests finish, so their sizes fall on and between
# capture sizes; a 10-token budget mixes prefill chunks with decodes.
MAX_TOKENS = [12, 7, 10]
CPU_GRAPHS = "debug" if native_unavailable("cpu") else "native"
MODES = [
    ("none", False), ("piecewise", False), ("full_and_piecewise", False),
    ("full_and_piecewise", True), ("full", False), ("full_decode_only", False),
]


def generate(path: Path, decision: Decision, **engine) -> tuple[list[list[int]], object]:
    options = {"block_size": 4, "num_blocks": 96, "max_model_len": 64, "max_num_seqs": 4,
               "max_num_batched_tokens": 10, **engine}
    llm = LLM(str(path), dtype="float32", decision=decision, **options)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    outputs = llm.generate(PROMPTS, params)
    return [list(o.token_ids) for o in outputs], llm.report()


def expected(tiny_models, name: str) -> list[list[int]]:
    oracle = tiny_models.oracle(name).tokens
    return [tokens[:n] for tokens, n in zip(oracle, MAX_TOKENS, strict=True)]


@pytest.mark.parametrize(("mode", "breakable"), MODES,
                         ids=[f"{m}{'-breakable' if b else ''}" for m, b in MODES])
@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_every_graph_mode_gives_transformers_tokens(runner, mode, breakable, tiny_models):
    name = "deepseek_v3"
    decision = Decision(runner, mode, breakable, capture_sizes=CAPTURE_SIZES)
    tokens, report = generate(tiny_models.path(name), decision)

    assert tokens == expected(tiny_models, name)
    graphs = report.graphs
    assert graphs.backend == ("none" if mode == "none" else CPU_GRAPHS)
    # Every op of the MLA and MoE layers goes through the kernel table: nothing fails to
    # capture (a native tape refuses any other torch op).
    assert not graphs.failed and not report.fallbacks
    if mode != "none":
        assert graphs.captured


@pytest.mark.parametrize(("runner", "mode", "breakable"), [
    ("mrv1", "piecewise", False), ("mrv2", "full_and_piecewise", True), ("mrv2", "full", False),
])
def test_the_debug_graph_backend_gives_the_same_tokens(runner, mode, breakable, tiny_models,
                                                       monkeypatch):
    monkeypatch.setenv(DEBUG_GRAPHS.name, "1")
    name = "deepseek_v2_grouped"
    decision = Decision(runner, mode, breakable, capture_sizes=CAPTURE_SIZES)
    tokens, report = generate(tiny_models.path(name), decision)
    assert tokens == expected(tiny_models, name)
    assert report.graphs.backend == "debug"
    assert not report.graphs.failed and report.graphs.captured


@pytest.mark.skipif(CPU_GRAPHS != "native", reason="native kernels: not built here")
@pytest.mark.parametrize("name", ["deepseek_v3", "deepseek_v2_grouped"])
def test_a_native_decode_graph_replays_without_python_calls(name, tiny_models, monkeypatch):
    """Every op of an MLA + MoE decode step is native (the router's product padded to whole
    strips, the grouped routing, the latent store, the experts, the latent attention): a
    decode graph's tape records no foreign call, so its replay is one C call. (Where a
    projection is not whole strips of 16 outputs, as deepseek_v3_plain_q's fused q + kv_a
    of 88, that product goes to torch, as any such weight does.)"""
    from interlock.kernels.native import tape

    foreign: list[str] = []
    record = tape.Tape.add_foreign

    def add_foreign(self, call):
        foreign.append(call.fn.__name__)
        record(self, call)

    monkeypatch.setattr(tape.Tape, "add_foreign", add_foreign)
    decision = Decision("mrv2", "full_decode_only", False, capture_sizes=(1, 2, 4))
    tokens, report = generate(tiny_models.path(name), decision)
    assert tokens == expected(tiny_models, name)
    assert report.graphs.backend == "native" and report.graphs.captured
    assert foreign == []


@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_piecewise_and_breakable_programs_break_at_every_latent_attention(runner, tiny_models):
    layers = 2
    shapes = {}
    for mode, breakable in (("full", False), ("piecewise", False), ("full", True)):
        decision = Decision(runner, mode, breakable, capture_sizes=(2,))
        _, report = generate(tiny_models.path("deepseek_v2"), decision)
        shapes[mode, breakable] = {(g.segments, g.breaks) for g in report.graphs.captured}
    assert shapes["full", False] == {(1, 0)}
    assert shapes["piecewise", False] == shapes["full", True] == {(layers + 1, layers)}


def test_the_latent_cache_holds_the_latent_and_rotary_key_only(tiny_models):
    config = load_config(tiny_models.path("deepseek_v3"))
    # kv_lora_rank 16 + qk_rope_head_dim 8 per layer, whatever the heads.
    assert [c.tensors[0].shape for c in layer_caches(config)] == [(24,), (24,)]
    assert layer_caches(config, tensor_parallel_size=2) == layer_caches(config)
    assert elements_per_token(config) == 2 * 24
    # Per head: 4 heads x (K 8 + 8, V 12) per layer.
    assert per_head_elements_per_token(config) == 2 * 4 * (16 + 12)
    assert bytes_per_block(config, "float32", 4) == 4 * 2 * 24 * 4


def _edited(tiny_models, tmp_path: Path, name: str, **changes) -> Path:
    model = tmp_path / name
    shutil.copytree(tiny_models.path(name), model)
    raw = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**raw, **changes}))
    return model


@pytest.mark.parametrize(("name", "changes", "message"), [
    ("deepseek_v2", {"topk_method": "fancy"},
     r"topk_method='fancy' is not supported; allowed: greedy, group_limited_greedy, what "
     r"transformers' DeepseekV2ForCausalLM routes with \(known: greedy, group_limited_greedy, "
     r"noaux_tc\)"),
    ("deepseek_v2", {"topk_method": "noaux_tc"}, r"topk_method='noaux_tc' is not supported"),
    ("deepseek_v3", {"topk_method": "greedy"},
     r"topk_method='greedy' is not supported; allowed: noaux_tc"),
    ("deepseek_v3", {"scoring_func": "softmax"},
     r"scoring_func='softmax' is not supported; allowed: sigmoid"),
    ("deepseek_v3", {"scoring_func": "tanh"}, r"scoring_func='tanh' .*known: softmax, sigmoid"),
    ("deepseek_v3", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}},
     r"rope type='dynamic' is not supported"),
    ("deepseek_v3", {"moe_layer_freq": 2}, r"moe_layer_freq=2 is not supported"),
    ("deepseek_v3", {"n_group": 3}, r"n_group=3 is not supported; allowed: a divisor of "
     r"n_routed_experts=8"),
    ("deepseek_v2", {"norm_topk_prob": True}, r"norm_topk_prob=True is not supported"),
    ("deepseek_v3", {"qk_rope_head_dim": 7}, r"qk_rope_head_dim=7 is not supported"),
    # Hostile numbers: each refused by name before anything is built.
    ("deepseek_v3", {"kv_lora_rank": 0}, r"kv_lora_rank"),
    ("deepseek_v3", {"q_lora_rank": -4}, r"q_lora_rank"),
    ("deepseek_v3", {"n_group": 0}, r"n_group=0 is not supported"),
    ("deepseek_v3", {"topk_group": 3}, r"topk_group=3 is not supported; allowed: at most "
     r"n_group=2"),
    ("deepseek_v3", {"num_experts_per_tok": 9}, r"num_experts_per_tok=9 is not supported"),
    ("deepseek_v3", {"routed_scaling_factor": "large"}, r"routed_scaling_factor"),
    ("deepseek_v3", {"first_k_dense_replace": -1}, r"first_k_dense_replace=-1"),
    ("deepseek_v3", {"n_shared_experts": "two"}, r"n_shared_experts"),
])
def test_configs_transformers_would_run_differently_are_refused(
    name, changes, message, tiny_models, tmp_path
):
    with pytest.raises(ConfigError, match=message):
        load_config(_edited(tiny_models, tmp_path, name, **changes))


@pytest.mark.parametrize(("changes", "key"), [
    ({"kv_lora_rank": 12}, "kv_lora_rank"),
    ({"q_lora_rank": None}, "q_lora_rank"),
    ({"v_head_dim": 8}, "v_head_dim"),
    ({"moe_intermediate_size": 16}, "moe_intermediate_size"),
    ({"n_routed_experts": 4, "n_group": 2}, "n_routed_experts"),
])
def test_a_config_whose_shapes_disagree_with_its_checkpoint_names_the_key(
    changes, key, tiny_models, tmp_path
):
    model = _edited(tiny_models, tmp_path, "deepseek_v3", **changes)
    with pytest.raises(CheckpointError, match=rf"does not match .*config\.json: [^)]*\b{key}\b"):
        LLM(str(model), dtype="float32", block_size=4, num_blocks=16, max_model_len=32,
            decision=Decision())
